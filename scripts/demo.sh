#!/usr/bin/env bash
# Starts the demo: bin/caddy with Caddyfile.examples/demo.Caddyfile and
# bin/coredns with Corefile.examples/demo.Corefile, all on loopback.
# Ctrl-C (or SIGTERM) stops both. BIN_DIR picks other binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN_DIR:-bin}
dns_port=${DEMO_DNS_PORT:-8453}
state=$(mktemp -d)

caddy_pid= coredns_pid=
stop() {
	trap - INT TERM EXIT
	echo "stopping the demo..."
	[ -n "$caddy_pid" ] && kill -TERM "$caddy_pid" 2>/dev/null || true
	[ -n "$coredns_pid" ] && kill -TERM "$coredns_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$state"
	echo "demo stopped"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

# Caddy keeps its storage and autosave in a throwaway directory.
XDG_DATA_HOME=$state/data XDG_CONFIG_HOME=$state/config \
	"$bin/caddy" run --config Caddyfile.examples/demo.Caddyfile --adapter caddyfile &
caddy_pid=$!
"$bin/coredns" -conf Corefile.examples/demo.Corefile -dns.port "$dns_port" &
coredns_pid=$!

wait_tcp() { # host port
	for _ in $(seq 1 200); do
		if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
		kill -0 "$caddy_pid" 2>/dev/null && kill -0 "$coredns_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
for p in 8480 8481 8482 8483 8485 8490 "$dns_port"; do
	if ! wait_tcp 127.0.0.1 "$p"; then
		echo "demo: 127.0.0.1:$p did not come up" >&2
		exit 1
	fi
done

cat <<MSG

edgesteer demo is running ($("$bin/caddy" version | head -n1)).
Try:
  curl -i -H 'X-User: alice' http://127.0.0.1:8480/hello   # latency-bucket pick; alice sticks to hers
  curl -s http://localhost:2019/latency_bucket/            # publisher latency details
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Peer: pgw1' http://127.0.0.1:8485/; done; echo
                                                           # peer rate limit: 200s, then 429s
  curl -s http://localhost:2019/peer_rate_limit/           # limits and throttle levels
  printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' | nc 127.0.0.1 8490   # layer4 proxy, same policy
  dig @127.0.0.1 -p $dns_port www.demo.edgesteer.test A +short
  dig @127.0.0.1 -p $dns_port vpn.demo.edgesteer.test A +short        # gateways, best first (ogs)
  dig @127.0.0.1 -p $dns_port _ogs.vpn.demo.edgesteer.test TXT +short  # OGS Selection Results
Press Ctrl-C to stop.
demo ready
MSG
wait -n || true
echo "demo: a server exited on its own" >&2
exit 1
