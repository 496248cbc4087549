package rttreports

import (
	"errors"
	"testing"
	"time"
)

func TestDecodeReport(t *testing.T) {
	good := `{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":12.5},{"name":"gw2","error":"timeout"}]}`
	rep, err := DecodeReport([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Probe != "https" || !rep.At.Equal(t0) || len(rep.Measurements) != 2 ||
		rep.Measurements[0].RTT != 12500*time.Microsecond || !rep.Measurements[1].Failed {
		t.Fatalf("%+v", rep)
	}
	// Round trip through the reporter's encoder.
	data, err := EncodeReport(rep)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := DecodeReport(data); err != nil || back.Measurements[0].RTT != rep.Measurements[0].RTT || !back.Measurements[1].Failed {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	for body, reason := range map[string]string{
		`{`: "malformed",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[],"location":"10.0.0.0/24"}`:             "malformed", // no field names a location
		`{"probe":"https","gateways":[{"name":"gw1","rtt_ms":1}]}`:                                           "malformed",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1"}]}`:                        "malformed",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":1,"error":"x"}]}`: "malformed",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":0}]}`:             "rtt_out_of_range",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":3600000}]}`:       "rtt_out_of_range",
		`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[]} {}`:                                   "malformed",
	} {
		_, err := DecodeReport([]byte(body))
		var ref *Refusal
		if !errors.As(err, &ref) || ref.Reason != reason {
			t.Errorf("%s: %v, want %s", body, err, reason)
		}
	}
}

func FuzzDecodeReport(f *testing.F) {
	f.Add([]byte(`{"probe":"https","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":12.5},{"name":"gw2","error":"timeout"}]}`))
	f.Add([]byte(`{"probe":"tcp","time":"2026-01-02T03:04:05Z","gateways":[{"name":"gw1","rtt_ms":1e-300}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := DecodeReport(data)
		if err != nil {
			return
		}
		for _, m := range rep.Measurements {
			if !m.Failed && (m.RTT <= 0 || m.RTT >= MaxRTT) {
				t.Fatalf("accepted rtt %v", m.RTT)
			}
		}
		r := newReports(Config{})
		r.Add("l", "a", rep, rep.At) // must not panic
	})
}
