package e2e

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Together's calls overlap: each waits until all n have begun, which
// calls made one after another would never see; and it returns only when
// every call has.
func TestTogetherRunsAllAtOnce(t *testing.T) {
	const n = 50
	var begun, ended atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	Together(n, func(i int) {
		if begun.Add(1) == n {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			t.Errorf("call %d: only %d of %d calls began", i, begun.Load(), n)
			once.Do(func() { close(all) }) // the others need not wait too
		}
		ended.Add(1)
	})
	if ended.Load() != n {
		t.Fatalf("returned with %d of %d calls ended", ended.Load(), n)
	}
}
