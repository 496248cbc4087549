package redisconn

import (
	"encoding/json"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The one client pool of the process: a go-redis client per (name,
// config), shared by every module and configuration generation that names
// it, Caddy's and CoreDNS's alike. A reload that keeps the config takes
// its reference before the old generation lets go, so it keeps the
// connections; the client closes when the last reference is released.
var pool = struct {
	sync.Mutex
	m map[string]*pooled
}{m: map[string]*pooled{}}

type pooled struct {
	client redis.UniversalClient
	refs   int
}

// Acquire returns the client of name and cfg (after FillDefaults and
// Validate), building it on first use, and the func that releases this
// reference (call it once).
func Acquire(name string, cfg *Config) (redis.UniversalClient, func(), error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	key := name + "\x00" + string(raw)
	pool.Lock()
	defer pool.Unlock()
	p := pool.m[key]
	if p == nil {
		c, err := New(cfg)
		if err != nil {
			return nil, nil, err
		}
		p = &pooled{client: c}
		pool.m[key] = p
	}
	p.refs++
	var once sync.Once
	return p.client, func() { once.Do(func() { release(key) }) }, nil
}

func release(key string) {
	pool.Lock()
	defer pool.Unlock()
	p := pool.m[key]
	if p == nil {
		return
	}
	if p.refs--; p.refs == 0 {
		delete(pool.m, key)
		p.client.Close()
	}
}

// Pooled is the number of clients the pool holds (for tests).
func Pooled() int {
	pool.Lock()
	defer pool.Unlock()
	return len(pool.m)
}
