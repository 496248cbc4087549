package dashboard

import (
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("edgesteer_dashboard", parseCaddyfile)
	// A terminal handler that serves content, like file_server.
	httpcaddyfile.RegisterDirectiveOrder("edgesteer_dashboard", httpcaddyfile.Before, "file_server")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(Handler)
	return d, d.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile reads
//
//	edgesteer_dashboard {
//		ogs <url...>
//		replicas <url...>
//		sample_interval <duration>
//		history <duration>
//		max_series <n>
//	}
//
// ogs and replicas are lists (repeating them adds); the others are given once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	_, o, err := cfparse.Open(d, "edgesteer_dashboard", 0, 0)
	if err != nil {
		return err
	}
	for o.Next() {
		var more []string
		switch o.Name() {
		case "ogs":
			more, err = o.List()
			h.OGS = append(h.OGS, more...)
		case "replicas":
			more, err = o.List()
			h.Replicas = append(h.Replicas, more...)
		case "sample_interval":
			h.SampleInterval, err = o.Duration(minInterval)
		case "history":
			h.History, err = o.Duration(time.Second)
		case "max_series":
			h.MaxSeries, err = o.Int(1, maxMaxSeries)
		default:
			err = o.Unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
