package loadsource

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProcStat(t *testing.T) {
	const (
		base     = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 100 0 100 700 100 0 0 0 0 0\nintr 1 2 3\n"
		quarter  = "cpu  200 0 200 1300 100 0 0 0 0 0\ncpu0 200 0 200 1300 100 0 0 0 0 0\nintr 1 2 3\n"
		allIdle  = "cpu  100 0 100 1300 300 0 0 0 0 0\n"
		allBusy  = "cpu  500 0 500 700 100 0 0 0 0 0\n"
		guestToo = "cpu  200 0 200 1300 100 0 0 0 500 500\n" // guest is part of user: ignored
		short    = "cpu  200 0 200 1300\n"                   // old kernels: no iowait
	)
	tests := []struct {
		name          string
		first, second string
		want          float64
		wantErr       string
	}{
		{"25 percent", base, quarter, 25, ""},
		{"idle", base, allIdle, 0, ""},
		{"busy", base, allBusy, 100, ""},
		{"guest not double counted", base, guestToo, 25, ""},
		{"four fields", "cpu  100 0 100 800\n", short, 100 * (1 - 500.0/700), ""},
		{"no time elapsed", base, base, 0, "no cpu time elapsed"},
		{"backwards", quarter, base, 0, "went backwards"},
		{"malformed first", "cpu  x y z w\n", quarter, 0, "field 1"},
		{"malformed second", base, "cpu  1 2\n", 0, "at least 4"},
		{"no cpu line", "cpu0 1 2 3 4\n", quarter, 0, `no "cpu " line`},
		{"empty", "", quarter, 0, `no "cpu " line`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stat")
			write(t, path, tt.first)
			p := &ProcStat{Path: path}
			p.wait = func(ctx context.Context, d time.Duration) error {
				if d != defaultInterval {
					t.Errorf("wait(%v), want default %v", d, defaultInterval)
				}
				write(t, path, tt.second)
				return nil
			}
			got, err := p.Read(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Read() = %v, %v; want error containing %q and the path", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !near(got, tt.want) {
				t.Fatalf("Read() = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestProcStatBaseline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	write(t, path, "cpu  100 0 100 700 100 0 0 0 0 0\n")
	waits := 0
	p := &ProcStat{Path: path, Interval: time.Millisecond}
	p.wait = func(ctx context.Context, d time.Duration) error {
		waits++
		return nil
	}
	read := func(content string, want float64, wantWaits int) {
		t.Helper()
		write(t, path, content)
		got, err := p.Read(context.Background())
		if err != nil || !near(got, want) || waits != wantWaits {
			t.Fatalf("Read() = %v, %v after %d waits; want %v after %d", got, err, waits, want, wantWaits)
		}
	}
	// First read: baseline and sample are both "cpu 200…", so it fails, but
	// the baseline is kept.
	write(t, path, "cpu  200 0 200 1300 100 0 0 0 0 0\n")
	if _, err := p.Read(context.Background()); err == nil {
		t.Fatal("Read with no elapsed time succeeded")
	}
	// Later reads use the previous sample and do not wait.
	read("cpu  300 0 300 1900 100 0 0 0 0 0\n", 25, 1)
	read("cpu  700 0 700 1900 100 0 0 0 0 0\n", 100, 1)
	// Same counters again: the last value, not an error.
	read("cpu  700 0 700 1900 100 0 0 0 0 0\n", 100, 1)
	// A stale baseline is replaced, which costs a wait.
	p.prevAt = time.Now().Add(-2 * maxBaselineAge)
	p.wait = func(ctx context.Context, d time.Duration) error {
		waits++
		write(t, path, "cpu  700 0 700 2300 100 0 0 0 0 0\n")
		return nil
	}
	read("cpu  700 0 700 1900 100 0 0 0 0 0\n", 0, 2)
}

func TestProcStatContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	write(t, path, "cpu  100 0 100 700 100 0 0 0 0 0\n")
	p := &ProcStat{Path: path, Interval: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Read(ctx); err == nil {
		t.Fatal("Read succeeded despite the context deadline")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Read took %v, want it bounded by the context", d)
	}
}

func TestProcStatReal(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat:", err)
	}
	p := &ProcStat{}
	for i := range 2 {
		v, err := p.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if v < 0 || v > 100 {
			t.Fatalf("read %d: %v outside 0..100", i, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("cpu  100 0 100 700 100 0 0 0 0 0\n"))
	f.Add([]byte("cpu  1 2 3\n"))
	f.Add([]byte("intr 1\ncpu  18446744073709551615 1 1 1 1 1 1 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseProcStat(b)
	})
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
