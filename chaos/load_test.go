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
	"time"

	"github.com/miekg/dns"
)

const slice = 500 * time.Millisecond

// stallGap: a host stall longer than this bunches the client's arrivals
// past the shares' bursts (README: a replica's bucket "loses capacity in
// any longer pause of its arrivals"; the burst is at least 100 ms of the
// share), so the cluster admits less than R for reasons of the host, not
// of the rule.
const stallGap = 100 * time.Millisecond

// rlLoad offers 3R per second of one peer over the three bin/caddy
// replicas, 60/30/10 (as issue 48 measured), and counts per 0.5 s slice
// (since t0) the requests sent and those admitted (200), by the time the
// answer came (a paused replica decides its queued requests on resuming).
type rlLoad struct {
	t0                time.Time
	sent, admitted    [400]atomic.Int64
	stalled           [400]atomic.Bool // the pacer woke more than stallGap late in this slice
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
				l.stalled[l.slot(now)].Store(true)
			}
			last = time.Now()
			for due := int(3 * R * time.Since(l.t0).Seconds()); n < due; n++ {
				r := c.caddies[targets[n%len(targets)]]
				l.sent[l.slot(time.Now())].Add(1)
				wg.Add(1)
				go func(n int) {
					defer wg.Done()
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
						l.admitted[l.slot(time.Now())].Add(1)
					}
				}(n)
			}
		}
	}()
	return l
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
