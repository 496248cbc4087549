package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// The cluster under the fault schedule: one redis-server (restartable on
// its address, its ACL users given on its command line so that a restart
// empty has them again), three bin/caddy replicas (peer_rate_limit
// cluster-wide at R per peer on /rl/, latency_bucket with a sticky store
// on the rest) and two bin/coredns replicas (ogs with store redis), each
// replica logged in as its own ACL user through a link of its own
// (e2e.FaultyLink), so a fault can hit one replica's path alone.

const (
	R          = 100.0           // peer_rate_limit's cluster-wide rate per peer
	replicaTTL = 8 * time.Second // above every one-sided fault (README: "set replica_ttl above the longest one-sided outage")
	rlPrefix   = "edgesteer:peer_rate_limit:http/edge/p"
)

type cluster struct {
	t         *testing.T
	redisDir  string
	redisAddr string
	redisMu   sync.Mutex
	redis     *e2e.Proc
	admin     *redis.Client
	caddies   []*replica
	dns       []*replica
	users     []string // ACL user of each replica: caddies then dns
}

// replica is one bin/caddy or bin/coredns of the cluster: its link to
// Redis, its config and the process in force (replaced on a restart).
type replica struct {
	name    string
	user    string
	link    *e2e.FaultyLink
	config  string
	admin   string // ogs: its admin listener; caddy: taken from the process
	metrics string // ogs: its prometheus listener
	http    string // caddy: its site's address
	started atomic.Int64
	caddy   atomic.Pointer[e2e.Caddy]
	coredns atomic.Pointer[e2e.CoreDNS]
}

func (r *replica) proc() *e2e.Proc {
	if c := r.caddy.Load(); c != nil {
		return c.Proc
	}
	return r.coredns.Load().Proc
}

// since is how long the replica's process has been running.
func (r *replica) since() time.Duration { return time.Since(time.Unix(0, r.started.Load())) }

func (r *replica) start(t *testing.T) {
	// From now: the new process may answer before start returns (its
	// listener is up before its admin API answers and its probes measure).
	r.started.Store(time.Now().UnixNano())
	if strings.HasPrefix(r.name, "caddy") {
		r.caddy.Store(e2e.StartCaddy(t, "caddyfile", r.config))
		r.caddy.Load().WaitTCP(t, r.http)
	} else {
		r.coredns.Store(e2e.StartCoreDNS(t, r.config, "other.example.test A"))
	}
	r.started.Store(time.Now().UnixNano())
}

func (r *replica) adminAddr() string {
	if c := r.caddy.Load(); c != nil {
		return c.Admin
	}
	return r.admin
}

func (c *cluster) startRedis() {
	args := e2e.RedisArgs(c.redisDir, c.redisAddr)
	for _, u := range c.users {
		args = append(args, "--user", u, "on", ">pw", "~*", "&*", "+@all")
	}
	p := e2e.Start(c.t, "redis", "redis-server", nil, args...)
	p.WaitFor(c.t, "redis PING", 30*time.Second, func() error { return e2e.RedisPing(c.redisAddr) })
	c.redisMu.Lock()
	c.redis = p
	c.redisMu.Unlock()
}

func (c *cluster) redisProc() *e2e.Proc {
	c.redisMu.Lock()
	defer c.redisMu.Unlock()
	return c.redis
}

