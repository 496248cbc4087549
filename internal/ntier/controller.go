package ntier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Kernel installs rule sets. Both methods are idempotent.
type Kernel interface {
	// Apply makes the kernel hold exactly rs, replacing an earlier set with
	// the same table and rule priority. If it fails, nothing of rs is left
	// that was not installed before (on a first install: nothing at all).
	Apply(rs RuleSet) error
	// Remove removes everything rs (or an earlier set with its table and
	// rule priority) installed; removing what is not there is no error.
	Remove(rs RuleSet) error
}

// Prober checks one node; nil is healthy.
type Prober interface {
	Probe(ctx context.Context, n Node) error
}

// TCPProber connects to the node's Health address.
type TCPProber struct{}

func (TCPProber) Probe(ctx context.Context, n Node) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", n.Health)
	if err != nil {
		return err
	}
	return c.Close()
}

// nodeState is one node's health state machine: up until Fall probes in a
// row fail, then down until Rise probes in a row succeed.
type nodeState struct {
	up          bool
	fails, oks  int
	since       time.Time
	lastErr     string
	probedTotal uint64
}

func (s *nodeState) observe(err error, h Health, now time.Time) (changed bool) {
	s.probedTotal++
	if err != nil {
		s.lastErr, s.oks = err.Error(), 0
		s.fails++
		if s.up && s.fails >= h.Fall {
			s.up, s.since = false, now
			return true
		}
		return false
	}
	s.lastErr, s.fails = "", 0
	s.oks++
	if !s.up && s.oks >= h.Rise {
		s.up, s.since = true, now
		return true
	}
	return false
}

// Controller owns a configuration, its nodes' health and what is installed.
// Nodes start up, so the documented assignment is installed at once.
type Controller struct {
	mu      sync.Mutex
	cfg     Config
	states  map[string]*nodeState // by node name, kept across Reconfigure
	kernel  Kernel
	prober  Prober
	now     func() time.Time
	applied *RuleSet // what the kernel holds; nil: nothing
	lastErr string   // the last Apply's error
	// onChange, if set, hears every node going down or up.
	onChange func(node string, up bool, lastErr string)
}

// OnChange sets f to hear each node's state change (for logs); f runs
// after the change is applied, outside the controller's lock.
func (c *Controller) OnChange(f func(node string, up bool, lastErr string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onChange = f
}

// New validates cfg (after defaults) and returns a controller that has
// installed nothing yet.
func New(cfg Config, k Kernel, p Prober, now func() time.Time) (*Controller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	c := &Controller{kernel: k, prober: p, now: now, states: map[string]*nodeState{}}
	c.setConfig(cfg)
	return c, nil
}

func (c *Controller) setConfig(cfg Config) {
	c.cfg = cfg
	keep := map[string]*nodeState{}
	for _, n := range cfg.Nodes {
		if s := c.states[n.Name]; s != nil {
			keep[n.Name] = s
		} else {
			keep[n.Name] = &nodeState{up: true, since: c.now()}
		}
	}
	c.states = keep
}

// Reconfigure adopts cfg (a reload): nodes kept by name keep their health,
// and the kernel is touched only if the rule set changes. On error the
// old configuration stays.
func (c *Controller) Reconfigure(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, oldStates := c.cfg, c.states
	c.setConfig(cfg)
	if c.applied == nil {
		return nil
	}
	if c.applied.Table != cfg.Table || c.applied.RulePriority != cfg.RulePriority {
		// A different table or priority is another rule set: take the old
		// one out first, or it would stay behind.
		if err := c.kernel.Remove(*c.applied); err != nil {
			c.cfg, c.states = old, oldStates
			return err
		}
		c.applied = nil
	}
	if err := c.sync(); err != nil {
		// Caddy keeps the old generation when a reload fails: so does the
		// controller (the next probe reinstalls it if it was taken out).
		c.cfg, c.states = old, oldStates
		return err
	}
	return nil
}

// Apply installs the rule set for the current health (idempotent).
func (c *Controller) Apply() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sync()
}

// sync brings the kernel to the wanted rule set, if it is not there.
func (c *Controller) sync() error {
	want := rules(c.cfg, c.assignment())
	if c.applied != nil && c.applied.Equal(want) {
		return nil
	}
	if err := c.kernel.Apply(want); err != nil {
		c.lastErr = err.Error()
		return err
	}
	c.applied, c.lastErr = &want, ""
	return nil
}

