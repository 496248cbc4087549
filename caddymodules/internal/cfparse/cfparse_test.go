package cfparse_test

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/caddymodules/internal/cfparse"
)

// toy is a directive using every reader.
type toy struct {
	Arg     []string
	Name    string
	Nodes   []string
	Count   int
	Ratio   float64
	Timeout caddy.Duration
	Grace   caddy.Duration
	Enabled bool
	Verbose bool
	Weights map[string]int
	Store   []string
	Prefix  string
}

func parseToy(d *caddyfile.Dispenser) (toy, error) {
	var t toy
	args, o, err := cfparse.Open(d, "toy", 0, 1)
	if err != nil {
		return t, err
	}
	t.Arg = args
	for o.Next() {
		var err error
		switch o.Name() {
		case "name":
			t.Name, err = o.String()
		case "nodes":
			var more []string
			more, err = o.List()
			t.Nodes = append(t.Nodes, more...)
		case "count":
			t.Count, err = o.Int(1, 10)
		case "ratio":
			t.Ratio, err = o.Float(0, 1)
		case "timeout":
			t.Timeout, err = o.Duration(time.Nanosecond)
		case "grace":
			t.Grace, err = o.Duration(0)
		case "enabled":
			t.Enabled, err = o.Bool()
		case "verbose":
			err = o.Flag()
			t.Verbose = err == nil
		case "weight": // weight <key> <n>, once per key
			var a []string
			if a, err = o.Args(2, 2); err == nil {
				if err = o.OnceFor(a[0]); err == nil {
					if t.Weights == nil {
						t.Weights = map[string]int{}
					}
					t.Weights[a[0]], err = o.ParseInt(a[1], 0, math.MaxInt)
				}
			}
		case "store": // store <endpoint...> { prefix <p> }
			if err = o.Once(); err == nil {
				t.Store, err = o.BlockArgs(1, cfparse.Many)
			}
			for sub := o.Sub(); err == nil && sub.Next(); {
				switch sub.Name() {
				case "prefix":
					t.Prefix, err = sub.String()
				default:
					err = sub.Unknown()
				}
			}
		default:
			err = o.Unknown()
		}
		if err != nil {
			return t, err
		}
	}
	return t, nil
}

func TestBlock(t *testing.T) {
	for _, tc := range []struct {
		input   string
		want    toy    // when wantErr is ""
		wantErr string // substring, with the file and line
	}{
		{input: "toy", want: toy{}},
		{input: "toy {\n}", want: toy{}},
		{input: `toy a {
			name n
			nodes a b
			nodes c
			count 10
			ratio 0.25
			timeout 1d
			grace 0s
			enabled true
			verbose
			weight x 0
			weight y 7
			store e1 e2 {
				prefix /p/
			}
		}`, want: toy{
			Arg: []string{"a"}, Name: "n", Nodes: []string{"a", "b", "c"}, Count: 10, Ratio: 0.25,
			Timeout: caddy.Duration(24 * time.Hour), Enabled: true, Verbose: true,
			Weights: map[string]int{"x": 0, "y": 7}, Store: []string{"e1", "e2"}, Prefix: "/p/",
		}},

		// Arguments: too many, too few, on the directive and on options.
		{input: "toy a b", wantErr: "toy: want 0 to 1 arguments, got 2: a b, at Testfile:1"},
		{input: "toy {\nname a b\n}", wantErr: "toy: name: want 1 argument, got 2: a b, at Testfile:2"},
		{input: "toy {\nname\n}", wantErr: "toy: name: want 1 argument, got none, at Testfile:2"},
		{input: "toy {\nnodes\n}", wantErr: "toy: nodes: want at least 1 argument, got none, at Testfile:2"},
		{input: "toy {\nverbose yes\n}", wantErr: "toy: verbose: want no arguments, got 1: yes, at Testfile:2"},
		{input: "toy {\nweight x\n}", wantErr: "toy: weight: want 2 arguments, got 1: x, at Testfile:2"},
		{input: "toy {\ncount 3 4\n}", wantErr: "toy: count: want 1 argument, got 2: 3 4"},
		{input: "toy {\nstore {\nprefix /p/\n}\n}", wantErr: "toy: store: want at least 1 argument, got none"},
		{input: "toy {\nstore e {\nprefix /p/ /q/\n}\n}", wantErr: "toy: store: prefix: want 1 argument, got 2: /p/ /q/, at Testfile:3"},

		// A block where none belongs.
		{input: "toy {\nname n {\ncount 3\n}\n}", wantErr: "toy: name takes no block, at Testfile:2"},

		// Repeats: single values refuse, lists append (above), keyed once per key.
		{input: "toy {\nname a\n\nname b\n}", wantErr: "toy: name given twice (first at Testfile:2), at Testfile:4"},
		{input: "toy {\nverbose\nverbose\n}", wantErr: "toy: verbose given twice (first at Testfile:2), at Testfile:3"},
		{input: "toy {\ncount 1\ncount 1\n}", wantErr: "toy: count given twice"},
		{input: "toy {\nweight x 1\nweight x 2\n}", wantErr: "toy: weight x given twice (first at Testfile:2), at Testfile:3"},
		{input: "toy {\nstore e {\n}\nstore f\n}", wantErr: "toy: store given twice"},
		{input: "toy {\nstore e {\nprefix a\nprefix b\n}\n}", wantErr: "toy: store: prefix given twice (first at Testfile:3), at Testfile:4"},

		// Numbers: decimal only, within bounds.
		{input: "toy {\ncount 3x\n}", wantErr: `toy: count "3x": want a whole number from 1 to 10, at Testfile:2`},
		{input: "toy {\ncount 0x10\n}", wantErr: `toy: count "0x10": want a whole number from 1 to 10`},
		{input: "toy {\ncount 0\n}", wantErr: `toy: count "0": want a whole number from 1 to 10`},
		{input: "toy {\ncount 11\n}", wantErr: `toy: count "11": want a whole number from 1 to 10`},
		{input: "toy {\ncount 1.0\n}", wantErr: `toy: count "1.0"`},
		{input: "toy {\nweight x -1\n}", wantErr: `toy: weight "-1": want a whole number of at least 0, at Testfile:2`},
		{input: "toy {\nratio 1.5\n}", wantErr: `toy: ratio "1.5": want a decimal number from 0 to 1`},
		{input: "toy {\nratio 0x1p-2\n}", wantErr: `toy: ratio "0x1p-2"`},
		{input: "toy {\nratio NaN\n}", wantErr: `toy: ratio "NaN"`},
		{input: "toy {\ntimeout 0s\n}", wantErr: `toy: timeout "0s": want a positive duration`},
		{input: "toy {\ntimeout 3x\n}", wantErr: `toy: timeout "3x": want a positive duration`},
		{input: "toy {\ngrace -1s\n}", wantErr: `toy: grace "-1s": want a duration of zero or more`},
		{input: "toy {\nenabled yes\n}", wantErr: `toy: enabled "yes": want true or false, at Testfile:2`},
		{input: "toy {\nenabled 1\n}", wantErr: `toy: enabled "1": want true or false`},

		{input: "toy {\ncolour blue\n}", wantErr: `toy: unknown option "colour", at Testfile:2`},
		{input: "toy {\nstore e {\ncolour blue\n}\n}", wantErr: `toy: store: unknown option "colour", at Testfile:3`},
	} {
		got, err := parseToy(caddyfile.NewTestDispenser(tc.input))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: got error %v, want one containing %q", tc.input, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
		} else if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.input, got, tc.want)
		}
	}
}

