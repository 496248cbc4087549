//go:build linux && amd64

package skew_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/e2e/skew"
)

// tolerance is how far a skewed wall clock may be from machine time +
// offset. The reads are bracketed by CLOCK_MONOTONIC reads on both sides,
// so scheduling delays do not count against it.
const tolerance = 50 * time.Millisecond

var (
	buildOnce sync.Once
	toolDir   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if toolDir != "" {
		os.RemoveAll(toolDir)
	}
	os.Exit(code)
}

// tools builds cmd/skewclock and testdata/probe once per test run and
// returns their paths.
func tools(t *testing.T) (launcher, probe string) {
	t.Helper()
	e2e.SkipShort(t)
	root := e2e.Root(t)
	buildOnce.Do(func() {
		if toolDir, buildErr = os.MkdirTemp("", "skewclock-test-"); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", toolDir+string(filepath.Separator),
			"./internal/e2e/skew/cmd/skewclock", "./internal/e2e/skew/testdata/probe")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(toolDir, "skewclock"), filepath.Join(toolDir, "probe")
}

// wallMinusMono is this process's CLOCK_REALTIME − CLOCK_MONOTONIC, both
// read by system call, from the tightest of a few bracketed reads. It is
// the same for every process on the machine; a skewed one differs by its
// offset.
func wallMinusMono(t *testing.T) int64 {
	best, bestGap := int64(0), int64(1<<62)
	for range 20 {
		var m1, w, m2 unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
		unix.ClockGettime(unix.CLOCK_REALTIME, &w)
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2)
		if gap := m2.Nano() - m1.Nano(); gap < bestGap {
			best, bestGap = w.Nano()-(m1.Nano()+m2.Nano())/2, gap
		}
	}
	return best
}

func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// run runs the command and returns its stdout (stderr is logged) and wait
// status.
func run(t *testing.T, name string, args ...string) (string, syscall.WaitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("stderr of %s: %s", cmd, stderr.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s: %v", cmd, err)
	}
	return stdout.String(), cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// skewOf returns the interval the offset of a wall read w lies in, given
// CLOCK_MONOTONIC reads m1 before and m2 after it and the machine's
// wall − mono: [w−m2−base, w−m1−base].
func skewOf(t *testing.T, w, m1, m2 string, base int64) (lo, hi time.Duration) {
	t.Helper()
	n := func(s string) int64 {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("probe output %q: %v", s, err)
		}
		return v
	}
	return time.Duration(n(w) - n(m2) - base), time.Duration(n(w) - n(m1) - base)
}

// within reports whether [lo, hi] reaches [want−tol, want+tol].
func within(lo, hi, want, tol time.Duration) bool {
	return hi >= want-tol && lo <= want+tol
}

// TestWallClockOffset: under skewclock, a Go program's wall clock — by
// time.Now (the runtime, no vDSO), clock_gettime REALTIME and
// REALTIME_COARSE, gettimeofday and time — is the machine's plus the
// offset, ahead and behind; its CLOCK_MONOTONIC is the machine's. The same
// program run plainly reads the machine's wall clock (the measurement's
// control).
func TestWallClockOffset(t *testing.T) {
	launcher, probe := tools(t)
	for _, offset := range []time.Duration{0, 800 * time.Millisecond, -1500 * time.Millisecond} {
		name := "plain"
		if offset != 0 {
			name = offset.String()
		}
		t.Run(name, func(t *testing.T) {
			base := wallMinusMono(t)
			before := monoNow()
			var out string
			var ws syscall.WaitStatus
			if offset == 0 {
				out, ws = run(t, probe, "clocks")
			} else {
				out, ws = run(t, launcher, skew.Args(offset, probe, "clocks")...)
			}
			after := monoNow()
			if ws.ExitStatus() != 0 {
				t.Fatalf("exit %v:\n%s", ws, out)
			}
			routes := map[string]bool{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(line)
				if f[0] == "bad-pointer" {
					if f[1] != strconv.Itoa(int(unix.EFAULT)) {
						t.Errorf("clock_gettime into an unmapped address: errno %s, want EFAULT", f[1])
					}
					continue
				}
				routes[f[0]] = true
				lo, hi := skewOf(t, f[1], f[2], f[3], base)
				tol := tolerance
				if strings.HasPrefix(f[0], "time") && f[0] != "time.Now" {
					tol += time.Second // time() has whole seconds
				}
				if !within(lo, hi, offset, tol) {
					t.Errorf("%s: wall clock off by [%v, %v], want %v ± %v", f[0], lo, hi, offset, tol)
				}
				for _, m := range f[2:4] {
					if v, _ := strconv.ParseInt(m, 10, 64); v < before || v > after {
						t.Errorf("%s: CLOCK_MONOTONIC %d outside the test's [%d, %d] around the run", f[0], v, before, after)
					}
				}
			}
			for _, r := range []string{"time.Now", "clock_gettime.REALTIME", "clock_gettime.REALTIME_COARSE", "gettimeofday", "time", "time.NULL"} {
				if !routes[r] {
					t.Errorf("probe printed no %s:\n%s", r, out)
				}
			}
		})
	}
}

