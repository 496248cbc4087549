#!/usr/bin/env bash
# latency_bucket through bin/caddy, with wrk, in one run:
#  1. throughput: lb_policy latency_bucket vs lb_policy random over the same
#     4 local upstreams, 10 interleaved runs of each, median ratio (goal >=
#     0.98x). wrk's connections all come from 127.0.0.1, so a sticky policy
#     sends them all to one upstream while random spreads them: the sticky-off
#     variant is the like-for-like comparison of the pick itself;
#  2. tail latency: one of 4 publishers 10x slower (50 ms vs 5 ms): p99 with
#     latency_bucket, with random, and with 4 fast publishers (goal: <= 1.2x
#     all-fast);
#  3. the latency_bucket transport (latency from real traffic): the same policy (latency probe,
#     sticky off) with and without `transport latency_bucket { transport http }`,
#     10 interleaved pairs, median ratio (goal >= 0.98x);
#  4. tail latency with one publisher slow to answer (50 ms) but fast to probe
#     (GET /probe at once): p99 with latency probe, latency both (the transport
#     timing real answers), within p2c (latency probe), and Caddy's least_conn,
#     against 4 fast publishers; after one warm-up run of each, TAIL_ROUNDS
#     (10) rounds, medians of per-round ratios (p2c goal <= 1.05x).
#     sticky off: wrk's connections are all one user (127.0.0.1).
#  5. capacity: four publishers of capacities 1:1:1:4 (testpeer -slots 1, 1,
#     1 and 4: requests beyond the slots wait in a queue; 10 ms of service
#     each: 700 requests/s in all), an open-loop constant rate of 80 % of
#     that (CAP_LOAD; bench/httpload, latency from each request's scheduled
#     send time): p99 of within p2c (sticky off), and of within p2c with
#     choices all, vs Caddy's least_conn and random, PAIRS interleaved
#     rounds (the order rotates), medians of per-round ratios (goals: <=
#     0.8x least_conn, <= 0.5x random);
#  6. cpu_bound: four equal CPU-bound publishers (-slots 1 -cpu 2ms: each
#     request burns 2 ms of CPU time, CPU_WORK), an open-loop rate of 80 %
#     (CPU_LOAD) of what wrk's closed loop gets through least_conn on this
#     host at the start of the part: p99 of within p2c vs least_conn, PAIRS
#     interleaved rounds, median of per-round ratios (goal <= 1.05x).
# PARTS selects what runs (default: the first four), e.g. PARTS="transport
# traffic_tail". capacity and cpu_bound are not in the default: with
# PAIRS=10 DUR=5s they take about 3 and 2 minutes (PARTS="capacity cpu_bound").
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need wrk wrk
PAIRS=${PAIRS:-10} DUR=${DUR:-5s} PARTS=${PARTS:-throughput tail transport traffic_tail}
TAIL_ROUNDS=${TAIL_ROUNDS:-10} CAP_LOAD=${CAP_LOAD:-0.8} CPU_LOAD=${CPU_LOAD:-0.8} CPU_WORK=${CPU_WORK:-2ms}
want() { [[ " $PARTS " == *" $1 "* ]]; }
go build -o bin/testpeer ./internal/e2e/testpeer
if want capacity || want cpu_bound; then go build -o bin/httpload ./bench/httpload; fi

peer() { # port name delay [testpeer options…]
	bg bin/testpeer -listen "127.0.0.1:$1" -name "$2" -delay "$3" -probe-delay 0 "${@:4}" 2>/dev/null
}

# Throughput upstreams: 18101-18104 (no delay). Tail upstreams: 18111-18114,
# 18114 ten times slower. All-fast upstreams: 18121-18124.
for i in 1 2 3 4; do peer $((18100 + i)) "p$i" 0; done
for i in 1 2 3; do peer $((18110 + i)) "t$i" 5ms; done
peer 18114 t4 50ms
for i in 1 2 3 4; do peer $((18120 + i)) "f$i" 5ms; done
# Slow to answer, fast to probe: 18131-18134, 18134 answers in 50 ms, /probe at once.
for i in 1 2 3; do peer $((18130 + i)) "s$i" 5ms; done
peer 18134 s4 50ms
# Capacities 1:1:1:4: 18141-18144, 10 ms of service each. CPU-bound: 18151-18154.
for i in 1 2 3; do peer $((18140 + i)) "c$i" 10ms -slots 1; done
peer 18144 c4 10ms -slots 4
for i in 1 2 3 4; do peer $((18150 + i)) "u$i" 0 -slots 1 -cpu "$CPU_WORK"; done

