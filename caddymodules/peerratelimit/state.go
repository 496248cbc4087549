package peerratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/live"
	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// states keeps each named limiter's state across config generations, the
// way Caddy keeps listeners: a new generation's Provision takes a reference
// (adopting the state) before the old generation's Cleanup drops its own,
// and the last reference stops the state's goroutines (handlerState.Destruct).
var states = caddy.NewUsagePool()

// registry holds the live states, for the admin API.
var registry live.Set[*handlerState]

// handlerState is the process state of one handler (kind, name), kept
// across config generations: the engine's store, the dynamic sampler and
// the sweeper. Its goroutines live as long as some generation holds it,
// not as long as any one generation.
type handlerState struct {
	kind, name string
	store      *ratelimit.Store

	// ctx is the goroutines' context: it belongs to no config generation
	// (each of those ends at its reload), only to this value, and Destruct
	// cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	sampling bool
	// gens are the attached generations, oldest first, and clusters the
	// cluster-wide limits by profile name (see reconcileClusters).
	gens     []*generation
	clusters map[string]*cluster
	// claims counts the modules holding the state per config generation
	// (identified by its context's Done channel) with their config
	// fingerprint: one generation may hold it several times only with
	// the same config (a handler repeated for several listeners).
	claims map[<-chan struct{}]claim
}

type claim struct {
	fingerprint string
	n           int
}

// lease is one module's hold on a shared state.
type lease struct {
	key      string
	hs       *handlerState
	at       *ratelimit.Attachment
	gen      *generation
	genID    <-chan struct{}
	released bool
}

func stateKey(kind, name string) string { return kind + "/" + name }

// acquire attaches g to the state of (kind, name), creating it if needed.
func acquire(ctx caddy.Context, kind, name, fp string, g ratelimit.Generation) (*lease, error) {
	key := stateKey(kind, name)
	v, _, err := states.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newHandlerState(kind, name), nil
	})
	if err != nil {
		return nil, err
	}
	hs := v.(*handlerState)
	genID := ctx.Done()
	hs.mu.Lock()
	c := hs.claims[genID]
	if c.n > 0 && c.fingerprint != fp {
		hs.mu.Unlock()
		states.Delete(key)
		return nil, fmt.Errorf("peer_rate_limit: name %q is given to two different %s handlers in this config: the name keys the state kept across reloads, give each its own", name, kind)
	}
	hs.claims[genID] = claim{fp, c.n + 1}
	hs.mu.Unlock()
	gen, _ := g.Payload.(*generation)
	l := &lease{key: key, hs: hs, at: hs.store.Attach(g), gen: gen, genID: genID}
	hs.mu.Lock()
	hs.gens = append(hs.gens, gen)
	err = hs.reconcileClusters(hs.gens)
	hs.mu.Unlock()
	if err != nil {
		l.release()
		return nil, err
	}
	if g.Dynamic != nil {
		hs.startSampling()
	}
	hs.publishLevel()
	return l, nil
}

// publishLevel sets the throttle gauge after a generation came or went:
// a new table may have lowered the level (ratelimit.Dynamic.Continue).
func (hs *handlerState) publishLevel() {
	if st, ok := hs.store.Controller(); ok {
		theMetrics.throttle.WithLabelValues(hs.name).Set(float64(st.Throttle))
	}
}

// release detaches the module's generation and drops its reference.
func (l *lease) release() error {
	if l.released {
		return nil
	}
	l.released = true
	l.at.Detach()
	hs := l.hs
	hs.publishLevel()
	if l.gen != nil && l.gen.dynamic != nil {
		l.gen.dynamic.releaseORCA(hs.kind, hs.name)
	}
	hs.mu.Lock()
	if i := slices.Index(hs.gens, l.gen); i >= 0 {
		hs.gens = slices.Delete(hs.gens, i, i+1)
	}
	if err := hs.reconcileClusters(hs.gens); err != nil && l.gen != nil && l.gen.logger != nil {
		l.gen.logger.Error("restoring the cluster settings of the running config", zap.Error(err))
	}
	if c := hs.claims[l.genID]; c.n > 1 {
		hs.claims[l.genID] = claim{c.fingerprint, c.n - 1}
	} else {
		delete(hs.claims, l.genID)
	}
	hs.mu.Unlock()
	_, err := states.Delete(l.key)
	return err
}

func newHandlerState(kind, name string) *handlerState {
	ctx, cancel := context.WithCancel(context.Background())
	hs := &handlerState{kind: kind, name: name, store: ratelimit.NewStore(), ctx: ctx, cancel: cancel,
		claims: map[<-chan struct{}]claim{}, clusters: map[string]*cluster{}}
	hs.wg.Add(1)
	go hs.sweep()
	registry.Add(hs)
	return hs
}

// Destruct stops the goroutines once no generation holds the state, and
// drops its metric series (its counters would restart from zero anyway;
// the decisions series go with the state's registration).
func (hs *handlerState) Destruct() error {
	registry.Remove(hs)
	hs.mu.Lock()
	for name, c := range hs.clusters {
		c.stop()
		delete(hs.clusters, name)
	}
	hs.mu.Unlock()
	hs.cancel()
	hs.wg.Wait()
	labels := prometheus.Labels{"handler": hs.name}
	theMetrics.throttle.Delete(labels)
	theMetrics.load.Delete(labels)
	theMetrics.sourceErrors.Delete(labels)
	theMetrics.refusalsDiscarded.DeletePartialMatch(labels)
	theMetrics.originMismatch.Delete(labels)
	return nil
}

// sweep drops refilled buckets idle for a minute, so tables keyed by
// client-controlled peers shrink back after a flood.
func (hs *handlerState) sweep() {
	defer hs.wg.Done()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-hs.ctx.Done():
			return
		case <-tick.C:
			now := monoclock.Now()
			hs.store.Sweep(now.Add(-time.Minute).UnixNano(), now.UnixNano())
		}
	}
}

// startSampling starts the dynamic sampler, once.
func (hs *handlerState) startSampling() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.sampling {
		return
	}
	hs.sampling = true
	hs.wg.Add(1)
	go hs.sampleLoop()
}

// newest returns the newest generation holding the state, or nil.
func (hs *handlerState) newest() *generation {
	g, _ := hs.store.Newest().(*generation)
	return g
}
