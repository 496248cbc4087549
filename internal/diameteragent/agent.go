package diameteragent

import (
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgesteer/edgesteer/internal/bounded"
	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/olrshare"
)

// Options are the agent's surroundings: its clock, how it dials upstream
// peers and where it logs. Zero values are the real ones (and no logs).
type Options struct {
	Clock  Clock
	Dial   Dialer
	Logger *slog.Logger
}

// Agent is a Diameter relay agent. It outlives configuration generations:
// connections, bindings and counters stay across Update.
type Agent struct {
	clock Clock
	dial  Dialer
	log   *slog.Logger

	gen atomic.Pointer[generation]

	mu          sync.Mutex
	peers       map[string]*upstream // by host, across generations
	groupStates map[string]*groupState
	downs       map[string]*downstream // by the CER's Origin-Host, lowercased
	nextID      uint32
	closed      bool
	started     bool
	sweeper     Timer
	throttlers  map[string]*throttler // by group name, across generations

	seed     maphash.Seed
	oc       *overload                       // DOIC reports in force, across generations
	bindings *bounded.Table[uint32]          // Session-Id hash → upstream id (bindshare.go: with an epoch tag)
	shared   atomic.Pointer[diambind.Shared] // the bindings' store level (nil: local only)
	reports  atomic.Pointer[olrshare.Sharer] // the DOIC reports' store level (nil: local only)

	counts counters
}

// counters are the agent's own, beside each group's.
type counters struct {
	late, undelivered, timedOut, loops       atomic.Int64
	realmNotServed, unableToDeliver, tooBusy atomic.Int64
	ingressRefused, bindingsEnded            atomic.Int64
	downstreamDWR, downstreamDPR             atomic.Int64
}

// generation is one configuration, compiled for routing.
type generation struct {
	cfg      Config
	peers    map[string]*upstream // by lowercased host
	byID     map[uint32]*upstream
	groups   map[string]*group
	groupOf  map[*upstream]*group // a peer's first group, for Destination-Host
	realms   map[string]*realmRoutes
	anyRealm realmRoutes
	fallback *group
}

type realmRoutes struct {
	byApp map[uint32]*group
	any   *group
}

// New validates cfg and returns an agent; Start connects it upstream.
func New(cfg Config, opts Options) (*Agent, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	a := &Agent{clock: opts.Clock, dial: opts.Dial, log: opts.Logger,
		peers: map[string]*upstream{}, groupStates: map[string]*groupState{}, downs: map[string]*downstream{},
		throttlers: map[string]*throttler{}, seed: maphash.MakeSeed()}
	if a.clock == nil {
		a.clock = realClock{}
	}
	if a.dial == nil {
		a.dial = defaultDialer
	}
	if a.log == nil {
		a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a.bindings = bounded.New[uint32](cfg.MaxBindings)
	a.oc = &overload{table: doic.NewTable(0)}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.install(cfg)
	return a, nil
}

// Start connects to every upstream peer and starts the binding sweeper.
func (a *Agent) Start() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range a.peers {
		u.start()
	}
	a.scheduleSweep()
	a.started = true
	for _, t := range a.throttlers {
		t.schedule(a.gen.Load())
	}
}

// Update applies a new configuration from the next request on. Peers
// whose host, realm and address are unchanged keep their connection;
// others are connected anew, and removed ones disconnected (their
// pending requests fail over within their group, as for a failure).
// Bindings and counters stay.
func (a *Agent) Update(cfg Config) error {
	if err := cfg.normalize(); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("agent closed")
	}
	removed := a.install(cfg)
	for _, u := range a.peers {
		u.start() // a new one connects; a kept one is already running
	}
	for _, u := range removed {
		go u.stop()
	}
	return nil
}

// install compiles cfg into a generation and makes it current (a.mu held).
// It returns the peers the new generation no longer has.
func (a *Agent) install(cfg Config) []*upstream {
	g := &generation{cfg: cfg, peers: map[string]*upstream{}, byID: map[uint32]*upstream{},
		groups: map[string]*group{}, groupOf: map[*upstream]*group{}, realms: map[string]*realmRoutes{}}
	kept := map[string]*upstream{}
	for _, pc := range cfg.Peers {
		u := a.peers[pc.Host]
		if u == nil || !samePeer(u.cfg, pc) {
			a.nextID++
			u = newUpstream(a, pc, a.nextID)
		}
		kept[pc.Host] = u
		g.peers[pc.Host], g.byID[u.id] = u, u
	}
	var removed []*upstream
	for h, u := range a.peers {
		if kept[h] != u {
			removed = append(removed, u)
		}
	}
	a.peers = kept
	for _, gc := range cfg.Groups {
		st := a.groupStates[gc.Name]
		if st == nil {
			st = new(groupState)
			a.groupStates[gc.Name] = st
		}
		gr := &group{GroupConfig: gc, st: st}
		for _, h := range gc.Peers {
			u := g.peers[h]
			gr.members = append(gr.members, u)
			if g.groupOf[u] == nil {
				g.groupOf[u] = gr
			}
		}
		g.groups[gc.Name] = gr
	}
	g.fallback = g.groups[cfg.DefaultGroup]
	for _, r := range cfg.Routes {
		rr := &g.anyRealm
		if r.Realm != "*" {
			if rr = g.realms[r.Realm]; rr == nil {
				rr = &realmRoutes{}
				g.realms[r.Realm] = rr
			}
		}
		gr := g.groups[r.Group]
		if len(r.Applications) == 0 {
			if rr.any == nil {
				rr.any = gr
			}
			continue
		}
		if rr.byApp == nil {
			rr.byApp = map[uint32]*group{}
		}
		for _, app := range r.Applications {
			if rr.byApp[app] == nil { // the first route listed wins
				rr.byApp[app] = gr
			}
		}
	}
	a.bindings.SetLimits(cfg.MaxBindings, max(1, int64(cfg.BindingTTL/time.Second)))
	if cfg.DOIC != nil {
		a.oc.table.SetMax(cfg.DOIC.MaxReports)
	}
	a.installDynamic(g)
	a.installBindingStore(cfg.BindingStore, cfg.BindingTTL)
	a.installReportStore(&cfg)
	a.gen.Store(g)
	return removed
}

