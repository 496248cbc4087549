package ogs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
			if !m.Failed && (m.RTT <= 0 || m.RTT >= MaxReportRTT) {
				t.Fatalf("accepted rtt %v", m.RTT)
			}
		}
		r := newReports(ReportConfig{})
		r.Add("l", "a", rep, rep.At) // must not panic
	})
}

func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string, mtime time.Time) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(path, mtime, mtime)
	}
	write("# reporters\nalice 0123456789abcdef0123\nbob   fedcba9876543210fedc # laptop\n", t0)
	tok, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if id, ok := tok.Lookup("0123456789abcdef0123", now); !ok || id != "alice" {
		t.Fatalf("alice: %q %v", id, ok)
	}
	for _, bad := range []string{"", "0123456789abcdef012", "alice", "nope"} {
		if _, ok := tok.Lookup(bad, now); ok {
			t.Fatalf("%q accepted", bad)
		}
	}
	// Re-read on change: bob's token is revoked, carol's added.
	write("alice 0123456789abcdef0123\ncarol cccccccccccccccccccc\n", t0.Add(time.Minute))
	now = now.Add(2 * time.Second)
	if _, ok := tok.Lookup("fedcba9876543210fedc", now); ok {
		t.Fatal("revoked token still accepted")
	}
	if id, ok := tok.Lookup("cccccccccccccccccccc", now); !ok || id != "carol" {
		t.Fatal("new token not accepted")
	}
	// A broken file keeps the tokens last read, and says so.
	write("carol\n", t0.Add(2*time.Minute))
	now = now.Add(2 * time.Second)
	if _, ok := tok.Lookup("cccccccccccccccccccc", now); !ok || tok.Err() == nil {
		t.Fatalf("broken re-read: tokens lost or no error (%v)", tok.Err())
	}
	// A file not there yet: no token, no error at load; it is read once it appears.
	later := filepath.Join(t.TempDir(), "later")
	lt, err := LoadTokens(later)
	if err != nil || lt.Len() != 0 || lt.Err() == nil {
		t.Fatalf("missing file: %v, %d tokens, Err %v", err, lt.Len(), lt.Err())
	}
	os.WriteFile(later, []byte("dave dddddddddddddddddddd\n"), 0o600)
	if id, ok := lt.Lookup("dddddddddddddddddddd", time.Now().Add(2*time.Second)); !ok || id != "dave" {
		t.Fatal("token file created after start not read")
	}
	if _, err := LoadTokens(t.TempDir()); err == nil {
		t.Fatal("a directory as tokens file accepted")
	}
	for body, want := range map[string]string{
		"a short\n":              "shorter than 16",
		"a 0123456789abcdef x\n": "want ID TOKEN",
		"a 0123456789abcdef\na 0123456789abcdeg\n": "given twice",
	} {
		write(body, t0)
		if _, err := LoadTokens(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	// A file without a token is valid: every report is refused. Emptying
	// it revokes the last token at once, as removing any line does.
	write("erin eeeeeeeeeeeeeeeeeeee\n", t0)
	et, err := LoadTokens(path)
	if err != nil || et.Len() != 1 {
		t.Fatalf("one token: %v, %d", err, et.Len())
	}
	write("# none left\n", t0.Add(3*time.Minute))
	if _, ok := et.Lookup("eeeeeeeeeeeeeeeeeeee", time.Now().Add(2*time.Second)); ok || et.Err() != nil || et.Len() != 0 {
		t.Fatalf("the last token's line removed: still accepted, or error %v, %d tokens", et.Err(), et.Len())
	}
}

func TestReportLimiter(t *testing.T) {
	l := NewReportLimiter(1, 3, 2)
	n := 0
	for range 10 {
		if l.Allow("a", t0) {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d allowed at once, burst 3", n)
	}
	if !l.Allow("a", t0.Add(time.Second)) {
		t.Fatal("no refill after a second")
	}
	for _, k := range []string{"b", "c", "d"} {
		l.Allow(k, t0)
	}
	if l.Len() != 2 {
		t.Fatalf("%d keys, bound 2", l.Len())
	}
}
