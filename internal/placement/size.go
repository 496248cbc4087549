package placement

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A tenant's size (its users, or any weight the operator chooses) sets its
// base partition count, as Foxpass sets a new customer's partition count
// from its number of users. The base is what auto partitions grow from and
// shrink back to.

// SizeStep gives Partitions to tenants of at least MinSize.
type SizeStep struct {
	MinSize    int64
	Partitions int
}

// SizeTable maps a size to a partition count: the step with the largest
// MinSize not above the size. Steps are in increasing MinSize, with
// partitions that never decrease (a bigger tenant never gets fewer).
type SizeTable []SizeStep

// Bounds on sizes, which come from a file or a store written by others and
// are checked like network input.
const (
	MaxSizedTenants = 100_000        // entries kept; more are ignored
	MaxSize         = int64(1) << 50 // a size above this is rejected
	MaxSizesBytes   = 32 << 20       // a sizes file or listing larger than this is not read
	maxTenantName   = 256            // bytes
	maxProblems     = 10             // rejected entries described, of any number
)

// ParseSizeTable reads steps written "size:partitions" ("0:1 1000:2
// 10000:4"); an error names the bad step.
func ParseSizeTable(fields []string) (SizeTable, error) {
	var t SizeTable
	for _, f := range fields {
		s, k, ok := strings.Cut(f, ":")
		size, err1 := strconv.ParseInt(s, 10, 64)
		parts, err2 := strconv.Atoi(k)
		if !ok || err1 != nil || err2 != nil || strings.HasPrefix(s, "+") || strings.HasPrefix(k, "+") {
			return nil, fmt.Errorf("step %q: want size:partitions, both whole decimal numbers", f)
		}
		t = append(t, SizeStep{MinSize: size, Partitions: parts})
	}
	return t, t.Validate()
}

// Validate checks the table's order and ranges.
func (t SizeTable) Validate() error {
	if len(t) == 0 {
		return errors.New("no steps")
	}
	for i, s := range t {
		if s.MinSize < 0 || s.MinSize > MaxSize || s.Partitions < 1 {
			return fmt.Errorf("step %d:%d: size must be 0 to %d, partitions at least 1", s.MinSize, s.Partitions, MaxSize)
		}
		if i > 0 && (s.MinSize <= t[i-1].MinSize || s.Partitions < t[i-1].Partitions) {
			return fmt.Errorf("step %d:%d after %d:%d: sizes must increase and partitions must not decrease",
				s.MinSize, s.Partitions, t[i-1].MinSize, t[i-1].Partitions)
		}
	}
	return nil
}

// Partitions returns the count for size; ok is false below the first step.
func (t SizeTable) Partitions(size int64) (k int, ok bool) {
	i, _ := slices.BinarySearchFunc(t, size, func(s SizeStep, size int64) int {
		switch {
		case s.MinSize > size:
			return 1
		case s.MinSize < size:
			return -1
		}
		return 0
	})
	if i < len(t) && t[i].MinSize == size {
		return t[i].Partitions, true
	}
	if i == 0 {
		return 0, false
	}
	return t[i-1].Partitions, true
}

// ParseSize checks one tenant's size as read from a store: the tenant a
// name of 1–256 bytes of printable UTF-8 without spaces, the size a whole
// decimal number from 0 to MaxSize.
func ParseSize(tenant, value string) (int64, error) {
	if err := checkTenantName(tenant); err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < 0 || n > MaxSize || strings.HasPrefix(value, "+") {
		return 0, fmt.Errorf("tenant %q: size %q: want a whole decimal number from 0 to %d", tenant, trunc(value), MaxSize)
	}
	return n, nil
}

func checkTenantName(tenant string) error {
	if tenant == "" || len(tenant) > maxTenantName || !utf8.ValidString(tenant) ||
		strings.IndexFunc(tenant, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 {
		return fmt.Errorf("tenant %q: want 1–%d bytes of printable UTF-8 without spaces", trunc(tenant), maxTenantName)
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Sizes is a parsed set of tenant sizes with what was rejected.
type Sizes struct {
	Sizes    map[string]int64
	Rejected int      // entries not taken (malformed, or past MaxSizedTenants)
	Problems []string // the first few rejections, in words
}

func (s *Sizes) reject(problem string) {
	s.Rejected++
	if len(s.Problems) < maxProblems {
		s.Problems = append(s.Problems, problem)
	}
}

// Add takes one entry, or rejects it (malformed, or past MaxSizedTenants).
func (s *Sizes) Add(where, tenant, value string) {
	if s.Sizes == nil {
		s.Sizes = map[string]int64{}
	}
	n, err := ParseSize(tenant, value)
	switch {
	case err != nil:
		s.reject(where + ": " + err.Error())
	case len(s.Sizes) >= MaxSizedTenants:
		s.reject(fmt.Sprintf("%s: tenant %q: more than %d tenants: ignored", where, tenant, MaxSizedTenants))
	default:
		s.Sizes[tenant] = n
	}
}

// ParseSizes reads lines "tenant size" ('#' starts a comment, blank lines
// are skipped). A malformed line is rejected and the rest kept; a reader
// longer than MaxSizesBytes is an error and nothing is taken from it.
func ParseSizes(r io.Reader) (*Sizes, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSizesBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSizesBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxSizesBytes)
	}
	out := &Sizes{Sizes: map[string]int64{}}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, MaxSizesBytes)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		switch {
		case len(f) == 0:
		case len(f) != 2:
			out.reject(fmt.Sprintf("line %d: %q: want a tenant and its size", line, trunc(strings.TrimSpace(text))))
		default:
			out.Add(fmt.Sprintf("line %d", line), f[0], f[1])
		}
	}
	return out, sc.Err()
}

// SetSizeTable applies a size table (nil: sizes unused) to the sizes held,
// and returns the tenants whose base partition count changed. A tenant's
// base is its run-time count, else its count in the config, else the
// table's count for its size, else the default; auto partitions grow it
// from its base and shrink it back to its base (a count grown above a
// lowered base shrinks step by step; a raised base takes effect at once).
// Connections stay on their nodes.
func (p *Placer) SetSizeTable(table SizeTable) (changed []string) {
	return p.resize(func() { p.sizeTable = slices.Clone(table) }, nil)
}

// ReplaceSizes makes sizes the tenants' sizes (nil: none) under the table
// in force, and returns the tenants whose base count changed.
func (p *Placer) ReplaceSizes(sizes map[string]int64) (changed []string) {
	return p.resize(func() { p.sizes = maps.Clone(sizes) }, sizes)
}

// resize applies set under the lock and lists the tenants (sized before,
// or in sizes) whose base count it changed.
func (p *Placer) resize(set func(), sizes map[string]int64) (changed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := map[string]int{}
	for tenant := range p.sizes {
		before[tenant] = p.partitions(tenant)
	}
	for tenant := range sizes {
		if _, ok := before[tenant]; !ok {
			before[tenant] = p.partitions(tenant)
		}
	}
	set()
	for tenant, k := range before {
		if p.partitions(tenant) != k {
			changed = append(changed, tenant)
		}
	}
	slices.Sort(changed)
	return changed
}

// SizedTenants returns each tenant with a size and its size.
func (p *Placer) SizedTenants() map[string]int64 {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return maps.Clone(p.sizes)
}

// sizeK is tenant's count from its size; p.mu is held.
func (p *Placer) sizeK(tenant string) (int, bool) {
	size, ok := p.sizes[tenant]
	if !ok {
		return 0, false
	}
	return p.sizeTable.Partitions(size)
}
