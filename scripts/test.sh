#!/usr/bin/env bash
# The project's test command (`make test`, and so .ci/run): installs the test
# tools that are missing (Debian packages, as root), builds the binaries the
# end-to-end tests run, then go vet and staticcheck, every test (unit,
# adapter and end to end through the real binaries), then the race detector
# over the engines and the adapters.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin" # slapd and slapadd live there

stage_start=$SECONDS
stage() { # name
	local now=$SECONDS
	[ -n "${stage_name:-}" ] && printf '== %s took %ds\n' "$stage_name" $((now - stage_start))
	stage_name=$1 stage_start=$now
	[ -n "$1" ] && printf '== %s\n' "$1"
	return 0
}

stage "install test tools"
missing=()
while read -r cmd pkg; do
	case "$cmd" in "" | \#*) continue ;; esac
	case "$cmd" in
	/*) [ -e "$cmd" ] || missing+=("$pkg") ;; # a package with no command: a file it installs
	*) command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg") ;;
	esac
done < <(cat scripts/test-deps.txt; echo) # a last line without a newline still counts
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# staticcheck (honnef.co/go/tools), pinned: built into bin/tools/ when it is
# missing, of another version, or built by another Go than this one (which
# it could not analyse packages of). The check reads the binary's build
# information, so a warm run only looks.
staticcheck_version=v0.8.2
staticcheck=bin/tools/staticcheck
want="$(go env GOVERSION) $staticcheck_version"
have=$(go version -m "$staticcheck" 2>/dev/null |
	awk 'NR == 1 {g = $2} $1 == "mod" && $2 == "honnef.co/go/tools" {v = $3} END {print g, v}') || true
if [ "$have" != "$want" ]; then
	echo "installing: staticcheck $staticcheck_version"
	GOBIN="$PWD/bin/tools" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
fi

stage "go mod download"
go mod download

stage "build the binaries"
# bin/test/<hash>/{caddy,coredns,testpeer,…,caddy-xcaddy}, which the end-to-end tests run:
# built here, before go test, so that no test process builds them while go
# test compiles the same packages beside it. This compiles nearly every
# package the tests link.
go run ./internal/e2e/buildbins >/dev/null

# Test binaries are compiled first (`go test -c`, vet included) and run
# after, so that no compile or link competes with a running end-to-end
# test for the two cores, and each binary is linked once (go test relinks
# on every run). -o DIR/ writes one binary per package; the engines
# (internal/) and the rest go to separate directories, where each
# package's name is unique.
M=$(go list -m)
tests=bin/tests
rm -rf "$tests"
mkdir -p "$tests"/engines "$tests"/rest "$tests"/race-full "$tests"/race-short
engines=$(go list ./internal/...)
rest=$(go list ./... | grep -v "^$M/internal/")
# The race stage's packages: the engines (internal/) with every test, the
# adapters and the harness with -short (it skips only what starts a
# process or a network namespace: see internal/e2e).
race_full=$(go list ./internal/... | grep -v '/internal/e2e$')
race_short=$(go list ./internal/e2e ./caddymodules/... ./corednsplugins/...)

# binaries DIR PACKAGE...: "PACKAGE BINARY SOURCE-DIR RUN", a line each, for
# the packages with test files, their binaries in DIR (go test -c -o DIR/);
# RUN is the -test.run pattern, "." (every test).
binaries() {
	local dir=$1
	shift
	go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Name}} {{.Dir}}{{end}}' "$@" |
		while read -r pkg _ src; do echo "$pkg $(realpath "$dir")/${pkg##*/}.test $src ."; done
}