func TestValues(t *testing.T) {
	for _, s := range []string{"3x", "0x10", "1_000", "1e3", "", " 3", "3.0", "99999999999999999999"} {
		if v, err := cfparse.Int(s, 0, math.MaxInt); err == nil {
			t.Errorf("Int(%q) = %d, want an error", s, v)
		}
	}
	for s, want := range map[string]int{"0": 0, "42": 42, "+7": 7, "007": 7} {
		if v, err := cfparse.Int(s, 0, math.MaxInt); err != nil || v != want {
			t.Errorf("Int(%q) = %d, %v; want %d", s, v, err, want)
		}
	}
	if _, err := cfparse.Int("-1", 0, math.MaxInt); err == nil || err.Error() != "want a whole number of at least 0" {
		t.Errorf("Int(-1): %v", err)
	}
	if v, err := cfparse.Int("-5", math.MinInt, 0); err != nil || v != -5 {
		t.Errorf("Int(-5) = %d, %v", v, err)
	}
	for _, s := range []string{"0x1p4", "Inf", "-inf", "NaN", "1,5", "1.5x", ""} {
		if v, err := cfparse.Float(s, math.Inf(-1), math.Inf(1)); err == nil {
			t.Errorf("Float(%q) = %g, want an error", s, v)
		}
	}
	for s, want := range map[string]float64{"0.2": 0.2, "1": 1, "-.5": -0.5, "2e-3": 0.002} {
		if v, err := cfparse.Float(s, math.Inf(-1), math.Inf(1)); err != nil || v != want {
			t.Errorf("Float(%q) = %g, %v; want %g", s, v, err, want)
		}
	}
	for s, want := range map[string]time.Duration{"1d": 24 * time.Hour, "1h30m": 90 * time.Minute, "0s": 0, "-2s": -2 * time.Second} {
		if v, err := cfparse.Duration(s, math.MinInt64); err != nil || v != want {
			t.Errorf("Duration(%q) = %v, %v; want %v", s, v, err, want)
		}
	}
	if _, err := cfparse.Duration("5", math.MinInt64); err == nil {
		t.Error("Duration(5) without a unit: want an error")
	}
	if _, err := cfparse.Duration("1s", 2*time.Second); err == nil || err.Error() != "want a duration of at least 2s" {
		t.Errorf("Duration(1s, 2s): %v", err)
	}
}
