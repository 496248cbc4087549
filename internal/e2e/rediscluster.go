package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of masters on loopback, each its own
// redis-server, with the slots spread by redis-cli --cluster create.
type RedisCluster struct {
	Addrs []string
	Procs []*Proc
}

// StartRedisCluster starts n (at least 3) cluster-enabled redis-servers
// and joins them into one cluster of n masters; it returns once every
// node reports cluster_state:ok.
func StartRedisCluster(t testing.TB, n int) *RedisCluster { return startRedisCluster(t, n, 0) }

// StartReplicatedRedisCluster starts a cluster of masters (at least 3),
// each with one replica (2 × masters redis-servers), so that a master's
// death is a shard failover: the cluster promotes its replica after the
// node timeout (2 s). Addrs lists every node, masters and replicas.
func StartReplicatedRedisCluster(t testing.TB, masters int) *RedisCluster {
	return startRedisCluster(t, masters, 1)
}

func startRedisCluster(t testing.TB, n, replicas int) *RedisCluster {
	t.Helper()
	SkipShort(t)
	if n < 3 {
		t.Fatalf("a Redis Cluster needs 3 masters, got %d", n)
	}
	rc := &RedisCluster{}
	for i := 0; i < n*(1+replicas); i++ {
		addr := Addr(t)
		dir := t.TempDir()
		args := append(RedisArgs(dir, addr), "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "2000")
		p := Start(t, fmt.Sprintf("redis-cluster-%d", i), "redis-server", nil, args...)
		p.WaitFor(t, "redis PING", 30*time.Second, func() error { return RedisPing(addr) })
		rc.Addrs, rc.Procs = append(rc.Addrs, addr), append(rc.Procs, p)
	}
	create := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, rc.Addrs...),
		"--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range rc.Addrs {
		waitRedis(t, a, "cluster_state:ok", func(c *redis.Client) (string, error) {
			return c.ClusterInfo(context.Background()).Result()
		})
	}
	if replicas > 0 { // every replica has synced with its master
		for _, a := range rc.Addrs {
			waitRedis(t, a, "", func(c *redis.Client) (string, error) {
				info, err := c.Info(context.Background(), "replication").Result()
				if err == nil && strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
					err = fmt.Errorf("replica not in sync yet")
				}
				return info, err
			})
		}
	}
	return rc
}

// MasterOf returns the index in Addrs of the master that serves key's
// slot.
func (rc *RedisCluster) MasterOf(t testing.TB, key string) int {
	t.Helper()
	// A node can miss a call on a loaded host, or answer while a view is
	// still settling: ask again for a while before giving up.
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		i, err := rc.masterOf(key)
		if err == nil {
			return i
		}
		last = err
	}
	t.Fatalf("no live node of the cluster names the master of %q: %v", key, last)
	return -1
}

func (rc *RedisCluster) masterOf(key string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := errors.New("every node has exited")
	for _, a := range rc.Addrs {
		if rc.Procs[rc.index(a)].Exited() {
			continue
		}
		c := redisClient(a)
		defer c.Close()
		slot, e := c.ClusterKeySlot(ctx, key).Result()
		if e != nil {
			err = fmt.Errorf("%s: CLUSTER KEYSLOT: %w", a, e)
			continue
		}
		// CLUSTER SLOTS names each range's master first, on Redis 6 as on 7;
		// CLUSTER SHARDS (7.0 on) would have to be read by role.
		//lint:ignore SA1019 deprecated for Redis 7 clients, still served and exact here
		slots, e := c.ClusterSlots(ctx).Result()
		if e != nil {
			err = fmt.Errorf("%s: CLUSTER SLOTS: %w", a, e)
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				if i := rc.index(r.Nodes[0].Addr); i >= 0 {
					return i, nil
				}
				err = fmt.Errorf("%s: slot %d's master %s is not a node of this cluster", a, slot, r.Nodes[0].Addr)
			}
		}
	}
	return -1, err
}

func (rc *RedisCluster) index(addr string) int {
	for i, a := range rc.Addrs {
		if a == addr {
			return i
		}
	}
	return -1
}

