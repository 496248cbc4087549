#!/usr/bin/env bash
# ogs through bin/coredns, with dnsperf, in one run: cached ogs answers vs
# the stock template plugin (goal >= 0.9x) and the stock hosts plugin, each
# answering the same name with the same four A records from an identical
# server. 5 interleaved runs each, median queries per second and median of
# per-run ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need dnsperf dnsperf
go build -o bin/testpeer ./internal/e2e/testpeer
RUNS=${RUNS:-5} SECS=${SECS:-5}

for i in 1 2 3 4; do
	bg bin/testpeer -listen "127.0.0.1$i:18443" -name "gw$i" 2>/dev/null
done
cat >"$work/ogs.Corefile" <<COREFILE
vpn.example.test {
	bind 127.0.0.1
	ogs {
		gateway gw1.example.test 127.0.0.11:18443
		gateway gw2.example.test 127.0.0.12:18443
		gateway gw3.example.test 127.0.0.13:18443
		gateway gw4.example.test 127.0.0.14:18443
		probe http /
	}
}
COREFILE
cat >"$work/template.Corefile" <<'COREFILE'
vpn.example.test {
	bind 127.0.0.1
	template IN A {
		answer "{{ .Name }} 30 IN A 127.0.0.11"
		answer "{{ .Name }} 30 IN A 127.0.0.12"
		answer "{{ .Name }} 30 IN A 127.0.0.13"
		answer "{{ .Name }} 30 IN A 127.0.0.14"
	}
}
COREFILE
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
bg bin/coredns -conf "$work/hosts.Corefile" -dns.port 18055 >/dev/null 2>&1
bg bin/coredns -conf "$work/ogs.Corefile" -dns.port 18053 >/dev/null 2>&1
bg bin/coredns -conf "$work/template.Corefile" -dns.port 18054 >/dev/null 2>&1
sleep 1
# Warm the ogs cache for this location (127.0.0.1/24).
dig @127.0.0.1 -p 18053 vpn.example.test A +short +time=10 >/dev/null
echo "vpn.example.test A" >"$work/queries.txt"

qps() { dnsperf_qps "$1" "$work/queries.txt" -l "$SECS" -c 4 -Q 500000; }
echo "machine: $(nproc) cores shared by dnsperf and coredns; dnsperf -c 4 -l $SECS, $RUNS interleaved runs"
o_all=() t_all=() h_all=() r_all=() rh_all=()
for i in $(seq "$RUNS"); do
	o=$(qps 18053)
	t=$(qps 18054)
	h=$(qps 18055)
	o_all+=("$o") t_all+=("$t") h_all+=("$h")
	r_all+=("$(ratio "$o" "$t")")
	rh_all+=("$(ratio "$o" "$h")")
	echo "run $i: ogs $o qps, template $t qps, hosts $h qps"
done
echo "medians: ogs $(printf '%s\n' "${o_all[@]}" | median) qps, template $(printf '%s\n' "${t_all[@]}" | median) qps, hosts $(printf '%s\n' "${h_all[@]}" | median) qps"
echo "ratios (median of per-run ratios): ogs/template $(printf '%s\n' "${r_all[@]}" | median)x (goal >= 0.9x), ogs/hosts $(printf '%s\n' "${rh_all[@]}" | median)x"
