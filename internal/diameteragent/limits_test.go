package diameteragent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

func rule(t *testing.T, name string, rate float64) *ratelimit.Rule {
	r, err := ratelimit.NewRule(name, rate, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The seed's egress example: the PCRF group's limit is applied after
// routing, just before forwarding, whatever the number of pGWs sending;
// refusals carry 3002, the E bit, the agent's Origin-Host and the
// configured Error-Message. Gy, routed to the OCS group, is not limited.
// The seed's dynamic example then throttles the group's rule by 40 %: the
// effective limit is 60 % of the static one.
func TestEgressLimitPerGroup(t *testing.T) {
	cfg := baseConfig()
	overall := rule(t, "overall", 100)
	cfg.Groups[0].Egress = ratelimit.NewProfile("pcrf", overall, nil, 16)
	cfg.Groups[0].Refusal = Refusal{ErrorMessage: "PCRF group over its rate"}
	h := newHarness(t, cfg)
	h.start()
	pgws := []*client{h.connect("pgw1.example"), h.connect("pgw2.example")}
	run := func(perClient int) (admitted, refused int) {
		step := time.Second / time.Duration(perClient*len(pgws))
		for i := range perClient {
			for k, c := range pgws {
				a := c.call(req{app: diameter.AppGx, origin: c.host, e2e: uint32(i*2 + k)}.bytes(t))
				switch {
				case a.result == ResultSuccess:
					admitted++
				case a.result == ResultUnableToDeliver && a.origin == "dra.example" && a.flags&diam.ErrorFlag != 0 && a.errMsg == "PCRF group over its rate":
					refused++
				default:
					t.Fatalf("answer %d from %s E=%v %q", a.result, a.origin, a.flags&diam.ErrorFlag != 0, a.errMsg)
				}
				h.clock.Advance(step)
			}
		}
		return admitted, refused
	}
	// 300 requests over one second against 100/s (burst 6).
	if adm, ref := run(150); adm < 100 || adm > 107 || adm+ref != 300 {
		t.Fatalf("static limit: %d admitted, %d refused; want 100-107 of 300", adm, ref)
	}
	for i := range 50 {
		if a := pgws[0].call(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i)}.bytes(t)); a.result != ResultSuccess {
			t.Fatalf("Gy limited: %d", a.result)
		}
	}
	h.clock.Advance(time.Second)
	overall.SetThrottle(40)
	if adm, ref := run(150); adm < 60 || adm > 65 || adm+ref != 300 {
		t.Fatalf("throttled 40%%: %d admitted, %d refused; want 60-65", adm, ref)
	}
	if got := h.agent.gen.Load().groups["pcrf"].st.refused.Load(); got < 400 {
		t.Fatalf("refused counter %d", got)
	}
}

// A group whose refusal is drop answers nothing to the requests over its
// limit.
func TestEgressDrop(t *testing.T) {
	cfg := baseConfig()
	cfg.Groups[1].Egress = ratelimit.NewProfile("ocs", rule(t, "overall", 1), nil, 16) // burst 2
	cfg.Groups[1].Refusal = Refusal{Drop: true}
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	for i := range 5 {
		c.send(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i + 1)}.bytes(t))
	}
	c.send(req{app: diameter.AppGx, e2e: 99}.bytes(t)) // answered by another server: may come first
	var got []uint32
	for len(got) < 3 {
		got = append(got, c.next().e2e)
	}
	select {
	case a := <-c.answers:
		got = append(got, a.e2e)
	case <-time.After(50 * time.Millisecond):
	}
	slices.Sort(got)
	if !slices.Equal(got, []uint32{1, 2, 99}) {
		t.Fatalf("answers %v: want the 2 admitted Gy and the Gx", got)
	}
}

// The seed's ingress example: pGW2 is limited to 1000 messages a second
// overall and 200 Gx CCR-I and 200 Gx CCR-T; its CCR-U pass as received,
// pGW1 is not limited, and the excess gets 3002 with the error message.
func TestIngressLimitSeedExample(t *testing.T) {
	cfg := baseConfig()
	cfg.Ingress = ratelimit.NewProfile("pgw2", rule(t, "overall", 1000),
		[]*ratelimit.Rule{rule(t, "gx-ccr-i", 200), rule(t, "gx-ccr-t", 200)}, 16)
	cfg.IngressRefusal = Refusal{ErrorMessage: "peer rate limit exceeded"}
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw2.example")
	admitted := map[uint32]int{}
	const each = 300 // of CCR-I, CCR-U and CCR-T over one second
	step := time.Second / (3 * each)
	for i := range each {
		for _, typ := range []uint32{1, 2, 3} {
			a := c.call(req{app: diameter.AppGx, ccType: typ, session: fmt.Sprint(typ, "-", i), origin: "pgw2.example", e2e: uint32(i)}.bytes(t))
			switch {
			case a.result == ResultSuccess:
				admitted[typ]++
			case a.result != ResultUnableToDeliver || a.errMsg != "peer rate limit exceeded" || a.origin != "dra.example":
				t.Fatalf("refusal %d %q from %s", a.result, a.errMsg, a.origin)
			}
			h.clock.Advance(step)
		}
	}
	// 200 a second plus the default burst of 11.
	if admitted[1] < 200 || admitted[1] > 211 || admitted[3] < 200 || admitted[3] > 211 || admitted[2] != each {
		t.Fatalf("admitted CCR-I %d, CCR-U %d, CCR-T %d", admitted[1], admitted[2], admitted[3])
	}
}

