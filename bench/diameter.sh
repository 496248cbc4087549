#!/usr/bin/env bash
# Diameter messages/s through bin/caddy, in one run: the layer4 proxy with
# peer_rate_limit's Diameter mode in front (limits never reached, so every
# message is framed, classified and decided) vs the plain layer4 proxy, to
# the same go-diameter peer. 64 requests in flight, 5 interleaved rounds;
# median of per-round ratios (goal >= 0.95x, issue 18). BEFORE=<another
# bin/caddy> adds that binary's Diameter limiter to each round (ports
# 18366/18365), e.g. a build of the main branch, for a before/after ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
go build -o bin/diameterload ./bench/diameterload
RUNS=${RUNS:-5} DUR=${DUR:-5s}
bg bin/diameterload -serve 127.0.0.1:18369
cat >"$work/Caddyfile" <<'CADDYFILE'
{
	admin off
	log default {
		level ERROR
	}
	layer4 {
		127.0.0.1:18368 {
			route {
				peer_rate_limit {
					diameter {
						origin_host dra.example
						origin_realm example
					}
					profile all {
						rate 1000000000
						message gx-ccr-u {
							rate 1000000000
						}
					}
				}
				proxy 127.0.0.1:18369
			}
		}
		127.0.0.1:18367 {
			route {
				proxy 127.0.0.1:18369
			}
		}
	}
}
CADDYFILE
bg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" bin/caddy run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
if [ -n "${BEFORE:-}" ]; then
	sed -e 's/18368/18366/; s/18367/18365/' "$work/Caddyfile" >"$work/Caddyfile.before"
	mkdir -p "$work/before"
	bg env XDG_DATA_HOME="$work/before" XDG_CONFIG_HOME="$work/before" "$BEFORE" run --adapter caddyfile --config "$work/Caddyfile.before" 2>"$work/caddy.before.log"
	wait_port 18366
fi
for p in 18369 18368 18367; do wait_port $p; done
echo "machine: $(nproc) cores shared by the load client, caddy and the peer; $RUNS interleaved rounds of $DUR"
lim=() plain=() ratios=() before=() bratios=()
for i in $(seq "$RUNS"); do
	a=$(bin/diameterload -target 127.0.0.1:18368 -d "$DUR")
	b=$(bin/diameterload -target 127.0.0.1:18367 -d "$DUR")
	lim+=("$a") plain+=("$b") ratios+=("$(ratio "$a" "$b")")
	if [ -n "${BEFORE:-}" ]; then
		c=$(bin/diameterload -target 127.0.0.1:18366 -d "$DUR")
		before+=("$c") bratios+=("$(ratio "$c" "$b")")
		echo "round $i: with the Diameter limiter $a msg/s, plain proxy $b msg/s, BEFORE's limiter $c msg/s"
	else
		echo "round $i: with the Diameter limiter $a msg/s, plain proxy $b msg/s"
	fi
done
if [ -n "${BEFORE:-}" ]; then
	echo "BEFORE: limiter $(printf '%s\n' "${before[@]}" | median) msg/s; ratio to the plain proxy $(printf '%s\n' "${bratios[@]}" | median)x"
fi
echo "medians: limiter $(printf '%s\n' "${lim[@]}" | median), plain $(printf '%s\n' "${plain[@]}" | median) msg/s; ratio $(printf '%s\n' "${ratios[@]}" | median)x (goal >= 0.95x)"
