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
