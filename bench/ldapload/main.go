// Command ldapload measures LDAP through the tenant router, with go-ldap.
//
//	ldapload -latency -direct 127.0.0.1:3891 -routed 127.0.0.1:3389 -n 2000
//	    interleaved connect+bind+search+close samples against both; prints
//	    p50 and p99 of each and their differences
//	ldapload -cpu -routed 127.0.0.1:3389 -anchor 127.0.0.1:3390 -pid <caddy pid> -n 20000
//	    bind+search on an open connection through the router and through
//	    the plain proxy, in alternating blocks; prints the CPU time the
//	    process (both hops run in it) spent per operation on each, and
//	    their ratio (median over the blocks)
//	ldapload -hold 10000 -routed 127.0.0.1:3389 -pid <caddy pid>
//	    opens and binds 10000 routed connections, then prints the router's
//	    resident memory per connection (VmRSS before and after)
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-ldap/ldap/v3"
)

// options are the command line's.
type options struct {
	direct, routed, anchor string
	n, block, pid          int
	dn, pw                 string
	linger                 time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.direct, "direct", "", "a node, directly")
	flag.StringVar(&o.routed, "routed", "", "the router")
	flag.StringVar(&o.anchor, "anchor", "", "with -latency: a plain caddy-l4 proxy to the same node (the anchor hop)")
	flag.IntVar(&o.n, "n", 2000, "samples per target")
	latency := flag.Bool("latency", false, "measure bind+search latency")
	cpu := flag.Bool("cpu", false, "measure the CPU time -pid spends per bind+search, routed and anchor")
	flag.IntVar(&o.block, "block", 500, "with -cpu: operations per block")
	hold := flag.Int("hold", 0, "connections to hold open through the router")
	flag.IntVar(&o.pid, "pid", 0, "the router's process ID, for its memory")
	tenant := flag.String("tenant", "acme", "tenant to bind as")
	flag.DurationVar(&o.linger, "linger", 0, "with -hold: keep the connections open this much longer after measuring (for profiling)")
	flag.Parse()
	o.dn, o.pw = fmt.Sprintf("uid=alice,o=%s,dc=example", *tenant), "pw-"+*tenant
	switch {
	case *latency:
		measureLatency(o)
	case *cpu:
		measureCPU(o)
	case *hold > 0:
		holdConnections(o, *hold)
	default:
		flag.Usage()
	}
}

// measureLatency samples bind+search on an open connection, what a
// directory client does on its persistent connection, then
// connect+bind+search+close, against each target in turns.
func measureLatency(o options) {
	dc, rc := dial(o.direct, o.dn, o.pw), dial(o.routed, o.dn, o.pw)
	var open, fresh func() time.Duration // the anchor's; nil without one
	if o.anchor != "" {
		ac := dial(o.anchor, o.dn, o.pw)
		open = func() time.Duration { return bindSearch(ac, o.dn, o.pw) }
		fresh = func() time.Duration { return sample(o.anchor, o.dn, o.pw) }
	}
	d, r, a := turns(o.n, func() time.Duration { return bindSearch(dc, o.dn, o.pw) },
		func() time.Duration { return bindSearch(rc, o.dn, o.pw) }, open)
	report("bind+search on an open connection", d, r, a)
	d, r, a = turns(o.n, func() time.Duration { return sample(o.direct, o.dn, o.pw) },
		func() time.Duration { return sample(o.routed, o.dn, o.pw) }, fresh)
	report("connect+bind+search+close", d, r, a)
}

// turns takes n samples of each target, one of each per turn, the order
// rotating from one turn to the next: no target always follows the same
// one. anchor is nil without an anchor.
func turns(n int, direct, routed, anchor func() time.Duration) (d, r, a []time.Duration) {
	takes := []func(){
		func() { d = append(d, direct()) },
		func() { r = append(r, routed()) },
	}
	if anchor != nil {
		takes = append(takes, func() { a = append(a, anchor()) })
	}
	for i := 0; i < n; i++ {
		for j := range takes {
			takes[(i+j)%len(takes)]()
		}
	}
	return d, r, a
}

// quantile is v's q-quantile; it sorts v.
func quantile(v []time.Duration, q float64) time.Duration {
	slices.Sort(v)
	return v[int(q*float64(len(v)-1))]
}

