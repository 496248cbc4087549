package redisstore

import (
	"encoding/json"
	"errors"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/redisconn"
)

func init() {
	httpcaddyfile.RegisterGlobalOption(AppName, parseGlobal)
}

// parseGlobal reads one store of the global option; the option may repeat,
// one store each:
//
//	edgesteer_redis <name> {
//		address <host:port>...
//		cluster
//		sentinel_master <name>
//		username <user>
//		password <password>
//		sentinel_password <password>
//		db <n>
//		tls
//		tls_server_name <name>
//		tls_ca_file <file>
//		tls_cert_file <file>
//		tls_key_file <file>
//		tls_insecure_skip_verify true|false
//		key_prefix <prefix>
//		dial_timeout <duration>
//		read_timeout <duration>
//		write_timeout <duration>
//		pool_size <n>
//	}
func parseGlobal(d *caddyfile.Dispenser, existing any) (any, error) {
	app := &App{Stores: map[string]*redisconn.Config{}}
	if prev, ok := existing.(httpcaddyfile.App); ok {
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, err
		}
	}
	args, b, err := cfparse.Open(d, AppName, 1, 1)
	if err != nil {
		return nil, err
	}
	name := args[0]
	if _, dup := app.Stores[name]; dup {
		return nil, d.Errf("%s: store %q declared twice", AppName, name)
	}
	cfg := &redisconn.Config{}
	for b.Next() {
		opt := d.Val()
		if opt != "address" {
			if err := b.Once(); err != nil {
				return nil, err
			}
		}
		vals, err := b.Args(0, cfparse.Many)
		if err != nil {
			return nil, err
		}
		if err := cfg.Set(opt, vals); err != nil {
			if errors.Is(err, redisconn.ErrUnknown) {
				return nil, b.Unknown()
			}
			if len(vals) == 1 {
				return nil, b.Invalid(vals[0], err)
			}
			return nil, b.Errf("%v", err)
		}
	}
	if len(cfg.Addresses) == 0 {
		return nil, d.Errf("%s %s: address is required", AppName, name)
	}
	app.Stores[name] = cfg
	raw, err := json.Marshal(app)
	if err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: AppName, Value: raw}, nil
}
