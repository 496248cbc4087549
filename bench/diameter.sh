#!/usr/bin/env bash
# Diameter messages/s through bin/caddy, in one run: the layer4 proxy with
# peer_rate_limit's Diameter mode in front (limits never reached, so every
# message is framed, classified and decided) vs the plain layer4 proxy, to
# the same go-diameter peer. 64 requests in flight, 5 interleaved rounds;
# median of per-round ratios (goal >= 0.95x). BEFORE=<another
# bin/caddy> adds that binary's Diameter limiter to each round (ports
# 18366/18365), e.g. a build of the main branch, for a before/after ratio.
# CLUSTER=1 adds, in a Caddy of its own (port 18364), the same limiter
# with its profile cluster-wide through a local redis-server (`cluster
# redis`): what shared limits add per message.
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
if [ -n "${CLUSTER:-}" ]; then
	need redis-server redis-server
	bg redis-server --bind 127.0.0.1 --port 18363 --save "" --appendonly no --dir "$work" --loglevel warning >"$work/redis.log" 2>&1
	wait_port 18363
	sed -e '/^\tlayer4 {/i\
\tedgesteer_redis main {\
\t\taddress 127.0.0.1:18363\
\t}' -e 's/18368/18364/; /^\t\t127.0.0.1:18367 {/,/^\t\t}/d' \
		-e 's/^\t\t\t\t\t\trate 1000000000$/&\
\t\t\t\t\t\tcluster redis main/' "$work/Caddyfile" >"$work/Caddyfile.cluster"
	mkdir -p "$work/cluster"
	bg env XDG_DATA_HOME="$work/cluster" XDG_CONFIG_HOME="$work/cluster" bin/caddy run --adapter caddyfile --config "$work/Caddyfile.cluster" 2>"$work/caddy.cluster.log"
	wait_port 18364
fi
for p in 18369 18368 18367; do wait_port $p; done
echo "machine: $(nproc) cores shared by the load client, caddy and the peer; $RUNS interleaved rounds of $DUR"
lim=() plain=() ratios=() before=() bratios=() clu=() cratios=()
for i in $(seq "$RUNS"); do
	a=$(bin/diameterload -target 127.0.0.1:18368 -d "$DUR")
	b=$(bin/diameterload -target 127.0.0.1:18367 -d "$DUR")
	lim+=("$a") plain+=("$b") ratios+=("$(ratio "$a" "$b")")
	if [ -n "${CLUSTER:-}" ]; then
		c=$(bin/diameterload -target 127.0.0.1:18364 -d "$DUR")
		clu+=("$c") cratios+=("$(ratio "$c" "$b")")
		echo "round $i: with the Diameter limiter cluster-wide $c msg/s"
	fi
	if [ -n "${BEFORE:-}" ]; then
		c=$(bin/diameterload -target 127.0.0.1:18366 -d "$DUR")
		before+=("$c") bratios+=("$(ratio "$c" "$b")")
		echo "round $i: with the Diameter limiter $a msg/s, plain proxy $b msg/s, BEFORE's limiter $c msg/s"
	else
		echo "round $i: with the Diameter limiter $a msg/s, plain proxy $b msg/s"
	fi
done
if [ -n "${CLUSTER:-}" ]; then
	echo "redis: $(redis-cli -p 18363 dbsize) keys, $(redis-cli -p 18363 info stats | grep -o 'total_commands_processed:[0-9]*')"
	echo "CLUSTER: limiter cluster-wide $(printf '%s\n' "${clu[@]}" | median) msg/s; ratio to the plain proxy $(printf '%s\n' "${cratios[@]}" | median)x"
fi
if [ -n "${BEFORE:-}" ]; then
	echo "BEFORE: limiter $(printf '%s\n' "${before[@]}" | median) msg/s; ratio to the plain proxy $(printf '%s\n' "${bratios[@]}" | median)x"
fi
echo "medians: limiter $(printf '%s\n' "${lim[@]}" | median), plain $(printf '%s\n' "${plain[@]}" | median) msg/s; ratio $(printf '%s\n' "${ratios[@]}" | median)x (goal >= 0.95x)"