// report prints p50 and p99 of the direct (d), routed (r) and anchor (a)
// samples and what the router and the anchor add to the direct path.
func report(what string, d, r, a []time.Duration) {
	p := quantile
	fmt.Printf("%s: direct p50 %v p99 %v; routed p50 %v p99 %v; added p50 %v p99 %v\n", what,
		p(d, .5), p(d, .99), p(r, .5), p(r, .99), p(r, .5)-p(d, .5), p(r, .99)-p(d, .99))
	if len(a) == 0 {
		return
	}
	fmt.Printf("%s: plain layer4 proxy p50 %v p99 %v, added p50 %v p99 %v; router/proxy added p50 %.2fx\n", what,
		p(a, .5), p(a, .99), p(a, .5)-p(d, .5), p(a, .99)-p(d, .99),
		float64(p(r, .5)-p(d, .5))/float64(p(a, .5)-p(d, .5)))
	// One line for scripts: added µs of router and proxy, and
	// their ratios, at p50 and p99.
	us := func(v time.Duration) float64 { return float64(v) / float64(time.Microsecond) }
	fmt.Printf("ratio %s added_us_p50 %.1f %.1f added_us_p99 %.1f %.1f ratio_p50 %.3f ratio_p99 %.3f\n",
		strings.ReplaceAll(what, " ", "_"),
		us(p(r, .5)-p(d, .5)), us(p(a, .5)-p(d, .5)), us(p(r, .99)-p(d, .99)), us(p(a, .99)-p(d, .99)),
		float64(p(r, .5)-p(d, .5))/float64(p(a, .5)-p(d, .5)),
		float64(p(r, .99)-p(d, .99))/float64(p(a, .99)-p(d, .99)))
}

// measureCPU prints the CPU time the process o.pid spends per bind+search
// on an open connection through the router and through the anchor, in
// alternating blocks, and the median ratio.
func measureCPU(o options) {
	if o.block <= 0 || o.n < o.block {
		log.Fatalf("-cpu needs -block > 0 and -n >= -block (got -n %d -block %d)", o.n, o.block)
	}
	rc, ac := dial(o.routed, o.dn, o.pw), dial(o.anchor, o.dn, o.pw)
	var r, a []float64 // CPU µs per operation, block by block
	perOp := func(c *ldap.Conn) float64 {
		before := cpuTime(o.pid)
		for range o.block {
			bindSearch(c, o.dn, o.pw)
		}
		return float64(cpuTime(o.pid)-before) / float64(time.Microsecond) / float64(o.block)
	}
	var ratios []float64
	for i := 0; i < o.n/o.block; i++ {
		if i%2 == 0 { // who goes first alternates
			r, a = append(r, perOp(rc)), append(a, perOp(ac))
		} else {
			a, r = append(a, perOp(ac)), append(r, perOp(rc))
		}
		ratios = append(ratios, r[i]/a[i])
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	fmt.Printf("cpu bind+search_on_an_open_connection router_us %.2f proxy_us %.2f ratio %.3f blocks %d of %d\n",
		med(r), med(a), med(ratios), len(ratios), o.block)
}

// holdConnections opens and binds hold routed connections and prints the
// router's resident memory per connection, 1 s and 11 s after the last bind.
func holdConnections(o options, hold int) {
	before := rss(o.pid)
	var conns []*ldap.Conn
	for i := 0; i < hold; i++ {
		c, err := ldap.DialURL("ldap://" + o.routed)
		if err != nil {
			log.Fatalf("connection %d: %v", i, err)
		}
		if err := c.Bind(o.dn, o.pw); err != nil {
			log.Fatalf("bind %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	held := time.Now()
	for _, at := range []time.Duration{time.Second, 11 * time.Second} { // after the last bind
		time.Sleep(time.Until(held.Add(at)))
		after := rss(o.pid)
		fmt.Printf("connections %d, router RSS %d KiB → %d KiB, %.1f KiB per idle routed connection (%v after the last bind)\n",
			len(conns), before, after, float64(after-before)/float64(len(conns)), at)
	}
	time.Sleep(o.linger)
	for _, c := range conns {
		c.Close()
	}
}

func dial(addr, dn, pw string) *ldap.Conn {
	c, err := ldap.DialURL("ldap://" + addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Bind(dn, pw); err != nil {
		log.Fatal(err)
	}
	return c
}

func bindSearch(c *ldap.Conn, dn, pw string) time.Duration {
	start := time.Now()
	if err := c.Bind(dn, pw); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Search(ldap.NewSearchRequest("cn=marker,dc=example", ldap.ScopeBaseObject, ldap.NeverDerefAliases,
		0, 0, false, "(objectClass=*)", []string{"description"}, nil)); err != nil {
		log.Fatal(err)
	}
	return time.Since(start)
}

func sample(addr, dn, pw string) time.Duration {
	start := time.Now()
	c := dial(addr, dn, pw)
	defer c.Close()
	if _, err := c.Search(ldap.NewSearchRequest("cn=marker,dc=example", ldap.ScopeBaseObject, ldap.NeverDerefAliases,
		0, 0, false, "(objectClass=*)", []string{"description"}, nil)); err != nil {
		log.Fatal(err)
	}
	return time.Since(start)
}

// cpuTime is the CPU time all of a process's threads have run, from the
// scheduler's own accounting (nanoseconds, unlike the clock ticks of
// /proc/<pid>/stat). Threads that ended meanwhile are not counted: Go's
// runtime keeps its threads.
func cpuTime(pid int) time.Duration {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		log.Fatal(err)
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}

// rss is a process's resident memory in KiB.
func rss(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	log.Fatal("no VmRSS")
	return 0
}