func startCluster(t *testing.T) *cluster {
	c := &cluster{t: t, redisDir: t.TempDir(), redisAddr: e2e.Addr(t),
		users: []string{"uc1", "uc2", "uc3", "uo1", "uo2"}}
	c.startRedis()
	c.admin = redis.NewClient(&redis.Options{Addr: c.redisAddr, MaxRetries: -1})
	t.Cleanup(func() { c.admin.Close() })
	upstream := e2e.Addr(t)
	e2e.StartPeer(t, "upstream", upstream, 0)
	var pubs, gws []string
	for i := range 3 {
		p := e2e.Addr(t)
		e2e.StartPeer(t, fmt.Sprintf("publisher-%d", i+1), p, 0)
		pubs = append(pubs, p)
		// Three gateways at equal distance: two runs of one location may
		// rank them differently (issue 48, part 2), so "one order" tells.
		g := fmt.Sprintf("127.0.0.%d:%d", 11+i, e2e.FreePort(t))
		e2e.StartPeer(t, fmt.Sprintf("gw%d", i+1), g, 0)
		gws = append(gws, g)
	}
	for i, u := range c.users {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{user: u, link: e2e.StartFaultyLink(t, ln, c.redisAddr, (&net.Dialer{}).DialContext)}
		if i < 3 {
			r.name, r.http = fmt.Sprintf("caddy%d", i+1), e2e.Addr(t)
			r.config = caddyConfig(r, upstream, pubs)
			c.caddies = append(c.caddies, r)
		} else {
			r.name, r.admin, r.metrics = fmt.Sprintf("coredns%d", i-2), e2e.Addr(t), e2e.Addr(t)
			r.config = corefile(r, gws)
			c.dns = append(c.dns, r)
		}
	}
	var wg sync.WaitGroup
	for _, r := range c.all() {
		wg.Add(1)
		go func() { defer wg.Done(); r.start(t) }()
	}
	wg.Wait()
	return c
}

func (c *cluster) all() []*replica { return append(append([]*replica{}, c.caddies...), c.dns...) }

// caddyConfig: peer_rate_limit's profile p limits X-Peer to R per second
// for the cluster (replicas 3, so that a replica restarted while Redis is
// away enforces R ÷ 3), latency_bucket as in the cluster example.
func caddyConfig(r *replica, upstream string, pubs []string) string {
	return fmt.Sprintf(`{
	edgesteer_redis main {
		address %s
		username %s
		password pw
	}
}
http://%s {
	handle /rl/* {
		peer_rate_limit {
			name edge
			profile p {
				peer {http.request.header.X-Peer}
				rate %g
				cluster redis main {
					replicas 3
					replica_ttl %v
				}
			}
		}
		reverse_proxy %s
	}
	handle {
		reverse_proxy %s {
			lb_policy latency_bucket {
				name apps
				probe http /probe
				probe_interval 300ms
				probe_timeout 1s
				sticky_user {http.request.header.X-User}
				sticky_app web # every replica listens on its own port: one app for all
				sticky_store redis main
			}
			header_down X-Publisher {http.reverse_proxy.latency_bucket.publisher}
			header_down X-Decision {http.reverse_proxy.latency_bucket.decision}
		}
	}
}
`, r.link.Addr(), r.user, r.http, R, replicaTTL, upstream, strings.Join(pubs, " "))
}

// corefile: ogs with recheck off (the convergence step every second),
// store redis through the replica's link.
func corefile(r *replica, gws []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vpn.example.test {\n\tbind 127.0.0.1\n\togs {\n")
	for i, g := range gws {
		fmt.Fprintf(&b, "\t\tgateway gw%d.example.test %s\n", i+1, g)
	}
	fmt.Fprintf(&b, "\t\tprobe http /probe\n\t\tprobes 2\n\t\trecheck off\n")
	fmt.Fprintf(&b, "\t\tstore redis {\n\t\t\taddress %s\n\t\t\tusername %s\n\t\t\tpassword pw\n\t\t\tkey_prefix e2e\n\t\t}\n", r.link.Addr(), r.user)
	fmt.Fprintf(&b, "\t\tadmin %s\n\t}\n\tprometheus %s\n}\n", r.admin, r.metrics)
	return b.String()
}

// getJSON decodes GET url into v within 2 s.
func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// seed is CHAOS_SEED when set (to replay a run), else the clock's.
func seed(t *testing.T) uint64 {
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		var s uint64
		if _, err := fmt.Sscan(v, &s); err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		return s
	}
	return uint64(time.Now().UnixNano())
}
