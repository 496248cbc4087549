package loadsource

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	defaultProcStatPath = "/proc/stat"
	defaultInterval     = 200 * time.Millisecond
	// maxBaselineAge: an older baseline would average over a long-gone past
	// and hide a current spike.
	maxBaselineAge = time.Minute
)

// ProcStat computes the local host's CPU busy percent from /proc/stat, for
// when the limiter runs on the backend's own host and needs no exporter.
// /proc/stat holds counters since boot, so the load is the delta between two
// reads; when Read is called periodically, the previous read is the baseline
// and Read does not wait.
type ProcStat struct {
	Path     string        // default "/proc/stat" (tests point it at a temp file)
	Interval time.Duration // default 200 ms

	mu       sync.Mutex
	prev     cpuTimes
	prevAt   time.Time // zero: no baseline yet
	last     float64
	haveLast bool
	// wait is the pause between baseline and sample; tests replace it.
	wait func(ctx context.Context, d time.Duration) error
}

// cpuTimes are the aggregate counters of the "cpu " line, in clock ticks.
type cpuTimes struct{ total, idle uint64 }

func (p *ProcStat) path() string {
	if p.Path == "" {
		return defaultProcStatPath
	}
	return p.Path
}

func (p *ProcStat) String() string { return "procstat " + p.path() }

// Read holds the lock while it waits so that concurrent callers share one
// baseline instead of racing to replace it.
func (p *ProcStat) Read(ctx context.Context) (float64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.read(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return v, nil
}

func (p *ProcStat) read(ctx context.Context) (float64, error) {
	fresh := p.prevAt.IsZero() || time.Since(p.prevAt) > maxBaselineAge
	if fresh {
		base, err := p.sample()
		if err != nil {
			return 0, err
		}
		p.prev, p.prevAt = base, time.Now()
		interval := p.Interval
		if interval <= 0 {
			interval = defaultInterval
		}
		wait := p.wait
		if wait == nil {
			wait = sleep
		}
		if err := wait(ctx, interval); err != nil {
			return 0, err
		}
	}
	cur, err := p.sample()
	if err != nil {
		return 0, err
	}
	now := time.Now()
	if cur.total < p.prev.total || cur.idle < p.prev.idle {
		// Counters never decrease on a live system; restart from here.
		p.prev, p.prevAt = cur, now
		return 0, errors.New("cpu counters went backwards")
	}
	dTotal, dIdle := cur.total-p.prev.total, cur.idle-p.prev.idle
	if dTotal == 0 {
		// Called again within one tick: nothing new to report, and keeping
		// the baseline lets the next call see a real delta.
		if !fresh && p.haveLast {
			return p.last, nil
		}
		return 0, errors.New("no cpu time elapsed between samples")
	}
	v := 100 * (1 - float64(min(dIdle, dTotal))/float64(dTotal))
	p.prev, p.prevAt, p.last, p.haveLast = cur, now, v, true
	return v, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *ProcStat) sample() (cpuTimes, error) {
	b, err := os.ReadFile(p.path())
	if err != nil {
		return cpuTimes{}, err
	}
	return parseProcStat(b)
}

// parseProcStat sums user..steal into the total; guest and guest_nice are
// left out because the kernel already counts them in user and nice.
func parseProcStat(b []byte) (cpuTimes, error) {
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "cpu ") {
			continue
		}
		fields := strings.Fields(line)[1:]
		if len(fields) < 4 {
			return cpuTimes{}, fmt.Errorf("cpu line has %d fields, want at least 4", len(fields))
		}
		var t cpuTimes
		for i, f := range fields[:min(len(fields), 8)] {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("cpu line field %d: %w", i+1, err)
			}
			t.total += n
			if i == 3 || i == 4 { // idle, iowait
				t.idle += n
			}
		}
		return t, nil
	}
	return cpuTimes{}, errors.New(`no "cpu " line`)
}
