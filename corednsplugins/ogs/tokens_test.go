package ogs

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// tokensOf writes n random tokens and returns the file and the tokens.
func tokensOf(tb testing.TB, n int) (string, []string) {
	var b strings.Builder
	toks := make([]string, n)
	for i := range toks {
		raw := make([]byte, 16)
		rand.Read(raw)
		toks[i] = hex.EncodeToString(raw)
		fmt.Fprintf(&b, "id%d %s\n", i, toks[i])
	}
	path := filepath.Join(tb.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path, toks
}

func TestTokensIndexed(t *testing.T) {
	path, toks := tokensOf(t, MaxTokens)
	tk, err := LoadTokens(path)
	if err != nil || tk.Len() != MaxTokens {
		t.Fatalf("%v, %d tokens", err, tk.Len())
	}
	now := time.Now()
	for _, i := range []int{0, 1, MaxTokens / 2, MaxTokens - 1} {
		if id, ok := tk.Lookup(toks[i], now); !ok || id != fmt.Sprint("id", i) {
			t.Fatalf("token %d: %q %v", i, id, ok)
		}
	}
	if _, ok := tk.Lookup(toks[0][:31]+"x", now); ok {
		t.Fatal("an unknown token accepted")
	}
}

// BenchmarkTokensLookup: one check with 1 and with 10 000 tokens; with the
// index both cost one SHA-256 and one map lookup (BENCHMARKS.md: the ratio).
func BenchmarkTokensLookup(b *testing.B) {
	for _, n := range []int{1, MaxTokens} {
		b.Run(fmt.Sprint("tokens=", n), func(b *testing.B) {
			path, toks := tokensOf(b, n)
			tk, err := LoadTokens(path)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			b.ResetTimer()
			for i := range b.N {
				if _, ok := tk.Lookup(toks[i%n], now); !ok {
					b.Fatal("not found")
				}
			}
		})
	}
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
