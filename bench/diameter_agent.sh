#!/usr/bin/env bash
# The Diameter routing agent (layer4 diameter_agent) through bin/caddy, in
# one run, all in a network namespace of its own (freeDiameter will not
# start with loopback addresses only; needs root):
#  1. messages/s: the same CCR-U traffic (one client connection, 64 in
#     flight, 1,000 Session-Ids, Destination-Realm "example") through the
#     agent, through freeDiameter 1.2.1 relaying it (rt_default), and
#     through the plain layer4 proxy, to the same go-diameter server (CER,
#     DWR and every request answered from the raw bytes). RUNS interleaved
#     rounds, the order rotating; medians of per-round ratios (goals:
#     >= 1.0x freeDiameter, >= 0.7x the plain proxy);
#  2. p99 during a failover: a second agent whose group has two servers;
#     each round is a run with both up, then a run where one is killed
#     (kill -9) halfway; p99 of each, and their ratio (median over rounds).
#     The killed server is restarted and the agent sees it OKAY again
#     before the next round.
#  3. DOIC on vs off: the throughput run through the agent (port 18468)
#     and through the same agent with a doic block (port 18464: the
#     agent's OC-Supported-Features added to each request, its Load to
#     each answer), interleaved; median of per-round ratios (goal >= 0.97x).
# PARTS selects what runs (default "throughput failover"; "doic" as well). PROFILE=<file>
# writes a 10 s CPU profile of bin/caddy under the agent's load (admin
# pprof) to <file>. CADDY=<binary> runs that build instead of building
# bin/caddy (bench/smoke_test.go, in make test, runs one short round so).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need freeDiameterd freediameterd
if [ ! -e /usr/lib/freeDiameter/rt_default.fdx ]; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq freediameter-extensions >/dev/null
fi
need openssl openssl
need jq jq
RUNS=${RUNS:-5} DUR=${DUR:-5s} PARTS=${PARTS:-throughput failover}
want() { [[ " $PARTS " == *" $1 "* ]]; }
secs=${DUR%s}
if [ -z "${CADDY:-}" ]; then
	go build -o bin/caddy ./builds/caddy
	CADDY=bin/caddy
fi
go build -o bin/diameterload ./bench/diameterload

# The namespace: a veth pair with both ends inside, 10.98.0.1 and .2.
ns=edgesteer-bench-$$
ip netns add "$ns"
cleanup_ns() { cleanup; ip netns del "$ns" 2>/dev/null || true; }
trap cleanup_ns EXIT
ip -n "$ns" link set lo up
ip -n "$ns" link add veth0 type veth peer name veth1
ip -n "$ns" addr add 10.98.0.1/24 dev veth0
ip -n "$ns" addr add 10.98.0.2/24 dev veth1
ip -n "$ns" link set veth0 up
ip -n "$ns" link set veth1 up
in_ns() { ip netns exec "$ns" "$@"; }
# nsbg CMD…: bg in the namespace; the PID held is the program's (ip execs it).
nsbg() { bg ip netns exec "$ns" "$@"; }
# wait_ns PORT [HOST]: wait_port inside the namespace.
wait_ns() {
	in_ns bash -c 'for _ in $(seq 100); do (exec 3<>"/dev/tcp/$1/$0") 2>/dev/null && exit 0; sleep 0.1; done
		echo "port $0 did not come up" >&2; exit 1' "$1" "${2:-10.98.0.1}"
}
ip=10.98.0.1

# Servers: the throughput server, and the failover group's two.
server() { # port host
	nsbg bin/diameterload -serve "$ip:$1" -host "$2" -realm example -fast
}
server 18469 peer.example
server 18470 s1.example
server 18471 s2.example
eval "pid_s2=${pids[-1]}"

