package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// FreePort never returns one port twice in a process, and stays out of the
// kernel's ephemeral range and the portrange tests' source ports. With the
// kernel's own choice of port, 300 calls repeat one about four times in
// five (birthday odds over ~28,000 ephemeral ports).
func TestFreePortNeverRepeats(t *testing.T) {
	lo, hi := freeRange()
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if hi > lo && (p < lo || p >= hi) {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
	}
}

// Ports another test process has handed out, and not bound yet, are not
// handed out here: the other process (this test binary run again) takes
// 50 and holds them; none can be claimed here, and FreePort's next 300
// avoid them.
func TestFreePortAcrossProcesses(t *testing.T) {
	if os.Getenv("EDGESTEER_HOLD_PORTS") != "" {
		for range 50 {
			fmt.Println(FreePort(t))
		}
		fmt.Println("held")
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent lets go
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortAcrossProcesses$")
	cmd.Env = append(os.Environ(), "EDGESTEER_HOLD_PORTS=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	theirs := map[int]bool{}
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "held" {
		p, err := strconv.Atoi(strings.TrimSpace(lines.Text()))
		if err != nil {
			t.Fatalf("the other process printed %q", lines.Text())
		}
		theirs[p] = true
	}
	if len(theirs) != 50 {
		t.Fatalf("the other process handed out %d ports, want 50", len(theirs))
	}
	handedOut.Lock()
	for p := range theirs {
		if claim(p) {
			t.Errorf("port %d, handed out by the other process, claimed here too", p)
		}
	}
	handedOut.Unlock()
	for range 300 {
		if p := FreePort(t); theirs[p] {
			t.Fatalf("FreePort handed out %d, the other process's", p)
		}
	}
}

// Chromium's refused ports are never handed out: a dashboard test on one
// fails with net::ERR_UNSAFE_PORT (seen once on 10080, in FreePort's range).
func TestFreePortSkipsPortsBrowsersRefuse(t *testing.T) {
	for _, p := range []int{10080, 6000, 5060, 80} {
		if !browserRefuses(p) {
			t.Errorf("port %d: Chromium refuses it, FreePort may hand it out", p)
		}
	}
	for _, p := range []int{10081, 15000, 19999} {
		if browserRefuses(p) {
			t.Errorf("port %d refused, Chromium loads it", p)
		}
	}
}
