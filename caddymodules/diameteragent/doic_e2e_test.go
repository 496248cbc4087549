package diameteragent_test

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/datatype"

	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// doicAgentConfig: Gx to pcrf1/pcrf2 (round robin, egress 200/s throttled
// by the load in loadFile: 70 % → 40 %), Gy to ocs1/ocs2 (least_loaded),
// DOIC on.
func doicAgentConfig(listen string, addrs map[string]string, loadFile string) string {
	return "{\n" + e2e.DiameterAgent{Listen: listen, Head: gxGy, Addrs: addrs,
		Peers: []string{"pcrf1.example", "pcrf2.example", "ocs1.example", "ocs2.example"},
		Body: fmt.Sprintf(`
					group pcrf {
						peers pcrf1.example pcrf2.example
						egress {
							rate 200 40
						}
						dynamic {
							source file %s
							interval 200ms
							threshold 60 40
							reversal 50
							reversal_hold 5s
						}
					}
					group ocs {
						peers ocs1.example ocs2.example
						policy least_loaded
					}
					route operator.example pcrf 16777238
					route operator.example ocs 4
					watchdog 6s
					doic
`, loadFile)}.Layer4() + "}"
}

// post sets the AVPs a testpeer server appends to its answers.
func (s *server) post(t *testing.T, avps []byte, valid time.Duration) {
	t.Helper()
	q := url.Values{"hex": {hex.EncodeToString(avps)}}
	if valid > 0 {
		q.Set("for", valid.String())
	}
	resp, err := http.Post("http://"+s.stats+"/_avps?"+q.Encode(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: POST /_avps: %s", s.host, resp.Status)
	}
}

// driver sends new Gx or Gy sessions' CCR-Is at a steady rate until
// stopped, counting what it sent and how it was answered. A DOIC driver
// advertises OC-Supported-Features (loss and peer reports) and, as a
// reacting node, applies the agent's PEER reports before sending.
type driver struct {
	p                 *pgw
	app               uint32
	doic              *doic.Table
	sent, withheld    atomic.Int64
	ok, refused, busy atomic.Int64
	withOLR           atomic.Int64
	lastOLR           atomic.Pointer[doic.OLR]
	stop              chan struct{}
	wg                sync.WaitGroup
}

func drive(p *pgw, app uint32, rate int, reacting bool) *driver {
	d := &driver{p: p, app: app, stop: make(chan struct{})}
	if reacting {
		d.doic = doic.NewTable(0)
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-d.stop:
				return
			case <-tick.C:
			}
			if d.doic != nil {
				if r := d.doic.Lookup(doic.PeerReport, []byte("dra.example"), time.Now()); r != nil && r.Throttle() {
					d.withheld.Add(1)
					continue
				}
			}
			var extra []*diam.AVP
			if d.doic != nil {
				extra = append(extra, diam.NewAVP(doic.CodeSupportedFeatures, 0, 0, &diam.GroupedAVP{AVP: []*diam.AVP{
					diam.NewAVP(doic.CodeFeatureVector, 0, 0, datatype.Unsigned64(doic.FeatureLoss|doic.FeaturePeerReport))}}))
			}
			m := p.ccr(app, ccrI, fmt.Sprintf("%s;%d;%d", p.host, time.Now().UnixNano(), i), "operator.example", extra...)
			d.sent.Add(1)
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				a, err := p.call(m)
				switch {
				case err != nil:
				case a.result == diam.Success:
					d.ok.Add(1)
				case a.result == 3004:
					d.busy.Add(1)
				default:
					d.refused.Add(1)
				}
				for _, b := range a.olrs {
					o, r := doic.ParseOLR(b)
					if r != doic.OK {
						continue
					}
					d.withOLR.Add(1)
					d.lastOLR.Store(&o)
					if d.doic != nil && o.Type == doic.PeerReport {
						d.doic.Apply(o.SourceID, o, time.Now())
					}
				}
			}()
		}
	}()
	return d
}

func (d *driver) halt() { close(d.stop); d.wg.Wait() }

// counts snapshots the requests each server has received.
func counts(t *testing.T, servers ...*server) []int {
	out := make([]int, len(servers))
	for i, s := range servers {
		out[i] = s.get(t).Requests
	}
	return out
}

// share measures, over window, the part of the requests sent in it that
// reached s among all servers.
func share(t *testing.T, window time.Duration, s *server, all ...*server) (got float64, total int) {
	t.Helper()
	before := counts(t, all...)
	mine := s.get(t).Requests
	time.Sleep(window)
	after := counts(t, all...)
	for i := range all {
		total += after[i] - before[i]
	}
	return float64(s.get(t).Requests-mine) / float64(max(total, 1)), total
}

