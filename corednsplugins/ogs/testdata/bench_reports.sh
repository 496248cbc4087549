#!/usr/bin/env bash
# Cached ogs answers with client reports off vs on, through bin/coredns with
# dnsperf: three identical ogs servers (four gateways, the location's entry
# warmed): reports off; reports on, none for the querier's network
# (127.0.0.0/24 has no reporter); reports on, answered from the querier's
# network's reports (three reporters from 127.0.0.2-4 posted first). RUNS
# interleaved runs of SECS seconds each; median qps and median per-run
# ratios against reports off, the three servers' order rotating run by run.
# The bench/ogs.sh method; kept here with the
# plugin it measures.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. bench/lib.sh
go build -o "$work"/coredns ./builds/coredns
go build -o "$work"/testpeer ./internal/e2e/testpeer
RUNS=${RUNS:-10} SECS=${SECS:-5}
for i in 1 2 3 4; do bg "$work"/testpeer -listen "127.0.0.1$i:18643" -name "gw$i" 2>/dev/null; done
need dnsperf dnsperf
token=bench-reporter-token-0123456789
echo "bench $token" >"$work/tokens"
ogs() {
cat <<COREFILE
vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test 127.0.0.11:18643
		gateway gw2.example.test 127.0.0.12:18643
		gateway gw3.example.test 127.0.0.13:18643
		gateway gw4.example.test 127.0.0.14:18643
		probe http /
		$1
	}
}
COREFILE
}
ogs "" >"$work/off.Corefile"
ogs "admin 127.0.0.1:18661
		report_tokens $work/tokens" >"$work/none.Corefile"
ogs "admin 127.0.0.1:18662
		report_tokens $work/tokens" >"$work/rep.Corefile"
bg "$work"/coredns -conf "$work/off.Corefile" -dns.port 18651 >/dev/null 2>&1
bg "$work"/coredns -conf "$work/none.Corefile" -dns.port 18652 >/dev/null 2>&1
bg "$work"/coredns -conf "$work/rep.Corefile" -dns.port 18653 >/dev/null 2>&1
wait_port 18662
for src in 127.0.0.2 127.0.0.3 127.0.0.4; do
	curl -sf --interface "$src" -H "Authorization: Bearer $token" -o /dev/null \
		-d "{\"probe\":\"http\",\"time\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\",\"gateways\":[{\"name\":\"gw4.example.test\",\"rtt_ms\":5},{\"name\":\"gw3.example.test\",\"rtt_ms\":9},{\"name\":\"gw2.example.test\",\"rtt_ms\":20},{\"name\":\"gw1.example.test\",\"rtt_ms\":40}]}" \
		http://127.0.0.1:18662/ogs/reports
done
for p in 18651 18652 18653; do dig @127.0.0.1 -p $p vpn.example.test A +short +time=10 >/dev/null; done
echo "answered from reports: $(dig @127.0.0.1 -p 18653 _ogs.vpn.example.test TXT +short | grep -o 'source reports[^"]*')"
echo "vpn.example.test A" >"$work/queries.txt"
qps() { dnsperf_qps "$1" "$work/queries.txt" -l "$SECS" -c 4 -Q 500000; }
o_all=() n_all=() r_all=() rn=() rr=()
for i in $(seq "$RUNS"); do
	# The order rotates run by run: none of the three always goes first.
	case $((i % 3)) in
	0) o=$(qps 18651); n=$(qps 18652); r=$(qps 18653) ;;
	1) n=$(qps 18652); r=$(qps 18653); o=$(qps 18651) ;;
	2) r=$(qps 18653); o=$(qps 18651); n=$(qps 18652) ;;
	esac
	o_all+=("$o") n_all+=("$n") r_all+=("$r")
	rn+=("$(ratio "$n" "$o")") rr+=("$(ratio "$r" "$o")")
	echo "run $i: off $o, on-none $n, on-reported $r"
done
echo "medians: off $(printf '%s\n' "${o_all[@]}" | median), on-none $(printf '%s\n' "${n_all[@]}" | median), on-reported $(printf '%s\n' "${r_all[@]}" | median)"
echo "ratios: on-none/off $(printf '%s\n' "${rn[@]}" | median)x, on-reported/off $(printf '%s\n' "${rr[@]}" | median)x"
