#!/usr/bin/env bash
# Cached ogs answers (the location fresh in memory) with `store redis` vs
# without, against the stock hosts plugin, through bin/coredns with dnsperf:
# RUNS interleaved runs of SECS seconds each; median qps and median per-run
# ratios, and the Redis commands the whole run cost (the local level must
# make none). The bench/ogs.sh method; kept here with the plugin it measures.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. bench/lib.sh
go build -o "$work"/coredns ./builds/coredns
go build -o "$work"/testpeer ./internal/e2e/testpeer
RUNS=${RUNS:-5} SECS=${SECS:-5}
for i in 1 2 3 4; do bg "$work"/testpeer -listen "127.0.0.1$i:18543" -name "gw$i" 2>/dev/null; done
need redis-server redis-server
need dnsperf dnsperf
bg redis-server --bind 127.0.0.1 --port 18179 --save "" --appendonly no --dir "$work" --loglevel warning >/dev/null
wait_port 18179
ogs() {
cat <<COREFILE
vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test 127.0.0.11:18543
		gateway gw2.example.test 127.0.0.12:18543
		gateway gw3.example.test 127.0.0.13:18543
		gateway gw4.example.test 127.0.0.14:18543
		probe http /
		$1
	}
}
COREFILE
}
ogs "" >"$work/ogs.Corefile"
ogs "store redis {
			address 127.0.0.1:18179
		}" >"$work/ogsr.Corefile"
cat >"$work/hosts.Corefile" <<'COREFILE'
vpn.example.test {
	bind 127.0.0.1
	hosts {
		127.0.0.11 vpn.example.test
		127.0.0.12 vpn.example.test
		127.0.0.13 vpn.example.test
		127.0.0.14 vpn.example.test
	}
}
COREFILE
bg "$work"/coredns -conf "$work/hosts.Corefile" -dns.port 18155 >/dev/null 2>&1
bg "$work"/coredns -conf "$work/ogs.Corefile" -dns.port 18153 >/dev/null 2>&1
bg "$work"/coredns -conf "$work/ogsr.Corefile" -dns.port 18154 >/dev/null 2>&1
sleep 1
dig @127.0.0.1 -p 18153 vpn.example.test A +short +time=10 >/dev/null
dig @127.0.0.1 -p 18154 vpn.example.test A +short +time=10 >/dev/null
echo "stored: $(redis-cli -p 18179 --scan --pattern "edgesteer:ogs:*")"
echo "vpn.example.test A" >"$work/queries.txt"
qps() { dnsperf_qps "$1" "$work/queries.txt" -l "$SECS" -c 4 -Q 500000; }
o_all=() r_all=() h_all=() rr=() rh=() oh=()
for i in $(seq "$RUNS"); do
	o=$(qps 18153); r=$(qps 18154); h=$(qps 18155)
	o_all+=("$o") r_all+=("$r") h_all+=("$h")
	rr+=("$(ratio "$r" "$o")") rh+=("$(ratio "$r" "$h")") oh+=("$(ratio "$o" "$h")")
	echo "run $i: ogs $o, ogs+redis $r, hosts $h"
done
echo "medians: ogs $(printf '%s\n' "${o_all[@]}" | median), ogs+redis $(printf '%s\n' "${r_all[@]}" | median), hosts $(printf '%s\n' "${h_all[@]}" | median)"
echo "ratios: redis/no-store $(printf '%s\n' "${rr[@]}" | median)x, redis/hosts $(printf '%s\n' "${rh[@]}" | median)x, no-store/hosts $(printf '%s\n' "${oh[@]}" | median)x"
echo "redis commands processed: $(redis-cli -p 18179 info stats | grep total_commands_processed)"
