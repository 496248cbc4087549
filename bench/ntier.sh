#!/usr/bin/env bash
# N-tier cache redirection through bin/caddy on loopback, with wrk, in one
# run: the two-tier path of the examples (upper tier caddy-l4 with PROXY v2
# → lower tier cache_redirect → origin, bypass requests) against one Caddy
# reverse_proxy hop to the same origin; and cacheable requests answered by
# varnish through both tiers. 10 interleaved rounds; median of per-round
# ratios (goal: two-tier >= 0.9x one hop). As root, then transparent mode
# against proxy mode in network namespaces (BenchmarkTierModes: throughput,
# CPU per GiB, time to first byte against the direct route); NTIER_ONLY=1
# runs only that part.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin"
if [ "$(id -u)" = 0 ] && [ "${NTIER_ONLY:-}" = 1 ]; then
	exec go test -run '^$' -bench BenchmarkTierModes -benchtime=1x ./caddymodules/ntier/
fi
need wrk wrk
need varnishd varnish
go build -o bin/caddy ./builds/caddy
go build -o bin/testpeer ./internal/e2e/testpeer
PAIRS=${PAIRS:-10} DUR=${DUR:-5s}
caddy() { exec env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" CADDY_ADMIN=127.0.0.1:0 "$@" bin/caddy run --adapter caddyfile --config "$cfg" 2>>"$work/caddy.log"; }
bg bin/testpeer -listen 127.0.0.6:8610 -name origin -cache-control max-age=3600 2>/dev/null
# The bench's cache fetches straight from the origin; wrk connects from
# 127.0.0.1, so the lower tier must not take that for the cache (cache_peers).
bg varnishd -F -j none -a 127.0.0.5:6081 -b 127.0.0.6:8610 -n "$work/varnish" -T 127.0.0.1:0 -s malloc,256m >/dev/null 2>&1
cfg=Caddyfile.examples/ntier-upper.Caddyfile
bg caddy
cfg=Caddyfile.examples/ntier-lower.Caddyfile
bg caddy CACHE_PEERS=127.0.0.99
bg caddy CACHE_PEERS=127.0.0.99 NODE=l2b LOWER_IP=127.0.0.4
cat >"$work/one-hop.Caddyfile" <<'CADDYFILE'
{
	auto_https off
}
http://127.0.0.1:8620 {
	bind 127.0.0.1
	reverse_proxy 127.0.0.6:8610
}
CADDYFILE
cfg=$work/one-hop.Caddyfile
bg caddy
wait_port 8610 127.0.0.6; wait_port 6081 127.0.0.5; wait_port 8600 127.0.0.2
wait_port 8601 127.0.0.3; wait_port 8601 127.0.0.4; wait_port 8620
rps() { wrk_rps "$1" -t2 -c50 -d"$DUR"; }
# The hit path must really hit: warm the cache and check.
curl -s -o /dev/null http://127.0.0.2:8600/img/logo.png
curl -sI http://127.0.0.2:8600/img/logo.png | grep -q '^X-Varnish: [0-9]* [0-9]*' || { echo "no cache hit through the tiers" >&2; exit 1; }
echo "machine: $(nproc) cores shared by wrk, three Caddy processes, varnish and the origin; wrk -t2 -c50 -d$DUR, $PAIRS interleaved rounds"
two=() one=() hit=() r2=() rh=()
for i in $(seq "$PAIRS"); do
	a=$(rps http://127.0.0.2:8600/api/item)
	b=$(rps http://127.0.0.1:8620/api/item)
	c=$(rps http://127.0.0.2:8600/img/logo.png)
	two+=("$a") one+=("$b") hit+=("$c") r2+=("$(ratio "$a" "$b")") rh+=("$(ratio "$c" "$b")")
	echo "round $i: two-tier bypass $a req/s, one hop $b req/s, two-tier cache hits $c req/s"
done
echo "medians: two-tier bypass $(printf '%s\n' "${two[@]}" | median), one hop $(printf '%s\n' "${one[@]}" | median), two-tier hits $(printf '%s\n' "${hit[@]}" | median) req/s"
echo "ratio two-tier/one hop $(printf '%s\n' "${r2[@]}" | median)x (goal >= 0.9x); hits through both tiers/one hop $(printf '%s\n' "${rh[@]}" | median)x"
if [ "$(id -u)" = 0 ]; then
	echo "transparent mode against proxy mode (namespaces; ratios: machine_cpu_transparent/proxy, processes_cpu_transparent/proxy, ttfb_transparent/direct):"
	go test -run '^$' -bench BenchmarkTierModes -benchtime=1x ./caddymodules/ntier/ | grep -E '^Benchmark|^ok|FAIL' | tr '\t' '\n' | sed 's/^ *//'
fi
