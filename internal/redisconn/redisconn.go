// Package redisconn is the one Redis connection config of edgesteer: the
// fields an operator declares once (addresses, ACL user and password, TLS,
// key prefix, timeouts) and the go-redis universal client built from them
// (one address: a single server; several, or Cluster set: Redis Cluster;
// SentinelMaster set: the addresses are Sentinels). The Caddy app
// edgesteer_redis declares named configs for the Caddy modules; CoreDNS's
// ogs takes the same options in its own block. Both read options through
// Set, so an option is spelled and checked the same way everywhere.
package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
)

// Defaults. The timeouts are short on purpose: edgesteer never waits on
// Redis on a request's path for longer than its own budget, and a store
// that does not answer within them is treated as down (the modules go on
// locally and say so).
const (
	DefaultPrefix       = "edgesteer"
	DefaultDialTimeout  = time.Second
	DefaultReadTimeout  = 250 * time.Millisecond
	DefaultWriteTimeout = 250 * time.Millisecond
)

// Config is one Redis connection. Durations are strings in JSON ("250ms",
// "1s"), or nanoseconds as numbers, as in Caddy's JSON.
type Config struct {
	// Addresses are host:port pairs: one server, the seeds of a Redis
	// Cluster, or the Sentinels when SentinelMaster is set.
	Addresses []string `json:"addresses,omitempty"`
	// Cluster makes a single address a Redis Cluster seed.
	Cluster bool `json:"cluster,omitempty"`
	// SentinelMaster is the master name the Sentinels at Addresses watch.
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// Username and Password authenticate (ACL user, or Password alone for
	// requirepass). SentinelPassword is the Sentinels' own, if any.
	Username         string `json:"username,omitempty"`
	Password         string `json:"password,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// DB selects a database (single server and Sentinel only).
	DB int `json:"db,omitempty"`
	// TLS, when set, connects with TLS.
	TLS *TLS `json:"tls,omitempty"`
	// KeyPrefix namespaces every key edgesteer writes (default
	// "edgesteer"); each module adds its own name and the policy or
	// profile name after it.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// DialTimeout, ReadTimeout and WriteTimeout bound one connection
	// attempt and one command's reply and write (defaults 1s, 250ms, 250ms).
	DialTimeout  Duration `json:"dial_timeout,omitempty"`
	ReadTimeout  Duration `json:"read_timeout,omitempty"`
	WriteTimeout Duration `json:"write_timeout,omitempty"`
	// PoolSize is the connections per node (default go-redis': 10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`
}

