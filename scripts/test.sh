#!/usr/bin/env bash
# The project's test command (`make test`, and so .ci/run): installs the test
# tools that are missing (Debian packages, as root), then go vet and every
# test: unit, adapter and end-to-end through the real binaries.
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

stage "go vet"
go vet ./...

stage "go test -race (engines)"
# The engines hold the shared state (tables, trackers, limiters): run them
# under the race detector too. internal/e2e runs the binaries; it is below.
go test -race -count=1 $(go list ./internal/... | grep -v '/internal/e2e$')

stage "go test"
go test -count=1 -timeout 40m ${GOTEST_FLAGS:-} ./...

stage ""
printf '== total %ds\n' "$SECONDS"
