// Package monoclock is a wall clock that never steps: the wall time read
// once when the process started, advanced by the monotonic clock since.
// A limiter that counts time in wall-clock nanoseconds (so that replicas
// can share epochs through a store) but reads time.Now() for each
// decision admits up to rate × Δ more when the host's clock is stepped
// forward by Δ (an NTP or hypervisor correction) and refuses for Δ when it
// is stepped back; on this clock neither happens, and the offset to the
// store's clock, measured at each sync, absorbs how far the two drift.
package monoclock

import "time"

var start = time.Now()

// Now returns the process's start time plus the monotonic time elapsed
// since: its UnixNano never steps, and it keeps a monotonic reading, so
// Sub and Until between two such times are monotonic too.
func Now() time.Time { return start.Add(time.Since(start)) }
