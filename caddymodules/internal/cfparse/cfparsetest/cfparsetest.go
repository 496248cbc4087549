// Package cfparsetest runs the modules' table-driven Caddyfile parse tests
// in the CoreDNS setup_test style: each input either parses to the expected
// JSON config or fails with an error containing the expected text (which
// carries the file and line).
package cfparsetest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Case is one input and what it must give.
type Case struct {
	Input       string
	Expected    string // the JSON config; checked when ExpectedErr is empty
	ExpectedErr string // empty: must parse
}

// Check parses every case's Input into fresh() and checks the outcome; then,
// for a case that parsed as expected, also calls after (if not nil), e.g. to
// validate the parsed value.
func Check[T caddyfile.Unmarshaler](t *testing.T, fresh func() T, cases []Case, after func(T) error) {
	t.Helper()
	for i, c := range cases {
		m := fresh()
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.Input))
		if c.ExpectedErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.ExpectedErr) {
				t.Errorf("case %d (%q): want an error containing %q, got %v", i, c.Input, c.ExpectedErr, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("case %d (%q): %v", i, c.Input, err)
			continue
		}
		if got, _ := json.Marshal(m); string(got) != c.Expected {
			t.Errorf("case %d (%q): got %s\nwant %s", i, c.Input, got, c.Expected)
			continue
		}
		if after != nil {
			if err := after(m); err != nil {
				t.Errorf("case %d (%q): parsed, then: %v", i, c.Input, err)
			}
		}
	}
}

// Adapts adapts a whole Caddyfile (the caller's test imports the modules
// it names) and checks that the JSON holds each of wants, as written.
func Adapts(t *testing.T, cf string, wants ...string) {
	t.Helper()
	out, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatalf("adapt: %v %v", err, warn)
	}
	for _, want := range wants {
		if !strings.Contains(string(out), want) {
			t.Errorf("adapted JSON lacks %s:\n%s", want, out)
		}
	}
}
