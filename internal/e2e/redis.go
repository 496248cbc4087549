package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"
)

// RedisArgs are redis-server's arguments for a throwaway server on addr
// (host:port): no persistence, no protected mode, its files in dir. Use them
// with Topology.Start to run Redis in a namespace.
func RedisArgs(dir, addr string) []string {
	host, port, _ := net.SplitHostPort(addr)
	return []string{"--bind", host, "--port", port, "--dir", dir, "--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--loglevel", "warning"}
}

// StartRedis starts redis-server on a free loopback port and waits until it
// answers PING; it returns the process and its address. Stop it and start
// it again on the same address with StartRedisAt to test a store that goes
// down and comes back.
func StartRedis(t testing.TB) (*Proc, string) {
	t.Helper()
	addr := Addr(t)
	return StartRedisAt(t, t.TempDir(), addr), addr
}

// StartRedisAt starts redis-server on addr with its files in dir.
func StartRedisAt(t testing.TB, dir, addr string) *Proc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is needed (Debian package redis-server; make test installs it)")
	}
	p := Start(t, "redis", "redis-server", nil, RedisArgs(dir, addr)...)
	p.WaitFor(t, "redis PING", 30*time.Second, func() error { return RedisPing(addr) })
	return p
}

// RedisPing sends PING to addr and wants +PONG.
func RedisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
