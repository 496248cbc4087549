package diameteragent_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/avp"
	"github.com/fiorix/go-diameter/v4/diam/datatype"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// server is a testpeer process serving Diameter (a PCRF or an OCS).
type server struct {
	*e2e.Proc
	host, stats string
	client      *http.Client // reaching stats (nil: the default one)
}

func startServer(t *testing.T, host, realm string, delay time.Duration) (*server, string) {
	t.Helper()
	addr, statsAddr := e2e.Addr(t), e2e.Addr(t)
	p := e2e.Start(t, host, e2e.Bin(t, "testpeer"), nil, "-listen", statsAddr, "-name", host,
		"-diameter", addr, "-realm", realm, "-answer-delay", delay.String())
	p.WaitTCP(t, addr)
	p.WaitTCP(t, statsAddr)
	return &server{Proc: p, host: host, stats: statsAddr}, addr
}

type serverStats struct {
	Requests      int            `json:"requests"`
	ByType        map[string]int `json:"by_type"`
	Retransmitted map[string]int `json:"retransmitted"`
	Connections   int            `json:"connections"`
}

func (s *server) get(t *testing.T) serverStats {
	t.Helper()
	client := s.client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Get("http://" + s.stats + "/_diameter")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st serverStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// slowOCS is how long ocs3 takes to answer.
const slowOCS = 5 * time.Second

// agentConfig is the agent in front of two PCRFs (Gx) and two OCSs (Gy),
// routed by application in realm operator.example; the PCRF group's
// egress limit is pcrfRate requests per second with a burst of a tenth
// of a second (so a sender starved of CPU for up to 100 ms loses no
// admissions on a busy host). Tw is 6 s, so a hung
// server is SUSPECT 12 s after its last message; the OCS group's
// request_timeout (20 s) is above that, so its requests fail over then.
// pcrfExtra goes into the PCRF group's block (a dynamic block).
func agentConfig(listen string, addrs map[string]string, pcrfRate int, pcrfExtra ...string) string {
	const egressEnd = "error_message \"PCRF group over its rate\"\n\t\t\t\t\t\t}\n"
	return strings.Replace(agentConfigBase(listen, addrs, pcrfRate), egressEnd, egressEnd+strings.Join(pcrfExtra, "\n")+"\n", 1)
}

func agentConfigBase(listen string, addrs map[string]string, pcrfRate int) string {
	return "{\n" + e2e.DiameterAgent{Listen: listen, Head: gxGy, Addrs: addrs,
		Peers: []string{"pcrf1.example", "pcrf2.example", "ocs1.example", "ocs2.example", "ocs3.example"},
		Body: fmt.Sprintf(`
					group pcrf {
						peers pcrf1.example pcrf2.example
						request_timeout 5s
						egress {
							rate %d %d
							error_message "PCRF group over its rate"
						}
					}
					group ocs {
						peers ocs1.example ocs2.example
						policy least_outstanding
						request_timeout 20s
					}
					route operator.example pcrf 16777238
					route operator.example ocs 4
					watchdog 6s
					reconnect 200ms 1s
`, pcrfRate, pcrfRate/10)}.Layer4() + "}\n"
}

// gxGy is the agent's vendor and applications: Gx (3GPP) and Gy (credit
// control).
const gxGy = `
					vendor_id 10415
					application 16777238 vendor 10415
					application 4
`

type agentView struct {
	Name string `json:"name"`
	diameteragent.View
}

func view(t *testing.T, c *e2e.Caddy) diameteragent.View {
	t.Helper()
	var vs []agentView
	c.AdminJSON(t, "/diameter_agent/", &vs)
	if len(vs) != 1 || vs[0].Name != "dra" {
		t.Fatalf("admin view: %+v", vs)
	}
	return vs[0].View
}

// startAgent starts bin/caddy with config, whose agent listens at listen,
// and waits until every peer of the agent is OKAY.
func startAgent(t *testing.T, listen, config string) *e2e.Caddy {
	t.Helper()
	c := e2e.StartCaddy(t, "caddyfile", config)
	c.WaitTCP(t, listen)
	c.WaitFor(t, "every peer OKAY", 20*time.Second, func() error {
		for _, p := range view(t, c).Peers {
			if p.State != "OKAY" {
				return fmt.Errorf("%s %s (%s)", p.Host, p.State, p.LastError)
			}
		}
		return nil
	})
	return c
}

func group(v diameteragent.View, name string) diameteragent.GroupView {
	for _, g := range v.Groups {
		if g.Name == name {
			return g
		}
	}
	return diameteragent.GroupView{}
}

// TestAgentThroughCaddy runs bin/caddy as the agent of two pGWs, two
// PCRFs and two OCSs (testpeer processes), in phases on one set-up.
func TestAgentThroughCaddy(t *testing.T) {
	servers := map[string]*server{}
	addrs := map[string]string{}
	for _, h := range []string{"pcrf1.example", "pcrf2.example", "ocs1.example", "ocs2.example", "ocs3.example"} {
		// The PCRFs answer after 50 ms, so requests are pending on them
		// when one is killed. ocs3 is the slow OCS: 5 s (in no group but
		// in the slow-OCS phase).
		delay := time.Duration(0)
		switch {
		case strings.HasPrefix(h, "pcrf"):
			delay = 50 * time.Millisecond
		case h == "ocs3.example":
			delay = slowOCS
		}
		servers[h], addrs[h] = startServer(t, h, "operator.example", delay)
	}
	listen := e2e.Addr(t)
	c := startAgent(t, listen, agentConfig(listen, addrs, 5000))
	pgws := []*pgw{dialPGW(t, listen, "pgw1.example"), dialPGW(t, listen, "pgw2.example")}
	connections := func() int {
		n := 0
		for _, s := range servers {
			n += s.get(t).Connections
		}
		return n
	}

	t.Run("gx to a PCRF, gy to an OCS, sessions stick", func(t *testing.T) {
		type result struct {
			app     uint32
			id      string
			answers []answer
			err     error
		}
		var mu sync.Mutex
		var results []result
		var wg sync.WaitGroup
		for _, p := range pgws {
			for i := range 20 {
				for _, app := range []uint32{diameter.AppGx, diameter.AppGy} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						id := fmt.Sprintf("%s;%d;%d", p.host, app, i)
						as, err := p.session(app, id, "operator.example", 3, 0)
						mu.Lock()
						results = append(results, result{app, id, as, err})
						mu.Unlock()
					}()
				}
			}
		}
		wg.Wait()
		servedBy := map[string]int{}
		for _, r := range results {
			if r.err != nil {
				t.Fatal(r.err)
			}
			want := "pcrf"
			if r.app == diameter.AppGy {
				want = "ocs"
			}
			for i, a := range r.answers {
				if a.result != diam.Success || !strings.HasPrefix(a.origin, want) || a.session != r.id {
					t.Fatalf("session %s request %d: %+v, want 2001 from a %s", r.id, i, a, want)
				}
				if a.origin != r.answers[0].origin {
					t.Fatalf("session %s: request %d answered by %s, its CCR-I by %s", r.id, i, a.origin, r.answers[0].origin)
				}
			}
			servedBy[r.answers[0].origin]++
		}
		for h := range servers {
			if servedBy[h] == 0 && h != "ocs3.example" { // in no group
				t.Errorf("%s served no session: %v", h, servedBy)
			}
		}
		if v := view(t, c); v.Bindings != 0 {
			t.Errorf("%d bindings left after every session's CCR-T", v.Bindings)
		}
	})

	t.Run("unknown realm 3003", func(t *testing.T) {
		a, err := pgws[0].call(pgws[0].ccr(diameter.AppGx, ccrI, "pgw1;nowhere", "nowhere.example"))
		if err != nil || a.result != 3003 || a.origin != "dra.example" || !a.eBit {
			t.Fatalf("%+v %v: want 3003 from dra.example with the E bit", a, err)
		}
	})

	t.Run("a reload that fails leaves the agent on its config", func(t *testing.T) {
		before, conns := view(t, c), connections()
		// dra's routes and pcrf2's address change, and a second agent
		// after it routes to a group it does not have: the load fails once
		// dra is provisioned. Installed even for a moment, the change
		// would reconnect pcrf2.
		moved := maps.Clone(addrs)
		moved["pcrf2.example"] = "127.0.0.1:1"
		bad := strings.Replace(agentConfig(listen, moved, 5000), "route operator.example ocs 4",
			"route operator.example ocs 4\n\t\t\t\t\troute nowhere.example pcrf", 1)
		bad = strings.Replace(bad, "\t\t\t}\n\t\t}\n\t}\n}", `			}
			route {
				diameter_agent dra2 {
					origin_host dra2.example
					origin_realm operator.example
					host_ip_address 127.0.0.1
					application 4
					route operator.example nosuch
				}
			}
		}
	}
}`, 1)
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := e2e.CaddyCommand(t, "reload", "--config", path, "--adapter", "caddyfile", "--address", c.Admin).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "diameter_agent dra2: route 0") {
			t.Fatalf("caddy reload of a bad config: %v\n%s", err, out)
		}
		if after := view(t, c); !reflect.DeepEqual(after.Routes, before.Routes) {
			t.Errorf("routes after the failed reload: %+v, want %+v", after.Routes, before.Routes)
		}
		a, err := pgws[0].call(pgws[0].ccr(diameter.AppGx, ccrI, "pgw1;failed-reload", "nowhere.example"))
		if err != nil || a.result != 3003 || a.origin != "dra.example" {
			t.Errorf("after the failed reload, realm nowhere.example: %+v %v, want 3003 from dra.example", a, err)
		}
		if n := connections(); n != conns {
			t.Errorf("servers accepted %d connections, %d before the failed reload", n, conns)
		}
	})

	t.Run("destination-host honoured, loop 3005", func(t *testing.T) {
		p := pgws[1]
		for i, dest := range []string{"pcrf2.example", "pcrf2.example", "pcrf2.example", "pcrf1.example", "pcrf1.example", "ocs2.example", "ocs2.example", "ocs1.example", "ocs1.example"} {
			app := uint32(diameter.AppGx)
			if strings.HasPrefix(dest, "ocs") {
				app = diameter.AppGy
			}
			id := fmt.Sprintf("pgw2;dest;%d", i)
			host := diam.NewAVP(avp.DestinationHost, avp.Mbit, 0, datatype.DiameterIdentity(dest))
			for _, typ := range []uint32{ccrI, ccrT} {
				a, err := p.call(p.ccr(app, typ, id, "operator.example", host))
				if err != nil || a.result != diam.Success || a.origin != dest {
					t.Fatalf("Destination-Host %s: %+v %v", dest, a, err)
				}
			}
		}
		rr := diam.NewAVP(avp.RouteRecord, avp.Mbit, 0, datatype.DiameterIdentity("DRA.example"))
		a, err := p.call(p.ccr(diameter.AppGx, ccrI, "pgw2;loop", "operator.example", rr))
		if err != nil || a.result != 3005 || a.origin != "dra.example" {
			t.Fatalf("Route-Record naming the agent: %+v %v, want 3005 from dra.example", a, err)
		}
	})

	t.Run("a RAR from a PCRF reaches the pGW named", func(t *testing.T) {
		for _, dest := range []*pgw{pgws[1], pgws[0], pgws[0]} {
			before := [2]int64{pgws[0].rars.Load(), pgws[1].rars.Load()}
			resp, err := http.Post("http://"+servers["pcrf2.example"].stats+"/_rar?dest="+strings.ToUpper(dest.host)+"&session=rar", "", nil)
			if err != nil {
				t.Fatal(err)
			}
			var raa struct {
				ResultCode uint32 `json:"result_code"`
				OriginHost string `json:"origin_host"`
			}
			err = json.NewDecoder(resp.Body).Decode(&raa)
			resp.Body.Close()
			if err != nil || raa.ResultCode != diam.Success || raa.OriginHost != dest.host {
				t.Fatalf("RAR to %s: RAA %+v %v", dest.host, raa, err)
			}
			for i, p := range pgws {
				want := before[i]
				if p == dest {
					want++
				}
				if got := p.rars.Load(); got != want {
					t.Errorf("%s received %d RARs, want %d", p.host, got, want)
				}
			}
		}
	})

	// load runs Gx sessions (CCR-I, CCR-U…, CCR-T) from both pGWs on
	// workers goroutines each until stop, and counts the answers.
	type tally struct {
		sent, ok, refused, other atomic.Int64
		lost                     atomic.Int64 // no answer, or the connection ended
		bad                      atomic.Value // the first odd answer
	}
	load := func(workers int, pause time.Duration, session func(*pgw, string) ([]answer, error)) (*tally, func()) {
		var tl tally
		var stopping atomic.Bool
		var wg sync.WaitGroup
		for _, p := range pgws {
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; !stopping.Load(); n++ {
						as, err := session(p, fmt.Sprintf("%s;load;%d;%d;%d", p.host, time.Now().UnixNano(), w, n))
						tl.sent.Add(int64(len(as)))
						if err != nil {
							tl.lost.Add(1)
							tl.bad.CompareAndSwap(nil, err.Error())
							return
						}
						for _, a := range as {
							switch {
							case a.result == diam.Success:
								tl.ok.Add(1)
							case a.result == 3002 && a.eBit && a.origin == "dra.example" && a.errMsg == "PCRF group over its rate":
								tl.refused.Add(1)
							default:
								tl.other.Add(1)
								tl.bad.CompareAndSwap(nil, fmt.Sprintf("%+v", a))
							}
						}
						time.Sleep(pause)
					}
				}()
			}
		}
		return &tl, func() { stopping.Store(true); wg.Wait() }
	}
	gx := func(p *pgw, id string) ([]answer, error) {
		return p.session(diameter.AppGx, id, "operator.example", 3, 0)
	}

	t.Run("reload under load changes the PCRF limit", func(t *testing.T) {
		const rate = 200
		before := connections()
		// 32 senders: enough to offer well over the limit (a session
		// admitted throughout takes 250 ms) without spinning on refusals.
		tl, stop := load(16, 50*time.Millisecond, gx)
		time.Sleep(500 * time.Millisecond)
		c.Reload(t, "caddyfile", agentConfig(listen, addrs, rate))
		time.Sleep(time.Second) // the burst of the new limit is spent
		// Each count is read at the middle of its admin call: a busy
		// host's slow answer then skews neither end of the window.
		read := func() (diameteragent.GroupView, time.Time) {
			a := time.Now()
			g := group(view(t, c), "pcrf")
			return g, a.Add(time.Since(a) / 2)
		}
		g0, t0 := read()
		time.Sleep(4 * time.Second)
		g1, t1 := read()
		stop()
		secs := t1.Sub(t0).Seconds()
		admitted, refused := float64(g1.Admitted-g0.Admitted)/secs, float64(g1.Refused-g0.Refused)/secs
		t.Logf("admitted %.1f/s, refused %.1f/s at a limit of %d/s; answers: %d ok, %d refused, %d other, %d lost",
			admitted, refused, rate, tl.ok.Load(), tl.refused.Load(), tl.other.Load(), tl.lost.Load())
		// The rule: admitted up to the limit, refused only above it. A
		// host too busy to offer the limit (nothing refused in the
		// window) is not asked to reach it.
		if admitted > 1.05*rate {
			t.Errorf("PCRF group admitted %.1f/s, want at most %d + 5%%", admitted, rate)
		}
		if refused > 0 && admitted < 0.95*rate {
			t.Errorf("PCRF group admitted %.1f/s while refusing %.1f/s, want %d − 5%%", admitted, refused, rate)
		}
		if tl.lost.Load() != 0 || tl.other.Load() != 0 || tl.refused.Load() == 0 {
			t.Errorf("lost %d, other %d (%v), refused %d: want none lost, none odd, some refused",
				tl.lost.Load(), tl.other.Load(), tl.bad.Load(), tl.refused.Load())
		}
		if after := connections(); after != before {
			t.Errorf("servers accepted %d connections before the reload, %d after: upstream connections were dropped", before, after)
		}
		for _, p := range pgws {
			select {
			case <-p.closed:
				t.Errorf("%s: its connection ended", p.host)
			default:
			}
		}
		if v, ok := c.Metric(t, `caddy_edgesteer_diameter_agent_group_requests_total{agent="dra",group="pcrf",outcome="refused"}`); !ok || v == 0 {
			t.Errorf("refused metric %v %v", v, ok)
		}
	})

	t.Run("dynamic throttling of the PCRF group's egress limit", func(t *testing.T) {
		const rate = 200
		loadFile := filepath.Join(t.TempDir(), "load")
		setLoad := func(v string) {
			if err := os.WriteFile(loadFile, []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		setLoad("70")
		c.Reload(t, "caddyfile", agentConfig(listen, addrs, rate, fmt.Sprintf(`dynamic {
							source file %s
							interval 200ms
							threshold 60 50
							reversal_hold 500ms
						}`, loadFile)))
		throttle := func(want int) func() error {
			return func() error {
				d := group(view(t, c), "pcrf").Dynamic
				if d == nil || d.ThrottlePercent != want {
					return fmt.Errorf("dynamic %+v, want %d %%", d, want)
				}
				return nil
			}
		}
		c.WaitFor(t, "throttled by half at 70 % load", 10*time.Second, throttle(50))
		tl, stop := load(16, 50*time.Millisecond, gx)
		time.Sleep(time.Second)
		g0, t0 := group(view(t, c), "pcrf"), time.Now()
		time.Sleep(4 * time.Second)
		g1, t1 := group(view(t, c), "pcrf"), time.Now()
		setLoad("10")
		c.WaitFor(t, "unthrottled after the reversal hold", 10*time.Second, throttle(0))
		stop()
		admitted := float64(g1.Admitted-g0.Admitted) / t1.Sub(t0).Seconds()
		t.Logf("throttled 50 %%: admitted %.1f/s of a %d/s limit; answers: %d ok, %d refused, %d other, %d lost",
			admitted, rate, tl.ok.Load(), tl.refused.Load(), tl.other.Load(), tl.lost.Load())
		if want := rate / 2.0; math.Abs(admitted-want) > 0.05*want {
			t.Errorf("PCRF group admitted %.1f/s throttled by half, want %.0f ± 5%%", admitted, want)
		}
		if tl.lost.Load() != 0 || tl.other.Load() != 0 {
			t.Errorf("lost %d, other %d (%v)", tl.lost.Load(), tl.other.Load(), tl.bad.Load())
		}
		if v, ok := c.Metric(t, `caddy_edgesteer_diameter_agent_group_throttle_percent{agent="dra",group="pcrf"}`); !ok || v != 0 {
			t.Errorf("throttle metric %v %v, want 0", v, ok)
		}
	})

	t.Run("a slow OCS delays no Gx request", func(t *testing.T) {
		// Gy goes to a group of ocs3 alone, answering after 5 s, with at
		// most 32 requests pending and a request_timeout of 3 s.
		const timeout, bound = 3 * time.Second, 32
		slow := strings.Replace(agentConfig(listen, addrs, 5000), "route operator.example ocs 4", fmt.Sprintf(`group slowocs {
						peers ocs3.example
						max_pending %d
						request_timeout %v
					}
					route operator.example slowocs 4`, bound, timeout), 1)
		c.Reload(t, "caddyfile", slow)
		defer c.Reload(t, "caddyfile", agentConfig(listen, addrs, 5000))
		var mu sync.Mutex
		var gxA, gxB []time.Duration
		var gxBad, gyBad []string
		gy := map[uint32][]time.Duration{}
		var phaseB, stopGx, stopGy atomic.Bool
		var wg sync.WaitGroup
		timed := func(p *pgw, app, typ uint32, id string) (answer, time.Duration, error) {
			start := time.Now()
			a, err := p.call(p.ccr(app, typ, id, "operator.example"))
			return a, time.Since(start), err
		}
		for _, p := range pgws {
			for w := range 4 { // Gx: CCR-I, CCR-T, … (the PCRFs answer in 50 ms)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; !stopGx.Load(); n++ {
						typ := uint32(ccrI)
						if n%2 == 1 {
							typ = ccrT
						}
						a, d, err := timed(p, diameter.AppGx, typ, fmt.Sprintf("%s;gx-slow;%d;%d", p.host, w, n/2))
						b := phaseB.Load()
						mu.Lock()
						switch {
						case err != nil || a.result != diam.Success || !strings.HasPrefix(a.origin, "pcrf"):
							gxBad = append(gxBad, fmt.Sprintf("%+v %v", a, err))
						case b:
							gxB = append(gxB, d)
						default:
							gxA = append(gxA, d)
						}
						mu.Unlock()
					}
				}()
			}
		}
		time.Sleep(3 * time.Second) // phase A: Gx alone
		for _, p := range pgws {
			for w := range 24 { // Gy: more senders than the group's bound
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; !stopGy.Load(); n++ {
						a, d, err := timed(p, diameter.AppGy, ccrI, fmt.Sprintf("%s;gy-slow;%d;%d", p.host, w, n))
						mu.Lock()
						switch {
						case err != nil:
							gyBad = append(gyBad, err.Error())
						case a.result == 3004 && a.eBit && a.origin == "dra.example":
							gy[3004] = append(gy[3004], d)
						case a.result == 3002 && a.eBit && a.origin == "dra.example" && strings.HasPrefix(a.errMsg, "request timeout"):
							gy[3002] = append(gy[3002], d)
						default:
							gyBad = append(gyBad, fmt.Sprintf("%+v after %v", a, d))
						}
						mu.Unlock()
						if a.result == 3004 {
							time.Sleep(200 * time.Millisecond) // a pGW backs off; no busy loop on the host
						}
					}
				}()
			}
		}
		time.Sleep(timeout + time.Second) // the group fills up, its first requests time out
		phaseB.Store(true)
		time.Sleep(3 * time.Second) // phase B: Gx beside a full slow group
		stopGx.Store(true)
		stopGy.Store(true)
		wg.Wait()
		p99 := func(ds []time.Duration) time.Duration {
			slices.Sort(ds)
			return ds[len(ds)*99/100]
		}
		if len(gxBad) != 0 || len(gyBad) != 0 || len(gxA) < 100 || len(gxB) < 100 {
			t.Fatalf("Gx: %d, %d answered 2001, odd %v; Gy odd %v", len(gxA), len(gxB), gxBad, gyBad)
		}
		if len(gy[3004]) == 0 || len(gy[3002]) == 0 {
			t.Fatalf("Gy: %d × 3004, %d × 3002: want both (the group full, and its requests timed out)", len(gy[3004]), len(gy[3002]))
		}
		a, b := p99(gxA), p99(gxB)
		t.Logf("Gx p99 %v alone (%d requests), %v beside the slow OCS group (%d requests): ratio %.2f; Gy: %d × 3004 (slowest %v), %d × 3002 (%v to %v)",
			a, len(gxA), b, len(gxB), float64(b)/float64(a), len(gy[3004]), slices.Max(gy[3004]), len(gy[3002]), slices.Min(gy[3002]), slices.Max(gy[3002]))
		// The p99 ratio is logged, not asserted: on a 2-core host shared
		// with other test binaries it swings with their load (1.15 was
		// measured beside six other sessions' builds and tests), while a
		// Gx request that waited for the OCS would take its 5 s.
		if slices.Max(gxB) >= slowOCS {
			t.Errorf("a Gx request took %v: it waited for the OCS", slices.Max(gxB))
		}
		if slices.Min(gy[3002]) < timeout || slices.Max(gy[3004]) >= timeout {
			t.Errorf("Gy 3002 after %v at the soonest (want ≥ request_timeout %v), 3004 after %v at the latest (want at once, before it)",
				slices.Min(gy[3002]), timeout, slices.Max(gy[3004]))
		}
	})

	t.Run("SIGSTOP an OCS under load: SUSPECT, its pending requests fail over", func(t *testing.T) {
		ocs1 := servers["ocs1.example"]
		tl, stop := load(4, 20*time.Millisecond, func(p *pgw, id string) ([]answer, error) {
			return p.session(diameter.AppGy, id, "operator.example", 3, 20*time.Millisecond)
		})
		time.Sleep(500 * time.Millisecond)
		if err := ocs1.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer ocs1.Signal(syscall.SIGCONT)
		// SUSPECT comes 2 × Tw after ocs1's last message, DOWN (which
		// closes the connection and would fail requests over too) Tw
		// later: the failover must be seen in between.
		c.WaitFor(t, "ocs1 SUSPECT and requests failed over", 20*time.Second, func() error {
			v := view(t, c)
			for _, p := range v.Peers {
				if p.Host == "ocs1.example" && p.State != "SUSPECT" {
					return fmt.Errorf("ocs1 %s", p.State)
				}
			}
			if g := group(v, "ocs"); g.FailedOver == 0 {
				return fmt.Errorf("ocs1 SUSPECT and nothing failed over: %+v", g)
			}
			return nil
		})
		stop()
		t.Logf("answers: %d ok, %d other, %d lost", tl.ok.Load(), tl.other.Load(), tl.lost.Load())
		if tl.lost.Load() != 0 || tl.other.Load() != 0 {
			t.Errorf("lost %d, other %d (%v): want every Gy request answered 2001", tl.lost.Load(), tl.other.Load(), tl.bad.Load())
		}
		if st := servers["ocs2.example"].get(t); len(st.Retransmitted) == 0 {
			t.Errorf("ocs2 saw no request with the T flag")
		}
		if g := group(view(t, c), "ocs"); g.FailedOver == 0 || g.TimedOut != 0 {
			t.Errorf("ocs group %+v: want some failed over, none timed out", g)
		}
	})

	t.Run("kill -9 a PCRF under load", func(t *testing.T) {
		c.Reload(t, "caddyfile", agentConfig(listen, addrs, 5000))
		var moved, back atomic.Int64
		tl, stop := load(8, 0, func(p *pgw, id string) ([]answer, error) {
			as, err := p.session(diameter.AppGx, id, "operator.example", 6, 20*time.Millisecond)
			for i := 1; i < len(as); i++ {
				switch prev, cur := as[i-1].origin, as[i].origin; {
				case prev == "pcrf1.example" && cur == "pcrf2.example":
					moved.Add(1)
				case prev != cur:
					back.Add(1)
				}
			}
			return as, err
		})
		// Kill it while sessions are under way and requests pending on it
		// (it answers after 50 ms).
		time.Sleep(time.Second)
		c.WaitFor(t, "requests pending on pcrf1", 10*time.Second, func() error {
			for _, p := range view(t, c).Peers {
				if p.Host == "pcrf1.example" && p.Outstanding < 3 {
					return fmt.Errorf("pcrf1 %s, %d outstanding", p.State, p.Outstanding)
				}
			}
			return nil
		})
		pcrf1 := servers["pcrf1.example"]
		if err := pcrf1.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		stop()
		t.Logf("answers: %d ok, %d refused, %d other, %d lost", tl.ok.Load(), tl.refused.Load(), tl.other.Load(), tl.lost.Load())
		if tl.lost.Load() != 0 || tl.other.Load() != 0 || tl.refused.Load() != 0 {
			t.Errorf("lost %d, other %d, refused %d (%v): want every request answered 2001", tl.lost.Load(), tl.other.Load(), tl.refused.Load(), tl.bad.Load())
		}
		if moved.Load() == 0 || back.Load() != 0 {
			t.Errorf("sessions moved from pcrf1 to pcrf2: %d, otherwise: %d; want some, and none", moved.Load(), back.Load())
		}
		st := servers["pcrf2.example"].get(t)
		if len(st.Retransmitted) == 0 {
			t.Errorf("pcrf2 saw no request with the T flag")
		}
		if g := group(view(t, c), "pcrf"); g.FailedOver == 0 {
			t.Errorf("the group counts no failover: %+v", g)
		}
	})
}
