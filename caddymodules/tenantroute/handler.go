// Package tenantroute provides layer4.handlers.tenant_route: it routes a
// persistent LDAP connection to a node that holds its tenant. As in
// Foxpass's LDAP service, each tenant lives on a few nodes only, so each
// node loads and caches few tenants' data, and a tenant's connections must
// reach one of its nodes. The tenant comes from the bind DN; placement is
// rendezvous top-k per tenant with least connections among the k
// (internal/placement); LDAP framing is internal/ldapwire.
package tenantroute

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
)

func init() {
	caddy.RegisterModule(&TenantRoute{})
}

// TenantRoute is a terminal handler: it connects the client to a node of
// its tenant and relays both ways.
//
// Tenant isolation: a later BindRequest on the same connection naming a
// different tenant never reaches the first tenant's node; the connection
// is closed (logged and counted) instead.
type TenantRoute struct {
	// Name keys the state that outlives a config reload (live connection
	// counts, run-time partition overrides, the etcd watch) and labels
	// metrics and the admin API. Default: "tenant_route-" and 8 hex digits
	// of a hash of the node list (or of the etcd endpoints and prefix).
	Name string `json:"name,omitempty"`
	// Nodes are the static members (host:port); with Etcd they are only
	// the starting set.
	Nodes []string `json:"nodes,omitempty"`
	// Etcd, if set, keeps the members in step with nodes registered in etcd.
	Etcd *EtcdMembership `json:"etcd,omitempty"`
	// Partitions per tenant (default 2); TenantPartitions overrides it for
	// some tenants.
	Partitions       int            `json:"partitions,omitempty"`
	TenantPartitions map[string]int `json:"tenant_partitions,omitempty"`
	// TenantRDN names the bind DN attribute holding the tenant (default
	// "o"); TenantRegexp instead takes its first capture group.
	TenantRDN    string `json:"tenant_rdn,omitempty"`
	TenantRegexp string `json:"tenant_regexp,omitempty"`
	// Tenant, instead, is a placeholder whose value names the tenant, such
	// as {l4.tls.server_name} behind caddy-l4's tls handler or
	// {l4.conn.local_addr} for a listener per tenant (with the ldap matcher
	// before it, {l4.ldap.*} too). The connection's first message may then
	// be any operation, and the tenant is fixed for the connection: later
	// binds are not checked against it.
	Tenant string `json:"tenant,omitempty"`
	// DialTimeout per node (default 3s); a node that fails is skipped for
	// CoolOff (default 30s).
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	CoolOff     caddy.Duration `json:"cool_off,omitempty"`
	// FirstResponseTimeout (default 5s) bounds the wait for a node to start
	// answering the connection's first message. A node that accepts and
	// then stays silent cools off like one that cannot be dialled, and the
	// message goes to the next node if it is a bind, search, compare or
	// StartTLS; otherwise the client is sent a Notice of Disconnection
	// (unavailable) and closed.
	FirstResponseTimeout caddy.Duration `json:"first_response_timeout,omitempty"`
	// MaxMessageLength bounds a client message (default 65536).
	MaxMessageLength int `json:"max_message_length,omitempty"`
	// AutoPartitions, if set, makes each tenant's partition count follow
	// its authenticated load (internal/placement.Auto states the rule).
	AutoPartitions *AutoPartitions `json:"auto_partitions,omitempty"`
	// MaxPerNode caps the connections through this router on one node
	// (0: none). A tenant whose nodes are all full grows (auto_partitions)
	// or its connection is refused with LDAP busy (51).
	MaxPerNode int `json:"max_per_node,omitempty"`
	// MaxFailedBinds closes a connection after this many failed binds
	// (default 3).
	MaxFailedBinds int `json:"max_failed_binds,omitempty"`
	// PartitionsBySize maps a tenant's size (users, or any weight) to its
	// base partition count; TenantSizesFile holds the sizes, one "tenant
	// size" a line, and is read again when it changes (or Etcd.SizesPrefix
	// holds them). The table with one source of sizes, or neither.
	// tenant_partitions and run-time counts win over a size; auto
	// partitions grow from the base (README: Partitions from a tenant's size).
	PartitionsBySize []SizeStep `json:"partitions_by_size,omitempty"`
	TenantSizesFile  string     `json:"tenant_sizes_file,omitempty"`

	rule   *ldapwire.TenantRule
	logger *zap.Logger
	state  *state
	placer *placement.Placer // state's
	gen    any               // the config load that provisioned this handler
	// released is set by Cleanup; state stays set for connections still
	// relaying, which keep counting in it.
	released atomic.Bool
}

// SizeStep gives Partitions to tenants of at least MinSize.
type SizeStep struct {
	MinSize    int64 `json:"min_size"`
	Partitions int   `json:"partitions"`
}

// AutoPartitions grows a tenant's partitions while its connections per
// node exceed TargetPerNode, its share of all connections exceeds its
// share of nodes by ShareFactor, or its client messages per second per
// node exceed TargetRequestsPerNode (each optional, at least one given),
// up to Max (0: every member), and shrinks them one step after every
// given signal stayed below half its threshold for CoolDown.
type AutoPartitions struct {
	TargetPerNode         int            `json:"target_per_node,omitempty"`
	ShareFactor           float64        `json:"share_factor,omitempty"`
	TargetRequestsPerNode float64        `json:"target_requests_per_node,omitempty"`
	Max                   int            `json:"max,omitempty"`
	CoolDown              caddy.Duration `json:"cool_down,omitempty"` // default 5m
}

// CaddyModule returns the Caddy module information.
func (*TenantRoute) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.tenant_route",
		New: func() caddy.Module { return new(TenantRoute) },
	}
}

// Cleanup lets go of the name's state: the old generation's Cleanup runs
// after the new one adopted it, so only the last user stops the etcd watch.
func (t *TenantRoute) Cleanup() error {
	if t.state != nil && !t.released.Swap(true) {
		t.state.release(t)
	}
	return nil
}

// Handle reads the first message, finds the tenant, connects to one of its
// nodes (connect.go), judges the first bind (account.go) and relays
// (handover.go).
func (t *TenantRoute) Handle(cx *layer4.Connection, _ layer4.Handler) error {
	first, err := ldapwire.Read(cx, int64(t.MaxMessageLength))
	if err != nil {
		return fmt.Errorf("tenant_route: first message: %w", err)
	}
	tenant, rule, err := t.tenant(cx, first)
	if err != nil {
		return err
	}
	if t.state.watcher.Load() != nil {
		t.state.seen.Touch(tenant) // its assignment is published (connect.go)
	}
	lease, up, err := t.connect(tenant, first)
	if errors.Is(err, placement.ErrBusy) {
		t.refuseBusy(cx, tenant, first)
		return nil
	}
	if err != nil {
		// Tell the client why before caddy-l4 closes the connection.
		cx.Write(ldapwire.NoticeOfDisconnection(ldapwire.ResultUnavailable, "no directory node answered; try again"))
		return err
	}
	c := t.route(cx, tenant, lease, up)
	if c.accountFirst(first) {
		cx.Write(up.head) // the failed bind's answer, then the close
		return c.finish(nil)
	}
	return c.relay(rule)
}

// Interface guards
var (
	_ layer4.NextHandler    = (*TenantRoute)(nil)
	_ caddy.Provisioner     = (*TenantRoute)(nil)
	_ caddy.CleanerUpper    = (*TenantRoute)(nil)
	_ caddyfile.Unmarshaler = (*TenantRoute)(nil)
)