// TestMonotonicAcrossSleep: time.Since across a 300 ms sleep measures the
// sleep, ahead and behind (the runtime's monotonic clock is not shifted).
func TestMonotonicAcrossSleep(t *testing.T) {
	launcher, probe := tools(t)
	for _, offset := range []time.Duration{800 * time.Millisecond, -1500 * time.Millisecond} {
		out, ws := run(t, launcher, skew.Args(offset, probe, "sleep", "300ms")...)
		f := strings.Fields(out)
		if ws.ExitStatus() != 0 || len(f) != 2 {
			t.Fatalf("%v: exit %v: %q", offset, ws, out)
		}
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		// A shifted monotonic clock would put this off by the offset.
		if d := time.Duration(ns); d < 300*time.Millisecond || d > 300*time.Millisecond+tolerance*4 {
			t.Errorf("%v: time.Since across a 300ms sleep = %v", offset, d)
		}
	}
}

// TestManyThreads: eight goroutines, each locked to its own thread, with
// GOMAXPROCS=2, reading at once: every read on every thread is skewed.
func TestManyThreads(t *testing.T) {
	launcher, probe := tools(t)
	const offset = 800 * time.Millisecond
	base := wallMinusMono(t)
	cmd := exec.Command(launcher, skew.Args(offset, probe, "threads", "8")...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tids := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		tids[f[1]]++
		if lo, hi := skewOf(t, f[2], f[3], f[4], base); !within(lo, hi, offset, tolerance) {
			t.Errorf("thread %s: wall clock off by [%v, %v], want %v", f[1], lo, hi, offset)
		}
	}
	if len(tids) != 8 {
		t.Fatalf("reads from %d threads, want 8: %v", len(tids), tids)
	}
	for tid, n := range tids {
		if n != 20 {
			t.Errorf("thread %s: %d reads, want 20", tid, n)
		}
	}
}

// TestExitCodes: the launcher exits with the target's code; a missing
// target is 127, bad arguments 2.
func TestExitCodes(t *testing.T) {
	launcher, probe := tools(t)
	for _, code := range []int{0, 3, 42} {
		if _, ws := run(t, launcher, skew.Args(time.Second, probe, "exit", strconv.Itoa(code))...); ws.ExitStatus() != code {
			t.Errorf("target exits %d: launcher %v", code, ws)
		}
	}
	if _, ws := run(t, launcher, skew.Args(time.Second, "/nonexistent/program")...); ws.ExitStatus() != 127 {
		t.Errorf("missing target: launcher %v, want exit 127", ws)
	}
	if _, ws := run(t, launcher, "-offset", "soon", "--", probe, "exit", "0"); ws.ExitStatus() != 2 {
		t.Errorf("-offset soon: launcher %v, want exit 2", ws)
	}
	if _, ws := run(t, launcher, "-offset", "1s"); ws.ExitStatus() != 2 {
		t.Errorf("no program: launcher %v, want exit 2", ws)
	}
}

// started is a launcher running a probe that printed "pid N".
type started struct {
	cmd    *exec.Cmd
	out    *bytes.Buffer
	target int
	done   chan struct{}
	eof    chan struct{} // closed when out holds all the probe wrote after its pid
}

func startProbe(t *testing.T, mode string) *started {
	t.Helper()
	launcher, probe := tools(t)
	s := &started{cmd: exec.Command(launcher, skew.Args(time.Second, probe, mode)...), out: &bytes.Buffer{}, done: make(chan struct{}), eof: make(chan struct{})}
	// An *os.File, so that Wait waits for the launcher only, not for
	// every holder of the pipe (a target that outlived it).
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = pw, os.Stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		if s.target > 0 {
			syscall.Kill(s.target, syscall.SIGKILL) // if a broken launcher left it
		}
		pr.Close()
	})
	lines := bufio.NewScanner(pr)
	if !lines.Scan() {
		t.Fatal("the probe printed nothing")
	}
	f := strings.Fields(lines.Text())
	if len(f) != 2 || f[0] != "pid" {
		t.Fatalf("probe said %q", lines.Text())
	}
	s.target, _ = strconv.Atoi(f[1])
	go func() {
		for lines.Scan() {
			s.out.WriteString(lines.Text() + "\n")
		}
		close(s.eof)
	}()
	return s
}