// FailMaster kills (SIGKILL) the master that serves key's slot and waits
// until another node serves the slot (its replica, promoted after the
// node timeout) and the survivors report cluster_state:ok. It returns
// the index of the dead node.
func (rc *RedisCluster) FailMaster(t testing.TB, key string) int {
	t.Helper()
	dead := rc.MasterOf(t, key)
	rc.Procs[dead].Kill()
	deadline := time.Now().Add(60 * time.Second)
	for rc.MasterOf(t, key) == dead {
		if time.Now().After(deadline) {
			t.Fatalf("no replica took over %q's slot from %s", key, rc.Addrs[dead])
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, a := range rc.Addrs {
		if i != dead {
			waitRedis(t, a, "cluster_state:ok", func(c *redis.Client) (string, error) {
				return c.ClusterInfo(context.Background()).Result()
			})
		}
	}
	return dead
}

// Sentinel is a Redis master, one replica of it and one Sentinel that
// watches them under the master name Master.
type Sentinel struct {
	Master               string
	MasterAddr, ReplAddr string
	SentinelAddr         string
	MasterProc, ReplProc *Proc
	SentinelProc         *Proc
}

// StartSentinel starts a master, a replica (replicaof the master) and a
// Sentinel (quorum 1, down-after 1 s): Debian's redis-sentinel (package
// redis-sentinel, which make test installs). It returns once the Sentinel
// knows the master and its replica.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	SkipShort(t)
	s := &Sentinel{Master: "edgesteer-test"}
	var dir string
	s.MasterProc, s.MasterAddr = StartRedis(t)
	s.ReplAddr, dir = Addr(t), t.TempDir()
	mhost, mport := splitAddr(s.MasterAddr)
	s.ReplProc = Start(t, "redis-replica", "redis-server", nil, append(RedisArgs(dir, s.ReplAddr), "--replicaof", mhost, mport)...)
	waitRedis(t, s.ReplAddr, "master_link_status:up", func(c *redis.Client) (string, error) {
		return c.Info(context.Background(), "replication").Result()
	})
	s.SentinelAddr = Addr(t)
	shost, sport := splitAddr(s.SentinelAddr)
	conf := filepath.Join(t.TempDir(), "sentinel.conf") // Sentinel rewrites it: its own directory
	body := fmt.Sprintf("port %s\nbind %s\nprotected-mode no\ndaemonize no\nsentinel resolve-hostnames no\n"+
		"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %[3]s 1000\nsentinel failover-timeout %[3]s 5000\n",
		sport, shost, s.Master, mhost, mport)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		t.Fatal("redis-sentinel is needed (Debian package redis-sentinel; make test installs it)")
	}
	s.SentinelProc = Start(t, "redis-sentinel", "redis-sentinel", nil, conf)
	waitRedis(t, s.SentinelAddr, "num-slaves", func(c *redis.Client) (string, error) {
		m, err := c.Do(context.Background(), "SENTINEL", "MASTER", s.Master).StringSlice()
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == "num-slaves" && m[i+1] != "0" {
				return "num-slaves", err
			}
		}
		return fmt.Sprint(m), err
	})
	return s
}

// Failover asks the Sentinel to promote the replica and waits until the
// Sentinel names the replica as the master and the old master has become
// its replica (writes the old master took before that are lost: Redis'
// replication is asynchronous).
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.SentinelAddr, Protocol: 2})
	defer c.Close()
	// Sentinel refuses with NOGOODSLAVE until it has the replica's INFO
	// (it asks every 10 s at first): try again until then.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := c.Do(context.Background(), "SENTINEL", "FAILOVER", s.Master).Err()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(deadline) {
			t.Fatalf("SENTINEL FAILOVER: %v", err)
		}
	}
	waitRedis(t, s.SentinelAddr, s.ReplAddr, func(c *redis.Client) (string, error) {
		a, err := c.Do(context.Background(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master).StringSlice()
		return strings.Join(a, ":"), err
	})
	waitRedis(t, s.MasterAddr, "role:slave", func(c *redis.Client) (string, error) {
		return c.Info(context.Background(), "replication").Result()
	})
}

// waitRedis polls addr with ask until its answer contains want (30 s).
func waitRedis(t testing.TB, addr, want string, ask func(*redis.Client) (string, error)) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2}) // RESP2: SENTINEL answers as flat lists
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := ask(c)
		if err == nil && strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis %s: waiting for %q: %v %q", addr, want, err, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func splitAddr(addr string) (string, string) {
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}

// redisClient is a plain client of one server, closed with the process.
func redisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
}