// The refusal's Result-Code is configurable; the E bit follows it (set for
// 3xxx protocol errors only).
func TestEgressRefusalResultCode(t *testing.T) {
	for _, code := range []uint32{ResultTooBusy, ResultUnableToComply} {
		cfg := baseConfig()
		cfg.Groups[1].Egress = ratelimit.NewProfile("ocs", rule(t, "overall", 1), nil, 16) // burst 2
		cfg.Groups[1].Refusal = Refusal{ResultCode: code}
		h := newHarness(t, cfg)
		h.start()
		c := h.connect("pgw1.example")
		var last message
		for i := range 3 {
			last = c.call(req{app: diameter.AppGy, realm: "ocs.example", e2e: uint32(i + 1)}.bytes(t))
		}
		if last.result != code || (last.flags&diam.ErrorFlag != 0) != (code < 4000) || last.errMsg != DefaultErrorMessage || last.origin != "dra.example" {
			t.Errorf("refusal with result_code %d: %d E=%v %q from %s", code, last.result, last.flags&diam.ErrorFlag != 0, last.errMsg, last.origin)
		}
	}
}

// fakeLoad is a load source a test sets.
type fakeLoad struct {
	mu   sync.Mutex
	load float64
	err  error
}

func (f *fakeLoad) set(load float64, err error) {
	f.mu.Lock()
	f.load, f.err = load, err
	f.mu.Unlock()
}
func (f *fakeLoad) String() string { return "fake" }
func (f *fakeLoad) Read(context.Context) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.load, f.err
}

// Dynamic throttling of a group's egress limit, with peer_rate_limit's
// engine: the load sampled every interval sets the throttle by the table
// (70 % → 40 % withheld: 60 of 100/s admitted); a reload carries the level
// over; an unreadable source keeps it; below the reversal load for the
// hold, it steps back.
func TestEgressDynamicThrottling(t *testing.T) {
	src := &fakeLoad{}
	ctl := func() *ratelimit.Dynamic {
		c, err := ratelimit.NewDynamic([]ratelimit.Step{{AtLeast: 60, Throttle: 40}}, 50, 3*time.Second, 40)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg := baseConfig()
	overall := rule(t, "overall", 100)
	cfg.Groups[0].Egress = ratelimit.NewProfile("pcrf", overall, nil, 16)
	cfg.Groups[0].Dynamic = &Dynamic{Source: src, Interval: time.Second, Controller: ctl()}
	h := newHarness(t, cfg)
	h.start()
	c := h.connect("pgw1.example")
	n := 0
	admitted := func(requests int) int { // over one second
		ok := 0
		for range requests {
			n++
			if a := c.call(req{app: diameter.AppGx, e2e: uint32(n)}.bytes(t)); a.result == ResultSuccess {
				ok++
			}
			h.clock.Advance(time.Second / time.Duration(requests))
		}
		return ok
	}
	throttle := func() int {
		d := h.agent.View().Groups[0].Dynamic
		if d == nil {
			t.Fatal("no dynamic view")
		}
		return d.ThrottlePercent
	}
	src.set(70, nil)
	h.clock.Advance(time.Second)
	if got := throttle(); got != 40 || overall.Throttle() != 40 {
		t.Fatalf("load 70 %%: throttle %d %%, rule %d %%; want 40", got, overall.Throttle())
	}
	h.clock.Advance(time.Second)
	if got := admitted(300); got < 60 || got > 66 {
		t.Fatalf("throttled 40 %%: %d of 300 admitted in a second, want 60-66", got)
	}
	cfg2 := baseConfig()
	cfg2.Groups[0].Egress = cfg.Groups[0].Egress
	cfg2.Groups[0].Dynamic = &Dynamic{Source: src, Interval: time.Second, Controller: ctl()}
	if err := h.agent.Update(cfg2); err != nil {
		t.Fatal(err)
	}
	src.set(0, fmt.Errorf("unreachable"))
	h.clock.Advance(2 * time.Second)
	if d := h.agent.View().Groups[0].Dynamic; d.ThrottlePercent != 40 || d.Errors < 2 || d.LastError != "unreachable" {
		t.Fatalf("after a reload and failed reads: %+v, want 40 %% kept and the errors counted", d)
	}
	src.set(10, nil)
	h.clock.Advance(5 * time.Second)
	if got := throttle(); got != 0 || overall.Throttle() != 0 {
		t.Fatalf("after the reversal hold: throttle %d %%, rule %d %%; want 0", got, overall.Throttle())
	}
	if got := admitted(300); got < 100 || got > 107 {
		t.Fatalf("unthrottled: %d of 300 admitted in a second, want 100-107", got)
	}
}
