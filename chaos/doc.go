// Package chaos holds the end-to-end test that runs the cluster modules'
// replicas (peer_rate_limit and latency_bucket in bin/caddy, ogs in
// bin/coredns) against one redis-server through a seeded random schedule
// of bounded faults, checking each module's README rules every second
// (issue 48, part 3). It has no code of its own: see chaos_test.go.
package chaos
