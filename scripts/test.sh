#!/usr/bin/env bash
# The project's test command (`make test`, and so .ci/run): installs the test
# tools that are missing (Debian packages, as root), builds the binaries the
# end-to-end tests run, then go vet and every test (unit, adapter and end to
# end through the real binaries), then the race detector over the engines
# and the adapters.
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
	command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done < <(cat scripts/test-deps.txt; echo) # a last line without a newline still counts
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stage "go mod download"
go mod download

stage "build the binaries"
# bin/test/<hash>/{caddy,coredns,testpeer,…,caddy-xcaddy}, which the end-to-end tests run:
# built here, before go test, so that no test process builds them while go
# test compiles the same packages beside it. This compiles nearly every
# package the tests link.
go run ./internal/e2e/buildbins >/dev/null

# The packages of the race stage: the engines (internal/) with every test,
# the adapters and the harness with -short.
race_full=$(go list ./internal/... | grep -v '/internal/e2e$')
race_short="./internal/e2e ./caddymodules/... ./corednsplugins/..."

stage "go test (vet and every test)"
# -vet=all: go test runs all of go vet's checks on every package, test files
# included, while it builds it (packages without tests too), so one pass
# does both (go vet ./... first analysed every dependency a second time).
# -s -w: test binaries without symbol table and DWARF, which cuts link time;
# stack traces keep their names.
# Not -p 3 with the slow packages first: in a cold run on a loaded host that
# failed two rate- and latency-measuring tests (peer_rate_limit
# TestClusterACLRefusesPeerKeys counted 0.90 x the limit, ogs
# TestReloadKeepsLocations got another gateway order).
# The slowest packages are named first: go test starts the test runs in the
# order of its package list, so with the longest first the two at a time
# overlap and the stage ends near the longest package's time rather than
# after it (./... repeats them; go test runs each once). Each takes its
# time in end-to-end waits, not CPU: the order adds no load.
slowest="./caddymodules/peerratelimit ./caddymodules/latencybucket ./corednsplugins/ogs ./caddymodules/tenantroute ./caddymodules/dashboard ./internal/e2e"
go test -vet=all -ldflags='-s -w' -count=1 -timeout 40m ${GOTEST_FLAGS:-} $slowest ./...

stage "go test -race"
# The engines (internal/), with every test, and the adapters, with their
# unit and in-process tests (-short skips only what starts a process or a
# network namespace: see internal/e2e), under the race detector. vet ran
# above.
go test -race -vet=off -ldflags='-s -w' -count=1 $race_full
go test -race -vet=off -ldflags='-s -w' -count=1 -short $race_short

stage ""
printf '== total %ds\n' "$SECONDS"
