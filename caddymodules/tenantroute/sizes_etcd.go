package tenantroute

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edgesteer/edgesteer/internal/placement"
)

// maxSizesRecv bounds one etcd answer read for sizes: values come from
// the store and are checked like network input.
const maxSizesRecv = 64 << 20

// startSizesEtcd lists the tenant sizes under e.SizesPrefix
// (<sizes_prefix><tenant> = decimal size), then watches the prefix and
// lists it again after a change (at most once a second). While etcd is
// unreachable, or the watch fails, the sizes read before stay in force and
// the listing is retried every second. Unlike a file, etcd down at load
// does not fail the config: it is a store, like the membership.
func startSizesEtcd(e *EtcdMembership, p *placement.Placer, logger *zap.Logger, changed func([]string)) (*sizesFeed, error) {
	b, _ := json.Marshal([]any{e.Endpoints, e.SizesPrefix})
	f := newSizesFeed("etcd:"+string(b), "etcd "+e.SizesPrefix, p, logger, changed)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 3 * time.Second, Logger: zap.NewNop(),
		MaxCallRecvMsgSize: maxSizesRecv})
	if err != nil {
		return nil, fmt.Errorf("tenant_route: etcd %v: %v", e.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.stopped
		cancel()
	}()
	go func() {
		defer close(f.done)
		defer cli.Close()
		for ctx.Err() == nil {
			err := f.etcdRound(ctx, cli, e.SizesPrefix)
			if ctx.Err() != nil {
				return
			}
			f.fail(err)
			if !f.sleep(time.Second) {
				return
			}
		}
	}()
	return f, nil
}

// etcdRound lists the prefix and takes it, then follows changes until the
// watch fails.
func (f *sizesFeed) etcdRound(ctx context.Context, cli *clientv3.Client, prefix string) error {
	rev, err := f.etcdList(ctx, cli, prefix)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	events := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	dirty := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-events:
		case <-tick.C:
			if dirty {
				if _, err := f.etcdList(ctx, cli, prefix); err != nil {
					return err
				}
				dirty = false
			}
			continue
		}
		if !ok {
			return fmt.Errorf("etcd watch of %s ended", prefix)
		}
		if err := resp.Err(); err != nil {
			return err
		}
		dirty = true
	}
}

// etcdList reads at most placement.MaxSizedTenants entries (one more to
// tell that there are more) and takes them.
func (f *sizesFeed) etcdList(ctx context.Context, cli *clientv3.Client, prefix string) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(gctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(placement.MaxSizedTenants+1))
	if err != nil {
		return 0, err
	}
	sizes := &placement.Sizes{Sizes: map[string]int64{}}
	for _, kv := range resp.Kvs {
		sizes.Add("key "+string(kv.Key), strings.TrimPrefix(string(kv.Key), prefix), strings.TrimSpace(string(kv.Value)))
	}
	f.take(sizes)
	return resp.Header.Revision, nil
}
