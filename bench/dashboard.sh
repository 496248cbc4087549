#!/usr/bin/env bash
# The dashboard's cost and weight, in one run:
#  1. request path: wrk through a copy of the demo's latency_bucket site
#     (three publishers, probes every 2 s, sticky_user) in a Caddy that also
#     runs edgesteer_dashboard (sampling every 2 s, and a client polling its
#     api/state every 2 s as the open page does) vs the same Caddy config
#     without the dashboard: PAIRS interleaved rounds, median of per-round
#     ratios (goal >= 0.98x);
#  2. the sampler's own CPU: each idle Caddy's CPU time (utime + stime from
#     /proc) over IDLE seconds, with the poller still running: what sampling
#     and serving api/state cost, whatever the machine's other load;
#  3. the page: bytes transferred (page, assets and the first api/state,
#     gzip) and time to the first complete render in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need wrk wrk
need chromium chromium
PAIRS=${PAIRS:-10} DUR=${DUR:-5s} IDLE=${IDLE:-30}
go build -o bin/caddy ./builds/caddy
go build -o bin/dashboardrender ./bench/dashboardrender

config() { # front-port publisher-base dashboard(0|1) dashboard-port
	printf '{\n\tadmin off\n\tauto_https off\n\tlog default {\n\t\tlevel ERROR\n\t}\n}\n'
	printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\treverse_proxy 127.0.0.1:%s 127.0.0.1:%s 127.0.0.1:%s {\n' "$1" $(($2 + 1)) $(($2 + 2)) $(($2 + 3))
	printf '\t\tlb_policy latency_bucket {\n\t\t\tname bench\n\t\t\tprobe http /\n\t\t\tprobe_interval 2s\n\t\t\tsegment 127.0.0.1:%s 40ms\n\t\t\tsticky_user {http.request.header.X-User}\n\t\t}\n\t}\n}\n' $(($2 + 3))
	for i in 1 2 3; do
		printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\trespond "publisher-%s"\n}\n' $(($2 + i)) "$i"
	done
	if [ "$3" = 1 ]; then
		printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\tencode gzip\n\tedgesteer_dashboard {\n\t\tsample_interval 2s\n\t}\n}\n' "$4"
	fi
}
config 18480 18480 1 18488 >"$work/with.Caddyfile"
config 18580 18580 0 0 >"$work/without.Caddyfile"
for c in with without; do
	mkdir -p "$work/$c"
	bg env XDG_DATA_HOME="$work/$c" XDG_CONFIG_HOME="$work/$c" bin/caddy run --adapter caddyfile --config "$work/$c.Caddyfile" 2>"$work/$c.log"
	eval "pid_$c=\$!"
done
for p in 18480 18483 18488 18580 18583; do wait_port $p; done
sleep 5 # a few probe rounds and samples
# The open page: api/state every 2 s, all along.
bg bash -c 'while :; do curl -s -o /dev/null --compressed http://127.0.0.1:18488/api/state; sleep 2; done'

rps() { wrk_rps "http://127.0.0.1:$1/" -t2 -c50 -d"$DUR" -H "X-User: bench"; }
echo "machine: $(nproc) cores shared by wrk and both Caddys; wrk -t2 -c50 -d$DUR, $PAIRS interleaved rounds"
ratios=() with_all=() without_all=()
for i in $(seq "$PAIRS"); do
	if [ $((i % 2)) = 1 ]; then a=$(rps 18480); b=$(rps 18580); else b=$(rps 18580); a=$(rps 18480); fi
	with_all+=("$a") without_all+=("$b")
	ratios+=("$(ratio "$a" "$b")")
	echo "round $i: with dashboard $a, without $b req/s"
done
echo "throughput medians: with dashboard $(printf '%s\n' "${with_all[@]}" | median), without $(printf '%s\n' "${without_all[@]}" | median) req/s"
echo "ratio with/without (median of per-round ratios): $(printf '%s\n' "${ratios[@]}" | median)x (goal >= 0.98x)"

# CPU ticks (utime + stime) of a process.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
w0=$(ticks "$pid_with") o0=$(ticks "$pid_without")
sleep "$IDLE"
w1=$(ticks "$pid_with") o1=$(ticks "$pid_without")
hz=$(getconf CLK_TCK)
awk -v w=$((w1 - w0)) -v o=$((o1 - o0)) -v hz="$hz" -v s="$IDLE" 'BEGIN {
	printf "idle CPU over %d s (probes every 2 s in both; sampling every 2 s and api/state polled every 2 s in one): with dashboard %.1f ms/s, without %.1f ms/s; the dashboard costs %.1f ms of CPU per second (%.2f %% of one core)\n",
		s, 1000*w/hz/s, 1000*o/hz/s, 1000*(w-o)/hz/s, 100*(w-o)/hz/s }'

# Page weight, file by file (gzip as served), then the browser's figures.
total=0
for path in "" assets/app.js assets/agent.js assets/app.css assets/uPlot.iife.min.js assets/uPlot.min.css api/state; do
	n=$(curl -s --compressed -o /dev/null -w '%{size_download}' "http://127.0.0.1:18488/$path")
	total=$((total + n))
	printf 'gzip %-26s %7d bytes\n' "/${path}" "$n"
done
echo "page weight (page, assets, one api/state; gzip bodies): $total bytes"
bin/dashboardrender -url http://127.0.0.1:18488/ -runs 5