// TestDOICThroughCaddy: bin/caddy as a DOIC reacting and reporting node
// between go-diameter pGWs and testpeer servers.
func TestDOICThroughCaddy(t *testing.T) {
	servers := map[string]*server{}
	addrs := map[string]string{}
	for _, h := range []string{"pcrf1.example", "pcrf2.example", "ocs1.example", "ocs2.example"} {
		servers[h], addrs[h] = startServer(t, h, "operator.example", 0)
	}
	pcrf1, pcrf2, ocs1, ocs2 := servers["pcrf1.example"], servers["pcrf2.example"], servers["ocs1.example"], servers["ocs2.example"]
	loadFile := filepath.Join(t.TempDir(), "load")
	setLoad := func(pct int) {
		if err := os.WriteFile(loadFile, []byte(fmt.Sprint(pct)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setLoad(10)
	listen := e2e.Addr(t)
	c := startAgent(t, listen, doicAgentConfig(listen, addrs, loadFile))
	pgw1 := dialPGW(t, listen, "pgw1.example")
	const window = 3 * time.Second

	t.Run("a PCRF's 50 % host report, sequence and expiry", func(t *testing.T) {
		d := drive(pgw1, diameter.AppGx, 150, false)
		defer d.halt()
		if got, n := share(t, time.Second, pcrf1, pcrf1, pcrf2); got < 0.45 || got > 0.55 {
			t.Fatalf("before any report: pcrf1 got %.3f of %d", got, n)
		}
		// Valid 10 s; the server stops sending it after 10 s as well.
		pcrf1.post(t, doic.EncodeOLR(doic.HostReport, 10, 50, 10*time.Second, ""), 10*time.Second)
		posted := time.Now()
		time.Sleep(time.Second)
		// 50 % of its share of a half: a quarter; the rest to pcrf2.
		if got, n := share(t, window, pcrf1, pcrf1, pcrf2); got < 0.25*0.9 || got > 0.25*1.1 {
			t.Fatalf("under the 50 %% report: pcrf1 got %.3f of %d, want 0.25 ± 10 %%", got, n)
		}
		if v := view(t, c).DOIC; v == nil || len(v.Reports) != 1 || v.Reports[0].Reduction != 50 {
			t.Fatalf("view: %+v", v)
		}
		// A lower sequence number is ignored.
		pcrf1.post(t, doic.EncodeOLR(doic.HostReport, 9, 90, 10*time.Second, ""), time.Until(posted.Add(10*time.Second)))
		time.Sleep(500 * time.Millisecond)
		if got, n := share(t, time.Second, pcrf1, pcrf1, pcrf2); got < 0.25*0.9 || got > 0.25*1.1 {
			t.Fatalf("after a lower sequence number: pcrf1 got %.3f of %d, want 0.25 ± 10 %%", got, n)
		}
		if v := view(t, c).DOIC; v.Ignored["stale"] == 0 {
			t.Fatalf("stale report not counted: %+v", v.Ignored)
		}
		// A higher one replaces it: 80 % (a tenth), valid until the first
		// one would have expired.
		rest := time.Until(posted.Add(10 * time.Second)).Truncate(time.Second)
		pcrf1.post(t, doic.EncodeOLR(doic.HostReport, 11, 80, rest, ""), rest)
		time.Sleep(500 * time.Millisecond)
		if got, n := share(t, time.Second, pcrf1, pcrf1, pcrf2); got < 0.1*0.8 || got > 0.1*1.2 {
			t.Fatalf("after a higher sequence number (80 %%): pcrf1 got %.3f of %d, want 0.10 ± 20 %%", got, n)
		}
		// Expired: its share again within a second.
		time.Sleep(time.Until(posted.Add(11 * time.Second)))
		if got, n := share(t, window, pcrf1, pcrf1, pcrf2); got < 0.45 || got > 0.55 {
			t.Fatalf("after expiry: pcrf1 got %.3f of %d, want 0.5 ± 10 %%", got, n)
		}
		if v := view(t, c).DOIC; len(v.Reports) != 0 || v.ReportsReceived == 0 {
			t.Fatalf("view after expiry: %+v", v)
		}
	})

	t.Run("bad DOIC input is counted and the connection stays up", func(t *testing.T) {
		before := view(t, c).DOIC.Ignored
		conns := pcrf2.get(t).Connections
		bad := append(append(doic.EncodeOLR(doic.HostReport, 1, 101, time.Second, ""), doic.EncodeOLR(doic.HostReport, 1, 50, 86401*time.Second, "")...),
			0, 0, 2, 0x6f, 0, 0, 0, 20, 0, 0, 2, 0x70, 0, 0, 0, 40, 0, 0, 0, 0) // an OC-OLR whose inner AVP overruns it
		pcrf2.post(t, bad, 0)
		defer pcrf2.post(t, nil, 0)
		for i := range 20 {
			if a, err := pgw1.call(pgw1.ccr(diameter.AppGx, ccrI, fmt.Sprint("bad;", i), "operator.example")); err != nil || a.result != diam.Success {
				t.Fatalf("request %d: %+v %v", i, a, err)
			}
		}
		v := view(t, c)
		for _, r := range []string{"reduction_over_100", "validity_over_86400", "malformed"} {
			if v.DOIC.Ignored[r]-before[r] != 10 {
				t.Errorf("%s: %d counted, want 10", r, v.DOIC.Ignored[r]-before[r])
			}
		}
		if len(v.DOIC.Reports) != 0 || v.Peers[1].State != "OKAY" || pcrf2.get(t).Connections != conns {
			t.Errorf("reports %+v, pcrf2 %s, connections %d → %d", v.DOIC.Reports, v.Peers[1].State, conns, pcrf2.get(t).Connections)
		}
		if m, ok := c.Metric(t, `caddy_edgesteer_diameter_agent_doic_ignored_total{agent="dra",reason="reduction_over_100"}`); !ok || m < 10 {
			t.Errorf("metric: %v %v", m, ok)
		}
	})

	t.Run("the agent's 40 % throttle as a PEER report", func(t *testing.T) {
		setLoad(70)
		c.WaitFor(t, "throttle 40", 10*time.Second, func() error {
			if g := group(view(t, c), "pcrf"); g.Dynamic == nil || g.Dynamic.ThrottlePercent != 40 {
				return fmt.Errorf("%+v", g.Dynamic)
			}
			return nil
		})
		// Offered 180/s against 200/s less 40 %: 120/s admitted.
		pgwD := dialPGW(t, listen, "pgw-doic.example")
		d := drive(pgwD, diameter.AppGx, 180, true)
		time.Sleep(time.Second) // the first answer brings the report
		s0, r0, w0 := d.sent.Load(), d.refused.Load(), d.withheld.Load()
		time.Sleep(window)
		d.halt()
		sent, refused, withheld := d.sent.Load()-s0, d.refused.Load()-r0, d.withheld.Load()-w0
		o := d.lastOLR.Load()
		if o == nil || o.Type != doic.PeerReport || o.Reduction != 40 || string(o.SourceID) != "dra.example" || o.Validity != 5*time.Second {
			t.Fatalf("the DOIC pGW's last OC-OLR: %+v", o)
		}
		frac := float64(withheld) / float64(sent+withheld)
		if frac < 0.38 || frac > 0.42 || float64(refused) > 0.02*float64(sent) {
			t.Fatalf("DOIC pGW: sent %d, withheld %d (%.3f, want 0.40), refused %d (want ≤ 2 %%)", sent, withheld, frac, refused)
		}
		t.Logf("DOIC pGW: sent %d, withheld %d, refused %d", sent, withheld, refused)
		// A pGW without DOIC: refusals as before, and no OC-OLR.
		d = drive(pgw1, diameter.AppGx, 180, false)
		time.Sleep(500 * time.Millisecond)
		s0, r0 = d.sent.Load(), d.refused.Load()
		time.Sleep(window)
		d.halt()
		sent, refused = d.sent.Load()-s0, d.refused.Load()-r0
		// The throttle admits 120/s: what the pGW got through is that, or
		// all it sent when a busy host let it send less (it sent 143/s of
		// its 180/s once in a cold make test).
		secs := window.Seconds()
		offered, admitted := float64(sent)/secs, float64(sent-refused)/secs
		if admitted > 1.1*120 || admitted < 0.85*min(offered, 120) || (offered > 1.1*120 && refused == 0) || d.withOLR.Load() != 0 {
			t.Fatalf("pGW without DOIC: sent %.0f/s, refused %d of %d: admitted %.0f/s, want 120/s or all it sent below that; answers with an OC-OLR %d",
				offered, refused, sent, admitted, d.withOLR.Load())
		}
		if v := view(t, c); v.DOIC.ReportsSent == 0 || group(v, "pcrf").Report == nil || group(v, "pcrf").Report.Reduction != 40 {
			t.Fatalf("view: sent %d, group report %+v", v.DOIC.ReportsSent, group(v, "pcrf").Report)
		}
		setLoad(10)
	})

	t.Run("Load 10000 vs 60000 moves new sessions", func(t *testing.T) {
		ocs1.post(t, doic.EncodeLoad(doic.LoadHost, 10000, "ocs1.example"), 0)
		ocs2.post(t, doic.EncodeLoad(doic.LoadHost, 60000, "ocs2.example"), 0)
		for i := range 4 { // each reports
			pgw1.call(pgw1.ccr(diameter.AppGy, ccrI, fmt.Sprint("load;", i), "operator.example"))
		}
		c.WaitFor(t, "both loads", 5*time.Second, func() error {
			for _, p := range view(t, c).Peers[2:] {
				if p.Load == nil {
					return fmt.Errorf("%s: no load", p.Host)
				}
			}
			return nil
		})
		d := drive(pgw1, diameter.AppGy, 200, false)
		got, n := share(t, window, ocs1, ocs1, ocs2)
		d.halt()
		want := 55536.0 / (55536 + 5536)
		if got < want-0.03 || got > want+0.03 {
			t.Fatalf("ocs1 (load 10000) got %.3f of %d new sessions, want %.3f ± 0.03", got, n, want)
		}
		t.Logf("ocs1 (load 10000) %.3f of %d, ocs2 (60000) the rest", got, n)
	})
}