site() { # port policy upstream-base
	local ups="" i
	for i in 1 2 3 4; do ups+=" 127.0.0.1:$(($3 + i))"; done
	if [ "$2" = latency_bucket ] || [ "$2" = latency_bucket_nosticky ]; then
		local sticky=on
		[ "$2" = latency_bucket_nosticky ] && sticky=off
		printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\treverse_proxy%s {\n\t\tlb_policy latency_bucket {\n\t\t\tprobe http /\n\t\t\tprobe_interval 1s\n\t\t\tsticky %s\n\t\t}\n\t}\n}\n' "$1" "$ups" "$sticky"
	elif [ "$2" = probe_nowrap ] || [ "$2" = probe_wrap ] || [ "$2" = traffic_probe ] || [ "$2" = traffic_both ] || [[ "$2" == *_p2c ]]; then
		local latency=probe transport="" within=random
		[ "$2" = traffic_both ] && latency=both
		[[ "$2" == *_p2c ]] && within=p2c
		[ "$2" = capacity_all_p2c ] && within=$'p2c\n\t\t\tchoices all'
		[ "$2" != probe_nowrap ] && transport='\t\ttransport latency_bucket {\n\t\t\ttransport http\n\t\t}\n'
		printf "http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\treverse_proxy%s {\n\t\tlb_policy latency_bucket {\n\t\t\tname %s\n\t\t\tlatency %s\n\t\t\tprobe http /probe\n\t\t\tprobe_interval 1s\n\t\t\twithin %s\n\t\t\tsticky off\n\t\t}\n$transport\t}\n}\n" "$1" "$ups" "$2" "$latency" "$within"
	else
		printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\treverse_proxy%s {\n\t\tlb_policy %s\n\t}\n}\n' "$1" "$ups" "$2"
	fi
}
{
	printf '{\n\tadmin off\n\tauto_https off\n\tlog default {\n\t\tlevel ERROR\n\t}\n}\n'
	site 18001 latency_bucket 18100
	site 18002 random 18100
	site 18003 latency_bucket_nosticky 18100
	site 18011 latency_bucket 18110
	site 18012 random 18110
	site 18021 random 18120
	site 18004 probe_nowrap 18100
	site 18005 probe_wrap 18100
	site 18031 traffic_probe 18130
	site 18032 traffic_both 18130
	site 18033 least_conn 18130
	site 18034 traffic_p2c 18130
	site 18041 capacity_p2c 18140
	site 18042 least_conn 18140
	site 18043 random 18140
	site 18045 capacity_all_p2c 18140
	site 18051 cpu_p2c 18150
	site 18052 least_conn 18150
} >"$work/Caddyfile"
bg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" bin/caddy run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
for p in 18001 18002 18003 18004 18005 18011 18012 18021 18031 18032 18033 18034 18041 18042 18043 18045 18051 18052 18101 18114 18124 18134 18144 18154; do wait_port $p; done
sleep 3 # a few probe rounds

rps() { wrk_rps "http://127.0.0.1:$1/" -t2 -c50 -d"$DUR"; }
p99() {
	local out
	out=$(wrk_checked "http://127.0.0.1:$1/" -t2 -c10 -d"$DUR" --latency) || return 1
	awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out"
}
# load PORT RATE: bench/httpload's line for an open-loop run of DUR at RATE
# requests/s, or a failure when any request failed.
load() {
	local out
	out=$(bin/httpload -url "http://127.0.0.1:$1/" -rate "$2" -d "$DUR") || { printf 'httpload against port %s failed: %s\n' "$1" "$out" >&2; return 1; }
	printf '%s\n' "$out"
}
# field NAME LINE: the value after NAME in LINE.
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) {print $(i + 1); exit}}' <<<"$2"; }

echo "machine: $(nproc) cores shared by wrk, caddy and the upstreams; wrk -t2 -c50 -d$DUR, $PAIRS interleaved rounds"
if want throughput; then
ratios=() ratios_ns=() lb_all=() ns_all=() rnd_all=()
for i in $(seq "$PAIRS"); do
	a=$(rps 18001)
	c=$(rps 18003)
	b=$(rps 18002)
	lb_all+=("$a") ns_all+=("$c") rnd_all+=("$b")
	ratios+=("$(ratio "$a" "$b")")
	ratios_ns+=("$(ratio "$c" "$b")")
	echo "round $i: latency_bucket $a, latency_bucket sticky off $c, random $b req/s"
