#!/usr/bin/env bash
# Starts the demo, all on loopback: bin/caddy with
# Caddyfile.examples/demo.Caddyfile and bin/coredns with
# Corefile.examples/demo.Corefile; then, when varnish is installed, the
# N-tier cache redirection examples (upper tier, two lower-tier nodes,
# varnish); as root, the transparent N-tier in network namespaces it makes
# and removes; and, when slapd is installed, the LDAP tenant routing example
# with three slapd nodes; two Diameter servers for the agent of demo.Caddyfile;
# then a small background load (and a pGW through the agent) so the dashboard
# (http://127.0.0.1:8488/) moves. Ctrl-C (or SIGTERM) stops everything and
# exits 0. Each server's output goes to a log file (DEMO_LOG_DIR, default a
# new directory under /tmp, kept after the demo). BIN_DIR picks other
# binaries; DEMO_LOAD=0 starts no background load.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN_DIR:-bin}
dns_port=${DEMO_DNS_PORT:-8453}
state=$(mktemp -d)
logs=${DEMO_LOG_DIR:-$(mktemp -d /tmp/edgesteer-demo-logs.XXXXXX)}
mkdir -p "$logs"
export PATH="$PATH:/usr/sbin"

pids=()
stop() {
	trap - INT TERM EXIT
	echo "stopping the demo..."
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if declare -F tier_cleanup >/dev/null; then tier_cleanup; fi
	rm -rf "$state"
	echo "demo stopped (logs kept in $logs)"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

# start NAME CMD...: run a server in the background (exec, so the PID is
# the server's), with its own Caddy storage directory and its output in
# $logs/NAME.log.
start() {
	local name=$1
	shift
	mkdir -p "$state/$name"
	(export XDG_DATA_HOME=$state/$name XDG_CONFIG_HOME=$state/$name; exec "$@" >"$logs/$name.log" 2>&1) &
	pids+=($!)
}
wait_tcp() { # host port
	for _ in $(seq 1 200); do
		if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
		sleep 0.1
	done
	return 1
}
up() { # host:port...
	for a in "$@"; do
		if ! wait_tcp "${a%:*}" "${a##*:}"; then
			echo "demo: $a did not come up" >&2
			exit 1
		fi
	done
}

# The Diameter agent's two PCRFs (bench/diameterload as a server), before
# Caddy so that the agent's first connections find them.
diameterload=$bin/diameterload
if [ ! -x "$diameterload" ]; then
	diameterload=$state/diameterload
	go build -o "$diameterload" ./bench/diameterload
fi
start pcrf1 "$diameterload" -serve 127.0.0.1:8471 -host pcrf1.example -realm operator.example
start pcrf2 "$diameterload" -serve 127.0.0.1:8472 -host pcrf2.example -realm operator.example
up 127.0.0.1:8471 127.0.0.1:8472
start caddy "$bin/caddy" run --config Caddyfile.examples/demo.Caddyfile --adapter caddyfile
start coredns "$bin/coredns" -conf Corefile.examples/demo.Corefile -dns.port "$dns_port"
up 127.0.0.1:8480 127.0.0.1:8481 127.0.0.1:8482 127.0.0.1:8483 127.0.0.1:8485 127.0.0.1:8490 127.0.0.1:8468 \
	127.0.0.1:8488 127.0.0.21:8444 127.0.0.22:8444 127.0.0.23:8444 127.0.0.1:"$dns_port" 127.0.0.6:8610
try_ntier= try_ldap= has_ntier=0 has_ldap=0

# N-tier cache redirection: the example files as they are; varnish fetches
# misses through lower-tier node l2b; the origin is a site of demo.Caddyfile.
if command -v varnishd >/dev/null; then
	start varnish varnishd -F -j none -a 127.0.0.5:6081 -b 127.0.0.4:8601 -n "$state/varnish" \
		-T 127.0.0.1:0 -s malloc,64m
	start upper env CADDY_ADMIN=localhost:2020 "$bin/caddy" run --adapter caddyfile \
		--config Caddyfile.examples/ntier-upper.Caddyfile
	start l2a env CADDY_ADMIN=localhost:2021 "$bin/caddy" run --adapter caddyfile \
		--config Caddyfile.examples/ntier-lower.Caddyfile
	start l2b env CADDY_ADMIN=localhost:2022 NODE=l2b LOWER_IP=127.0.0.4 "$bin/caddy" run --adapter caddyfile \
		--config Caddyfile.examples/ntier-lower.Caddyfile
	up 127.0.0.5:6081 127.0.0.2:8600 127.0.0.2:8700 127.0.0.3:8601 127.0.0.4:8601 127.0.0.3:8701 127.0.0.4:8701
	has_ntier=1
	try_ntier="
N-tier cache redirection (ntier-upper/lower.Caddyfile, varnish at 127.0.0.5:6081):
  curl -si --interface 127.0.0.10 http://127.0.0.2:8600/img/logo.png | grep -E 'X-Cache-Path|X-Varnish|origin'
                                                           # twice: a miss via l2b, then a hit
  curl -s --interface 127.0.0.10 -H 'Client-IP: 6.6.6.6' http://127.0.0.2:8600/api/x
                                                           # bypass; the origin sees the real client and
                                                           # the node's source port (l2a 1024-33279, l2b above)
  curl -s --local-port 2000-2010 http://127.0.0.2:8700/    # routed by port alone: l2a
  curl -s localhost:2021/metrics | grep cache_redirect     # per-path counters of l2a"
else
	try_ntier="
(N-tier cache redirection: install varnish to see it here.)"
fi

# Transparent N-tier (only as root, with ip and nft): network namespaces
# client → upper → l2a, l2b on one bridge, 10.78.0.0/24, made here and
# deleted on stop; the upper runs Caddyfile.examples/ntier-transparent-
# upper.Caddyfile (kernel rules only), each lower node a transparent
# listener that answers itself, as a cache hit would.
try_tier=
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v nft >/dev/null; then
	tns=esdemo$$
	tier_hosts=(client:10 upper:1 l2a:2 l2b:3)
	tier_cleanup() {
		for h in br "${tier_hosts[@]%:*}"; do ip netns del "$tns-$h" 2>/dev/null || true; done
	}
	ip netns add "$tns-br"
	ip -n "$tns-br" link add br0 type bridge
	ip -n "$tns-br" link set br0 up
	i=0
	for h in "${tier_hosts[@]}"; do
		n=$tns-${h%:*}
		ip netns add "$n"
		ip -n "$tns-br" link add "p$i" type veth peer name eth0 netns "$n"
		ip -n "$tns-br" link set "p$i" master br0 up
		ip -n "$n" addr add "10.78.0.${h#*:}/24" dev eth0
		ip -n "$n" link set eth0 up
		ip -n "$n" link set lo up
		i=$((i + 1))
	done
	ip netns exec "$tns-upper" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
		net.ipv4.conf.eth0.send_redirects=0
	ip -n "$tns-client" route add 203.0.113.0/24 via 10.78.0.1
	for a in 100 101 102 103; do ip -n "$tns-client" addr add "10.78.0.$a/24" dev eth0; done
	echo '{"nodes":[{"name":"l2a","next_hop":"10.78.0.2"},{"name":"l2b","next_hop":"10.78.0.3"}]}' >"$state/tiers.json"
	cat >"$state/tier-lower.Caddyfile" <<'CADDYFILE'
{
	ntier {
		lower {
			ports 80
			listen_port 3129
		}
	}
}
http://:3129 {
	bind tproxy/0.0.0.0
	respond "{$NODE} answers: you asked {http.request.local.host}:{http.request.local.port}, you are {http.request.remote.host}"
}
CADDYFILE
	for node in l2a l2b; do
		start "tier-$node" ip netns exec "$tns-$node" env NODE=$node "$bin/caddy" run --adapter caddyfile \
			--config "$state/tier-lower.Caddyfile"
	done
	start tier-upper ip netns exec "$tns-upper" env TIER_MAP="$state/tiers.json" HEALTH_INTERVAL=1s HEALTH_TIMEOUT=500ms "$bin/caddy" run \
		--adapter caddyfile --config Caddyfile.examples/ntier-transparent-upper.Caddyfile
	tier_up=0
	for _ in $(seq 1 200); do
		if ip netns exec "$tns-upper" curl -s localhost:2019/ntier/ 2>/dev/null | grep -q '"installed":true'; then
			tier_up=1
			break
		fi
		sleep 0.1
	done
	if [ "$tier_up" = 0 ]; then
		echo "demo: the transparent upper tier did not install its rules (see $logs/tier-upper.log)" >&2
		exit 1
	fi
	try_tier="
