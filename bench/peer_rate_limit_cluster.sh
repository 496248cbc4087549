#!/usr/bin/env bash
# peer_rate_limit with `cluster redis` on vs off, through bin/caddy, in one
# run:
#  1. per-request cost: the same reverse_proxy to the same local upstream
#     behind a profile whose limit is never reached, cluster-wide (a local
#     redis-server) or per replica; wrk, PAIRS interleaved rounds, median of
#     per-round ratios (goal >= 0.97x);
#  2. Redis commands per admitted request: a cluster-wide limit of 5,000/s
#     driven past it by wrk, Redis' total_commands_processed against the
#     admin view's admitted_total over the same window (goal <= 0.01).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need wrk wrk
need redis-server redis-server
go build -o bin/testpeer ./internal/e2e/testpeer
go build -o bin/caddy ./builds/caddy
PAIRS=${PAIRS:-10} DUR=${DUR:-5s} OPSDUR=${OPSDUR:-10}

bg redis-server --bind 127.0.0.1 --port 18390 --save "" --appendonly no --dir "$work" --loglevel warning >"$work/redis.log" 2>&1
bg bin/testpeer -listen 127.0.0.1:18301 -name upstream 2>/dev/null
cat >"$work/Caddyfile" <<'CADDYFILE'
{
	admin 127.0.0.1:18319
	auto_https off
	log default {
		level ERROR
	}
	edgesteer_redis main {
		address 127.0.0.1:18390
	}
}
http://127.0.0.1:18311 {
	bind 127.0.0.1
	peer_rate_limit {
		name on
		profile all {
			peer {http.request.header.X-Peer}
			rate 1000000000
			cluster redis main
		}
	}
	reverse_proxy 127.0.0.1:18301
}
http://127.0.0.1:18312 {
	bind 127.0.0.1
	peer_rate_limit {
		name off
		profile all {
			peer {http.request.header.X-Peer}
			rate 1000000000
		}
	}
	reverse_proxy 127.0.0.1:18301
}
http://127.0.0.1:18313 {
	bind 127.0.0.1
	peer_rate_limit {
		name fivek
		profile all {
			peer {http.request.header.X-Peer}
			rate 5000
			cluster redis main
		}
	}
	reverse_proxy 127.0.0.1:18301
}
CADDYFILE
bg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" bin/caddy run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
for p in 18390 18301 18311 18312 18313 18319; do wait_port $p; done

# view NAME FIELD: a field of handler NAME's profile "all" (cluster. for the cluster's).
view() {
	curl -s http://127.0.0.1:18319/peer_rate_limit/ | python3 -c "
import json, sys
for h in json.load(sys.stdin):
    if h['name'] == '$1':
        p = h['profiles'][0]
        for k in '$2'.split('.'):
            p = p[k]
        print(p)"
}
# The cluster must be syncing before anything is measured.
for _ in $(seq 100); do [ "$(view on cluster.redis_healthy)" = True ] && break; sleep 0.1; done
[ "$(view on cluster.redis_healthy)" = True ] || { echo "cluster never synced:" >&2; cat "$work/caddy.log" >&2; exit 1; }

rps() { wrk_rps "http://127.0.0.1:$1/" -t2 -c50 -d"$DUR" -H 'X-Peer: pgw1'; }
echo "machine: $(nproc) cores shared by wrk, caddy, redis-server and the upstream; wrk -t2 -c50 -d$DUR, $PAIRS interleaved rounds"
on=() off=() ratios=()
for i in $(seq "$PAIRS"); do
	a=$(rps 18311)
	b=$(rps 18312)
	on+=("$a") off+=("$b") ratios+=("$(ratio "$a" "$b")")
	echo "round $i: cluster on $a req/s, off $b req/s"
done
echo "medians: cluster on $(printf '%s\n' "${on[@]}" | median), off $(printf '%s\n' "${off[@]}" | median) req/s; ratio on/off $(printf '%s\n' "${ratios[@]}" | median)x (goal >= 0.97x)"
echo "cluster on: $(view on cluster.sync_errors_total) failed syncs, fallback $(view on cluster.fallback)"

# Redis commands per admitted request at a cluster-wide 5,000/s.
cmds() { redis-cli -p 18390 INFO stats | awk -F: '/^total_commands_processed/ {print $2+0}'; }
wrk -t2 -c50 -d2s -H 'X-Peer: pgw1' http://127.0.0.1:18313/ >/dev/null # shares settle
a0=$(view fivek admitted_total) r0=$(view fivek rejected_total) c0=$(cmds)
wrk -t2 -c50 -d"${OPSDUR}s" -H 'X-Peer: pgw1' http://127.0.0.1:18313/ >"$work/wrk5k.txt"
c1=$(cmds) a1=$(view fivek admitted_total) r1=$(view fivek rejected_total)
adm=$((a1 - a0)) rej=$((r1 - r0)) ops=$((c1 - c0 - 1))
echo "5k/s limit, ${OPSDUR}s: admitted $adm ($(awk -v a=$adm -v d=$OPSDUR 'BEGIN {printf "%.0f", a/d}')/s), refused $rej; Redis commands $ops ($(awk -v o=$ops -v d=$OPSDUR 'BEGIN {printf "%.1f", o/d}')/s): $(awk -v o=$ops -v a=$adm 'BEGIN {printf "%.5f", o/a}') commands per admitted request (goal <= 0.01)"
