package tenantroute_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-ldap/ldap/v3"

	"github.com/edgesteer/edgesteer/internal/e2e"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// skewScale is one size of the end-to-end skew run.
type skewScale struct {
	nodes, tenants, conns, wave int
	target                      int // auto's target_per_node
}

// skewOutcome is one placement mode's end state, as slapd saw it.
type skewOutcome struct {
	mode                    string
	maxMean                 float64 // connections per node: max / mean
	tenantsMean, tenantsMax float64 // distinct tenants per node
	topK                    int     // the hottest tenant's k (admin view)
	topShare                float64 // its share of its busiest node
	topNodes                int     // nodes its connections reached
	grown                   int     // tenants above k = 2
}

// The skew simulation (internal/placement TestSkewSimulation) end to end,
// at smaller scale: real slapd
// nodes, bin/caddy, go-ldap clients arriving in concurrent waves (each a
// burst of simultaneous dials and binds), tenants drawn from Zipf(1.1).
// The same sequence runs under fixed k = 2, fixed k = N and auto
// partitions, each on a fresh handler state (a reload with another name).
// Where each connection landed is what slapd answered. CI size: 6 nodes,
// 30 tenants, 240 connections; TENANT_SKEW_FULL=1: 8 nodes, 200 tenants,
// 1,600 connections. Assertions are tolerant (the numbers go to
// BENCHMARKS.md): auto concentrates the hottest tenant less than fixed
// k = 2 and keeps fewer tenants per node than k = N.
func TestSkewThroughRouter(t *testing.T) {
	e2e.SkipShort(t)
	sc := skewScale{nodes: 6, tenants: 30, conns: 240, wave: 40, target: 10}
	full := os.Getenv("TENANT_SKEW_FULL") != ""
	if full {
		sc = skewScale{nodes: 8, tenants: 200, conns: 1600, wave: 100, target: 25}
	}
	names := make([]string, sc.tenants)
	for i := range names {
		names[i] = fmt.Sprint("t", i)
	}
	addrs, _ := startNodes(t, sc.nodes, func(node string) string { return ldifWith(node, names) })
	r := rand.New(rand.NewPCG(17, 1))
	zipf := rand.NewZipf(r, 1.1, 1, uint64(sc.tenants-1))
	seq := make([]string, sc.conns)
	for i := range seq {
		seq[i] = names[zipf.Uint64()]
	}
	front := e2e.Addr(t)
	modes := []struct{ name, partitions, extra string }{
		{"fixed k=2", "2", ""},
		{fmt.Sprintf("fixed k=%d (N)", sc.nodes), fmt.Sprint(sc.nodes), ""},
		{fmt.Sprintf("auto, target_per_node %d", sc.target), "2", fmt.Sprintf("auto_partitions {\n target_per_node %d\n cool_down 5m\n}", sc.target)},
		{"auto, share_factor 1", "2", "auto_partitions {\n share_factor 1\n cool_down 5m\n}"},
	}
	var c *e2e.Caddy
	var out []skewOutcome
	for i, m := range modes {
		cfg := skewConfig(front, addrs, fmt.Sprint("skew", i), m.partitions, m.extra)
		if c == nil {
			c = e2e.StartCaddy(t, "caddyfile", cfg)
			c.WaitTCP(t, front)
		} else {
			c.Reload(t, "caddyfile", cfg)
			waitView(t, c, "the new handler", func(v viewT) bool { return v.Name == fmt.Sprint("skew", i) })
		}
		o := skewRun(t, c, front, addrs, seq, sc.wave)
		o.mode = m.name
		out = append(out, o)
	}
	t.Logf("%d slapd nodes, %d tenants, %d connections in concurrent waves of %d", sc.nodes, sc.tenants, sc.conns, sc.wave)
	t.Logf("| placement | per-node max/mean | distinct tenants per node (mean / max) | hottest tenant's k | nodes its connections reached | its share of its busiest node | tenants grown |")
	t.Logf("|---|---|---|---|---|---|---|")
	for _, o := range out {
		t.Logf("| %s | %.2f | %.1f / %.0f | %d | %d | %.0f %% | %d |", o.mode, o.maxMean, o.tenantsMean, o.tenantsMax, o.topK, o.topNodes,
			100*o.topShare, o.grown)
	}
	fixed2, fixedN := out[0], out[1]
	if auto := out[2]; auto.topK <= 2 || auto.topNodes <= 2 || fixed2.topNodes > 2 {
		t.Errorf("%s: the hottest tenant at k = %d reached %d nodes (fixed k=2: %d)", auto.mode, auto.topK, auto.topNodes, fixed2.topNodes)
	}
	// Both auto modes keep fewer tenants per node than k = N; the target
	// keeps the spread. The share trigger grows only tenants whose
	// connections per node exceed the router's mean. In this mix only the
	// hottest tenant comes near (70 of 240 connections, 29 %, against 33 %
	// at k = 2 of 6), and only while the router is cold: among the first
	// few connections (from 6 on, README rule) it may hold 3 of 7. Whether
	// it does depends on whether binds of the first wave are answered while
	// the wave still arrives (a busy host): replayed in process with
	// shuffled orders, answers one bind behind grew it in 98 of 200, all
	// binds before any answer in 0. So share_factor 1 grows at most the
	// hottest tenant, by at most two steps.
	for _, auto := range out[2:] {
		if auto.tenantsMean >= fixedN.tenantsMean {
			t.Errorf("%s: %.1f tenants per node, k=N %.1f", auto.mode, auto.tenantsMean, fixedN.tenantsMean)
		}
	}
	if auto := out[2]; auto.maxMean > 1.5 {
		t.Errorf("%s: per-node max/mean %.2f", auto.mode, auto.maxMean)
	}
	if full {
		return
	}
	// The CI size's figures that BENCHMARKS.md quotes, each within the
	// band stated there (wide enough for the order in which a wave's
	// binds reach the router, which varies between runs).
	auto, share := out[2], out[3]
	for _, c := range []struct {
		what   string
		got    float64
		lo, hi float64
	}{
		{"fixed k=N: per-node max/mean", fixedN.maxMean, 1, 1.10},
		{"auto target: per-node max/mean", auto.maxMean, 1, 1.10},
		{"auto target: the hottest tenant's k", float64(auto.topK), 5, 6},
		{"auto target: nodes its connections reached", float64(auto.topNodes), 4, 6},
		{"auto target: tenants per node ÷ k=N's", auto.tenantsMean / fixedN.tenantsMean, 0.55, 0.92},
		{"share_factor 1: tenants grown", float64(share.grown), 0, 1},
		{"share_factor 1: the hottest tenant's k", float64(share.topK), 2, 4},
	} {
		if c.got < c.lo || c.got > c.hi {
			t.Errorf("%s = %.3g, want %g–%g (BENCHMARKS.md)", c.what, c.got, c.lo, c.hi)
		}
	}
	if share.grown > 0 && share.topK == 2 {
		t.Errorf("share_factor 1 grew %d tenants, not the hottest", share.grown)
	}
}

