// Package cfvalue parses the values of configuration options strictly, for
// every edgesteer module whatever its configuration reader (Caddy's
// Caddyfile dispenser through caddymodules/internal/cfparse, CoreDNS's
// Corefile controller in corednsplugins/ogs): a number with anything but
// decimal digits ("3x", "0x10", "1_000"), a float that is hexadecimal, NaN or
// infinite, a boolean other than true or false, or a value out of its range
// is an error saying what was wanted. The caller names the option and the
// value, at the file and line its reader knows.
package cfvalue

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Bool parses exactly "true" or "false" (strconv.ParseBool would also take
// 1, t, F, TRUE…, which nobody writes on purpose).
func Bool(s string) (bool, error) {
	switch s {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errors.New("want true or false")
}

// Int parses a decimal whole number from min to max (math.MaxInt for no
// upper bound, math.MinInt for no lower one). Unlike fmt.Sscan it refuses
// "3x", and unlike base 0 it refuses "0x10" and "1_000".
func Int(s string, min, max int) (int, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < int64(min) || v > int64(max) {
		return 0, errors.New("want a whole number" + intRange(min, max))
	}
	return int(v), nil
}

func intRange(min, max int) string {
	switch {
	case max == math.MaxInt:
		return fmt.Sprintf(" of at least %d", min)
	case min == math.MinInt:
		return fmt.Sprintf(" of at most %d", max)
	}
	return fmt.Sprintf(" from %d to %d", min, max)
}

// Float parses a decimal number from min to max (math.Inf for no bound);
// hexadecimal, infinities and NaN are refused.
func Float(s string, min, max float64) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || strings.ContainsAny(s, "xX") || math.IsNaN(v) || math.IsInf(v, 0) || v < min || v > max {
		return 0, errors.New("want a decimal number" + floatRange(min, max))
	}
	return v, nil
}

func floatRange(min, max float64) string {
	switch {
	case math.IsInf(min, -1) && math.IsInf(max, 1):
		return ""
	case math.IsInf(max, 1):
		return fmt.Sprintf(" of at least %g", min)
	case math.IsInf(min, -1):
		return fmt.Sprintf(" of at most %g", max)
	}
	return fmt.Sprintf(" from %g to %g", min, max)
}

// Duration parses a duration of at least min: 0 for "zero or more",
// time.Nanosecond for "positive", math.MinInt64 for no bound. The syntax is
// Caddy's (caddy.ParseDuration): Go's time.ParseDuration plus days, "d",
// possibly fractional and combined with other units ("14d", "1.5d",
// "1d12h"), so one spelling works in every edgesteer module.
func Duration(s string, min time.Duration) (time.Duration, error) {
	v, err := parseDuration(s)
	if err == nil && v >= min {
		return v, nil
	}
	switch {
	case min == math.MinInt64:
		return 0, errors.New("want a duration, such as 250ms, 30s or 1d")
	case min == 0:
		return 0, errors.New("want a duration of zero or more, such as 0s, 250ms or 1d")
	case min == time.Nanosecond:
		return 0, errors.New("want a positive duration, such as 250ms, 30s or 1d")
	}
	return 0, fmt.Errorf("want a duration of at least %v", min)
}

// parseDuration rewrites every day count as hours ("1.5d" → "36h") and hands
// the result to time.ParseDuration. A day count is the run of number
// characters (digits, '.', '+', '-') right before a 'd'.
func parseDuration(s string) (time.Duration, error) {
	if len(s) > 1024 {
		return 0, errors.New("duration too long")
	}
	if !strings.Contains(s, "d") {
		return time.ParseDuration(s)
	}
	var b strings.Builder
	start := 0 // where the current run of number characters began
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9' || c == '.' || c == '+' || c == '-':
			continue
		case c == 'd':
			days, err := strconv.ParseFloat(s[start:i], 64)
			if err != nil {
				return 0, fmt.Errorf("bad day count %q", s[start:i])
			}
			b.WriteString(strconv.FormatFloat(days*24, 'f', -1, 64))
			b.WriteByte('h')
		default:
			b.WriteString(s[start : i+1])
		}
		start = i + 1
	}
	b.WriteString(s[start:])
	return time.ParseDuration(b.String())
}
