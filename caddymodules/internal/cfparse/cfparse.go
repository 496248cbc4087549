// Package cfparse reads the option blocks of edgesteer's Caddyfile
// directives strictly, in the manner of caddy-l4's l4throttle: an option
// given twice, a wrong number of arguments, a block after an option that
// takes none, or a number with anything but decimal digits ("3x", "0x10")
// is an error that names the module, the option and the value, at the file
// and line where it was written.
//
// Which reader an option uses declares how it may repeat: String, Int,
// Float, Duration, Bool and Flag take one value and refuse a second
// occurrence; List appends, so a list option may repeat; options with
// their own shape call Once (or OnceFor a key, such as a header name)
// and Args themselves.
package cfparse

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/edgesteer/edgesteer/internal/cfvalue"
)

// Many as the most arguments of Args means "no limit".
const Many = -1

// Block reads the options of one block, one per line.
type Block struct {
	d       *caddyfile.Dispenser
	module  string // prefix of every error, e.g. "tenant_route" or "tenant_route: etcd"
	nesting int
	name    string            // the option under the cursor
	seen    map[string]string // option (or option and key) → "file:line" it was first given at
}

// Open consumes the directive name at d's cursor, returns its same-line
// arguments (at least min, at most max, or Many) and a reader of the block
// that may follow. module prefixes every error.
func Open(d *caddyfile.Dispenser, module string, min, max int) ([]string, *Block, error) {
	d.Next()
	b := &Block{d: d, module: module, nesting: d.Nesting(), name: d.Val()}
	args := d.RemainingArgs()
	if err := b.count(module, args, min, max); err != nil {
		return nil, nil, err
	}
	return args, b, nil
}

// Sub returns a reader of the block after the current option (call it once
// the option's own arguments are read, with BlockArgs).
func (b *Block) Sub() *Block {
	return &Block{d: b.d, module: b.module + ": " + b.name, nesting: b.d.Nesting(), name: b.name}
}

// Next moves to the next option of the block; it is false at the block's end.
func (b *Block) Next() bool {
	if !b.d.NextBlock(b.nesting) {
		return false
	}
	b.name = b.d.Val()
	return true
}

// Name is the current option's name.
func (b *Block) Name() string { return b.name }

// Dispenser is the underlying dispenser, for options parsed by other code
// (a nested Caddy module, a matcher set).
func (b *Block) Dispenser() *caddyfile.Dispenser { return b.d }

// Once fails if the current option was already given in this block.
func (b *Block) Once() error { return b.once(b.name, b.name) }

// OnceFor fails if the current option was already given in this block
// for the same key (tenant_partitions <tenant> <k>: once per tenant).
func (b *Block) OnceFor(key string) error { return b.once(b.name+"\x00"+key, b.name+" "+key) }

func (b *Block) once(key, what string) error {
	if b.seen == nil {
		b.seen = map[string]string{}
	}
	here := fmt.Sprintf("%s:%d", b.d.File(), b.d.Line())
	if first, ok := b.seen[key]; ok {
		return b.d.Errf("%s: %s given twice (first at %s)", b.module, what, first)
	}
	b.seen[key] = here
	return nil
}

// Args reads the rest of the option's line: at least min arguments, at most
// max (or Many), and no block after them.
func (b *Block) Args(min, max int) ([]string, error) {
	args, err := b.BlockArgs(min, max)
	if err != nil {
		return nil, err
	}
	if b.d.NextBlock(b.d.Nesting()) {
		b.d.Prev() // back to the brace, on the option's line
		return nil, b.d.Errf("%s: %s takes no block", b.module, b.name)
	}
	return args, nil
}

// BlockArgs is Args for an option that may have a block after its
// arguments; read the block with Sub (or leave it to other code).
func (b *Block) BlockArgs(min, max int) ([]string, error) {
	args := b.d.RemainingArgs()
	return args, b.count(b.module+": "+b.name, args, min, max)
}

// count checks the number of arguments of what (the directive or an option).
func (b *Block) count(what string, args []string, min, max int) error {
	n := len(args)
	if n >= min && (max == Many || n <= max) {
		return nil
	}
	var want string
	switch {
	case max == 0:
		want = "no arguments"
	case min == max:
		want = plural(min)
	case max == Many:
		want = "at least " + plural(min)
	default:
		want = fmt.Sprintf("%d to %d arguments", min, max)
	}
	if n == 0 {
		return b.d.Errf("%s: want %s, got none", what, want)
	}
	return b.d.Errf("%s: want %s, got %d: %s", what, want, n, strings.Join(args, " "))
}