func (c *Controller) assignment() []int {
	names, up := make([]string, len(c.cfg.Nodes)), make([]bool, len(c.cfg.Nodes))
	for i, n := range c.cfg.Nodes {
		names[i], up[i] = n.Name, c.states[n.Name].up
	}
	return Assign(names, up, c.cfg.Buckets)
}

// Remove takes out what the controller installed (idempotent).
func (c *Controller) Remove() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	rs := rules(c.cfg, c.assignment())
	if c.applied != nil {
		rs = *c.applied
	}
	if err := c.kernel.Remove(rs); err != nil {
		return err
	}
	c.applied, c.lastErr = nil, "" // and no probe reinstalls it
	return nil
}

// ProbeOnce probes every node at once (each within the health timeout),
// moves their states and re-applies the rules if an assignment changed.
// It returns the Apply error, if any; the next call retries.
func (c *Controller) ProbeOnce(ctx context.Context) error {
	c.mu.Lock()
	cfg := c.cfg
	c.mu.Unlock()
	errs := make([]error, len(cfg.Nodes))
	var wg sync.WaitGroup
	for i, n := range cfg.Nodes {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, cfg.Health.Timeout)
			defer cancel()
			errs[i] = c.prober.Probe(pctx, n)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.mu.Lock()
	now := c.now()
	var changed []Node
	for i, n := range cfg.Nodes {
		if s := c.states[n.Name]; s != nil && s.observe(errs[i], c.cfg.Health, now) { // a Reconfigure meanwhile may have dropped it
			changed = append(changed, n)
		}
	}
	var err error
	if c.applied != nil || c.lastErr != "" { // else not installed (yet, or any more): nothing to move
		err = c.sync()
	}
	report := func() {}
	if f := c.onChange; f != nil {
		states := make([]nodeState, len(changed))
		for i, n := range changed {
			states[i] = *c.states[n.Name]
		}
		report = func() {
			for i, n := range changed {
				f(n.Name, states[i].up, states[i].lastErr)
			}
		}
	}
	c.mu.Unlock()
	report()
	return err
}

// Run probes every health interval until ctx ends; Apply errors go to
// onErr (which may be nil).
func (c *Controller) Run(ctx context.Context, onErr func(error)) {
	for {
		c.mu.Lock()
		interval := c.cfg.Health.Interval
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		if err := c.ProbeOnce(ctx); err != nil && onErr != nil && !errors.Is(err, ctx.Err()) {
			onErr(err)
		}
	}
}

// NodeFor returns the node a client address goes to now ("" for an
// invalid address).
func (c *Controller) NodeFor(a netip.Addr) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := Bucket(a, c.cfg.Seed, c.cfg.Buckets)
	if b < 0 {
		return ""
	}
	return c.cfg.Nodes[c.assignment()[b]].Name
}

// View is the controller's state for an admin view.
type View struct {
	Installed bool       `json:"installed"`
	Error     string     `json:"error,omitempty"`
	Buckets   int        `json:"buckets"`
	Seed      string     `json:"seed"`
	Nodes     []NodeView `json:"nodes"`
}

// NodeView is one node's health and share of the buckets.
type NodeView struct {
	Name        string    `json:"name"`
	NextHop     string    `json:"next_hop"`
	NextHop6    string    `json:"next_hop6,omitempty"`
	Mark        uint32    `json:"mark"`
	Up          bool      `json:"up"`
	Since       time.Time `json:"since"`
	LastError   string    `json:"last_error,omitempty"`
	Documented  int       `json:"buckets_documented"`
	Serving     int       `json:"buckets_serving"`
	ProbedTotal uint64    `json:"probes_total"`
}

// View returns the state now.
func (c *Controller) View() View {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := View{Installed: c.applied != nil, Error: c.lastErr, Buckets: c.cfg.Buckets, Seed: fmt.Sprintf("0x%08x", c.cfg.Seed)}
	assign := c.assignment()
	for i, n := range c.cfg.Nodes {
		s := c.states[n.Name]
		v.Nodes = append(v.Nodes, NodeView{
			Name: n.Name, NextHop: addrString(n.NextHop), NextHop6: addrString(n.NextHop6), Mark: mark(c.cfg, i), Up: s.up, Since: s.since,
			LastError: s.lastErr, ProbedTotal: s.probedTotal,
			Documented: (c.cfg.Buckets - i + len(c.cfg.Nodes) - 1) / len(c.cfg.Nodes),
			Serving:    len(slices.DeleteFunc(slices.Clone(assign), func(x int) bool { return x != i })),
		})
	}
	return v
}

// addrString is a's text, "" for no address.
func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
