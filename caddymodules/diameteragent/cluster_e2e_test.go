package diameteragent_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/diambind"
	"github.com/edgesteer/edgesteer/internal/diameter"
	"github.com/edgesteer/edgesteer/internal/doic"
	"github.com/edgesteer/edgesteer/internal/e2e"
)

// replicaConfig is one replica of agent dra (its own origin_host, the
// name shared) in front of two PCRFs, its bindings in Redis at redisAddr.
func replicaConfig(listen, origin, redisAddr string, addrs map[string]string) string {
	dra := e2e.DiameterAgent{Listen: listen, Origin: origin, Addrs: addrs,
		Head: `
					vendor_id 10415
					application 16777238 vendor 10415
`,
		Peers: []string{"pcrf1.example", "pcrf2.example"},
		Body: `
					group pcrf {
						peers pcrf1.example pcrf2.example
					}
					route operator.example pcrf
					watchdog 6s
					reconnect 200ms 1s
					binding_store redis main
					doic
`}
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
	}
%s}
`, redisAddr, dra.Layer4())
}

func storeOf(t *testing.T, c *e2e.Caddy) diambind.View {
	t.Helper()
	bs := view(t, c).BindingStore
	if bs == nil {
		t.Fatal("no binding_store in the admin view")
	}
	return *bs
}

// TestBindingsSharedByReplicas: two bin/caddy replicas of one agent share
// its Session-Id bindings through a real redis-server, in phases on one
// set-up: a session opened through one replica and continued through the
// other stays on its server; with Redis stopped, bindings stay local and
// that is counted (view, metric, one log line); once Redis is back, the
// bindings made meanwhile are written, and the other replica continues
// those sessions on their servers; a Redis that hangs (SIGSTOP) costs a
// local miss at most the timeout until it is marked down, then nothing;
// a PCRF's overload report read by one replica throttles at the other
// within the README's bound.
func TestBindingsSharedByReplicas(t *testing.T) {
	rp, redisAddr := e2e.StartRedis(t)
	top := t // Redis restarted in a phase lives for the whole test
	redisDir := t.TempDir()
	addrs := map[string]string{}
	servers := map[string]*server{}
	for _, h := range []string{"pcrf1.example", "pcrf2.example"} {
		servers[h], addrs[h] = startServer(t, h, "operator.example", 0)
	}
	var replicas [2]*e2e.Caddy
	var pgws [2]*pgw
	for i, origin := range []string{"dra-a.example", "dra-b.example"} {
		listen := e2e.Addr(t)
		c := startAgent(t, listen, replicaConfig(listen, origin, redisAddr, addrs))
		replicas[i], pgws[i] = c, dialPGW(t, listen, fmt.Sprintf("pgw%d.example", i+1))
	}
	a, b := replicas[0], replicas[1]
	pa, pb := pgws[0], pgws[1]
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	call := func(p *pgw, typ uint32, sid string) string {
		t.Helper()
		ans, err := p.call(p.ccr(diameter.AppGx, typ, sid, "operator.example"))
		if err != nil || ans.result != 2001 {
			t.Fatalf("%s session %s CC-Request-Type %d: %+v %v", p.host, sid, typ, ans, err)
		}
		return ans.origin
	}
	// open opens sessions through p (CCR-I, CCR-U) and returns their
	// servers: round robin sends them to each PCRF in turn.
	open := func(p *pgw, prefix string, n int) (sids []string, first map[string]string) {
		first = map[string]string{}
		for i := range n {
			sid := fmt.Sprintf("%s;%d", prefix, i)
			sids, first[sid] = append(sids, sid), call(p, ccrI, sid)
			if got := call(p, ccrU, sid); got != first[sid] {
				t.Fatalf("session %s: CCR-U through the same replica to %s, its CCR-I to %s", sid, got, first[sid])
			}
		}
		return sids, first
	}
	// continueThrough sends CCR-Us of the sessions, in order, through p,
	// whose round robin is first set so that, left to itself, it would
	// send each to the other PCRF than its CCR-I went to.
	continueThrough := func(p *pgw, sids []string, first map[string]string) {
		t.Helper()
		if picked := call(p, ccrI, sids[0]+";turn"); picked != first[sids[0]] {
			call(p, ccrI, sids[0]+";turn2") // its next pick would be first[sids[0]]
		}
		for _, sid := range sids {
			for range 2 {
				if got := call(p, ccrU, sid); got != first[sid] {
					t.Fatalf("session %s continued through %s went to %s, its CCR-I to %s", sid, p.host, got, first[sid])
				}
			}
		}
	}
	const n = 8

	t.Run("a session opened through one replica stays on its server through the other", func(t *testing.T) {
		sids, first := open(pa, "pgw1;sunny", n)
		a.WaitFor(t, "the bindings in Redis", 5*time.Second, func() error {
			if q := storeOf(t, a).Queued; q != 0 {
				return fmt.Errorf("%d queued", q)
			}
			return nil
		})
		before := storeOf(t, b).Counts.Lookups
		continueThrough(pb, sids, first)
		if c := storeOf(t, b).Counts; c.Lookups-before != n || c.Found < n {
			t.Fatalf("B's store counts %+v: want one lookup per session (%d), then local hits", c, n)
		}
		for sid, want := range first {
			key := "edgesteer:diameter_agent:dra:" + sid
			if got, err := rdb.Get(context.Background(), key).Result(); err != nil || got != want {
				t.Fatalf("Redis %s = %q %v, want %s", key, got, err, want)
			}
			call(pb, ccrT, sid)
			b.WaitFor(t, "the ended binding deleted", 5*time.Second, func() error {
				if n, _ := rdb.Exists(context.Background(), key).Result(); n != 0 {
					return fmt.Errorf("%s still there", key)
				}
				return nil
			})
		}
	})

	var outageSids []string
	var outage map[string]string
	t.Run("with Redis stopped, bindings stay local and that is counted", func(t *testing.T) {
		rp.Stop()
		// Sessions opened before the store is marked down (their writes
		// fail and wait) and after (queued at once).
		early, earlyFirst := open(pa, "pgw1;early", 2)
		a.WaitFor(t, "the store marked down", 10*time.Second, func() error {
			if v := storeOf(t, a); v.Healthy {
				return fmt.Errorf("healthy, %d errors", v.Counts.Errors)
			}
			return nil
		})
		outageSids, outage = open(pa, "pgw1;outage", n)
		outageSids = append(early, outageSids...)
		maps.Copy(outage, earlyFirst)
		for _, sid := range outageSids { // local hits
			if got := call(pa, ccrU, sid); got != outage[sid] {
				t.Fatalf("with Redis stopped, session %s moved from %s to %s", sid, outage[sid], got)
			}
		}
		v := storeOf(t, a)
		if v.Counts.Downs != 1 || v.Queued < n+2 || v.LastReason == "" || v.DownSince.IsZero() {
			t.Fatalf("A's binding_store while Redis is stopped: %+v", v)
		}
		if up, ok := a.Metric(t, `caddy_edgesteer_diameter_agent_binding_store_up{agent="dra",store="redis main"}`); !ok || up != 0 {
			t.Fatalf("binding_store_up %v %v, want 0", up, ok)
		}
		if q, _ := a.Metric(t, `caddy_edgesteer_diameter_agent_binding_store_queued{agent="dra"`); q < n+2 {
			t.Fatalf("binding_store_queued %v, want at least %d", q, n)
		}
		if k := strings.Count(a.Logs(), "binding store down"); k != 1 {
			t.Fatalf("%d log lines for one outage, want 1", k)
		}
	})

	t.Run("after Redis returns, the bindings made meanwhile are reconciled", func(t *testing.T) {
		rp = e2e.StartRedisAt(top, redisDir, redisAddr)
		a.WaitFor(t, "the queue written", 10*time.Second, func() error {
			if v := storeOf(t, a); !v.Healthy || v.Queued != 0 {
				return fmt.Errorf("healthy %v, %d queued", v.Healthy, v.Queued)
			}
			return nil
		})
		if c := storeOf(t, a).Counts; c.Reconciled < n+2 {
			t.Fatalf("reconciled %d, want at least %d", c.Reconciled, n+2)
		}
		if k := strings.Count(a.Logs(), "binding store back"); k != 1 {
			t.Fatalf("%d log lines for one return, want 1", k)
		}
		b.WaitFor(t, "B's store in use", 10*time.Second, func() error {
			if !storeOf(t, b).Healthy {
				return fmt.Errorf("down")
			}
			return nil
		})
		continueThrough(pb, outageSids, outage)
	})

	t.Run("a hanging Redis delays a local miss at most the timeout, then is marked down", func(t *testing.T) {
		if err := rp.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer rp.Signal(syscall.SIGCONT)
		before := storeOf(t, b).Counts
		// Continuing requests of sessions B does not know: each reads
		// Redis, gives up at binding_store's timeout and is routed.
		for i := 0; storeOf(t, b).Healthy; i++ {
			if i == 200 {
				t.Fatal("B's store still healthy after 200 reads without an answer")
			}
			call(pb, ccrU, fmt.Sprintf("pgw2;hang;%d", i))
			time.Sleep(20 * time.Millisecond)
		}
		v := storeOf(t, b)
		if v.LastReason != "timeout" || v.Counts.Downs != before.Downs+1 {
			t.Fatalf("B's binding_store with Redis stopped by SIGSTOP: %+v", v)
		}
		for i := range 5 { // no read any more
			call(pb, ccrU, fmt.Sprintf("pgw2;hang;after;%d", i))
		}
		if c := storeOf(t, b).Counts; c.Skipped-v.Counts.Skipped != 5 || c.Lookups-v.Counts.Lookups != 5 {
			t.Fatalf("B's counts after the store was marked down: %+v, before %+v", c, v.Counts)
		}
		rp.Signal(syscall.SIGCONT)
		b.WaitFor(t, "B's store back", 10*time.Second, func() error {
			if v := storeOf(t, b); !v.Healthy || v.Queued != 0 {
				return fmt.Errorf("healthy %v, %d queued", v.Healthy, v.Queued)
			}
			return nil
		})
	})

	t.Run("an overload report read by one replica throttles at the other", func(t *testing.T) {
		for _, c := range []*e2e.Caddy{a, b} {
			c.WaitFor(t, "the report store in use", 10*time.Second, func() error {
				if s := view(t, c).DOIC.Store; s == nil || !s.Healthy {
					return fmt.Errorf("report store %+v", s)
				}
				return nil
			})
		}
		const seq = 1_800_000_000_123
		servers["pcrf1.example"].post(t, doic.EncodeOLR(doic.HostReport, seq, 100, 30*time.Second, ""), 0)
		// New sessions through A until pcrf1 answers one: that answer
		// carries the report, which A takes and writes.
		for i := 0; ; i++ {
			if i == 4 {
				t.Fatal("pcrf1 answered none of 4 new sessions through A")
			}
			if call(pa, ccrI, fmt.Sprintf("pgw1;olr;%d", i)) == "pcrf1.example" {
				break
			}
		}
		taken := time.Now()
		// The README's bound is the read interval (1 s) after A's write;
		// the wait allows 3 s for a busy host, and the figure is logged.
		b.WaitFor(t, "B holding A's report", 3*time.Second, func() error {
			for _, r := range view(t, b).DOIC.Reports {
				if r.Name == "pcrf1.example" && r.Sequence == seq && r.Reduction == 100 {
					return nil
				}
			}
			return fmt.Errorf("reports %+v", view(t, b).DOIC.Reports)
		})
		t.Logf("A's report in force at B %v after A's answer", time.Since(taken).Round(time.Millisecond))
		for i := range 10 { // B sends no new session to pcrf1 under its 100 % report
			if got := call(pb, ccrI, fmt.Sprintf("pgw2;olr;%d", i)); got == "pcrf1.example" {
				t.Fatalf("session %d through B went to pcrf1 under A's 100 %% report", i)
			}
		}
		if v := view(t, b).DOIC; v.ReportsReceived != 0 || v.Store.Counts.Merged == 0 {
			t.Fatalf("B's DOIC view: received %d, store %+v; want the report merged from the store only", v.ReportsReceived, v.Store)
		}
	})
}
