package ogs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// delayProxy relays TCP connections to target, holding every chunk
// oneWay in each direction before passing it on (in order, without
// limiting the rate): a store that far from the replica. It returns the
// proxy's address.
func delayProxy(t *testing.T, target string, oneWay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); delayCopy(u, c, oneWay) }()
			go func() { defer wg.Done(); delayCopy(c, u, oneWay) }()
		}
	}()
	return l.Addr().String()
}

// delayCopy copies src to dst, each chunk written oneWay after it was
// read; it closes both when either side ends.
func delayCopy(dst, src net.Conn, oneWay time.Duration) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{time.Now().Add(oneWay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range ch { // let the reader end
	}
}

// Three replicas at different distances from one redis-server (direct,
// 10 ms and 25 ms each way through a delaying proxy), and 40 new locations
// queried at once on all three: exactly one probe run per location in the
// cluster (counted at the gateways, in the metrics and in the admin views),
// and every replica holds and answers the stored result of that run (the
// same probe time, RTTs and order on each, the order Redis holds).
func TestClusterRaceOneRunPerLocation(t *testing.T) {
	e2e.SkipShort(t)
	gws := clusterGateways(t)
	_, redisAddr := e2e.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	replicas := []*replica{
		startRaceReplica(t, gws, redisAddr),
		startRaceReplica(t, gws, delayProxy(t, redisAddr, 10*ms)),
		startRaceReplica(t, gws, delayProxy(t, redisAddr, 25*ms)),
	}
	const locations = 40
	queryAllAtOnce(t, replicas, locations)

	// Every replica ends with a fresh result for every location (a
	// replica whose queries fell back waits on for the stored result).
	views := make([]adminJSON, len(replicas))
	replicas[0].WaitFor(t, "every location on every replica", 60*time.Second, func() error {
		for k, r := range replicas {
			views[k] = fetchAdmin(t, r.admin)
			n := 0
			for _, l := range views[k].Servers[0].Locations {
				if l.Fresh {
					n++
				}
			}
			if n != locations {
				return fmt.Errorf("replica %d: %d fresh locations", k, n)
			}
		}
		return nil
	})

	runs, viewRuns, waits := 0.0, 0, 0.0
	for k, r := range replicas {
		runs += metric(t, r.metrics, "coredns_ogs_probe_runs_total")
		waits += metric(t, r.metrics, "coredns_ogs_cluster_lock_waits_total")
		viewRuns += views[k].Servers[0].RunsTotal
	}
	conns := totalConns(gws...)
	t.Logf("%d locations on %d replicas: %v probe runs, %d gateway connections, %v lock waits", locations, len(replicas), runs, conns, waits)
	if runs != locations || viewRuns != locations || conns != 6*locations {
		t.Errorf("%v probe runs (metrics), %d (admin views), %d gateway connections; want one run per location: %d runs, %d connections", runs, viewRuns, conns, locations, 6*locations)
	}
	if waits == 0 {
		t.Error("no replica waited for another's run: the race was not there to lose")
	}

	for i := range locations {
		checkOneStoredResult(t, rdb, replicas, views, raceSubnet(i))
	}
}

// startRaceReplica starts a replica whose store calls get 3 s, not 250 ms:
// this test is about the race, and a call timing out on a loaded host is
// store trouble (the replica then probes locally, as documented), which
// TestClusterRedisHanging covers.
func startRaceReplica(t *testing.T, gws []*countingGateway, redisAddr string) *replica {
	t.Helper()
	r := &replica{metrics: e2e.Addr(t), admin: e2e.Addr(t)}
	cf := strings.Replace(clusterCorefile(gws, redisAddr, r.metrics, r.admin, ""), "key_prefix e2e\n", "key_prefix e2e\n\t\t\tread_timeout 3s\n\t\t\twrite_timeout 3s\n", 1)
	r.CoreDNS = e2e.StartCoreDNS(t, cf, "other.example.test A")
	return r
}

func raceSubnet(i int) string { return fmt.Sprintf("10.%d.%d.0/24", 20+i/200, i%200) }

// queryAllAtOnce queries each of locations new locations on every replica,
// all at once; every query must be answered.
func queryAllAtOnce(t *testing.T, replicas []*replica, locations int) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, locations*len(replicas))
	for i := range locations {
		for _, r := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := exchange(r.Addr, "vpn.example.test", dns.TypeA, raceSubnet(i))
				if err == nil && (resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0) {
					err = fmt.Errorf("rcode %s, %d records", dns.RcodeToString[resp.Rcode], len(resp.Answer))
				}
				if err != nil {
					errs <- fmt.Errorf("%s from %s: %v", r.Addr, raceSubnet(i), err)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// checkOneStoredResult checks that every replica holds the result Redis
// holds for subnet (the same probe time, RTTs and order) and answers it.
func checkOneStoredResult(t *testing.T, rdb *redis.Client, replicas []*replica, views []adminJSON, subnet string) {
	t.Helper()
	type held struct {
		at    time.Time
		rtts  map[string]float64
		order []string
	}
	ctx := context.Background()
	loc := "ecs:" + subnet
	var stored struct {
		At    time.Time `json:"at"`
		Order []string  `json:"order"`
	}
	raw, err := rdb.Get(ctx, storeKey(subnet)).Result()
	if err == nil {
		err = json.Unmarshal([]byte(raw), &stored)
	}
	if err != nil {
		t.Fatalf("%s in Redis: %v", loc, err)
	}
	var first *held
	for k := range replicas {
		var h *held
		for _, l := range views[k].Servers[0].Locations {
			if l.Location == loc {
				h = &held{l.ProbedAt, l.RTTsMs, l.Order}
			}
		}
		switch {
		case h == nil:
			t.Fatalf("replica %d lacks %s", k, loc)
		case !h.at.Equal(stored.At):
			t.Errorf("%s: replica %d holds a result probed at %v, Redis one of %v: not the stored result", loc, k, h.at, stored.At)
		case first != nil && (!maps(first.rtts, h.rtts) || !slices.Equal(first.order, h.order)):
			t.Errorf("%s: replica %d holds %v %v, replica 0 %v %v", loc, k, h.order, h.rtts, first.order, first.rtts)
		}
		if first == nil {
			first = h
		}
	}
	// And answers it: the same A records, in the same order, everywhere.
	var want []string
	for k, r := range replicas {
		ips, ttl := query(t, r.Addr, subnet)
		if ttl != 30 || (k > 0 && !slices.Equal(ips, want)) {
			t.Errorf("%s: replica %d answers %v ttl %d, replica 0 %v", loc, k, ips, ttl, want)
		}
		want = ips
	}
}

func maps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