// output returns what the probe wrote after its pid, once every writer
// (the launcher and the target) has closed the pipe.
func (s *started) output(t *testing.T) string {
	t.Helper()
	select {
	case <-s.eof:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe's output never ended")
	}
	return s.out.String()
}

func (s *started) wait(t *testing.T) syscall.WaitStatus {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the launcher did not end")
	}
	return s.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// gone waits until pid has ended and been reaped (or is a zombie whose
// parent is not the launcher, which has exited).
func gone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("target %d still runs: %s", pid, b)
		}
	}
}

// TestSIGTERMForwarded: SIGTERM to the launcher reaches the target, whose
// handler runs; the launcher exits with the target's code, and the target
// is gone.
func TestSIGTERMForwarded(t *testing.T) {
	s := startProbe(t, "term")
	if pid, err := skew.TargetPID(s.cmd.Process.Pid); err != nil || pid != s.target {
		t.Errorf("TargetPID(launcher) = %d, %v; the target says it is %d", pid, err, s.target)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	if ws := s.wait(t); ws.ExitStatus() != 7 {
		t.Errorf("launcher ended %v, want exit 7 (the target's)", ws)
	}
	if out := s.output(t); !strings.Contains(out, "got SIGTERM") {
		t.Errorf("the target never got SIGTERM: %q", out)
	}
	gone(t, s.target)
}

// TestDiesOfTargetSignal: a target killed by a forwarded SIGTERM (default
// action) leaves the launcher killed by SIGTERM too, as its parent would
// have seen of the target; no zombie is left.
func TestDiesOfTargetSignal(t *testing.T) {
	s := startProbe(t, "hang")
	s.cmd.Process.Signal(syscall.SIGTERM)
	if ws := s.wait(t); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("launcher ended %v, want killed by SIGTERM", ws)
	}
	gone(t, s.target)
}

// TestLauncherKilled: SIGKILL to the launcher (a crash) takes the target
// with it: a target whose notifier is gone would read a wrong clock.
func TestLauncherKilled(t *testing.T) {
	s := startProbe(t, "hang")
	s.cmd.Process.Kill()
	if ws := s.wait(t); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("launcher ended %v", ws)
	}
	gone(t, s.target)
}

// TestInNamespace: `ip netns exec NS skewclock …` skews the target as
// outside.
func TestInNamespace(t *testing.T) {
	launcher, probe := tools(t)
	ns := e2e.NewNamespace(t)
	const offset = -1500 * time.Millisecond
	base := wallMinusMono(t)
	out, ws := run(t, "ip", append([]string{"netns", "exec", ns, launcher}, skew.Args(offset, probe, "clocks")...)...)
	if ws.ExitStatus() != 0 {
		t.Fatalf("exit %v: %s", ws, out)
	}
	f := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	if f[0] != "time.Now" {
		t.Fatalf("probe said %q", out)
	}
	if lo, hi := skewOf(t, f[1], f[2], f[3], base); !within(lo, hi, offset, tolerance) {
		t.Errorf("in %s: time.Now off by [%v, %v], want %v", ns, lo, hi, offset)
	}
}

