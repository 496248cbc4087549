// Package tenantroute provides layer4.handlers.tenant_route: it routes a
// persistent LDAP connection to a node that holds its tenant (the seed's
// Helix routing layer). The tenant comes from the bind DN; placement is
// rendezvous top-k per tenant with least connections among the k
// (internal/placement); LDAP framing is internal/ldapwire.
package tenantroute

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/ldapwire"
	"github.com/edgesteer/edgesteer/internal/placement"
	"github.com/edgesteer/edgesteer/internal/relay"
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

	rule   *ldapwire.TenantRule
	logger *zap.Logger
	state  *state
	placer *placement.Placer // state's
	gen    any               // the config load that provisioned this handler
	// released is set by Cleanup; state stays set for connections still
	// relaying, which keep counting in it.
	released atomic.Bool
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

// Provision validates the configuration, then adopts the process state of
// its name (state.go) and applies its settings to it.
func (t *TenantRoute) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	if err := registerMetrics(ctx); err != nil {
		return err
	}
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
	if a := t.AutoPartitions; a != nil {
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
	}
	if t.MaxPerNode < 0 || t.MaxFailedBinds < 0 {
		return fmt.Errorf("tenant_route: max_per_node %d, max_failed_binds %d: must be at least 1", t.MaxPerNode, t.MaxFailedBinds)
	}
	if t.MaxFailedBinds == 0 {
		t.MaxFailedBinds = 3
	}
	if t.Name == "" {
		t.Name = defaultName(t)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		t.gen = reg // one per config load
	}
	if t.state, err = adopt(t); err != nil {
		return err
	}
	t.placer = t.state.placer
	return nil
}

// Cleanup lets go of the name's state: the old generation's Cleanup runs
// after the new one adopted it, so only the last user stops the etcd watch.
func (t *TenantRoute) Cleanup() error {
	if t.state != nil && !t.released.Swap(true) {
		t.state.release(t)
	}
	return nil
}

// tenant names the connection's tenant, from the Tenant placeholder or the
// first message's bind DN, and the rule later binds must keep to (nil: none).
func (t *TenantRoute) tenant(cx *layer4.Connection, first *ldapwire.Message) (string, *ldapwire.TenantRule, error) {
	if t.Tenant != "" {
		tenant := cx.Replacer().ReplaceAll(t.Tenant, "")
		if tenant == "" {
			return "", nil, fmt.Errorf("tenant_route: %s is empty for this connection", t.Tenant)
		}
		return tenant, nil, nil
	}
	if first.Op != "bind" || first.Anonymous {
		return "", nil, fmt.Errorf("tenant_route: first message is %s, not a named bind: route StartTLS and anonymous connections elsewhere", first.Op)
	}
	tenant, ok := t.rule.Tenant(first.BindDN)
	if !ok {
		return "", nil, fmt.Errorf("tenant_route: no tenant in bind DN %q", first.BindDN)
	}
	return tenant, t.rule, nil
}

// busyMessage is the diagnostic of a refusal at max_per_node.
const busyMessage = "every directory node of this tenant is at its connection limit; try again later"

