package redisstore

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func adapt(t *testing.T, src string) (map[string]json.RawMessage, error) {
	t.Helper()
	out, _, err := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}.Adapt([]byte(src), nil)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Apps map[string]json.RawMessage `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Apps, nil
}

func TestGlobalOption(t *testing.T) {
	apps, err := adapt(t, `{
	edgesteer_redis main {
		address 10.0.0.1:6379 10.0.0.2:6379
		address 10.0.0.3:6379
		cluster
		username es
		password secret
		key_prefix prod
		read_timeout 100ms
	}
	edgesteer_redis side {
		address 127.0.0.1:6380
		sentinel_master mymaster
		tls
		tls_server_name redis.internal
	}
}
:8080 {
	respond ok
}`)
	if err != nil {
		t.Fatal(err)
	}
	got := string(apps[AppName])
	for _, want := range []string{
		`"main":{"addresses":["10.0.0.1:6379","10.0.0.2:6379","10.0.0.3:6379"],"cluster":true,"username":"es","password":"secret","key_prefix":"prod","read_timeout":"100ms"}`,
		`"side":{"addresses":["127.0.0.1:6380"],"sentinel_master":"mymaster","tls":{"server_name":"redis.internal"}}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("adapted %s\nwant it to contain %s", got, want)
		}
	}
}

func TestGlobalOptionErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`edgesteer_redis {
		address h:1
	}`, "edgesteer_redis: want 1 argument, got none"},
		{`edgesteer_redis a {
		key_prefix x
	}`, "edgesteer_redis a: address is required"},
		{`edgesteer_redis a {
		address h:1
		read_timeout soon
	}`, `edgesteer_redis: read_timeout "soon": want a duration of at least 1ms`},
		{`edgesteer_redis a {
		address h:1
		password x
		password y
	}`, "password"},
		{`edgesteer_redis a {
		address h:1
		colour blue
	}`, `unknown option "colour"`},
		{`edgesteer_redis a {
		address h:1
	}
	edgesteer_redis a {
		address h:2
	}`, `store "a" declared twice`},
	} {
		_, err := adapt(t, "{\n\t"+tc.body+"\n}\n:8080 {\n\trespond ok\n}\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\nerr %v, want %q", tc.body, err, tc.want)
		}
	}
}

// A bad store fails the config at load (caddy validate), naming the store,
// the field and the value.
func TestValidateNamesStoreAndField(t *testing.T) {
	for _, tc := range []struct{ store, want string }{
		{`{"addresses":["nohost"]}`, `edgesteer_redis main: address "nohost": want host:port`},
		{`{"addresses":["h:1"],"key_prefix":"a b"}`, `edgesteer_redis main: key_prefix "a b"`},
		{`{"addresses":["h:1"],"tls":{"ca_file":"/nonexistent/ca.pem"}}`, "edgesteer_redis main: tls_ca_file"},
	} {
		cfg := &caddy.Config{AppsRaw: caddy.ModuleMap{AppName: json.RawMessage(`{"stores":{"main":` + tc.store + `}}`)}}
		cfg.Admin = &caddy.AdminConfig{Disabled: true}
		err := caddy.Validate(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.store, err, tc.want)
		}
	}
}