func skewConfig(front string, nodes []string, name, partitions, extra string) string {
	return bindRoute(front, fmt.Sprintf("name %s\nnodes %s\npartitions %s\n%s", name, strings.Join(nodes, " "), partitions, extra))
}

// skewRun opens seq's connections in concurrent waves, records which node
// (slapd marker) answered each, reads the hottest tenant's k, and closes
// them all.
func skewRun(t *testing.T, c *e2e.Caddy, front string, addrs, seq []string, wave int) skewOutcome {
	t.Helper()
	type landed struct{ tenant, node string }
	got := make([]landed, len(seq))
	conns := make([]*ldap.Conn, len(seq))
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	for start := 0; start < len(seq); start += wave {
		end := min(start+wave, len(seq))
		for i := start; i < end; i++ { // dial the wave first, then bind all at once
			conn, err := ldap.DialURL("ldap://" + front)
			if err != nil {
				t.Fatal(err)
			}
			conns[i] = conn
		}
		begin := make(chan struct{})
		var wg sync.WaitGroup
		for i := start; i < end; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-begin
				tenant := seq[i]
				if err := conns[i].Bind("uid=alice,o="+tenant+",dc=example", "pw-"+tenant); err != nil {
					t.Errorf("bind %s: %v", tenant, err)
					return
				}
				node, err := searchOn(conns[i])
				if err != nil {
					t.Errorf("search %s: %v", tenant, err)
					return
				}
				got[i] = landed{tenant, node}
			}()
		}
		close(begin)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	perNode, tenantsOn := map[string]int{}, map[string]map[string]bool{}
	perTenant := map[string]int{}
	for _, l := range got {
		perNode[l.node]++
		perTenant[l.tenant]++
		if tenantsOn[l.node] == nil {
			tenantsOn[l.node] = map[string]bool{}
		}
		tenantsOn[l.node][l.tenant] = true
	}
	hottest := ""
	for tenant, n := range perTenant {
		if hottest == "" || n > perTenant[hottest] || n == perTenant[hottest] && tenant < hottest {
			hottest = tenant
		}
	}
	topOn := map[string]int{}
	for _, l := range got {
		if l.tenant == hottest {
			topOn[l.node]++
		}
	}
	var o skewOutcome
	most := 0
	for i := range addrs {
		node := fmt.Sprintf("node-%d", i+1)
		most = max(most, perNode[node])
		o.tenantsMean += float64(len(tenantsOn[node])) / float64(len(addrs))
		o.tenantsMax = max(o.tenantsMax, float64(len(tenantsOn[node])))
		if topOn[node] > 0 {
			o.topNodes++
		}
		if perNode[node] > 0 {
			o.topShare = max(o.topShare, float64(topOn[node])/float64(perNode[node]))
		}
	}
	o.maxMean = float64(most) / (float64(len(seq)) / float64(len(addrs)))
	v := adminView(t, c)
	o.topK = v.Tenants[hottest].Partitions
	for _, at := range v.Tenants {
		if at.Partitions > 2 && v.AutoPartitions != nil {
			o.grown++
		}
	}
	// Every connection is on one of its tenant's nodes now (auto may have
	// grown a tenant after some of its connections arrived: they stay).
	for _, l := range got {
		idx := slices.IndexFunc(addrs, func(a string) bool { return fmt.Sprintf("node-%d", slices.Index(addrs, a)+1) == l.node })
		if !slices.Contains(placement.Rank(l.tenant, addrs)[:v.Tenants[l.tenant].Partitions], addrs[idx]) {
			t.Fatalf("a connection of %s on %s, outside its %d nodes", l.tenant, l.node, v.Tenants[l.tenant].Partitions)
		}
	}
	return o
}
