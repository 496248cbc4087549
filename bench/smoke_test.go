// Package bench_test runs load scripts of bench/ in a short form, so that
// make test sees them work end to end (it measures nothing: the figures
// of a one-second round on a busy CI host mean nothing).
package bench_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// TestDiameterAgentBenchSmoke runs bench/diameter_agent.sh for one round
// of 1 s on the tests' bin/caddy: the agent, freeDiameter and the plain
// proxy each carry the load with every answer 2001 (diameterload fails the
// script otherwise), and a server killed under load loses no request.
func TestDiameterAgentBenchSmoke(t *testing.T) {
	e2e.SkipShort(t)
	if os.Getuid() != 0 {
		t.Fatal("bench/diameter_agent.sh makes a network namespace: run as root")
	}
	cmd := exec.Command("bash", "diameter_agent.sh")
	cmd.Env = append(os.Environ(), "RUNS=1", "DUR=1s", "CADDY="+e2e.Bin(t, "caddy"))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("bench/diameter_agent.sh took %v:\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("bench/diameter_agent.sh: %v", err)
	}
	for _, want := range []string{"ratio agent/freeDiameter", "ratio agent/plain proxy", "none lost", "ratio p99 with a failover"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output has no %q", want)
		}
	}
}
