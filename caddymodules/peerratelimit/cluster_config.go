package peerratelimit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/caddymodules/redisstore"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// ClusterConfig makes a profile's overall limit cluster-wide: the replicas
// that share the Redis store (and the handler and profile names) divide it
// among themselves by demand (internal/quota). No Redis call is made per
// request: each replica enforces its share, and syncs every Sync.
type ClusterConfig struct {
	// Redis names a store declared with the edgesteer_redis app (the
	// Caddyfile global option edgesteer_redis <name> { … }).
	Redis string `json:"redis"`
	// Sync is the sync interval (default 250ms).
	Sync caddy.Duration `json:"sync,omitempty"`
	// ReplicaTTL is how long a replica counts as live after its last sync
	// (default 4 × Sync): a dead replica's share returns to the others
	// within it.
	ReplicaTTL caddy.Duration `json:"replica_ttl,omitempty"`
	// Replicas is the replica count assumed until the first sync answers
	// (default 1): a replica whose store is unreachable from its start
	// enforces limit ÷ Replicas, so N replicas started while Redis is down
	// admit the limit together, not N times it.
	Replicas int `json:"replicas,omitempty"`
}

const defaultSync = 250 * time.Millisecond

// unmarshalCluster reads
//
//	cluster redis <store> {
//		sync <duration>
//		replica_ttl <duration>
//		replicas <n>
//	}
func unmarshalCluster(o *cfparse.Block) (*ClusterConfig, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	args, err := o.BlockArgs(2, 2)
	if err != nil {
		return nil, err
	}
	if args[0] != "redis" {
		return nil, o.Invalid(args[0], errors.New("want redis <store name>"))
	}
	c := &ClusterConfig{Redis: args[1]}
	for sub := o.Sub(); sub.Next(); {
		switch sub.Name() {
		case "sync":
			c.Sync, err = sub.Duration(time.Millisecond)
		case "replica_ttl":
			c.ReplicaTTL, err = sub.Duration(time.Millisecond)
		case "replicas":
			c.Replicas, err = sub.Int(1, math.MaxInt32)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// validate checks what can be checked without the Redis store.
func (c *ClusterConfig) validate(p *ProfileConfig) error {
	bad := func(opt string, v any, why string) error {
		return fmt.Errorf("peer_rate_limit: profile %s: cluster %s %v: %s", p.Name, opt, v, why)
	}
	if c.Redis == "" {
		return bad("redis", `""`, "want the name of an edgesteer_redis store")
	}
	if p.Rate <= 0 {
		return bad("redis", c.Redis, "a cluster-wide limit needs the profile's overall rate (rate)")
	}
	sync := time.Duration(c.Sync)
	if sync == 0 {
		sync = defaultSync
	}
	if sync < time.Millisecond {
		return bad("sync", time.Duration(c.Sync), "must be at least 1ms")
	}
	if c.Replicas < 0 {
		return bad("replicas", c.Replicas, "must be at least 1")
	}
	if c.ReplicaTTL != 0 && time.Duration(c.ReplicaTTL) < sync {
		return bad("replica_ttl", time.Duration(c.ReplicaTTL), fmt.Sprintf("must be at least the sync interval %v", sync))
	}
	return nil
}

// replicaName is this process's identity among the replicas: host name,
// process id and a random part (two processes on one host after a pid
// wraps, or in containers sharing a host name, stay apart).
var replicaName = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
})

// clusterSpec is one generation's cluster settings of one profile.
type clusterSpec struct {
	profile string
	conn    *redisstore.Conn
	cfg     quota.Config
	overall *ratelimit.Rule // the generation's overall rule: its throttle level
	// messages are the profile's message-type limits, each cluster-wide
	// with a quota of its own (keys under <prefix>/message/<type>).
	messages []messageSpec
	logger   *zap.Logger
}

// messageSpec is one message type's cluster-wide limit.
type messageSpec struct {
	cfg  quota.Config
	rule *ratelimit.Rule // the generation's rule: its throttle level
}

// messageKeySep separates a profile's key prefix from a message type's
// part: ':' follows the prefix in a peer's key of the overall limit, so
// no peer name (client-controlled) makes the two keys collide.
const messageKeySep = "/message/"

// newClusterSpec looks the store up and builds the quota configs: the
// overall limit's and one per message type.
func newClusterSpec(ctx caddy.Context, kind, handler string, p *ProfileConfig, engine *ratelimit.Profile) (*clusterSpec, error) {
	c := p.Cluster
	if err := c.validate(p); err != nil {
		return nil, err
	}
	conn, err := redisstore.Lookup(ctx, "peer_rate_limit: profile "+p.Name+": cluster redis", c.Redis)
	if err != nil {
		return nil, err
	}
	prefix := conn.Key("peer_rate_limit", kind+"/"+handler+"/"+p.Name)
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("peer_rate_limit: profile %s: cluster key prefix %q: braces would break the Redis Cluster hash tag; remove them from key_prefix, the handler name and the profile name", p.Name, prefix)
	}
	maxPeers := p.MaxPeers
	if maxPeers == 0 {
		maxPeers = defaultMaxPeers
	}
	spec := &clusterSpec{
		profile: p.Name, conn: conn, overall: engine.Overall, logger: ctx.Logger(),
		cfg: quota.Config{
			Prefix: prefix, Replica: replicaName(), Limit: p.Rate, Burst: p.Burst,
			Interval: time.Duration(c.Sync), ReplicaTTL: time.Duration(c.ReplicaTTL), MaxPeers: maxPeers,
			ExpectedReplicas: c.Replicas,
		},
	}
	for _, m := range p.Messages {
		if strings.ContainsAny(m.Type, "{}") {
			return nil, fmt.Errorf("peer_rate_limit: profile %s: message %q: braces would break the Redis Cluster hash tag of its cluster-wide limit", p.Name, m.Type)
		}
		cfg := spec.cfg
		cfg.Prefix, cfg.Limit, cfg.Burst = prefix+messageKeySep+m.Type, m.Rate, m.Burst
		spec.messages = append(spec.messages, messageSpec{cfg: cfg, rule: engine.Message(m.Type)})
	}
	slices.SortFunc(spec.messages, func(a, b messageSpec) int { return strings.Compare(a.rule.Name, b.rule.Name) })
	return spec, nil
}

// messageCfg returns the quota config of a message type, or the zero
// Config if the spec has none.
func (s *clusterSpec) messageCfg(name string) quota.Config {
	for _, m := range s.messages {
		if m.rule.Name == name {
			return m.cfg
		}
	}
	return quota.Config{}
}