done
echo "throughput medians: latency_bucket $(printf '%s\n' "${lb_all[@]}" | median), sticky off $(printf '%s\n' "${ns_all[@]}" | median), random $(printf '%s\n' "${rnd_all[@]}" | median) req/s"
echo "throughput ratios (median of per-round ratios): latency_bucket/random $(printf '%s\n' "${ratios[@]}" | median)x, latency_bucket sticky off/random $(printf '%s\n' "${ratios_ns[@]}" | median)x (goal >= 0.98x)"
fi

if want tail; then

lbp=() rp=() fp=()
for i in $(seq 5); do
	l=$(p99 18011)
	r=$(p99 18012)
	f=$(p99 18021)
	lbp+=("$l") rp+=("$r") fp+=("$f")
done
l=$(printf '%s\n' "${lbp[@]}" | median) r=$(printf '%s\n' "${rp[@]}" | median) f=$(printf '%s\n' "${fp[@]}" | median)
echo "tail (one publisher 10x slower, wrk -c10, median of 5): p99 latency_bucket ${l} ms, random ${r} ms, all-fast ${f} ms"
awk -v l="$l" -v r="$r" -v f="$f" 'BEGIN {printf "tail ratios: latency_bucket/all-fast %.2fx (goal <= 1.2x), random/all-fast %.2fx\n", l/f, r/f}'
fi

if want transport; then
	wr=() nw=() wr_all=() nw_all=()
	for i in $(seq "$PAIRS"); do
		if [ $((i % 2)) = 1 ]; then
			a=$(rps 18005)
			b=$(rps 18004)
		else
			b=$(rps 18004)
			a=$(rps 18005)
		fi
		wr_all+=("$a") nw_all+=("$b")
		wr+=("$(ratio "$a" "$b")")
		echo "round $i: with the latency_bucket transport $a, without $b req/s"
	done
	echo "transport medians: with $(printf '%s\n' "${wr_all[@]}" | median), without $(printf '%s\n' "${nw_all[@]}" | median) req/s"
	echo "transport ratio (median of per-round ratios): with/without $(printf '%s\n' "${wr[@]}" | median)x (goal >= 0.98x)"
fi

if want traffic_tail; then
	# Warm-up, one run per site: the traffic policies learn the slow
	# publisher from its answers (a cold start gives it a fair share until
	# its first answers are counted, which the rounds do not measure).
	for p in 18031 18032 18033 18034 18021; do p99 $p >/dev/null; done
	tp=() tb=() tl=() tf=() tc=() rp=() rb=() rl=() rc=()
	for i in $(seq "$TAIL_ROUNDS"); do
		tp+=("$(p99 18031)")
		tb+=("$(p99 18032)")
		tl+=("$(p99 18033)")
		tc+=("$(p99 18034)")
		tf+=("$(p99 18021)")
		# Per-round ratios: the anchor's own p99 moves with the host's load.
		rp+=("$(ratio "${tp[-1]}" "${tf[-1]}")") rb+=("$(ratio "${tb[-1]}" "${tf[-1]}")")
		rl+=("$(ratio "${tl[-1]}" "${tf[-1]}")") rc+=("$(ratio "${tc[-1]}" "${tf[-1]}")")
		echo "round $i: p99 probe ${tp[-1]} ms, both ${tb[-1]} ms, least_conn ${tl[-1]} ms, p2c ${tc[-1]} ms, all-fast ${tf[-1]} ms"
	done
	p=$(printf '%s\n' "${tp[@]}" | median) b=$(printf '%s\n' "${tb[@]}" | median) l=$(printf '%s\n' "${tl[@]}" | median) f=$(printf '%s\n' "${tf[@]}" | median)
	c=$(printf '%s\n' "${tc[@]}" | median)
	echo "tail (one publisher 50 ms to answer, fast to probe; wrk -c10, median of $TAIL_ROUNDS): p99 probe ${p} ms, both ${b} ms, least_conn ${l} ms, within p2c ${c} ms, all-fast ${f} ms"
	echo "tail ratios to all-fast, medians of per-round ratios: probe $(printf '%s\n' "${rp[@]}" | median)x, both $(printf '%s\n' "${rb[@]}" | median)x, least_conn $(printf '%s\n' "${rl[@]}" | median)x, within p2c $(printf '%s\n' "${rc[@]}" | median)x (goal <= 1.05x)"
