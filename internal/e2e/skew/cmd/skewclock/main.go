// Command skewclock runs a program with its wall clock off by a fixed
// offset and its monotonic clock untouched (see package skew):
//
//	skewclock -offset 800ms -- bin/caddy run --config caddy.json
package main

import (
	"runtime"

	"github.com/edgesteer/edgesteer/internal/e2e/skew"
)

// The launcher's copy that execs the target must run on the main thread,
// the one that is traced.
func init() { runtime.LockOSThread() }

func main() { skew.Main() }
