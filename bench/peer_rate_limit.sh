#!/usr/bin/env bash
# peer_rate_limit through bin/caddy, with wrk, in one run: the same
# reverse_proxy to the same local upstream with and without the handler in
# front (a profile whose limits are never reached, so every request pays
# the full decision: peer lookup, message matching, two buckets; checked
# before the run through the message-type placeholder). 10
# interleaved rounds; median of per-round ratios (goal >= 0.95x).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need wrk wrk
go build -o bin/testpeer ./internal/e2e/testpeer
PAIRS=${PAIRS:-10} DUR=${DUR:-5s}

bg bin/testpeer -listen 127.0.0.1:18201 -name upstream 2>/dev/null
cat >"$work/Caddyfile" <<'CADDYFILE'
{
	admin off
	auto_https off
	log default {
		level ERROR
	}
}
http://127.0.0.1:18211 {
	bind 127.0.0.1
	peer_rate_limit {
		profile all {
			rate 1000000000
			message ccr-u {
				match {
					path /gx/ccr-u
				}
				rate 1000000000
			}
		}
	}
	header >X-Message-Type "{http.peer_rate_limit.message_type}"
	reverse_proxy 127.0.0.1:18201
}
http://127.0.0.1:18212 {
	bind 127.0.0.1
	header >X-Message-Type "none"
	reverse_proxy 127.0.0.1:18201
}
CADDYFILE
bg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" bin/caddy run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
for p in 18201 18211 18212; do wait_port $p; done
# The measured path must take the full decision: the message rule matches it.
mt=$(curl -s -o /dev/null -D - http://127.0.0.1:18211/gx/ccr-u | awk 'tolower($1) == "x-message-type:" {print $2}' | tr -d '\r')
[ "$mt" = ccr-u ] || { echo "the benchmark path did not match the message rule (message type \"$mt\")" >&2; exit 1; }

rps() { wrk_rps "http://127.0.0.1:$1/gx/ccr-u" -t2 -c50 -d"$DUR"; }
echo "machine: $(nproc) cores shared by wrk, caddy and the upstream; wrk -t2 -c50 -d$DUR, $PAIRS interleaved rounds"
with=() without=() ratios=()
for i in $(seq "$PAIRS"); do
	a=$(rps 18211)
	b=$(rps 18212)
	with+=("$a") without+=("$b") ratios+=("$(ratio "$a" "$b")")
	echo "round $i: with peer_rate_limit $a req/s, without $b req/s"
done
echo "medians: with $(printf '%s\n' "${with[@]}" | median), without $(printf '%s\n' "${without[@]}" | median) req/s; ratio with/without $(printf '%s\n' "${ratios[@]}" | median)x (goal >= 0.95x)"
