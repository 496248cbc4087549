#!/usr/bin/env bash
# tenant_route through bin/caddy with one slapd node, in one run:
#  1. bind+search latency, on an open connection and with connect and
#     close: ROUNDS rounds (default 5) of N (default 2000) samples each,
#     the targets taking turns sample by sample, in an order that rotates
#     every turn: direct to slapd, through
#     the router and through a plain caddy-l4 proxy to the same slapd (the
#     anchor: what any layer4 hop costs here); p50 and p99 and what each
#     adds; then the median over the rounds of the router's added latency
#     over the anchor's (the goal: at most 1.05 at p50 and p99 on
#     an open connection);
#  2. the CPU time bin/caddy spends per bind+search on an open connection,
#     through the router and through the plain proxy in alternating blocks
#     of 500 (CPU_N each, default 20000; 0 skips), and the median ratio:
#     the per-message cost without the scheduling noise of latencies;
#  3. resident memory of the router per idle routed connection with bound
#     connections held open (the goal: at most 8 KiB). Each routed
#     connection holds two descriptors in the router, so HOLD is bounded by
#     the open-files limit: 9,950 under a hard limit of 20,000 (raise the
#     hard limit, as root with CAP_SYS_RESOURCE, for 10,000).
# CADDY names the binary to measure (default bin/caddy).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
export PATH="$PATH:/usr/sbin"
need slapd slapd
go build -o bin/ldapload ./bench/ldapload
ulimit -n "$(ulimit -Hn)"
hold=${HOLD:-$(( ($(ulimit -n) - 100) / 2 < 10000 ? ($(ulimit -n) - 100) / 2 : 10000 ))}
mkdir -p "$work/db"
cat >"$work/slapd.conf" <<CONF
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile $work/slapd.pid
database mdb
maxsize 104857600
suffix "dc=example"
rootdn "cn=admin,dc=example"
rootpw secret
directory $work/db
access to attrs=userPassword by anonymous auth by * none
access to * by * read
CONF
cat >"$work/data.ldif" <<'LDIF'
dn: dc=example
objectClass: dcObject
objectClass: organization
dc: example
o: example

dn: cn=marker,dc=example
objectClass: organizationalRole
cn: marker
description: node-1

dn: o=acme,dc=example
objectClass: organization
o: acme

dn: uid=alice,o=acme,dc=example
objectClass: inetOrgPerson
uid: alice
cn: Alice
sn: A
userPassword: pw-acme
LDIF
slapadd -f "$work/slapd.conf" -l "$work/data.ldif" 2>/dev/null
bg slapd -f "$work/slapd.conf" -h ldap://127.0.0.1:18391/ -d 0
cat >"$work/Caddyfile" <<'CADDYFILE'
{
	admin off
	log default {
		level ERROR
	}
	layer4 {
		127.0.0.1:18389 {
			route {
				tenant_route {
					nodes 127.0.0.1:18391
					partitions 1
				}
			}
		}
		127.0.0.1:18390 {
			route {
				proxy 127.0.0.1:18391
			}
		}
	}
}
CADDYFILE
bg env XDG_DATA_HOME="$work" XDG_CONFIG_HOME="$work" "${CADDY:-bin/caddy}" run --adapter caddyfile --config "$work/Caddyfile" 2>"$work/caddy.log"
caddy_pid=${pids[-1]}
for p in 18391 18389 18390; do wait_port $p; done
echo "machine: $(nproc) cores shared by the client, caddy and slapd"
for round in $(seq "${ROUNDS:-5}"); do
	echo "round $round"
	bin/ldapload -latency -direct 127.0.0.1:18391 -routed 127.0.0.1:18389 -anchor 127.0.0.1:18390 -n "${N:-2000}" | tee -a "$work/latency"
done
[ "${ROUNDS:-5}" -gt 0 ] && for what in bind+search_on_an_open_connection connect+bind+search+close; do
	for q in p50 p99; do
		col=$([ $q = p50 ] && echo 10 || echo 12)
		echo "$what: router/proxy added $q, median of ${ROUNDS:-5} rounds: $(awk -v w="$what" -v c=$col '$1 == "ratio" && $2 == w {print $c}' "$work/latency" | median)" \
			"(rounds: $(awk -v w="$what" -v c=$col '$1 == "ratio" && $2 == w {printf "%s ", $c}' "$work/latency"))"
	done
done
# CPU time bin/caddy spends per bind+search, router against plain proxy
# (CPU_N operations each, default 20000; 0 skips): the per-message cost
# without the scheduling noise of latencies.
if [ "${CPU_N:-20000}" -gt 0 ]; then
	bin/ldapload -cpu -routed 127.0.0.1:18389 -anchor 127.0.0.1:18390 -pid "$caddy_pid" -n "${CPU_N:-20000}"
fi
[ "$hold" -gt 0 ] || exit 0 # HOLD=0: latency only
echo "open-files limit $(ulimit -n): holding $hold connections"
bin/ldapload -hold "$hold" -routed 127.0.0.1:18389 -pid "$caddy_pid"