// closeWait bounds how long Close waits for the DPAs.
const closeWait = time.Second

// Close disconnects every peer with a DPR (RFC 6733 §5.4: a node shutting
// down says so to each peer), upstream and downstream, and stops. It
// returns once each peer answered its DPA (or closed), or after closeWait:
// a process exiting right after would otherwise cut them off.
func (a *Agent) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	if a.sweeper != nil {
		a.sweeper.Stop()
	}
	a.closeBindingStore()
	a.closeReportStore()
	peers := a.peers
	downs := a.downs
	a.downs = map[string]*downstream{}
	a.mu.Unlock()
	var links []*link
	for _, u := range peers {
		if l := u.stop(); l != nil {
			links = append(links, l)
		}
	}
	for _, d := range downs {
		a.disconnect(d.link, a.gen.Load().cfg.Watchdog)
		links = append(links, d.link)
	}
	deadline := time.NewTimer(closeWait)
	defer deadline.Stop()
	for _, l := range links {
		select {
		case <-l.done:
		case <-deadline.C:
			return
		}
	}
}

// disconnect sends l the agent's DPR; l closes at the DPA, or grace later.
func (a *Agent) disconnect(l *link, grace time.Duration) {
	dpr, err := buildDPR(&a.gen.Load().cfg.Identity, l.hbh())
	if err != nil {
		l.close()
		return
	}
	l.disconnect(dpr, a.clock, grace)
}

// scheduleSweep drops idle bindings every quarter TTL (a.mu held).
func (a *Agent) scheduleSweep() {
	if a.closed {
		return
	}
	ttl := a.gen.Load().cfg.BindingTTL
	a.sweeper = a.clock.AfterFunc(max(ttl/4, time.Second), func() {
		a.bindings.Sweep(a.seconds())
		a.mu.Lock()
		defer a.mu.Unlock()
		a.scheduleSweep()
	})
}

func (a *Agent) seconds() uint32 { return uint32(a.clock.Now().Unix()) }

// sessionKey hashes a Session-Id for the binding table (never 0).
func (a *Agent) sessionKey(sid []byte) uint64 { return maphash.Bytes(a.seed, sid) | 1 }

// bind binds a session to u.
func (a *Agent) bind(key uint64, u *upstream) { a.bindings.Put(key, u.id, a.seconds()) }

// answerSelf answers a request with the agent's identity: the refusals,
// 3xxx with the E bit.
func (a *Agent) answerSelf(to *link, in *msgInfo, code uint32, text string) {
	a.answerSelfWith(to, in, code, text, nil)
}

// answerSelfWith is answerSelf with add (if not nil) given the answer's
// bytes to append AVPs to.
func (a *Agent) answerSelfWith(to *link, in *msgInfo, code uint32, text string, add func([]byte) []byte) {
	g := a.gen.Load()
	switch code {
	case ResultUnableToDeliver:
		a.counts.unableToDeliver.Add(1)
	case ResultTooBusy:
		a.counts.tooBusy.Add(1)
	case ResultRealmNotServed:
		a.counts.realmNotServed.Add(1)
	case ResultLoopDetected:
		a.counts.loops.Add(1)
	}
	b, err := buildAnswer(in, &g.cfg.Identity, g.cfg.Applications, code, text)
	if err != nil {
		a.log.Warn("building an answer", "result_code", code, "error", err)
		return
	}
	if add != nil {
		b = add(b)
	}
	if !to.send(b) {
		a.counts.undelivered.Add(1)
	}
}

// lookupLower finds key in m, ignoring ASCII case (internal/diameter's
// LookupFold: no allocation when key is lowercase already).
func lookupLower[V any](m map[string]V, key []byte) (V, bool) { return diameter.LookupFold(m, key) }