# relay_agent PORT NAME [LINE]: the layer4 server at PORT whose agent NAME
# relays every request to the throughput server (peer.example), with LINE
# added to the agent's block.
relay_agent() {
	cat <<AGENT
		$ip:$1 {
			route {
				diameter_agent $2 {
					origin_host $2.bench
					origin_realm relay.bench
					host_ip_address $ip
					application 16777238 vendor 10415
					application 4
					peer peer.example {
						realm example
						address $ip:18469
					}
					group servers {
						peers peer.example
					}
					route example servers${3:+
					$3}
				}
			}
		}
AGENT
}
cat >"$work/Caddyfile" <<CADDYFILE
{
	admin 127.0.0.1:18419
	log default {
		level ERROR
	}
	layer4 {
$(relay_agent 18468 dra)
		$ip:18467 {
			route {
				proxy $ip:18469
			}
		}
$(relay_agent 18464 doic doic)
		$ip:18466 {
			route {
				diameter_agent fo {
					origin_host fo.bench
					origin_realm relay.bench
					host_ip_address $ip
					application 16777238 vendor 10415
					application 4
					peer s1.example {
						realm example
						address $ip:18470
					}
					peer s2.example {
						realm example
						address $ip:18471
					}
					group servers {
						peers s1.example s2.example
					}
					route example servers
					watchdog 6s
					reconnect 100ms 500ms
				}
			}
		}
	}
}
CADDYFILE
nsbg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" "$CADDY" run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
eval "pid_caddy=${pids[-1]}"

# freeDiameter relaying to the same server (rt_default: realm example →
# peer.example), accepting the load client (acl_wl).
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=fd.bench -days 2 -keyout "$work/fd.key" -out "$work/fd.pem" 2>/dev/null
echo 'ALLOW_IPSEC *.example' >"$work/acl.conf"
echo 'dr="example" : "peer.example" += 100 ;' >"$work/rt.conf"
cat >"$work/fd.conf" <<FDCONF
Identity = "fd.bench";
Realm = "relay.bench";
Port = 18465;
SecPort = 0;
No_SCTP;
No_IPv6;
ListenOn = "$ip";
TLS_Cred = "$work/fd.pem", "$work/fd.key";
TLS_CA = "$work/fd.pem";
LoadExtension = "/usr/lib/freeDiameter/acl_wl.fdx" : "$work/acl.conf";
LoadExtension = "/usr/lib/freeDiameter/rt_default.fdx" : "$work/rt.conf";
ConnectPeer = "peer.example" { ConnectTo = "$ip"; Port = 18469; No_TLS; };
FDCONF
nsbg freeDiameterd -c "$work/fd.conf" >"$work/fd.log" 2>&1

for p in 18469 18470 18471 18468 18467 18466 18465 18464; do wait_ns $p; done
wait_ns 18419 127.0.0.1
# view AGENT JQ: jq's answer on the admin view of agent AGENT.
view() { in_ns curl -s "http://127.0.0.1:18419/diameter_agent/" | jq -r --arg n "$1" ".[] | select(.name == \$n) | $2"; }
# okay AGENT N: wait up to 30 s for N of the agent's peers to be OKAY (a
# reconnected server is REOPEN until three DWAs, about 2 Tw).
okay() {
	for _ in $(seq 300); do
		[ "$(view "$1" '[.peers[] | select(.state == "OKAY")] | length')" -ge "$2" ] && return 0
		sleep 0.1
	done
	echo "agent $1: fewer than $2 peers OKAY:" >&2
	in_ns curl -s "http://127.0.0.1:18419/diameter_agent/" >&2
	return 1
}
okay dra 1
okay fo 2
okay doic 1
# load PORT [options]: one client connection's run; its Origin-Host is
# new each time (freeDiameter keeps a closed peer's name for a while).
load() {
	in_ns timeout $((secs + 30)) bin/diameterload -target "$ip:$1" -origin "pgw-$BASHPID.example" -realm example -sessions 1000 -d "$DUR" "${@:2}"
}
# freeDiameter's peer is open once a request goes through.
for _ in $(seq 50); do (DUR=0s secs=0 load 18465 >/dev/null 2>&1) && break; sleep 0.2; done
echo "machine: $(nproc) cores shared by the load client, the server, caddy and freeDiameter; load $(cut -d' ' -f1-3 /proc/loadavg); $RUNS interleaved rounds of $DUR"