Transparent N-tier (as root: namespaces $tns-*, removed on stop; the upper tier is kernel rules only):
  for a in 100 101 102 103; do ip netns exec $tns-client curl -s --interface 10.78.0.\$a http://203.0.113.80/; echo; done
                                                           # each client address sticks to its lower node
  ip netns exec $tns-upper curl -s localhost:2019/ntier/   # nodes, health, buckets, rules installed
  ip netns exec $tns-upper nft list table ip edgesteer_ntier   # the hash map of buckets to nodes"
else
	try_tier="
(Transparent N-tier: run the demo as root to see it here; it makes network namespaces.)"
fi

# LDAP tenant routing: three slapd nodes holding every demo tenant, and
# Caddyfile.examples/ldap-tenant-routing.Caddyfile in front.
if command -v slapd >/dev/null; then
	for i in 1 2 3; do
		d=$state/slapd$i
		mkdir -p "$d/db"
		cat >"$d/slapd.conf" <<CONF
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile $d/slapd.pid
database mdb
maxsize 104857600
suffix "dc=example"
rootdn "cn=admin,dc=example"
rootpw secret
directory $d/db
access to attrs=userPassword by anonymous auth by * none
access to * by * read
CONF
		{
			printf 'dn: dc=example\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: example\n\n'
			printf 'dn: cn=marker,dc=example\nobjectClass: organizationalRole\ncn: marker\ndescription: node-%s\n\n' "$i"
			for t in acme globex initech; do
				printf 'dn: o=%s,dc=example\nobjectClass: organization\no: %s\n\n' "$t" "$t"
				printf 'dn: uid=alice,o=%s,dc=example\nobjectClass: inetOrgPerson\nuid: alice\ncn: Alice\nsn: A\nuserPassword: pw\n\n' "$t"
			done
		} >"$d/data.ldif"
		slapadd -f "$d/slapd.conf" -l "$d/data.ldif" 2>/dev/null
		start "slapd$i" slapd -f "$d/slapd.conf" -h "ldap://127.0.0.1:389$i/" -d 0
	done
	start ldap env CADDY_ADMIN=localhost:2023 "$bin/caddy" run --adapter caddyfile \
		--config Caddyfile.examples/ldap-tenant-routing.Caddyfile
	up 127.0.0.1:3891 127.0.0.1:3892 127.0.0.1:3893 127.0.0.1:3389
	has_ldap=1
	try_ldap="
