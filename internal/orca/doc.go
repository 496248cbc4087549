// Package orca reads the load that backends report about themselves in
// their answers (ORCA, Open Request Cost Aggregation: the xDS ORCA spec,
// gRPC A51 and A58), and keeps each backend's latest utilization with
// A58's blackout and expiration periods.
//
// # Parsing
//
// Parse reads an endpoint-load-metrics header in its three forms, chosen
// by prefix: "TEXT cpu_utilization=0.3, named_metrics.foo=1", "JSON
// {...}" (proto3 JSON) and "BIN <base64 proto>"; ParseBin reads the
// endpoint-load-metrics-bin header. It fills a fixed-size Report and
// returns a Reason: every refusal has one, for a counter per reason. The
// input is bounded (MaxHeaderLen bytes, MaxMetrics map entries of at most
// MaxNameLen bytes); NaN and ±Inf are refused everywhere, negatives in the
// standard fields, and so is mem_utilization above 1 (the proto's rules).
// TEXT and JSON allocate nothing (names are substrings of the header);
// BIN allocates one string per map entry. Unknown fields and repeats are
// refused in TEXT and JSON (as Envoy and protojson do), skipped and
// last-wins in BIN (as protobuf does).
//
// # Tracking
//
// An Upstream holds one backend's latest report in atomic words; Observe
// records a report, Utilization reads application_utilization (falling
// back to cpu_utilization, as A58 does), its age and its state: none,
// blackout, fresh or expired. A report counts when it carries either
// utilization field; an explicit 0 in TEXT or JSON is an idle backend, not
// silence (gRPC, seeing only protos, cannot tell the two apart and skips
// it). A Tracker maps up to a fixed number of keys
// (dial addresses) to Upstreams with lock-free lookups, for callers that
// learn the upstream from the answer; Load combines the fresh ones.
//
// # Callers
//
// latency_bucket's p2c cost: each publisher's state holds an Upstream (no
// map on the pick path); the transport wrapper that counts requests in
// flight parses the answer's header on the way back (Parse into a Report
// on its stack, Observe with the policy's clock, count the Reason). The
// pick scales its cost (latency per request × (in flight + 1)) by a factor rising
// with Utilization, only when the state is StateFresh; a publisher in
// blackout or expired is costed on latency and in-flight alone, as A58
// gives a weightless endpoint the mean weight. The factor is the policy's
// rule, to be stated in its README with the share it implies (p2c is
// ordinal: at equilibrium a publisher's requests in flight, and so its
// share, fall roughly as 1/factor).
//
// peer_rate_limit's dynamic source "orca" (wired): the HTTP handler wraps
// the ResponseWriter and reads the header reverse_proxy copied from the
// upstream when the answer's headers are written, keyed by the upstream
// placeholder ({http.reverse_proxy.upstream.hostport}); its egress
// transport reads the upstream's response. Tracker.ObserveCPU keeps
// cpu_utilization alone, and a Source over that Tracker is the
// loadsource.Source the sample loop reads every interval: the max (or
// mean) of the fresh utilizations in percent, capped at 100, or
// ErrNoFreshReport, which keeps the throttle where it was like any
// unreadable source. Layer 4 has no answer header: the source is HTTP only.
package orca
