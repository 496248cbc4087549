package redisconn

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgesteer/edgesteer/internal/e2e"
)

func TestSetAndValidate(t *testing.T) {
	for _, tc := range []struct {
		lines [][]string // option, args...
		want  string     // error substring; "" = valid
	}{
		{[][]string{{"address", "127.0.0.1:6379"}}, ""},
		{[][]string{{"address", "a:1", "b:2"}, {"address", "c:3"}, {"read_timeout", "50ms"}, {"key_prefix", "es"}}, ""},
		{[][]string{{"address", "a:1"}, {"sentinel_master", "m"}, {"db", "3"}, {"tls"}}, ""},
		{nil, "address: at least one"},
		{[][]string{{"address", "nohost"}}, `address "nohost": want host:port`},
		{[][]string{{"address", "h:0"}}, "port must be 1-65535"},
		{[][]string{{"address", "h:1"}, {"read_timeout", "0s"}}, "want a duration of at least 1ms"},
		{[][]string{{"address", "h:1"}, {"db", "x"}}, "want a whole number"},
		{[][]string{{"address", "h:1"}, {"db", "1"}, {"cluster"}}, "only database 0"},
		{[][]string{{"address", "h:1"}, {"key_prefix", "a{b}"}}, "no braces"},
		{[][]string{{"address", "h:1"}, {"tls_cert_file", "c"}}, "give both or neither"},
		{[][]string{{"address", "h:1"}, {"tls", "x"}}, "want 0 argument(s)"},
		{[][]string{{"address", "h:1"}, {"bogus", "1"}}, "unknown option"},
	} {
		var c Config
		var err error
		for _, l := range tc.lines {
			if err = c.Set(l[0], l[1:]); err != nil {
				break
			}
		}
		if err == nil {
			c.FillDefaults()
			err = c.Validate()
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v: err %v, want %q", tc.lines, err, tc.want)
		}
	}
	if err := (&Config{}).Set("bogus", nil); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown option: %v", err)
	}
}

func TestDurationJSON(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(`{"read_timeout":"150ms","write_timeout":2000000}`), &c); err != nil {
		t.Fatal(err)
	}
	if time.Duration(c.ReadTimeout) != 150*time.Millisecond || time.Duration(c.WriteTimeout) != 2*time.Millisecond {
		t.Fatalf("got %v %v", c.ReadTimeout, c.WriteTimeout)
	}
	if err := json.Unmarshal([]byte(`{"read_timeout":"fast"}`), &c); err == nil {
		t.Fatal("read_timeout \"fast\" accepted")
	}
	out, _ := json.Marshal(Config{DialTimeout: Duration(time.Second)})
	if !strings.Contains(string(out), `"dial_timeout":"1s"`) {
		t.Fatalf("marshal: %s", out)
	}
}

// The client built from a config talks to a real redis-server, and a
// server that is down makes a command fail within the timeouts rather than
// hang.
func TestClientAgainstRedis(t *testing.T) {
	e2e.SkipShort(t)
	proc, addr := e2e.StartRedis(t)
	c := Config{Addresses: []string{addr}}
	client := newClient(t, &c)
	ctx := context.Background()
	if err := client.Set(ctx, c.Key("test", "x"), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := client.Get(ctx, "edgesteer:test:x").Result(); err != nil || v != "1" {
		t.Fatalf("get: %q %v", v, err)
	}
	proc.Stop()
	if err := client.Get(ctx, "edgesteer:test:x").Err(); err == nil {
		t.Fatal("a command to a stopped Redis succeeded")
	}
}

// A caller's context deadline bounds a call to a Redis that accepts and
// never answers, though read_timeout is an hour.
func TestContextDeadlineBoundsAHangingRedis(t *testing.T) {
	hanging, _ := e2e.HangingListener(t, "127.0.0.1:0") // accepts, never answers
	client := newClient(t, &Config{Addresses: []string{hanging}, ReadTimeout: Duration(time.Hour), WriteTimeout: Duration(time.Hour)})
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		got <- client.Get(ctx, "k").Err()
	}()
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("a hanging Redis answered")
		}
	case <-time.After(time.Minute): // far below read_timeout, far above the deadline
		t.Fatal("the call waited past its context's deadline (read_timeout applied instead)")
	}
}

// newClient fills c's defaults, validates it and returns its client,
// closed when the test ends.
func newClient(t *testing.T, c *Config) redis.UniversalClient {
	t.Helper()
	c.FillDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	client, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}