// TLS is the client side of a TLS connection to Redis.
type TLS struct {
	// ServerName overrides the name checked in the server's certificate
	// (default: the address's host).
	ServerName string `json:"server_name,omitempty"`
	// CAFile is a PEM bundle of the CAs to trust (default: the system's).
	CAFile string `json:"ca_file,omitempty"`
	// CertFile and KeyFile are a client certificate, for servers that
	// ask for one (tls-auth-clients).
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// InsecureSkipVerify accepts any certificate; for tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// Options lists the option names Set takes, for help and errors.
var Options = []string{"address", "cluster", "sentinel_master", "username", "password", "sentinel_password",
	"db", "tls", "tls_server_name", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_insecure_skip_verify",
	"key_prefix", "dial_timeout", "read_timeout", "write_timeout", "pool_size"}

// ErrUnknown is Set's error for an option that is not one of Options.
var ErrUnknown = errors.New("unknown option")

// Set applies one option line of a Caddyfile or Corefile block: the
// option's name and its arguments. address may repeat and takes one or more
// addresses; tls takes none; every other option one value. The error says
// what was wanted; the caller adds the file, line, option and value.
// Whether a single-valued option was given twice is the caller's check.
func (c *Config) Set(option string, args []string) error {
	if !slices.Contains(Options, option) {
		return ErrUnknown
	}
	want := 1
	switch option {
	case "address":
		if len(args) == 0 {
			return errors.New("want at least 1 address")
		}
		c.Addresses = append(c.Addresses, args...)
		return nil
	case "tls", "cluster":
		want = 0
	}
	if len(args) != want {
		return fmt.Errorf("want %d argument(s), got %d", want, len(args))
	}
	var err error
	switch option {
	case "cluster":
		c.Cluster = true
	case "tls":
		c.tls()
	case "sentinel_master":
		c.SentinelMaster = args[0]
	case "username":
		c.Username = args[0]
	case "password":
		c.Password = args[0]
	case "sentinel_password":
		c.SentinelPassword = args[0]
	case "db":
		c.DB, err = cfvalue.Int(args[0], 0, math.MaxInt32)
	case "tls_server_name":
		c.tls().ServerName = args[0]
	case "tls_ca_file":
		c.tls().CAFile = args[0]
	case "tls_cert_file":
		c.tls().CertFile = args[0]
	case "tls_key_file":
		c.tls().KeyFile = args[0]
	case "tls_insecure_skip_verify":
		c.tls().InsecureSkipVerify, err = cfvalue.Bool(args[0])
	case "key_prefix":
		c.KeyPrefix = args[0]
	case "dial_timeout":
		err = c.DialTimeout.set(args[0])
	case "read_timeout":
		err = c.ReadTimeout.set(args[0])
	case "write_timeout":
		err = c.WriteTimeout.set(args[0])
	case "pool_size":
		c.PoolSize, err = cfvalue.Int(args[0], 1, 10000)
	default:
		return ErrUnknown
	}
	return err
}

func (c *Config) tls() *TLS {
	if c.TLS == nil {
		c.TLS = &TLS{}
	}
	return c.TLS
}

// FillDefaults sets the defaults of unset fields.
func (c *Config) FillDefaults() {
	c.KeyPrefix = cmpOr(c.KeyPrefix, DefaultPrefix)
	c.DialTimeout = cmpOr(c.DialTimeout, Duration(DefaultDialTimeout))
	c.ReadTimeout = cmpOr(c.ReadTimeout, Duration(DefaultReadTimeout))
	c.WriteTimeout = cmpOr(c.WriteTimeout, Duration(DefaultWriteTimeout))
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Validate checks the config after FillDefaults; the error names the field
// and the value.
func (c *Config) Validate() error {
	if len(c.Addresses) == 0 {
		return errors.New("address: at least one Redis address is required")
	}
	for _, a := range c.Addresses {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return fmt.Errorf("address %q: want host:port", a)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("address %q: port must be 1-65535", a)
		}
	}
	if c.SentinelMaster != "" && c.Cluster {
		return errors.New("cluster and sentinel_master: choose one")
	}
	if c.DB != 0 && (c.Cluster || (c.SentinelMaster == "" && len(c.Addresses) > 1)) {
		return fmt.Errorf("db %d: Redis Cluster has only database 0", c.DB)
	}
	if c.DB < 0 {
		return fmt.Errorf("db %d: must be 0 or more", c.DB)
	}
	if strings.ContainsAny(c.KeyPrefix, "{} \t\r\n") {
		return fmt.Errorf("key_prefix %q: no braces or whitespace (braces are Redis Cluster hash tags)", c.KeyPrefix)
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"dial_timeout", c.DialTimeout}, {"read_timeout", c.ReadTimeout}, {"write_timeout", c.WriteTimeout}} {
		if time.Duration(d.v) < time.Millisecond {
			return fmt.Errorf("%s %v: must be at least 1ms", d.name, time.Duration(d.v))
		}
	}
	if c.PoolSize < 0 {
		return fmt.Errorf("pool_size %d: must be positive", c.PoolSize)
	}
	if t := c.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		return errors.New("tls_cert_file and tls_key_file: give both or neither")
	}
	return nil
}

