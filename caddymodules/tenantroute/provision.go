package tenantroute

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
)

// Provision checks the configuration and fills its defaults, step by step
// in the order of the options' documentation, then adopts the process
// state of its name (state.go) and applies its settings to it.
func (t *TenantRoute) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	if err := registerMetrics(ctx); err != nil {
		return err
	}
	for _, step := range []func() error{
		t.provisionMembership,
		t.provisionPartitions,
		t.provisionTenantRule,
		t.provisionTimeouts,
		t.AutoPartitions.provision,
		t.provisionLimits,
		t.provisionSizes,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	if t.Name == "" {
		t.Name = defaultName(t)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		t.gen = reg // one per config load
	}
	var err error
	if t.state, err = adopt(t); err != nil {
		return err
	}
	t.placer = t.state.placer
	return nil
}

// provisionMembership checks the static nodes and the etcd settings.
func (t *TenantRoute) provisionMembership() error {
	if len(t.Nodes) == 0 && t.Etcd == nil {
		return errors.New("tenant_route: no nodes (list them, or configure etcd membership)")
	}
	for _, n := range t.Nodes {
		if _, _, err := net.SplitHostPort(n); err != nil {
			return fmt.Errorf("tenant_route: node %q: want host:port", n)
		}
	}
	if t.Etcd != nil && (len(t.Etcd.Endpoints) == 0 || t.Etcd.Prefix == "") {
		return errors.New("tenant_route: etcd membership needs endpoints and a prefix")
	}
	if e := t.Etcd; e != nil && e.AssignmentPrefix != "" &&
		(strings.HasPrefix(e.AssignmentPrefix, e.Prefix) || strings.HasPrefix(e.Prefix, e.AssignmentPrefix)) {
		// Assignments under the members' prefix would read as members.
		return fmt.Errorf("tenant_route: etcd assignment_prefix %q overlaps prefix %q", e.AssignmentPrefix, e.Prefix)
	}
	if e := t.Etcd; e != nil && e.SizesPrefix != "" {
		for name, other := range map[string]string{"prefix": e.Prefix, "assignment_prefix": e.AssignmentPrefix} {
			if other != "" && (strings.HasPrefix(e.SizesPrefix, other) || strings.HasPrefix(other, e.SizesPrefix)) {
				return fmt.Errorf("tenant_route: etcd sizes_prefix %q overlaps %s %q", e.SizesPrefix, name, other)
			}
		}
	}
	return nil
}

// provisionPartitions defaults and checks the partition counts.
func (t *TenantRoute) provisionPartitions() error {
	if t.Partitions == 0 {
		t.Partitions = 2
	}
	if t.Partitions < 1 {
		return fmt.Errorf("tenant_route: partitions %d: must be at least 1", t.Partitions)
	}
	for tenant, k := range t.TenantPartitions {
		if k < 1 {
			return fmt.Errorf("tenant_route: tenant_partitions %s %d: must be at least 1", tenant, k)
		}
	}
	return nil
}

// provisionTenantRule checks where the tenant comes from and compiles the
// bind DN rule (default: the "o" attribute).
func (t *TenantRoute) provisionTenantRule() error {
	if t.Tenant != "" && (!strings.Contains(t.Tenant, "{") || t.TenantRDN != "" || t.TenantRegexp != "") {
		return fmt.Errorf("tenant_route: tenant %q: want a placeholder such as {l4.tls.server_name}, "+
			"instead of tenant_rdn or tenant_regexp", t.Tenant)
	}
	rdn := t.TenantRDN
	if rdn == "" && t.TenantRegexp == "" {
		rdn = "o"
	}
	var err error
	if t.rule, err = ldapwire.NewTenantRule(rdn, t.TenantRegexp); err != nil {
		return fmt.Errorf("tenant_route: %v", err)
	}
	return nil
}

// provisionTimeouts checks and defaults the timeouts and the message
// length bound.
func (t *TenantRoute) provisionTimeouts() error {
	if t.DialTimeout < 0 || t.CoolOff < 0 || t.MaxMessageLength < 0 || t.FirstResponseTimeout < 0 {
		return errors.New("tenant_route: dial_timeout, cool_off, first_response_timeout and max_message_length must be positive")
	}
	if t.DialTimeout == 0 {
		t.DialTimeout = caddy.Duration(3 * time.Second)
	}
	if t.FirstResponseTimeout == 0 {
		t.FirstResponseTimeout = caddy.Duration(5 * time.Second)
	}
	if t.CoolOff == 0 {
		t.CoolOff = caddy.Duration(30 * time.Second)
	}
	if t.MaxMessageLength == 0 {
		t.MaxMessageLength = ldapwire.DefaultMaxLength
	}
	return nil
}

// provision defaults and checks auto partitions, if configured (a is nil
// otherwise).
func (a *AutoPartitions) provision() error {
	if a == nil {
		return nil
	}
	if a.CoolDown == 0 {
		a.CoolDown = caddy.Duration(5 * time.Minute)
	}
	switch {
	case a.TargetPerNode < 0:
		return fmt.Errorf("tenant_route: auto_partitions target_per_node %d: must be at least 1", a.TargetPerNode)
	case a.ShareFactor != 0 && !(a.ShareFactor >= 1 && a.ShareFactor <= math.MaxFloat64):
		return fmt.Errorf("tenant_route: auto_partitions share_factor %g: must be at least 1", a.ShareFactor)
	case a.TargetRequestsPerNode < 0 || a.TargetRequestsPerNode > math.MaxFloat64:
		return fmt.Errorf("tenant_route: auto_partitions target_requests_per_node %g: must be positive", a.TargetRequestsPerNode)
	case a.TargetPerNode == 0 && a.ShareFactor == 0 && a.TargetRequestsPerNode == 0:
		return errors.New("tenant_route: auto_partitions: give target_per_node, share_factor or target_requests_per_node (at least one)")
	case a.Max < 0:
		return fmt.Errorf("tenant_route: auto_partitions max %d: must be at least 1", a.Max)
	case a.CoolDown < 0:
		return fmt.Errorf("tenant_route: auto_partitions cool_down %v: must be positive", time.Duration(a.CoolDown))
	}
	return nil
}

// provisionLimits checks max_per_node and defaults max_failed_binds.
func (t *TenantRoute) provisionLimits() error {
	if t.MaxPerNode < 0 || t.MaxFailedBinds < 0 {
		return fmt.Errorf("tenant_route: max_per_node %d, max_failed_binds %d: must be at least 1", t.MaxPerNode, t.MaxFailedBinds)
	}
	if t.MaxFailedBinds == 0 {
		t.MaxFailedBinds = 3
	}
	return nil
}