fi

if want capacity; then
	rate=$(awk -v l="$CAP_LOAD" 'BEGIN {printf "%d", l * 700}')
	for p in 18041 18042 18043 18045; do load $p "$rate" >/dev/null; done # warm-up: estimates, connections
	names=(p2c least_conn random all) ports=(18041 18042 18043 18045)
	cp=() cl=() cr=() rl=() rr=() ca=() al=() ar=()
	for i in $(seq "$PAIRS"); do
		declare -A got=()
		for k in 0 1 2 3; do # the order rotates from round to round
			j=$(((i + k) % 4))
			line=$(load "${ports[j]}" "$rate")
			got[${names[j]}]=$(field p99 "$line") got[${names[j]}_lag]=$(field lag-p99 "$line")
		done
		cp+=("${got[p2c]}") cl+=("${got[least_conn]}") cr+=("${got[random]}")
		rl+=("$(ratio "${got[p2c]}" "${got[least_conn]}")") rr+=("$(ratio "${got[p2c]}" "${got[random]}")")
		ca+=("${got[all]}") al+=("$(ratio "${got[all]}" "${got[least_conn]}")") ar+=("$(ratio "${got[all]}" "${got[random]}")")
		echo "round $i: p99 within p2c ${got[p2c]} ms, p2c choices all ${got[all]} ms, least_conn ${got[least_conn]} ms, random ${got[random]} ms (send lag p99 ${got[p2c_lag]}, ${got[all_lag]}, ${got[least_conn_lag]}, ${got[random_lag]} ms)"
		unset got
	done
	echo "capacity (slots 1:1:1:4, 10 ms each, open loop $rate/s = $CAP_LOAD of 700/s, $DUR, median of $PAIRS): p99 within p2c $(printf '%s\n' "${cp[@]}" | median) ms, p2c choices all $(printf '%s\n' "${ca[@]}" | median) ms, least_conn $(printf '%s\n' "${cl[@]}" | median) ms, random $(printf '%s\n' "${cr[@]}" | median) ms"
	echo "capacity ratios (medians of per-round ratios): within p2c/least_conn $(printf '%s\n' "${rl[@]}" | median)x (goal <= 0.8x), within p2c/random $(printf '%s\n' "${rr[@]}" | median)x (goal <= 0.5x)"
	echo "capacity ratios, choices all: p2c choices all/least_conn $(printf '%s\n' "${al[@]}" | median)x (goal <= 0.8x), p2c choices all/random $(printf '%s\n' "${ar[@]}" | median)x (goal <= 0.5x)"
fi

if want cpu_bound; then
	max=$(wrk_rps "http://127.0.0.1:18052/" -t2 -c16 -d"$DUR")
	rate=$(awk -v l="$CPU_LOAD" -v m="$max" 'BEGIN {printf "%d", l * m}')
	for p in 18051 18052; do load $p "$rate" >/dev/null; done # warm-up
	up=() ul=() ur=()
	for i in $(seq "$PAIRS"); do
		if [ $((i % 2)) = 1 ]; then
			a=$(load 18051 "$rate")
			b=$(load 18052 "$rate")
		else
			b=$(load 18052 "$rate")
			a=$(load 18051 "$rate")
		fi
		up+=("$(field p99 "$a")") ul+=("$(field p99 "$b")")
		ur+=("$(ratio "${up[-1]}" "${ul[-1]}")")
		echo "round $i: p99 within p2c ${up[-1]} ms, least_conn ${ul[-1]} ms (send lag p99 $(field lag-p99 "$a"), $(field lag-p99 "$b") ms)"
	done
	echo "cpu_bound (4 x slots 1, $CPU_WORK of CPU each; open loop $rate/s = $CPU_LOAD of wrk -c16's $max/s through least_conn, $DUR, median of $PAIRS): p99 within p2c $(printf '%s\n' "${up[@]}" | median) ms, least_conn $(printf '%s\n' "${ul[@]}" | median) ms"
	echo "cpu_bound ratio (median of per-round ratios): within p2c/least_conn $(printf '%s\n' "${ur[@]}" | median)x (goal <= 1.05x)"
fi
