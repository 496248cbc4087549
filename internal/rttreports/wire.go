package rttreports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// The report's JSON, as the reporter (builds/ogs-report) sends it and the
// endpoint reads it (README, "Reports").
type ReportJSON struct {
	Probe    string           `json:"probe"`
	Time     time.Time        `json:"time"`
	Gateways []GatewayRTTJSON `json:"gateways"`
}

// GatewayRTTJSON is one gateway's lowest RTT, or the reason every probe failed.
type GatewayRTTJSON struct {
	Name  string   `json:"name"`
	RTTMs *float64 `json:"rtt_ms,omitempty"`
	Error string   `json:"error,omitempty"`
}

// MaxReportGateways bounds the gateways one report may name.
const MaxGateways = 256

// DecodeReport parses a report body strictly (unknown fields, trailing
// data, a gateway with both or neither of rtt_ms and error are refused);
// the error is a *Refusal with reason "malformed". Range checks are Add's.
func DecodeReport(body []byte) (Report, error) {
	var j ReportJSON
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Report{}, &Refusal{"malformed", truncateDetail(err.Error())}
	}
	if dec.More() {
		return Report{}, &Refusal{"malformed", "data after the report"}
	}
	if j.Time.IsZero() {
		return Report{}, &Refusal{"malformed", "no time"}
	}
	if len(j.Gateways) > MaxGateways {
		return Report{}, &Refusal{"malformed", fmt.Sprintf("%d gateways, at most %d", len(j.Gateways), MaxGateways)}
	}
	rep := Report{Probe: j.Probe, At: j.Time}
	for _, g := range j.Gateways {
		m := Measurement{Gateway: g.Name}
		switch {
		case g.RTTMs != nil && g.Error != "":
			return Report{}, &Refusal{"malformed", fmt.Sprintf("gateway %q: both rtt_ms and error", truncateDetail(g.Name))}
		case g.RTTMs != nil:
			ms := *g.RTTMs
			if math.IsNaN(ms) || ms <= 0 || ms >= float64(MaxRTT/time.Millisecond) {
				return Report{}, &Refusal{"rtt_out_of_range", fmt.Sprintf("gateway %q: rtt_ms %v outside (0, %d)", truncateDetail(g.Name), ms, MaxRTT/time.Millisecond)}
			}
			m.RTT = time.Duration(ms * float64(time.Millisecond))
			if m.RTT <= 0 {
				m.RTT = 1 // below a nanosecond: the least positive
			}
		case g.Error != "":
			m.Failed = true
		default:
			return Report{}, &Refusal{"malformed", fmt.Sprintf("gateway %q: neither rtt_ms nor error", truncateDetail(g.Name))}
		}
		rep.Measurements = append(rep.Measurements, m)
	}
	return rep, nil
}

// EncodeReport is the reporter's side of DecodeReport.
func EncodeReport(rep Report) ([]byte, error) {
	j := ReportJSON{Probe: rep.Probe, Time: rep.At.UTC(), Gateways: []GatewayRTTJSON{}}
	for _, m := range rep.Measurements {
		g := GatewayRTTJSON{Name: m.Gateway}
		if m.Failed {
			g.Error = "failed"
		} else {
			ms := float64(m.RTT) / float64(time.Millisecond)
			g.RTTMs = &ms
		}
		j.Gateways = append(j.Gateways, g)
	}
	return json.MarshalIndent(j, "", "  ")
}

func truncateDetail(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