func plural(n int) string {
	if n == 1 {
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

// Unknown is the error for an option the module does not have.
func (b *Block) Unknown() error {
	return b.d.Errf("%s: unknown option %q", b.module, b.name)
}

// Errf is an error about the current option, at its file and line.
func (b *Block) Errf(format string, a ...any) error {
	return b.d.Errf("%s: %s: %s", b.module, b.name, fmt.Sprintf(format, a...))
}

// Invalid is the error for a bad value of the current option.
func (b *Block) Invalid(value string, err error) error {
	return b.d.Errf("%s: %s %q: %v", b.module, b.name, value, err)
}

// one reads the single argument of a single-valued option.
func (b *Block) one() (string, error) {
	if err := b.Once(); err != nil {
		return "", err
	}
	args, err := b.Args(1, 1)
	if err != nil {
		return "", err
	}
	return args[0], nil
}

// String reads an option given once with one argument.
func (b *Block) String() (string, error) { return b.one() }

// List reads one or more arguments; the option may repeat, and the caller
// appends.
func (b *Block) List() ([]string, error) { return b.Args(1, Many) }

// Flag reads an option given once with no arguments.
func (b *Block) Flag() error {
	if err := b.Once(); err != nil {
		return err
	}
	_, err := b.Args(0, 0)
	return err
}

// Bool reads an option given once with true or false.
func (b *Block) Bool() (bool, error) {
	s, err := b.one()
	if err != nil {
		return false, err
	}
	v, err := Bool(s)
	if err != nil {
		return false, b.Invalid(s, err)
	}
	return v, nil
}

// Int reads an option given once with a whole number from min to max.
func (b *Block) Int(min, max int) (int, error) {
	s, err := b.one()
	if err != nil {
		return 0, err
	}
	return b.ParseInt(s, min, max)
}

// Float reads an option given once with a decimal number from min to max.
func (b *Block) Float(min, max float64) (float64, error) {
	s, err := b.one()
	if err != nil {
		return 0, err
	}
	return b.ParseFloat(s, min, max)
}

// Duration reads an option given once with a duration of at least min.
func (b *Block) Duration(min time.Duration) (caddy.Duration, error) {
	s, err := b.one()
	if err != nil {
		return 0, err
	}
	return b.ParseDuration(s, min)
}

// ParseInt is Int for one of the option's arguments.
func (b *Block) ParseInt(s string, min, max int) (int, error) {
	v, err := Int(s, min, max)
	if err != nil {
		return 0, b.Invalid(s, err)
	}
	return v, nil
}

// ParseFloat is Float for one of the option's arguments.
func (b *Block) ParseFloat(s string, min, max float64) (float64, error) {
	v, err := Float(s, min, max)
	if err != nil {
		return 0, b.Invalid(s, err)
	}
	return v, nil
}

// ParseDuration is Duration for one of the option's arguments.
func (b *Block) ParseDuration(s string, min time.Duration) (caddy.Duration, error) {
	v, err := Duration(s, min)
	if err != nil {
		return 0, b.Invalid(s, err)
	}
	return caddy.Duration(v), nil
}

// The value parsers are internal/cfvalue's, shared with the CoreDNS plugin.

// Bool parses exactly "true" or "false" (strconv.ParseBool would also take
// 1, t, F, TRUE…, which nobody writes on purpose).
func Bool(s string) (bool, error) { return cfvalue.Bool(s) }

// Int parses a decimal whole number from min to max (use math.MaxInt for
// no upper bound). Unlike fmt.Sscan it refuses "3x", and unlike base 0 it
// refuses "0x10" and "1_000".
func Int(s string, min, max int) (int, error) { return cfvalue.Int(s, min, max) }

// Float parses a decimal number from min to max (math.Inf for no bound);
// hexadecimal, infinities and NaN are refused.
func Float(s string, min, max float64) (float64, error) { return cfvalue.Float(s, min, max) }

// Duration parses a Caddy duration (Go's syntax, or days: "1d", "1.5d") of
// at least min: 0 for "zero or more", time.Nanosecond for "positive",
// math.MinInt64 for no bound.
func Duration(s string, min time.Duration) (time.Duration, error) { return cfvalue.Duration(s, min) }
