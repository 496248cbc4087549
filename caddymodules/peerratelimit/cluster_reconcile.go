package peerratelimit

import (
	"errors"
	"fmt"

	"github.com/edgesteer/edgesteer/internal/monoclock"
	"github.com/edgesteer/edgesteer/internal/quota"
	"github.com/edgesteer/edgesteer/internal/quotaredis"
)

// reconcileClusters follows the attached generations (newest last): every
// profile with a cluster block in the newest generation that has it gets
// its cluster, updated to that generation's settings; a profile that no
// attached generation limits cluster-wide any more has its cluster
// stopped. The engines of gens get the cluster as their overall Allower.
func (hs *handlerState) reconcileClusters(gens []*generation) error {
	newest := map[string]*clusterSpec{}
	for _, g := range gens {
		for _, s := range g.clusters {
			newest[s.profile] = s
		}
	}
	var errs []error
	for name, spec := range newest {
		c := hs.clusters[name]
		if c == nil {
			var err error
			if c, err = newCluster(hs.ctx, hs.name, spec); err != nil {
				errs = append(errs, err)
				continue
			}
			hs.clusters[name] = c
		} else if err := c.update(spec); err != nil {
			errs = append(errs, err)
			continue
		}
	}
	for name, c := range hs.clusters {
		if newest[name] == nil {
			c.stop()
			delete(hs.clusters, name)
		}
	}
	for _, g := range gens {
		for _, e := range g.engines {
			// An engine in use already has its cluster (the same one for
			// as long as a generation has it): only new engines are set.
			if c := hs.clusters[e.Name]; c != nil && g.hasCluster(e.Name) && e.Global() == nil {
				for _, mq := range c.messages() {
					if e.Message(mq.name) != nil {
						e.SetMessageGlobal(mq.name, mq)
					}
				}
				e.SetGlobal(c)
			}
		}
	}
	return errors.Join(errs...)
}

// hasCluster reports whether the generation limits profile cluster-wide.
func (g *generation) hasCluster(profile string) bool {
	for _, s := range g.clusters {
		if s.profile == profile {
			return true
		}
	}
	return false
}

// update applies a newer (or, after a failed load, the remaining newest)
// generation's settings: the same quota when its config is unchanged
// (only the store's client may differ), a new one otherwise (the shares
// start at the floor again and are proportional from the next sync).
// Nothing changes unless every new quota could be made: a spec that
// failed is tried again in full when it comes back.
func (c *cluster) update(spec *clusterSpec) error {
	old := c.spec.Load()
	var q *quota.Quota
	if old.cfg != spec.cfg {
		var err error
		if q, err = quota.New(spec.cfg, quotaredis.New(spec.conn.Client)); err != nil {
			return fmt.Errorf("peer_rate_limit: profile %s: cluster: %v", spec.profile, err)
		}
	}
	if err := c.updateMessages(old, spec); err != nil {
		return err
	}
	c.spec.Store(spec)
	if q != nil {
		c.q.Store(q)
	} else if old.conn.Client != spec.conn.Client {
		// The quota keeps its shares; only the client changes.
		c.q.Load().SetStore(quotaredis.New(spec.conn.Client))
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// updateMessages follows spec's message types: a type whose quota config
// is unchanged keeps its quota (only the store's client may change), a
// changed one gets a new quota, a new type a new msgQuota; a type spec no
// longer has is dropped. Every new quota is made before anything changes,
// so an error leaves the cluster as it was.
func (c *cluster) updateMessages(old, spec *clusterSpec) error {
	cur := *c.msgs.Load()
	fresh := map[string]*quota.Quota{}
	for _, ms := range spec.messages {
		name := ms.rule.Name
		if cur[name] != nil && old != nil && old.messageCfg(name) == ms.cfg {
			continue
		}
		q, err := quota.New(ms.cfg, quotaredis.New(spec.conn.Client))
		if err != nil {
			return fmt.Errorf("peer_rate_limit: profile %s: message %s: cluster: %v", spec.profile, name, err)
		}
		fresh[name] = q
	}
	next := make(map[string]*msgQuota, len(spec.messages))
	for _, ms := range spec.messages {
		name := ms.rule.Name
		mq := cur[name]
		if mq == nil {
			mq = &msgQuota{name: name}
		}
		if q := fresh[name]; q != nil {
			mq.q.Store(q)
		} else if old.conn.Client != spec.conn.Client {
			mq.q.Load().SetStore(quotaredis.New(spec.conn.Client))
		}
		mq.rule.Store(ms.rule)
		next[name] = mq
	}
	c.msgs.Store(&next)
	return nil
}

// applyClusterThrottle passes a new dynamic level on at once (the sync
// loop would at its next sync).
func (hs *handlerState) applyClusterThrottle() {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	now := monoclock.Now()
	for _, c := range hs.clusters {
		c.applyThrottle(now)
	}
}

// clusterOf returns the profile's cluster, if any.
func (hs *handlerState) clusterOf(profile string) *cluster {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.clusters[profile]
}