// Universal returns go-redis' options for the config (after FillDefaults
// and Validate); it reads the TLS files.
func (c *Config) Universal() (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		Addrs:            c.Addresses,
		MasterName:       c.SentinelMaster,
		Username:         c.Username,
		Password:         c.Password,
		SentinelPassword: c.SentinelPassword,
		DB:               c.DB,
		DialTimeout:      time.Duration(c.DialTimeout),
		ReadTimeout:      time.Duration(c.ReadTimeout),
		WriteTimeout:     time.Duration(c.WriteTimeout),
		PoolSize:         c.PoolSize,
		IsClusterMode:    c.Cluster,
		// One attempt: the callers have their own fallback and never
		// want go-redis to retry past their deadline.
		MaxRetries: -1,
		// A caller's context deadline (a request path's 50 ms, a sync's
		// period) bounds the wait for an answer; read_timeout and
		// write_timeout apply to calls without one. Without this,
		// go-redis waits read_timeout on a Redis that accepts and never
		// answers, whatever the caller's deadline.
		ContextTimeoutEnabled: true,
		// The client library's name and version in CLIENT LIST is noise
		// on servers that refuse CLIENT SETINFO (older Redis, proxies).
		DisableIdentity: true,
	}
	if c.TLS != nil {
		cfg, err := c.TLS.config()
		if err != nil {
			return nil, err
		}
		o.TLSConfig = cfg
	}
	return o, nil
}

func (t *TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca_file %q: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls_cert_file/tls_key_file: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// New builds the client (after FillDefaults and Validate). It does not
// connect: go-redis dials on the first command, so a Redis that is down at
// start does not stop the process.
func New(c *Config) (redis.UniversalClient, error) {
	o, err := c.Universal()
	if err != nil {
		return nil, err
	}
	c2 := redis.NewUniversalClient(o)
	if cc, ok := c2.(*redis.ClusterClient); ok {
		cc.AddHook(reloadOnLostNode{cc})
	}
	return c2, nil
}

// reloadOnLostNode makes a Redis Cluster client reload its slot map when
// a command finds its node gone. go-redis reloads it on MOVED, ASK and
// READONLY, and otherwise only every ClusterStateReloadInterval (60 s):
// after a shard's failover (its master dead, a replica promoted) every
// command for that shard's slots would go to the dead address and fail
// until then, and each new location would be probed by every replica.
// So the first such failure asks for a reload (go-redis runs one at a
// time, 200 ms apart at most), and the calls after it reach the promoted
// master.
type reloadOnLostNode struct{ c *redis.ClusterClient }

// lostNode says whether err means the node may be gone: no answer, or a
// slot the cluster says is down.
func lostNode(err error) bool {
	switch Reason(err) {
	case "timeout", "closed", "refused", "reset", "network", "clusterdown", "tryagain":
		return true
	}
	return false
}

func (h reloadOnLostNode) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnLostNode) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if lostNode(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnLostNode) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if lostNode(cmd.Err()) {
				h.c.ReloadState(ctx)
				break
			}
		}
		return err
	}
}

// Key joins the prefix, the module and the name of its policy or profile
// into a key namespace ("edgesteer:latency_bucket:web").
func (c *Config) Key(module, name string) string {
	return c.KeyPrefix + ":" + module + ":" + name
}

// Duration is a time.Duration that reads from JSON as a string ("250ms",
// "1s", "1d") or as nanoseconds, and writes as a string.
type Duration time.Duration

func (d *Duration) set(s string) error {
	v, err := cfvalue.Duration(s, time.Millisecond)
	*d = Duration(v)
	return err
}

// UnmarshalJSON reads a string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		s, err := strconv.Unquote(string(b))
		if err != nil {
			return err
		}
		return d.set(s)
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("duration %s: want a string such as \"250ms\" or nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(time.Duration(d).String())), nil
}

// go-redis prints a line on every failed dial ("failed to dial after 5
// attempts") to stderr. The modules log a store's transitions themselves,
// once each (down, back), with their name and what they do meanwhile; the
// client's per-attempt lines would repeat on every sync while Redis is down.
func init() { redis.SetLogger(quiet{}) }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