// TestCaddy: bin/caddy under skewclock answers its admin API, and the
// "ts" of the log line for each admin request is the request's time on
// the test's clock plus the offset, ahead and behind.
func TestCaddy(t *testing.T) {
	launcher, _ := tools(t)
	caddy := e2e.Bin(t, "caddy")
	for _, offset := range []time.Duration{800 * time.Millisecond, -1500 * time.Millisecond} {
		t.Run(offset.String(), func(t *testing.T) {
			dir := t.TempDir()
			admin := e2e.Addr(t)
			config := fmt.Sprintf(`{"admin": {"listen": %q}, "logging": {"logs": {"default": {"level": "INFO"}}}}`, admin)
			path := filepath.Join(dir, "caddy.json")
			if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			env := []string{"HOME=" + dir, "XDG_CONFIG_HOME=" + filepath.Join(dir, "config"), "XDG_DATA_HOME=" + filepath.Join(dir, "data")}
			p := e2e.Start(t, "caddy", launcher, env, skew.Args(offset, caddy, "run", "--config", path)...)
			get := func(uri string) error {
				resp, err := http.Get("http://" + admin + uri)
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: %s", uri, resp.Status)
				}
				return nil
			}
			p.WaitFor(t, "admin API", 60*time.Second, func() error { return get("/config/") })
			type window struct{ from, to time.Time }
			windows := map[string]window{}
			for i := range 5 {
				uri := fmt.Sprintf("/config/?probe=%d", i)
				from := time.Now()
				if err := get(uri); err != nil {
					t.Fatal(err)
				}
				windows[uri] = window{from, time.Now()}
			}
			p.WaitLog(t, `"uri":"/config/?probe=4"`, 10*time.Second)
			seen := 0
			for _, line := range strings.Split(p.Logs(), "\n") {
				var entry struct {
					TS  float64 `json:"ts"`
					Msg string  `json:"msg"`
					URI string  `json:"uri"`
				}
				if json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "received request" {
					continue
				}
				w, ok := windows[entry.URI]
				if !ok {
					continue
				}
				seen++
				ts := time.Unix(0, int64(entry.TS*1e9))
				lo, hi := ts.Sub(w.to), ts.Sub(w.from)
				if !within(lo, hi, offset, tolerance) {
					t.Errorf("%s: caddy's ts %.6f is [%v, %v] off the request's time, want %v", entry.URI, entry.TS, lo, hi, offset)
				}
			}
			if seen != len(windows) {
				t.Fatalf("log lines for %d of %d admin requests:\n%s", seen, len(windows), p.Logs())
			}
			if err := p.Stop(); err != nil {
				t.Errorf("caddy under skewclock stopped with %v", err)
			}
		})
	}
}

// TestCoreDNS: bin/coredns under skewclock answers queries, with its wall
// clock read through the launcher (-v counts the reads it answered).
func TestCoreDNS(t *testing.T) {
	launcher, _ := tools(t)
	coredns := e2e.Bin(t, "coredns")
	path := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(path, []byte(". {\n\twhoami\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := e2e.FreePort(t)
	p := e2e.Start(t, "coredns", launcher, nil,
		append([]string{"-v"}, skew.Args(-1500*time.Millisecond, coredns, "-conf", path, "-dns.port", strconv.Itoa(port))...)...)
	p.WaitFor(t, "a DNS answer", 30*time.Second, func() error {
		m := new(dns.Msg)
		m.SetQuestion("whoami.example.", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil && len(r.Extra) == 0 {
			err = fmt.Errorf("answer without whoami's records: %v", r)
		}
		return err
	})
	if err := p.Stop(); err != nil {
		t.Errorf("coredns under skewclock stopped with %v", err)
	}
	var reads int
	for _, line := range strings.Split(p.Logs(), "\n") {
		if i := strings.Index(line, " wall-clock reads answered"); i > 0 {
			reads, _ = strconv.Atoi(line[strings.LastIndex(line[:i], " ")+1 : i])
		}
	}
	if reads == 0 {
		t.Errorf("the launcher answered no wall-clock read of coredns:\n%s", p.Logs())
	}
	t.Logf("%d wall-clock reads of coredns answered", reads)
}

// TestOverhead logs how many time.Now calls per second a program makes
// under skewclock and plainly (for the README; nothing is asserted).
func TestOverhead(t *testing.T) {
	launcher, probe := tools(t)
	rate := func(args ...string) (now, since float64) {
		out, ws := run(t, args[0], args[1:]...)
		f := strings.Fields(out)
		if ws.ExitStatus() != 0 || len(f) != 3 {
			t.Fatalf("exit %v: %q", ws, out)
		}
		now, _ = strconv.ParseFloat(f[1], 64)
		since, _ = strconv.ParseFloat(f[2], 64)
		return now, since
	}
	now, since := rate(probe, "rate", "1s")
	skewNow, skewSince := rate(append([]string{launcher}, skew.Args(time.Second, probe, "rate", "1s")...)...)
	t.Logf("calls per second, plain → under skewclock: time.Now (wall + monotonic) %.0f → %.0f (%.3f → %.1f µs each); "+
		"time.Since (monotonic only) %.0f → %.0f (%.3f → %.3f µs each)",
		now, skewNow, 1e6/now, 1e6/skewNow, since, skewSince, 1e6/since, 1e6/skewSince)
}