if want throughput; then
	ag=() fd=() px=() rfd=() rpx=()
	for i in $(seq "$RUNS"); do
		# One assignment per command: set -e stops the script when a run
		# fails (in "a=$(x) b=$(y)" only the last substitution's status counts).
		case $((i % 3)) in
		1) a=$(load 18468); f=$(load 18465); p=$(load 18467) ;;
		2) f=$(load 18465); p=$(load 18467); a=$(load 18468) ;;
		0) p=$(load 18467); a=$(load 18468); f=$(load 18465) ;;
		esac
		ag+=("$a") fd+=("$f") px+=("$p") rfd+=("$(ratio "$a" "$f")") rpx+=("$(ratio "$a" "$p")")
		echo "round $i: agent $a msg/s, freeDiameter $f msg/s, plain proxy $p msg/s"
	done
	echo "throughput medians: agent $(printf '%s\n' "${ag[@]}" | median), freeDiameter $(printf '%s\n' "${fd[@]}" | median), plain proxy $(printf '%s\n' "${px[@]}" | median) msg/s"
	echo "ratio agent/freeDiameter (median of per-round ratios): $(printf '%s\n' "${rfd[@]}" | median)x (goal >= 1.0x)"
	echo "ratio agent/plain proxy (median of per-round ratios): $(printf '%s\n' "${rpx[@]}" | median)x (goal >= 0.7x)"
fi

if want doic; then
	off=() on=() rd=()
	for i in $(seq "$RUNS"); do
		if ((i % 2)); then a=$(load 18468); d=$(load 18464); else d=$(load 18464); a=$(load 18468); fi
		off+=("$a") on+=("$d") rd+=("$(ratio "$d" "$a")")
		echo "round $i: DOIC off $a msg/s, DOIC on $d msg/s"
	done
	echo "DOIC medians: off $(printf '%s\n' "${off[@]}" | median), on $(printf '%s\n' "${on[@]}" | median) msg/s"
	echo "ratio DOIC on/off (median of per-round ratios): $(printf '%s\n' "${rd[@]}" | median)x (goal >= 0.97x)"
fi

if [ -n "${PROFILE:-}" ]; then
	load 18468 -d 12s >/dev/null &
	in_ns curl -s -o "$PROFILE" "http://127.0.0.1:18419/debug/pprof/profile?seconds=10"
	wait $!
	echo "CPU profile of bin/caddy under the agent's load: $PROFILE"
fi

if want failover; then
	base=() fo=() rr=() moved=()
	for i in $(seq "$RUNS"); do
		out=$(load 18466 -latency) # fails on any answer but 2001
		read -r rate p50 p99 mx <<<"$out"
		base+=("$p99")
		before=$(view fo '[.groups[].failed_over] | add')
		(sleep $(awk -v s="$secs" 'BEGIN {print 1 + s / 2}') && kill -9 "$pid_s2") &
		out=$(load 18466 -latency)
		read -r frate fp50 fp99 fmx <<<"$out"
		wait $!
		after=$(view fo '[.groups[].failed_over] | add')
		fo+=("$fp99") rr+=("$(ratio "$fp99" "$p99")") moved+=($((after - before)))
		echo "round $i: both up p99 $p99 ms (p50 $p50, max $mx, $rate msg/s); s2 killed halfway p99 $fp99 ms (p50 $fp50, max $fmx, $frate msg/s), $((after - before)) requests failed over, none lost"
		[ "$i" -lt "$RUNS" ] || break # no next round to restart s2 for
		server 18471 s2.example
		eval "pid_s2=${pids[-1]}"
		wait_ns 18471
		okay fo 2
	done
	echo "p99 medians: both up $(printf '%s\n' "${base[@]}" | median) ms, one killed $(printf '%s\n' "${fo[@]}" | median) ms"
	echo "ratio p99 with a failover / without (median of per-round ratios): $(printf '%s\n' "${rr[@]}" | median)x; requests failed over per kill: ${moved[*]}"
fi