// Handle reads the first message, finds the tenant, connects to its node
// and relays.
func (t *TenantRoute) Handle(cx *layer4.Connection, _ layer4.Handler) error {
	max := int64(t.MaxMessageLength)
	first, err := ldapwire.Read(cx, max)
	if err != nil {
		return fmt.Errorf("tenant_route: first message: %w", err)
	}
	tenant, rule, err := t.tenant(cx, first)
	if err != nil {
		return err
	}
	st := t.state
	if st.watcher.Load() != nil {
		st.seen.Touch(tenant) // its assignment is published (connect.go)
	}
	lease, up, err := t.connect(tenant, first)
	if errors.Is(err, placement.ErrBusy) {
		busyRefusals.WithLabelValues(t.Name).Inc()
		if ce := t.logger.Check(zap.DebugLevel, "every node of the tenant is at max_per_node: busy"); ce != nil {
			ce.Write(zap.String("tenant", tenant))
		}
		// LDAP busy (51): the client may try again later.
		if first.Op == "bind" {
			cx.Write(ldapwire.BindResponse(first.ID, ldapwire.ResultBusy, busyMessage))
		} else {
			cx.Write(ldapwire.NoticeOfDisconnection(ldapwire.ResultBusy, busyMessage))
		}
		return nil
	}
	if err != nil {
		// Tell the client why before caddy-l4 closes the connection.
		cx.Write(ldapwire.NoticeOfDisconnection(ldapwire.ResultUnavailable, "no directory node answered; try again"))
		return err
	}
	node := lease.Node
	st.connected.add(tenant, 1)
	routed.WithLabelValues(t.Name, node).Inc()
	repl := cx.Replacer()
	repl.Set("l4.tenant_route.tenant", tenant)
	repl.Set("l4.tenant_route.node", node)
	remote := cx.RemoteAddr()
	if ce := t.logger.Check(zap.DebugLevel, "routing"); ce != nil {
		ce.Write(zap.String("tenant", tenant), zap.String("node", node), zap.String("remote", remote.String()))
	}
	// end runs once the relay has ended (or could not start), and says
	// what the connection's end was.
	end := func(err error) error {
		up.Close()
		lease.Release(time.Now()) // the reservation made by the pick
		st.connected.add(tenant, -1)
		if rebind := (*ldapwire.RebindError)(nil); errors.As(err, &rebind) {
			refusedRebinds.WithLabelValues(t.Name).Inc()
			t.logger.Warn("bind to another tenant on a routed connection: closing it",
				zap.String("tenant", tenant), zap.String("bind_dn", rebind.BindDN))
			return fmt.Errorf("tenant_route: %w", err)
		}
		if errors.Is(err, net.ErrClosed) || errors.Is(err, ldapwire.ErrLastAnswer) || errors.Is(err, errNoHalfClose) {
			return nil
		}
		return err
	}

	// Only authenticated connections count as load: each BindResponse the
	// node sends says whether this one is (internal/placement.Lease), and
	// each later bind the client sends on a connection that stopped
	// counting must first be admitted on its node as a new connection is
	// (countingGuard). A successful bind after a successful bind changes
	// nothing and takes no lock: the relay calls onBind in the path of
	// every BindResponse, and a rebind as the same user is common (pooled
	// connections).
	failures := 0
	onBind := func(code int64) error {
		switch code {
		case ldapwire.ResultSuccess:
			lease.Bound(true, time.Now())
		case ldapwire.ResultSASLBindInProgress:
			lease.BindInProgress()
		default:
			lease.Bound(false, time.Now())
			failedBinds.WithLabelValues(t.Name).Inc()
			st.failed.Add(tenant)
			if failures++; failures >= t.MaxFailedBinds {
				failedBindCloses.WithLabelValues(t.Name).Inc()
				if ce := t.logger.Check(zap.InfoLevel, "closing a connection after max_failed_binds failed binds"); ce != nil {
					ce.Write(zap.String("tenant", tenant), zap.Int("failed_binds", failures), zap.String("remote", remote.String()))
				}
				return ldapwire.ErrLastAnswer // the client reads the answer, then the close
			}
		}
		return nil
	}
	if up.bindResult >= 0 {
		if onBind(up.bindResult) != nil {
			cx.Write(up.head)
			return end(nil)
		}
	} else if first.Op != "bind" {
		lease.Bound(true, time.Now()) // no bind to judge (tenant from a placeholder): counted
	}

	if len(up.head) > 0 { // the node's answer has begun
		if _, err := cx.Write(up.head); err != nil {
			return end(err)
		}
	}
	// Later messages are framed, and only BindRequests decoded, by the
	// guard; an idle connection holds no buffer (internal/relay). The ends
	// the relay writes to are wrapped (refuse.go): a bind refused at
	// admission goes to no node, and its answer to the client goes between
	// two of the node's messages.
	watcher := &ldapwire.BindWatcher{OnBind: onBind, MaxLen: max}
	if up.bindResult < 0 && len(up.head) > 0 {
		// The header of the answer to a first message that is not a
		// bind: the watcher frames the node's stream from its start.
		if n, err := watcher.Feed(up.head); err != nil || n != len(up.head) {
			return end(fmt.Errorf("tenant_route: the node's first answer: %d of %d bytes framed: %v", n, len(up.head), err))
		}
	}
	toClient := &clientConn{wrapped: wrapped{Conn: cx}, watcher: watcher, inside: !watcher.Between()}
	fromClient := &countingGuard{guard: ldapwire.TenantGuard{Rule: rule, Tenant: tenant, MaxLen: max}, lease: lease}
	fromClient.guard.Admit = func(id int64) error {
		fromClient.flush() // the messages before the bind count as the connection counted when they passed
		if lease.Admit(time.Now()) == nil {
			return nil
		}
		busyRefusals.WithLabelValues(t.Name).Inc()
		if ce := t.logger.Check(zap.DebugLevel, "the connection's node is at max_per_node: bind refused busy"); ce != nil {
			ce.Write(zap.String("tenant", tenant), zap.String("node", node), zap.String("remote", remote.String()))
		}
		if err := toClient.answer(ldapwire.BindResponse(id, ldapwire.ResultBusy, busyMessage)); err != nil {
			return err
		}
		return ldapwire.ErrRefused
	}
	client := relay.End{Conn: toClient, Filter: fromClient}
	node2client := relay.End{Conn: &nodeConn{wrapped: wrapped{Conn: up.Conn}, guard: &fromClient.guard}, Filter: watcher}
	if sock, ok := cx.Conn.(*net.TCPConn); ok && len(cx.MatchingBytes()) == 0 {
		// The bare socket, nothing read ahead: the relay takes it over
		// and this handler returns, so an idle connection holds no
		// goroutine, nor caddy-l4's buffers (README "Idle connections").
		if own, err := relay.Own(sock); err == nil {
			toClient.Conn = own
			if relay.Start(client, node2client, func(err error) {
				own.Close()
				if err := end(err); err != nil {
					t.logger.Error("handling connection", zap.String("remote", remote.String()), zap.Error(err))
				}
			}) {
				relays.WithLabelValues(t.Name, "handed_over").Inc()
				return nil // caddy-l4 closes its descriptor; the socket stays open through own
			}
			own.Close()
			toClient.Conn = cx
		}
	}
	client.Buffered = func() int { return len(cx.MatchingBytes()) } // bytes a matcher read ahead come first
	switch sc := cx.Conn.(type) {
	case *net.TCPConn:
		// The bare socket: cx adds only its read-ahead (Buffered), so
		// the relay reads the socket itself, one syscall per read.
		client.Socket, client.Direct = sc, true
		toClient.socket = sc
	case syscall.Conn:
		// A wrapper (proxy protocol, say) may hold bytes of its own:
		// wait on the socket, read through the wrapper.
		client.Socket = sc
		toClient.socket = sc
	}
	relays.WithLabelValues(t.Name, "in_place").Inc()
	return end(relay.Pipe(client, node2client))
}

// Interface guards
var (
	_ layer4.NextHandler    = (*TenantRoute)(nil)
	_ caddy.Provisioner     = (*TenantRoute)(nil)
	_ caddy.CleanerUpper    = (*TenantRoute)(nil)
	_ caddyfile.Unmarshaler = (*TenantRoute)(nil)
)
