package redisconn

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

// TestClassifyRealErrors drives a real redis-server into each kind of answer
// a module meets and checks what Classify and Reason make of it: a store
// that refuses part of the keys (ACL), a full one (maxmemory noeviction), a
// paused one (timeout), one that is not there, and values that are not the
// module's (WRONGTYPE, a hash field that is not an integer).
func TestClassifyRealErrors(t *testing.T) {
	e2e.SkipShort(t)
	_, addr := e2e.StartRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.Do(ctx, "ACL", "SETUSER", "part", "on", ">pw", "~allowed:*", "+@all").Err())
	must(admin.Set(ctx, "allowed:str", "x", 0).Err())
	must(admin.HSet(ctx, "allowed:h", "a", "garbage").Err())

	part := redis.NewClient(&redis.Options{Addr: addr, Username: "part", Password: "pw", MaxRetries: -1})
	defer part.Close()
	wrongpw := redis.NewClient(&redis.Options{Addr: addr, Username: "part", Password: "nope", MaxRetries: -1})
	defer wrongpw.Close()
	short := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer short.Close()
	gone := redis.NewClient(&redis.Options{Addr: e2e.ClosingListener(t), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer gone.Close()

	type want struct {
		kind   Kind
		reason string
	}
	check := func(what string, err error, w want) {
		t.Helper()
		if k, r := Classify(err), Reason(err); k != w.kind || r != w.reason {
			t.Errorf("%s: error %v classified %v/%q, want %v/%q", what, err, k, r, w.kind, w.reason)
		}
		if r := Reason(err); r != "" && !slices.Contains(Reasons, r) {
			t.Errorf("%s: reason %q is not in Reasons", what, r)
		}
	}
	check("GET of a missing key", part.Get(ctx, "allowed:none").Err(), want{NotFound, ""})
	check("GET allowed", part.Get(ctx, "allowed:str").Err(), want{OK, ""})
	check("HINCRBY on a string", part.HIncrBy(ctx, "allowed:str", "a", 1).Err(), want{Malformed, ""})
	check("HINCRBY on a garbage field", part.HIncrBy(ctx, "allowed:h", "a", 1).Err(), want{Malformed, ""})
	check("a script's HINCRBY on a string", part.Eval(ctx, "return redis.call('HINCRBY', KEYS[1], 'a', 1)",
		[]string{"allowed:str"}).Err(), want{Malformed, ""})
	check("HINCRBY outside the ACL's keys", part.HIncrBy(ctx, "other:h", "a", 1).Err(), want{Trouble, "noperm"})
	check("wrong password", wrongpw.Ping(ctx).Err(), want{Trouble, "noauth"})
	check("a caller's parse", fmt.Errorf("%w: field a %q", ErrMalformed, "x"), want{Malformed, ""})

	// One pipeline with commands inside and outside the ACL: each
	// command's own error says which keys are in trouble.
	pipe := part.Pipeline()
	in := pipe.HIncrBy(ctx, "allowed:p", "a", 1)
	out := pipe.HIncrBy(ctx, "other:p", "a", 1)
	_, err := pipe.Exec(ctx)
	check("pipeline's first error", err, want{Trouble, "noperm"})
	check("pipeline, allowed key", in.Err(), want{OK, ""})
	check("pipeline, refused key", out.Err(), want{Trouble, "noperm"})

	must(admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	must(admin.ConfigSet(ctx, "maxmemory", "1").Err())
	check("write over maxmemory", part.Set(ctx, "allowed:big", strings.Repeat("x", 1000), 0).Err(), want{Trouble, "oom"})
	must(admin.ConfigSet(ctx, "maxmemory", "0").Err())

	must(admin.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err())
	check("paused server", short.Get(ctx, "allowed:str").Err(), want{Trouble, "timeout"})
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	check("caller's deadline", short.Get(cctx, "allowed:str").Err(), want{Trouble, "timeout"})
	cancel()

	check("closed connection", gone.Ping(ctx).Err(), want{Trouble, "reset"})
	short.Close()
	check("closed client", short.Ping(ctx).Err(), want{Trouble, "closed"})
	if _, err := exec.LookPath("redis-server"); err == nil {
		refused := redis.NewClient(&redis.Options{Addr: e2e.Addr(t), MaxRetries: -1})
		defer refused.Close()
		check("nothing listening", refused.Ping(ctx).Err(), want{Trouble, "refused"})
	}
}

// TestClassifyReplies reads error replies as each Redis version words
// them, a script's failed call included: Redis 6 wraps it in one ERR, whose
// text still says what failed; Redis 7 passes the call's own reply through.
func TestClassifyReplies(t *testing.T) {
	const sha = "f_2e3f5ad2d6d2c8a9b7e3bfb0f0c1a8a4e1b9c7d2"
	for _, c := range []struct {
		reply  string
		kind   Kind
		reason string
	}{
		{"WRONGTYPE Operation against a key holding the wrong kind of value", Malformed, ""},
		{"WRONGTYPE Operation against a key holding the wrong kind of value script: 2e3f5ad2, on @user_script:1.", Malformed, ""},
		{"ERR Error running script (call to " + sha + "): @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value", Malformed, ""},
		{"ERR Error running script (call to " + sha + "): @user_script:3: ERR hash value is not an integer", Malformed, ""},
		{"ERR value is not an integer or out of range", Malformed, ""},
		// Redis before 2.6 had no WRONGTYPE word.
		{"ERR Operation against a key holding the wrong kind of value", Malformed, ""},
		// Other script failures are the store's trouble, not the value's.
		{"ERR Error running script (call to " + sha + "): @user_script:1: @user_script: 1: The user executing the script can't access at least one of the keys mentioned in the command", Trouble, "error_reply"},
		{"ERR Error running script (call to " + sha + "): @user_script:1: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'.", Trouble, "error_reply"},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", Trouble, "noperm"},
		{"ERR unknown command 'GETEX'", Trouble, "error_reply"},
	} {
		for _, err := range []error{replyErr(c.reply), fmt.Errorf("store: %w", replyErr(c.reply))} {
			if k, r := Classify(err), Reason(err); k != c.kind || r != c.reason {
				t.Errorf("%v: classified %v/%q, want %v/%q", err, k, r, c.kind, c.reason)
			}
		}
	}
}

// TestAcquireSharesOneClient: one client per (name, config), released with
// its last reference; another name or config is another client.
func TestAcquireSharesOneClient(t *testing.T) {
	cfg := &Config{Addresses: []string{"127.0.0.1:1"}}
	cfg.FillDefaults()
	before := Pooled()
	c1, r1, err := Acquire("a", cfg)
	if err != nil {
		t.Fatal(err)
	}
	c2, r2, _ := Acquire("a", cfg)
	other := *cfg
	other.KeyPrefix = "x"
	c3, r3, _ := Acquire("a", &other)
	c4, r4, _ := Acquire("b", cfg)
	if c1 != c2 || c1 == c3 || c1 == c4 {
		t.Fatalf("same name and config must share one client, others not: %p %p %p %p", c1, c2, c3, c4)
	}
	if n := Pooled() - before; n != 3 {
		t.Fatalf("pool holds %d new clients, want 3", n)
	}
	r1()
	r1() // twice is once
	if err := c2.Ping(context.Background()).Err(); err != nil && strings.Contains(err.Error(), "closed") {
		t.Fatalf("client closed while a reference is held: %v", err)
	}
	r2()
	if err := c1.Ping(context.Background()).Err(); err != redis.ErrClosed {
		t.Fatalf("client after its last release: %v, want closed", err)
	}
	r3()
	r4()
	if n := Pooled(); n != before {
		t.Fatalf("pool holds %d clients after every release, want %d", n, before)
	}
}

// BenchmarkClassify is the classification each command's result gets:
// no error, a missing key, an error reply, a timeout.
func BenchmarkClassify(b *testing.B) {
	for _, c := range []struct {
		name string
		err  error
		want Kind
	}{
		{"ok", nil, OK},
		{"not_found", redis.Nil, NotFound},
		{"noperm", noperm(), Trouble},
		{"timeout", context.DeadlineExceeded, Trouble},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if Classify(c.err) != c.want {
					b.Fatal(c.name)
				}
			}
		})
	}
}

// replyErr is an error reply as go-redis returns it (a redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func noperm() error {
	return replyErr("NOPERM User part has no permissions to access one of the keys used as arguments")
}