# split_tests N: passes binaries' lines through, each as N lines that
# together run its tests once: the binary's tests (-test.list) dealt out in
# turn, the part's number after the package's name (benchmarks are not
# listed: -test.run does not run them). N=1, or a binary that cannot list
# its tests (run_tests then fails on it), passes the line through as it is.
split_tests() {
	local n=$1 pkg bin src run i j list
	while read -r pkg bin src run; do
		if [ "$n" -le 1 ] || ! list=$(cd "$src" && "$bin" -test.list "$run"); then
			echo "$pkg $bin $src $run"
			continue
		fi
		mapfile -t names < <(grep -v '^Benchmark' <<<"$list")
		if [ ${#names[@]} -eq 0 ]; then
			echo "$pkg $bin $src $run"
			continue
		fi
		for ((i = 0; i < n; i++)); do
			local part=()
			for ((j = i; j < ${#names[@]}; j += n)); do part+=("${names[j]}"); done
			[ ${#part[@]} -gt 0 ] || continue
			echo "$pkg[$((i + 1))/$n] $bin $src ^($(IFS='|'; echo "${part[*]}"))\$"
		done
	done
}

# run_tests P [TEST FLAGS]: runs the binaries listed on standard input (as
# binaries prints them), P at a time in the order listed, each in its
# package's directory as go test does; prints "ok" or, for a failure, the
# whole output and "FAIL", per package, as go test does; fails when any
# fails or a binary is missing.
run_tests() {
	local p=$1
	shift
	tr ' \n' '\0\0' | TEST_FLAGS="$*" xargs -0 -n 4 -P "$p" bash -c '
		pkg=$1 bin=$2 src=$3 run=$4
		log=$(mktemp) t0=$(date +%s%N)
		# shellcheck disable=SC2086 # the flags are words
		(cd "$src" && "$bin" -test.paniconexit0 -test.count=1 -test.timeout=40m -test.run "$run" $TEST_FLAGS) >"$log" 2>&1
		rc=$?
		ds=$((($(date +%s%N) - t0) / 100000000))
		if [ $rc -eq 0 ]; then
			printf "ok  \t%s\t%d.%ds\n" "$pkg" $((ds / 10)) $((ds % 10))
		else
			cat "$log"
			printf "FAIL\t%s\t%d.%ds\n" "$pkg" $((ds / 10)) $((ds % 10))
		fi
		rm -f "$log"
		[ $rc -eq 0 ] || exit 1' _
}

stage "compile the tests (and vet), staticcheck beside"
# staticcheck over every package, test files included, beside the compile:
# both work on the packages the binaries' build left in the build cache,
# and the end-to-end tests after them run with nothing beside. Its own
# cache (~/.cache/staticcheck) makes a warm run take seconds; cold, it
# analyses every dependency once (minutes of CPU). Any finding fails the
# run, after the compile.
"$staticcheck" ./... >"$tests"/staticcheck.out 2>&1 &
staticcheck_pid=$!
trap 'kill "$staticcheck_pid" 2>/dev/null || true' EXIT
# -vet=all: every go vet check on every package, test files included, while
# it builds it (packages without tests too). -s -w: test binaries without
# symbol table and DWARF, which cuts link time; stack traces keep their
# names.
go test -c -vet=all -ldflags='-s -w' -o "$tests"/engines/ $engines
go test -c -vet=all -ldflags='-s -w' -o "$tests"/rest/ $rest
if ! wait "$staticcheck_pid"; then
	cat "$tests"/staticcheck.out
	echo "FAIL	staticcheck $staticcheck_version ./..."
	exit 1
fi
trap - EXIT

stage "go test (every test)"
# Four at a time, the slowest first: each takes its time in end-to-end
# waits, not CPU (the stage keeps the two cores about 70 % busy), so the
# four overlap and the stage ends near the sum of their times over four.
# The two slowest packages (about 290 and 180 s alone) run as two parts
# each, which halves what one binary holds the stage for: 227–241 s in four
# runs, for 290 s three at a time unsplit. Nothing compiles beside them:
# the race build ran beside them at the lowest CPU priority once, and under
# that load two cluster tests measured off (an ogs replica's store calls
# timed out, the static anchor admitted 1.545 R for 1.601 R). A -test.run
# in TEST_FLAGS runs the two packages whole, so no test runs twice.
# chaos (one test: the fault schedule over the three cluster modules,
# about 60 s) goes next, in a lane of its own.
slowest="$M/caddymodules/peerratelimit $M/caddymodules/latencybucket $M/chaos $M/corednsplugins/ogs $M/caddymodules/tenantroute $M/caddymodules/dashboard"
parts=2
case "${TEST_FLAGS:-}" in *-test.run*) parts=1 ;; esac
{
	binaries "$tests"/rest $(printf '%s\n' $slowest | head -2) | split_tests $parts
	binaries "$tests"/rest $(printf '%s\n' $slowest | tail -n +3)
	binaries "$tests"/engines "$M/internal/e2e"
	binaries "$tests"/rest $(printf '%s\n' $rest | grep -vxF -f <(printf '%s\n' $slowest))
	binaries "$tests"/engines $(printf '%s\n' $engines | grep -vx "$M/internal/e2e")
} | run_tests "${TEST_PARALLEL:-4}" ${TEST_FLAGS:-}

stage "go test -race"
# The engines (internal/), with every test, and the adapters, with their
# unit and in-process tests (-short skips only what starts a process or a
# network namespace: see internal/e2e), under the race detector. vet ran
# above.
go test -race -vet=off -c -ldflags='-s -w' -o "$tests"/race-full/ $race_full
go test -race -vet=off -c -ldflags='-s -w' -o "$tests"/race-short/ $race_short
binaries "$tests"/race-full $race_full | run_tests 2
binaries "$tests"/race-short $race_short | run_tests 2 -test.short

stage ""
printf '== total %ds\n' "$SECONDS"
