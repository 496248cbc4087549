# Shared helpers of the bench/*.sh load scripts (sourced, not run).

# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# ratio A B: A/B to three decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a/b}'; }

# wait_port PORT [HOST]: wait up to 10 s for a TCP listener.
wait_port() {
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "port $1 did not come up" >&2
	return 1
}

# need CMD PACKAGE: install a Debian package when CMD is missing.
need() {
	command -v "$1" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; }
}

# A scratch directory and the background processes started with bg; both
# are cleaned up when the script exits.
work=$(mktemp -d)
pids=()
bg() { "$@" & pids+=($!); }
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# wrk_checked URL [wrk options…]: runs wrk and prints its report, or fails
# (status 1, report on stderr) when any answer was not 2xx/3xx or a socket
# error occurred: a load figure counts only answers that did what was asked.
wrk_checked() {
	local url=$1 out
	shift
	out=$(wrk "$@" "$url") || { printf 'wrk failed against %s:\n%s\n' "$url" "$out" >&2; return 1; }
	if grep -qE 'Non-2xx or 3xx responses|Socket errors' <<<"$out"; then
		printf 'wrk against %s had failed answers:\n%s\n' "$url" "$out" >&2
		return 1
	fi
	printf '%s\n' "$out"
}

# wrk_rps URL [wrk options…]: requests/s of wrk_checked.
wrk_rps() {
	local out
	out=$(wrk_checked "$@") || return 1
	awk '/Requests\/sec/ {print $2}' <<<"$out"
}

# dnsperf_qps PORT QUERYFILE [dnsperf options…]: queries/s, failing unless
# every answer's rcode was NOERROR.
dnsperf_qps() {
	local port=$1 file=$2 out codes
	shift 2
	out=$(dnsperf -s 127.0.0.1 -p "$port" -d "$file" "$@" 2>&1) || { printf 'dnsperf failed:\n%s\n' "$out" >&2; return 1; }
	codes=$(awk '/Response codes:/ {sub(/.*Response codes:[ \t]*/, ""); print}' <<<"$out")
	if [ -z "$codes" ] || grep -qvE '^NOERROR [0-9]+ \(100\.00%\)$' <<<"$codes"; then
		printf 'dnsperf on port %s: response codes %s (want only NOERROR):\n%s\n' "$port" "${codes:-none}" "$out" >&2
		return 1
	fi
	awk '/Queries per second/ {print $4}' <<<"$out"
}
