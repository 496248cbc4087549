package tenantroute

import (
	"math"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/placement"
)

// UnmarshalCaddyfile reads
//
//	tenant_route {
//		name <name>
//		nodes <host:port...>
//		partitions <k>
//		tenant_partitions <tenant> <k>
//		tenant_rdn <attribute>          # default o
//		tenant <placeholder>            # instead: {l4.tls.server_name}, …
//		tenant_regexp <regexp>          # instead: its first capture group
//		dial_timeout <duration>
//		cool_off <duration>
//		first_response_timeout <duration>
//		max_message_length <bytes>
//		etcd <endpoint...> {
//			prefix <key prefix of node registrations>
//			assignment_prefix <key prefix to publish tenant → nodes>
//			sizes_prefix <key prefix of tenant → size>  # with partitions_by_size
//		}
//		auto_partitions {                 # at least one of the three triggers
//			target_per_node <connections>
//			share_factor <factor>           # ≥ 1
//			target_requests_per_node <requests per second>
//			max <k>                         # default: every member
//			cool_down <duration>            # default 5m
//		}
//		max_per_node <connections>
//		max_failed_binds <n>            # default 3
//		partitions_by_size <size:k...>  # e.g. 0:1 1000:2 10000:4
//		tenant_sizes_file <path>        # lines "tenant size" (or etcd sizes_prefix)
//	}
//
// nodes is a list (repeating it adds nodes) and tenant_partitions is given
// once per tenant; every other option once.
func (t *TenantRoute) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "tenant_route", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		switch o.Name() {
		case "name":
			t.Name, err = o.String()
		case "nodes":
			var more []string
			more, err = o.List()
			t.Nodes = append(t.Nodes, more...)
		case "partitions":
			t.Partitions, err = o.Int(1, math.MaxInt)
		case "tenant_partitions":
			err = t.unmarshalTenantPartitions(o)
		case "tenant":
			t.Tenant, err = o.String()
		case "tenant_rdn":
			t.TenantRDN, err = o.String()
		case "tenant_regexp":
			t.TenantRegexp, err = o.String()
		case "dial_timeout":
			t.DialTimeout, err = o.Duration(time.Nanosecond)
		case "cool_off":
			t.CoolOff, err = o.Duration(time.Nanosecond)
		case "first_response_timeout":
			t.FirstResponseTimeout, err = o.Duration(time.Nanosecond)
		case "max_message_length":
			t.MaxMessageLength, err = o.Int(1, math.MaxInt)
		case "etcd":
			t.Etcd, err = unmarshalEtcd(o)
		case "auto_partitions":
			t.AutoPartitions, err = unmarshalAuto(o)
		case "max_per_node":
			t.MaxPerNode, err = o.Int(1, math.MaxInt)
		case "max_failed_binds":
			t.MaxFailedBinds, err = o.Int(1, math.MaxInt)
		case "partitions_by_size":
			err = t.unmarshalSizeTable(o)
		case "tenant_sizes_file":
			t.TenantSizesFile, err = o.String()
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalTenantPartitions reads tenant_partitions <tenant> <k>.
func (t *TenantRoute) unmarshalTenantPartitions(o *cfparse.Block) error {
	args, err := o.Args(2, 2)
	if err != nil {
		return err
	}
	if err := o.OnceFor(args[0]); err != nil {
		return err
	}
	k, err := o.ParseInt(args[1], 1, math.MaxInt)
	if err != nil {
		return err
	}
	if t.TenantPartitions == nil {
		t.TenantPartitions = map[string]int{}
	}
	t.TenantPartitions[args[0]] = k
	return nil
}

// unmarshalSizeTable reads partitions_by_size <size:k...>.
func (t *TenantRoute) unmarshalSizeTable(o *cfparse.Block) error {
	if err := o.Once(); err != nil {
		return err
	}
	args, err := o.Args(1, cfparse.Many)
	if err != nil {
		return err
	}
	table, err := placement.ParseSizeTable(args)
	if err != nil {
		return o.Errf("partitions_by_size %s: %v", strings.Join(args, " "), err)
	}
	for _, s := range table {
		t.PartitionsBySize = append(t.PartitionsBySize, SizeStep(s))
	}
	return nil
}

// unmarshalEtcd reads etcd <endpoint...> { prefix …; assignment_prefix … }.
func unmarshalEtcd(o *cfparse.Block) (*EtcdMembership, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	endpoints, err := o.BlockArgs(1, cfparse.Many)
	if err != nil {
		return nil, err
	}
	e := &EtcdMembership{Endpoints: endpoints}
	for sub := o.Sub(); sub.Next(); {
		switch sub.Name() {
		case "prefix":
			e.Prefix, err = sub.String()
		case "assignment_prefix":
			e.AssignmentPrefix, err = sub.String()
		case "sizes_prefix":
			e.SizesPrefix, err = sub.String()
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	return e, nil
}

// unmarshalAuto reads auto_partitions { target_per_node …; share_factor …;
// target_requests_per_node …; max …; cool_down … }.
func unmarshalAuto(o *cfparse.Block) (*AutoPartitions, error) {
	if err := o.Once(); err != nil {
		return nil, err
	}
	if _, err := o.BlockArgs(0, 0); err != nil {
		return nil, err
	}
	a := &AutoPartitions{}
	var err error
	for sub := o.Sub(); sub.Next(); {
		switch sub.Name() {
		case "target_per_node":
			a.TargetPerNode, err = sub.Int(1, math.MaxInt)
		case "share_factor":
			a.ShareFactor, err = sub.Float(1, math.Inf(1))
		case "target_requests_per_node":
			a.TargetRequestsPerNode, err = sub.Float(0.001, math.Inf(1))
		case "max":
			a.Max, err = sub.Int(1, math.MaxInt)
		case "cool_down":
			a.CoolDown, err = sub.Duration(time.Nanosecond)
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	if a.TargetPerNode == 0 && a.ShareFactor == 0 && a.TargetRequestsPerNode == 0 {
		return nil, o.Errf("auto_partitions: give target_per_node, share_factor or target_requests_per_node (at least one)")
	}
	return a, nil
}
