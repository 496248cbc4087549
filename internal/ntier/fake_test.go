package ntier

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"sync"
)

// fakeKernel holds rule sets by table, as a kernel would: Apply replaces
// the table's set, Remove drops it. fail makes the next calls fail.
type fakeKernel struct {
	mu        sync.Mutex
	tables    map[string]RuleSet
	applies   int
	removes   int
	failApply error
}

func newFakeKernel() *fakeKernel { return &fakeKernel{tables: map[string]RuleSet{}} }

func (k *fakeKernel) Apply(rs RuleSet) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.applies++
	if k.failApply != nil {
		return k.failApply // all or nothing: the table is untouched
	}
	k.tables[rs.Table] = rs
	return nil
}

func (k *fakeKernel) Remove(rs RuleSet) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.removes++
	delete(k.tables, rs.Table)
	return nil
}

func (k *fakeKernel) snapshot() map[string]RuleSet {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.tables)
}

// fakeProber answers from a map of node name → error, set by the test.
type fakeProber struct {
	mu   sync.Mutex
	down map[string]bool
}

func (p *fakeProber) set(node string, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down == nil {
		p.down = map[string]bool{}
	}
	p.down[node] = down
}

func (p *fakeProber) Probe(_ context.Context, n Node) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down[n.Name] {
		return errors.New("connection refused")
	}
	return nil
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
