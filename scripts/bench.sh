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
status=0
go test -run '^$' -bench "${BENCH:-.}" -benchmem -count "$count" ./... >bench/out/go.txt 2>&1 || {
	status=1
	echo "== go benchmarks FAILED:" >&2
	grep -E -B2 -A20 '^(--- FAIL|FAIL|panic:)' bench/out/go.txt >&2 || tail -n 40 bench/out/go.txt >&2
}
grep -E '^(Benchmark|ok|FAIL)' bench/out/go.txt || true # (a listing; the status above is what counts)
echo "== medians and ratios"
go run ./bench/ratios <bench/out/go.txt | tee bench/out/ratios.txt
failed=()
for s in bench/*.sh; do
	[ "$s" = bench/lib.sh ] && continue
	[ -e "$s" ] || continue
	echo "== $s"
	bash "$s" | tee "bench/out/$(basename "$s" .sh).txt" || failed+=("$s")
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "== FAILED load scripts: ${failed[*]}" >&2
	status=1
fi
exit $status
