package diameteragent

import (
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
	"github.com/edgesteer/edgesteer/internal/diameteragent"
)

// DOICConfig turns on Diameter overload control (RFC 7683, RFC 8581) and
// load information (RFC 8583); see the README's DOIC section.
type DOICConfig struct {
	// ReportRealm adds a REALM report of the routed group's throttle to
	// the answers to DOIC clients.
	ReportRealm bool `json:"report_realm,omitempty"`
	// Validity of the agent's own reports (default: the group's
	// reversal_hold), 1s to 24h.
	Validity caddy.Duration `json:"validity,omitempty"`
	// MaxReports bounds the reports in force the agent keeps (default 10000).
	MaxReports int `json:"max_reports,omitempty"`
	// What a request throttled by a server's report gets: reject (default,
	// answered ResultCode with ErrorMessage) or drop.
	Action       string `json:"action,omitempty"`
	ResultCode   uint32 `json:"result_code,omitempty"`   // default 3004
	ErrorMessage string `json:"error_message,omitempty"` // default "overload: throttled by DOIC"
}

func (o *DOICConfig) build() (*diameteragent.DOIC, error) {
	d := &diameteragent.DOIC{ReportRealm: o.ReportRealm, Validity: time.Duration(o.Validity), MaxReports: o.MaxReports,
		Refusal: diameteragent.Refusal{ResultCode: o.ResultCode, ErrorMessage: o.ErrorMessage}}
	switch o.Action {
	case "", "reject":
	case "drop":
		d.Refusal.Drop = true
	default:
		return nil, fmt.Errorf("diameter_agent: doic: action %q: want reject or drop", o.Action)
	}
	return d, nil
}

// unmarshalDOIC reads
//
//	doic {
//		report_realm
//		validity <duration>
//		max_reports <n>
//		action reject|drop
//		result_code <code>
//		error_message <text>
//	}
func unmarshalDOIC(b *cfparse.Block) (*DOICConfig, error) {
	if err := b.Once(); err != nil {
		return nil, err
	}
	if _, err := b.BlockArgs(0, 0); err != nil {
		return nil, err
	}
	o := &DOICConfig{}
	sub := b.Sub()
	for sub.Next() {
		var err error
		switch sub.Name() {
		case "report_realm":
			err = sub.Flag()
			o.ReportRealm = true
		case "validity":
			o.Validity, err = sub.Duration(time.Second)
		case "max_reports":
			o.MaxReports, err = sub.Int(1, math.MaxInt32)
		default:
			err = refusalOption(sub, &o.Action, &o.ResultCode, &o.ErrorMessage)
		}
		if err != nil {
			return nil, err
		}
	}
	return o, nil
}
