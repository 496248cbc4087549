package ntier

import (
	"encoding/json"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

func init() { httpcaddyfile.RegisterGlobalOption(AppName, parseGlobal) }

// parseGlobal reads the global option, given once:
//
//	ntier {
//		upper {
//			tier_map <file>
//			ports <port|lo-hi>...
//			interfaces <name>...
//			health_port <port>
//			health_interval <duration>
//			health_timeout <duration>
//			fall <n>
//			rise <n>
//			buckets <n>
//			seed <n>
//			table_base <n>
//			rule_priority <n>
//			table <name>
//		}
//		lower {
//			ports <port|lo-hi>...
//			interfaces <name>...
//			listen_port <port>
//			mark <n>
//			rule_priority <n>
//			table <name>
//			ip_versions 4|6...
//		}
//	}
func parseGlobal(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Errf("%s: given twice", AppName)
	}
	_, b, err := cfparse.Open(d, AppName, 0, 0)
	if err != nil {
		return nil, err
	}
	app := &App{}
	for b.Next() {
		if err := b.Once(); err != nil {
			return nil, err
		}
		if _, err := b.BlockArgs(0, 0); err != nil {
			return nil, err
		}
		switch b.Name() {
		case "upper":
			app.Upper = &Upper{}
			err = parseUpper(b.Sub(), app.Upper)
		case "lower":
			app.Lower = &Lower{}
			err = parseLower(b.Sub(), app.Lower)
		default:
			err = b.Unknown()
		}
		if err != nil {
			return nil, err
		}
	}
	raw, err := json.Marshal(app)
	if err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: AppName, Value: raw}, nil
}

func parseUpper(sub *cfparse.Block, u *Upper) error {
	for sub.Next() {
		var err error
		switch sub.Name() {
		case "tier_map":
			u.TierMapFile, err = sub.String()
		case "ports":
			err = list(sub, &u.Ports)
		case "interfaces":
			err = list(sub, &u.Interfaces)
		case "health_port":
			u.HealthPort, err = sub.Int(1, 65535)
		case "health_interval":
			u.HealthInterval, err = sub.Duration(time.Millisecond)
		case "health_timeout":
			u.HealthTimeout, err = sub.Duration(time.Millisecond)
		case "fall":
			u.Fall, err = sub.Int(1, 100)
		case "rise":
			u.Rise, err = sub.Int(1, 100)
		case "buckets":
			u.Buckets, err = sub.Int(1, 4096)
		case "seed":
			var n int
			n, err = sub.Int(1, math.MaxUint32)
			u.Seed = uint32(n)
		case "table_base":
			u.TableBase, err = sub.Int(1, math.MaxInt32)
		case "rule_priority":
			u.RulePriority, err = sub.Int(1, 32765)
		case "table":
			u.Table, err = sub.String()
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func parseLower(sub *cfparse.Block, l *Lower) error {
	for sub.Next() {
		var err error
		switch sub.Name() {
		case "ports":
			err = list(sub, &l.Ports)
		case "interfaces":
			err = list(sub, &l.Interfaces)
		case "listen_port":
			l.ListenPort, err = sub.Int(1, 65535)
		case "mark":
			var n int
			n, err = sub.Int(1, math.MaxInt32)
			l.Mark = uint32(n)
		case "rule_priority":
			l.RulePriority, err = sub.Int(1, 32765)
		case "table":
			l.Table, err = sub.String()
		case "ip_versions":
			var vals []string
			if vals, err = sub.List(); err == nil {
				for _, v := range vals {
					if v != "4" && v != "6" {
						return sub.Errf("ip_versions %q: want 4 or 6", v)
					}
					l.IPVersions = append(l.IPVersions, int(v[0]-'0'))
				}
			}
		default:
			err = sub.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// list appends an option's values: a list option may repeat.
func list(sub *cfparse.Block, into *[]string) error {
	vals, err := sub.List()
	*into = append(*into, vals...)
	return err
}
