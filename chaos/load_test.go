package chaos_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const slice = 500 * time.Millisecond

// stallGap: a host stall longer than this bunches the client's arrivals
// past the shares' bursts (README: a replica's bucket "loses capacity in
// any longer pause of its arrivals"; the burst is at least 100 ms of the
// share), so the cluster admits less than R for reasons of the host, not
// of the rule, then sends the backlog at once.
const stallGap = 100 * time.Millisecond

// stallTail is how long after a stall the replicas, stalled with the host,
// may still be deciding its backlog.
const stallTail = time.Second

// rlLoad offers 3R per second of one peer over the three bin/caddy
// replicas, 60/30/10 (as issue 48 measured), and counts per 0.5 s slice
// (since t0) the requests sent and, of those, the ones admitted (200), by
// the slice they were sent in: a replica decides a request within
// milliseconds of its sending (a paused one on resuming, at most its
// burst), where its answer may come much later on a loaded host (counted
// by answer, a client stall moved 20 admissions into the next slice: two
// calm windows at 0.895 R and 1.085 R, 0.99 R over both).
type rlLoad struct {
	t0                time.Time
	sent, admitted    [400]atomic.Int64
	pending           [400]atomic.Int64    // sent in the slice, not answered yet
	byReplica         [3][400]atomic.Int64 // admitted, per bin/caddy replica
	stalled           [400]atomic.Bool     // a stall of the pacer over stallGap, or its tail, touched this slice
	failed, completed atomic.Int64
}

func (c *cluster) startRLLoad(stop <-chan struct{}, wg *sync.WaitGroup) *rlLoad {
	l := &rlLoad{t0: time.Now()}
	client := &http.Client{Timeout: 4 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	targets := []int{0, 0, 0, 0, 0, 0, 1, 1, 1, 2}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for n := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if now := time.Now(); now.Sub(last) > stallGap {
				for j := l.slot(last); j <= l.slot(now.Add(stallTail)); j++ {
					l.stalled[j].Store(true)
				}
			}
			last = time.Now()
			for due := int(3 * R * time.Since(l.t0).Seconds()); n < due; n++ {
				i := targets[n%len(targets)]
				r := c.caddies[i]
				j := l.slot(time.Now())
				l.sent[j].Add(1)
				l.pending[j].Add(1)
				wg.Add(1)
				go func(n int) {
					defer wg.Done()
					defer l.pending[j].Add(-1)
					req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/rl/%d", r.http, n), nil)
					req.Header.Set("X-Peer", "pgw1")
					resp, err := client.Do(req)
					if err != nil {
						l.failed.Add(1)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					l.completed.Add(1)
					if resp.StatusCode == 200 {
						l.admitted[j].Add(1)
						l.byReplica[i][j].Add(1)
					}
				}(n)
			}
		}
	}()
	return l
}

// logSlices logs, per 0.5 s slice, what each bin/caddy replica admitted
// (a failed window's parts, to tell the rule in force).
func (l *rlLoad) logSlices(t *testing.T) {
	var b strings.Builder
	for j := range l.sent {
		if l.sent[j].Load() == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s sent %d admitted %d:", l.t0.Add(time.Duration(j)*slice).Format("15:04:05.0"), l.sent[j].Load(), l.admitted[j].Load())
		for i := range l.byReplica {
			fmt.Fprintf(&b, " %d", l.byReplica[i][j].Load())
		}
	}
	t.Logf("peer_rate_limit admitted per 0.5 s slice (caddy1 caddy2 caddy3):%s", b.String())
}

func (l *rlLoad) slot(t time.Time) int { return min(int(t.Sub(l.t0)/slice), len(l.sent)-1) }

// lbEvent is one answer of latency_bucket: the pair's publisher.
type lbEvent struct {
	user, replica, publisher string
	at                       time.Time
}

// lbLoad sends requests of (user, app) pairs to random bin/caddy replicas:
// every 50 ms a new user (one in four) or one of the last 10, and records the publisher
// that answered. Answers from a replica up to 2 s after its (re)start are
// left out: before its probes measured the publishers nothing is pinned
// (the README's rule 4, cold start).
type lbLoad struct {
	mu     sync.Mutex
	events []lbEvent
	failed int
}

func (c *cluster) startLBLoad(rng *rand.Rand, stop <-chan struct{}, wg *sync.WaitGroup) *lbLoad {
	l := &lbLoad{}
	client := &http.Client{Timeout: 4 * time.Second}
	users := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var u int
			if users == 0 || rng.IntN(4) == 0 {
				users++
				u = users
			} else {
				u = users - rng.IntN(min(users, 10))
			}
			r := c.caddies[rng.IntN(3)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r.since() < 2*time.Second {
					return
				}
				req, _ := http.NewRequest("GET", "http://"+r.http+"/", nil)
				req.Header.Set("X-User", fmt.Sprintf("user%d", u))
				resp, err := client.Do(req)
				if err != nil {
					return // a paused or killed replica: no answer, nothing to check
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				l.mu.Lock()
				defer l.mu.Unlock()
				if resp.StatusCode != 200 || resp.Header.Get("X-Publisher") == "" {
					l.failed++
					return
				}
				l.events = append(l.events, lbEvent{fmt.Sprint(u), r.name, resp.Header.Get("X-Publisher"), time.Now()})
			}()
		}
	}()
	return l
}

// flips returns each pair whose answers, in time order, went from one
// publisher to another more than once (A, B, A or A, B, C): the README
// allows one switch (a pending pin reconciled to the stored one), never
// two publishers in turn.
func (l *lbLoad) flips() (pairs int, bad []string) {
	l.mu.Lock()
	evs := append([]lbEvent{}, l.events...)
	l.mu.Unlock()
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	seq := map[string][]lbEvent{}
	for _, e := range evs {
		s := seq[e.user]
		if len(s) == 0 || s[len(s)-1].publisher != e.publisher {
			seq[e.user] = append(s, e)
		}
	}
	for u, s := range seq {
		if len(s) > 2 {
			var b strings.Builder
			for _, e := range s {
				fmt.Fprintf(&b, " %s from %s at %s;", e.publisher, e.replica, e.at.Format("15:04:05.000"))
			}
			bad = append(bad, fmt.Sprintf("user%s:%s", u, b.String()))
		}
	}
	return len(seq), bad
}

// askOGS asks addr for vpn.example.test A from the ECS subnet and returns
// the addresses in order.
func askOGS(addr, subnet string) (string, error) {
	m := new(dns.Msg)
	m.SetQuestion("vpn.example.test.", dns.TypeA)
	p := netip.MustParsePrefix(subnet)
	m.Extra = append(m.Extra, &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232},
		Option: []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: uint8(p.Bits()), Address: p.Addr().AsSlice()}}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).ExchangeContext(ctx, m, addr)
	if err != nil {
		return "", err
	}
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		return "", fmt.Errorf("%s with %d records", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
	var ips []string
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			ips = append(ips, a.A.String())
		}
	}
	return strings.Join(ips, " "), nil
}
