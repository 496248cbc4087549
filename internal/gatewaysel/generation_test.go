package gatewaysel

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// genStore is fakeStore with a generation marker (GenerationStore), and a
// restart that loses everything, as a Redis restarted empty does.
type genStore struct {
	*fakeStore
	mu  sync.Mutex
	gen string
}

func (g *genStore) Generation(ctx context.Context, token string) (string, bool, error) {
	if err := g.enter(ctx, "generation", KeysGeneration); err != nil {
		return "", false, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gen != "" {
		return g.gen, false, nil
	}
	g.gen = token
	return token, true, nil
}

func (g *genStore) restartEmpty() {
	g.mu.Lock()
	g.gen = ""
	g.mu.Unlock()
	g.fakeStore.mu.Lock()
	g.values, g.locks = map[string]stored{}, map[string]stored{}
	g.fakeStore.mu.Unlock()
}

// README, Cluster, rule 6: a store restarted empty loses the stored
// results the replicas answer from memory. Replica a stored its result;
// after the restart b, asked first, probes (another measure: another
// order) and writes its own. At the next reconcile each finds the
// generation marker gone or changed and takes its results back, so both
// answer the one stored, whichever replica ticks first. A store that kept
// its marker costs one call a tick and no write. (Without the marker, a
// answered its order and b the other until the entry expired: 14 days.)
func TestStoreRestartedEmptyConverges(t *testing.T) {
	for _, aFirst := range []bool{true, false} {
		store, ev := &genStore{fakeStore: newFakeStore()}, &events{}
		pb := &fakeProber{rtts: map[string]time.Duration{"a:1": 40 * ms, "b:1": 30 * ms, "c:1": 10 * ms, "d:1": 20 * ms}}
		a, b := replica(t, store, exampleProber(), ev), replica(t, store, pb, ev)
		a.reconcile() // both have seen the marker
		b.reconcile()
		a.Select(context.Background(), "loc")
		waitStored(t, store.fakeStore, "loc")
		store.restartEmpty()
		if sel := b.Select(context.Background(), "loc"); sel.Source != Probed || slices.Equal(sel.Names(), a.Select(context.Background(), "loc").Names()) {
			t.Fatalf("b after the restart: %v %v; want its own run, another order than a's", sel.Source, sel.Names())
		}
		waitStored(t, store.fakeStore, "loc")
		first, second := a, b
		if !aFirst {
			first, second = b, a
		}
		first.reconcile()
		second.reconcile()
		na, nb := a.Select(context.Background(), "loc").Names(), b.Select(context.Background(), "loc").Names()
		want := decodeNames(t, store.value("loc"))
		if !slices.Equal(na, nb) || !slices.Equal(na, want) {
			t.Fatalf("a first %v: a answers %v, b %v, the store holds %v; want one order, the stored one", aFirst, na, nb, want)
		}
		sets, calls := store.sets.Load(), store.calls.Load()
		a.reconcile()
		b.reconcile()
		if store.sets.Load() != sets || store.calls.Load() != calls+2 {
			t.Fatalf("the marker kept: %d writes, %d calls in two reconciles; want none and 2", store.sets.Load()-sets, store.calls.Load()-calls)
		}
	}
}

func waitStored(t *testing.T, f *fakeStore, loc string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); f.value(loc) == ""; time.Sleep(ms) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing stored", loc)
		}
	}
}

func decodeNames(t *testing.T, v string) []string {
	t.Helper()
	res, err := decodeStored([]byte(v), &Config{ProbeID: "tcp", Gateways: exampleGateways()}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return res.Names()
}
