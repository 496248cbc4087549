#!/usr/bin/env bash
# make bench: Go benchmarks (5 runs each, medians and ratios against the
# anchors measured in the same run), then every load script under bench/
# (each starts its own servers and prints its own ratios). Output is kept in
# bench/out/ for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
count=${BENCH_COUNT:-5}
echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go version | cut -d' ' -f3-)"
echo "== go benchmarks (-count $count)"
go test -run '^$' -bench "${BENCH:-.}" -benchmem -count "$count" ./... | tee bench/out/go.txt | grep -E '^(Benchmark|ok|FAIL)' || true
echo "== medians and ratios"
go run ./bench/ratios <bench/out/go.txt | tee bench/out/ratios.txt
for s in bench/*.sh; do
	[ "$s" = bench/lib.sh ] && continue
	[ -e "$s" ] || continue
	echo "== $s"
	bash "$s" | tee "bench/out/$(basename "$s" .sh).txt"
done