LDAP tenant routing (ldap-tenant-routing.Caddyfile, slapd nodes 3891-3893):
  ldapsearch -x -H ldap://127.0.0.1:3389 -D uid=alice,o=acme,dc=example -w pw -b cn=marker,dc=example description
                                                           # the node holding tenant acme answers
  curl -s localhost:2023/tenant_route/                     # tenant → nodes, connections per node"
else
	try_ldap="
(LDAP tenant routing: install slapd to see it here.)"
fi

# A small background load, so the dashboard's panels move: users through
# the latency-bucket front, two peers over and under their rate limit, N-tier
# requests (cache and bypass), and LDAP connections of each tenant held open
# for a while. It uses its own users, peers, paths and tenants' connections,
# so the commands of the banner behave as described.
ldap_bind() { # DN: hold one connection bound as DN (password pw) for a while
	local dn=$1 dnhex body op msg
	dnhex=$(printf '%s' "$dn" | od -An -tx1 -v | tr -d ' \n')
	# BindRequest (version 3, DN, simple "pw") in LDAPMessage 1; DN < 100 bytes.
	body=020103$(printf '04%02x' ${#dn})${dnhex}80027077
	op=$(printf '60%02x' $((${#body} / 2)))$body
	msg=$(printf '30%02x' $((${#op} / 2 + 3)))020101$op
	exec 3<>/dev/tcp/127.0.0.1/3389 || return 0
	printf "$(printf '%s' "$msg" | sed 's/../\\x&/g')" >&3
	sleep $((RANDOM % 20 + 5))
	exec 3>&-
}
load() {
	local i=0
	while :; do
		i=$((i + 1))
		curl -s -o /dev/null -m 2 -H "X-User: load-$((i % 40))" http://127.0.0.1:8480/load || true
		for _ in 1 2 3; do # about 7/s: over its 5/s
			curl -s -o /dev/null -m 2 -H "X-Peer: load-busy" http://127.0.0.1:8485/ || true
		done
		curl -s -o /dev/null -m 2 -H "X-Peer: load-calm" http://127.0.0.1:8485/ || true
		if [ "$has_ntier" = 1 ] && [ $((i % 2)) = 0 ]; then
			curl -s -o /dev/null -m 2 --interface 127.0.0.10 "http://127.0.0.2:8600/img/load-$((i % 7)).png" || true
			curl -s -o /dev/null -m 2 --interface 127.0.0.10 -H 'Client-IP: 6.6.6.6' http://127.0.0.2:8600/api/load || true
		fi
		if [ "$has_ldap" = 1 ] && [ $((i % 4)) = 0 ]; then
			for t in acme acme globex initech; do
				(ldap_bind "uid=alice,o=$t,dc=example") >/dev/null 2>&1 &
			done
		fi
		sleep 0.4
	done
}
# A pGW through the Diameter agent: 50 Gx requests/s against the PCRF
# group's 40/s, so its panel shows admissions and refusals.
diameter_load() {
	while :; do
		"$diameterload" -target 127.0.0.1:8468 -origin pgw-demo.example -realm operator.example \
			-sessions 100 -window 4 -rate 50 -d 1h -allow-refusals || sleep 1
	done
}
if [ "${DEMO_LOAD:-1}" != 0 ]; then
	(load) >/dev/null 2>&1 &
	pids+=($!)
	(diameter_load) >"$logs/pgw.log" 2>&1 &
	pids+=($!)
fi

cat <<MSG

edgesteer demo is running ($("$bin/caddy" version | head -n1)).
Dashboard: http://127.0.0.1:8488/   (a small background load keeps it moving)
Logs: $logs/<server>.log ($(cd "$logs" && ls | tr '\n' ' '))
Try:
  curl -i -H 'X-User: alice' http://127.0.0.1:8480/hello   # latency-bucket pick; alice sticks to hers
  curl -s http://localhost:2019/latency_bucket/            # publisher latency details
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Peer: pgw1' http://127.0.0.1:8485/; done; echo
                                                           # peer rate limit: 200s, then 429s
  curl -s http://localhost:2019/peer_rate_limit/           # limits and throttle levels
  printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' | nc 127.0.0.1 8490   # layer4 proxy, same policy
  dig @127.0.0.1 -p $dns_port www.demo.edgesteer.test A +short
  dig @127.0.0.1 -p $dns_port vpn.demo.edgesteer.test A +short        # gateways, best first (ogs): gw2 (5 ms),
                                                                       # gw3 (20 ms), gw1 (40 ms)
  dig @127.0.0.1 -p $dns_port _ogs.vpn.demo.edgesteer.test TXT +short  # OGS Selection Results
  curl -s http://localhost:2019/diameter_agent/            # Diameter agent: peers, the PCRF group's 40/s
                                                           # (a demo pGW sends 50/s: some get 3002)
$try_ntier
$try_tier
$try_ldap
Press Ctrl-C to stop.
demo ready
MSG
wait -n || true
echo "demo: a server exited on its own" >&2
exit 1
