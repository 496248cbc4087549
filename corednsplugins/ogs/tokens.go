package ogs

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Tokens are the report tokens of a file of lines "ID TOKEN" ('#' starts a
// comment), re-read when its modification time or size changes (looked at
// most once a second). Only the tokens' SHA-256 sums are kept, indexed by
// their first 8 bytes; a token's sum is then compared in constant time with
// the sums of its bucket. The map's timing depends only on the sum, which
// tells nothing of a token (finding a token whose sum starts with given
// bytes is a preimage search), so a check costs one hash and one lookup
// whatever the number of tokens (BenchmarkTokensLookup).
type Tokens struct {
	Path string

	mu      sync.Mutex
	checked time.Time
	mtime   time.Time
	size    int64
	sums    map[uint64][]tokenSum
	n       int
	err     error // the last re-read's error; the previous tokens stay
}

type tokenSum struct {
	id  string
	sum [32]byte
}

// MaxTokens bounds a tokens file.
const MaxTokens = 10_000

// LoadTokens reads path now; an error names the line. A file that does
// not exist yet is no error: there is no token (every report is refused)
// until it appears, and Err says so.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{Path: path}
	if err := t.reload(time.Now(), true); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return t, nil
}

// Lookup returns the id of token (ok false: not a known token). A file
// that fails to re-read keeps the tokens last read (Err says why).
func (t *Tokens) Lookup(token string, now time.Time) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.checked) >= time.Second {
		t.reloadLocked(now, false)
	}
	if token == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(token))
	id, found := "", 0
	for _, s := range t.sums[binary.BigEndian.Uint64(sum[:8])] {
		eq := subtle.ConstantTimeCompare(sum[:], s.sum[:])
		if eq == 1 && found == 0 {
			id = s.id
		}
		found |= eq
	}
	return id, found == 1
}

// Err returns why the last re-read failed (nil: it did not).
func (t *Tokens) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Len returns the number of tokens held.
func (t *Tokens) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *Tokens) reload(now time.Time, force bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reloadLocked(now, force)
}

func (t *Tokens) reloadLocked(now time.Time, force bool) error {
	t.checked = now
	fi, err := os.Stat(t.Path)
	if err != nil {
		t.err = err
		return err
	}
	if !force && fi.ModTime().Equal(t.mtime) && fi.Size() == t.size {
		return nil
	}
	sums, err := readTokens(t.Path)
	if err != nil {
		t.err = err
		return err
	}
	t.sums, t.n = make(map[uint64][]tokenSum, len(sums)), len(sums)
	for _, s := range sums {
		k := binary.BigEndian.Uint64(s.sum[:8])
		t.sums[k] = append(t.sums[k], s)
	}
	t.mtime, t.size, t.err = fi.ModTime(), fi.Size(), nil
	return nil
}

func readTokens(path string) ([]tokenSum, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []tokenSum
	ids := map[string]bool{}
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		f := strings.Fields(text)
		switch {
		case len(f) == 0:
			continue
		case len(f) != 2:
			return nil, fmt.Errorf("%s:%d: want ID TOKEN", path, line)
		case len(f[1]) < 16:
			return nil, fmt.Errorf("%s:%d: token of id %q: shorter than 16 characters", path, line, f[0])
		case ids[f[0]]:
			return nil, fmt.Errorf("%s:%d: id %q given twice", path, line, f[0])
		case strings.Contains(f[0], "|"):
			return nil, fmt.Errorf("%s:%d: id %q: '|' is not allowed", path, line, f[0])
		}
		ids[f[0]] = true
		out = append(out, tokenSum{id: f[0], sum: sha256.Sum256([]byte(f[1]))})
		if len(out) > MaxTokens {
			return nil, fmt.Errorf("%s: more than %d tokens", path, MaxTokens)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %v", path, line+1, err)
	}
	// No token is a valid file: every report is refused. Removing the last
	// line must revoke the last token, as removing any line does.
	return out, nil
}
