package peerratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/ratelimit"
)

// leasedConfig is what the HTTP and layer4 handlers have in common: their
// configuration (embedded, so its fields are theirs in JSON) and the lease
// on the handler state it names.
type leasedConfig struct {
	// Name labels metrics and the admin API, and keys the state kept across
	// config reloads (buckets, dynamic throttle level): a handler in the
	// next config with the same name adopts it. Default: the kind and a hash
	// of the handler's whole config (e.g. "http-5f1c2a9e"), so unnamed
	// handlers keep their state only through reloads that leave them
	// unchanged, and two different handlers never share it.
	Name     string          `json:"name,omitempty"`
	Profiles []ProfileConfig `json:"profiles"`
	Dynamic  *DynamicConfig  `json:"dynamic,omitempty"`

	lease *lease
}

// Cleanup lets go of the shared state; the last generation to let go
// stops its dynamic throttling and sweeper.
func (l *leasedConfig) Cleanup() error {
	if l.lease != nil {
		// The lease stays set (release is idempotent): connections
		// accepted before a reload still read it (L4Handler.current).
		return l.lease.release()
	}
	return nil
}

// defaultName returns the name of an unnamed module of kind: the kind and
// a hash of cfg, the module's config as given (before Provision fills in
// defaults).
func defaultName(kind string, cfg any) (string, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("peer_rate_limit: hashing the config for a default name: %v", err)
	}
	sum := sha256.Sum256(b)
	return kind + "-" + hex.EncodeToString(sum[:4]), nil
}

// fingerprint identifies a module's config, to tell a handler repeated for
// several listeners (same config, same name) from two handlers that share
// a name by mistake.
func fingerprint(cfg any) string {
	b, _ := json.Marshal(cfg)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// unmarshalCaddyfile reads the handler block: name, profile (with
// message options from opt), dynamic, and what extra knows (it returns
// false for an option it does not know; nil: nothing more). profile may
// repeat, once per name; every other option is given once.
func (l *leasedConfig) unmarshalCaddyfile(d *caddyfile.Dispenser, opt messageOption, extra func(*cfparse.Block) (bool, error)) error {
	_, o, err := cfparse.Open(d, "peer_rate_limit", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		switch o.Name() {
		case "name":
			l.Name, err = o.String()
		case "profile":
			var p ProfileConfig
			if p, err = unmarshalProfile(o, opt); err == nil {
				l.Profiles = append(l.Profiles, p)
			}
		case "dynamic":
			l.Dynamic, err = UnmarshalDynamic(o)
		default:
			ok := false
			if extra != nil {
				ok, err = extra(o)
			}
			if err == nil && !ok {
				err = o.Unknown()
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// generation is one provisioned module's part in its shared state: what
// the admin view, the sampler and long-lived Diameter connections read
// from the newest generation.
type generation struct {
	kind    string
	engines []*ratelimit.Profile
	dynamic *dynamicSettings // nil: no dynamic throttling
	handler any              // the module instance (*L4Handler for Diameter connections)
	// clusters are the profiles limited cluster-wide.
	clusters []*clusterSpec
	logger   *zap.Logger
}

// provisionState attaches a provisioned module to the state kept under
// (kind, name): it builds the dynamic controller from dc, if any, and
// adopts the buckets and controller state of earlier generations.
func provisionState(ctx caddy.Context, kind, name, fp string, cfgs []ProfileConfig, engines []*ratelimit.Profile, dc *DynamicConfig, throttled []*ratelimit.Rule, handler any) (*lease, error) {
	g := &generation{kind: kind, engines: engines, handler: handler, logger: ctx.Logger()}
	for i := range cfgs {
		if cfgs[i].Cluster == nil {
			continue
		}
		spec, err := newClusterSpec(ctx, kind, name, &cfgs[i], engines[i])
		if err != nil {
			return nil, err
		}
		g.clusters = append(g.clusters, spec)
	}
	var ctl *ratelimit.Dynamic
	if dc != nil {
		feed, err := provisionORCAFeed(kind, name, dc)
		if err != nil {
			return nil, err
		}
		ds, c, err := dc.build(throttled, ctx.Logger(), feed)
		if err != nil {
			if feed != nil {
				orcaFeeds.Delete(stateKey(kind, name))
			}
			return nil, err
		}
		g.dynamic, ctl = ds, c
	}
	l, err := acquire(ctx, kind, name, fp, ratelimit.Generation{
		Profiles: engines, Dynamic: ctl, Throttled: throttled, Payload: g,
	})
	if err != nil && g.dynamic != nil {
		g.dynamic.releaseORCA(kind, name)
	}
	return l, err
}

// provisionORCAFeed returns the feed of an HTTP handler or egress
// transport whose dynamic source is orca, or nil: layer 4 has no answer
// headers (dc.build then refuses the source).
func provisionORCAFeed(kind, name string, dc *DynamicConfig) (*orcaFeed, error) {
	if dc.Source != "orca" || kind == "layer4" {
		return nil, nil
	}
	p, err := dc.orcaPeriods("peer_rate_limit: ")
	if err != nil {
		return nil, err
	}
	return acquireORCAFeed(stateKey(kind, name), name, p)
}

// releaseORCA lets go of the generation's hold on its feed, once (a
// failed acquire has released its lease already).
func (ds *dynamicSettings) releaseORCA(kind, name string) {
	if ds.orca != nil && !ds.orcaReleased {
		ds.orcaReleased = true
		orcaFeeds.Delete(stateKey(kind, name))
	}
}
