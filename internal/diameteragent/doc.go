// Package diameteragent is a Diameter relay agent (RFC 6733 §2.8), the
// engine of the routing agent the Cisco vDRA seed describes: it terminates
// each downstream connection (a pGW's), keeps its own connection to each
// upstream server (PCRF, OCS), routes every request by realm and
// application to a peer group, balances per message with Session-Id
// binding, fails over with retransmission, and applies rate limits at
// ingress (per downstream peer) and at egress (per routed group, after
// routing, just before forwarding). It knows nothing of Caddy: a caddy-l4
// handler hands it accepted connections (Serve) and keeps one Agent across
// reloads (Update). Time and dialing are injected (Options), so tests drive
// watchdogs and timeouts with a test clock over in-memory connections.
//
// # Wire
//
// Messages are framed by internal/diameter's Framer (no copy, no
// allocation) and read by scan, which walks only the top-level AVPs the
// agent routes by, checking every length (FuzzScan). Requests are
// forwarded as bytes: a copy with a Route-Record appended and the
// Hop-by-Hop id replaced; nothing else is decoded or re-encoded, so AVPs
// of any application or vendor pass untouched. The agent's own messages
// (CER, CEA, DWR, DWA, DPR, DPA and every refusal) are encoded with
// go-diameter. A CER or CEA is read by scan too, not go-diameter's
// smparser, because that one rejects a message carrying an AVP missing
// from its dictionary, which real peers' CERs do.
//
// # Peers (RFC 6733 §5, RFC 3539)
//
//   - Downstream: the first message must be a CER, else the connection is
//     closed. The CEA carries the agent's Origin-Host, Origin-Realm,
//     Host-IP-Address(es), Vendor-Id, Product-Name, Origin-State-Id and the
//     configured applications (vendor-specific ones in
//     Vendor-Specific-Application-Id, with Supported-Vendor-Id). No
//     application in common (the Relay id 0xffffffff on either side
//     matches all): 5010 and close. No Origin-Host or Origin-Realm: 5005
//     and close. A second CER: 5012 DIAMETER_UNABLE_TO_COMPLY, the
//     connection stays. DWR: DWA 2001. DPR: DPA 2001 (counted), then close. A peer
//     is known by its CER's Origin-Host; a newer connection with the same
//     one takes over the name (server-initiated requests go to it).
//   - Upstream: the agent dials each server of the peer table (dial
//     timeout Tw), sends its CER and waits Tw for the CEA. The CER offers
//     the server's own applications (the peer table's applications, each
//     one of the agent's; none listed: all of the agent's). A CEA whose
//     Result-Code is not 2001, or that lists none of the applications
//     offered (RFC 6733 §5.3, DIAMETER_NO_COMMON_APPLICATION; the Relay id
//     matches all), leaves the peer down with the reason as its last
//     error. A route for an application must name one of the agent's
//     applications, and a group it routes to must not hold a server whose
//     applications leave that one out (refused at load). Reconnects back off from reconnect_min (1 s), doubling,
//     to reconnect_max (30 s); a successful CEA resets the backoff.
//   - Watchdog per upstream connection, RFC 3539's algorithm with Tw
//     (default 30 s, at least 6 s, not jittered): the timer is set again
//     by every message received. OKAY: a silent Tw sends a DWR; another
//     silent Tw makes the peer SUSPECT, and its pending requests fail over
//     at once. SUSPECT: any message makes it OKAY again; a further silent
//     Tw makes it DOWN and closes the connection. A connection opened
//     after DOWN is in REOPEN until three DWRs in a row are answered (one
//     per Tw); the very first connection goes straight to OKAY. Only OKAY
//     peers are routed to. So a hung server is SUSPECT 2 × Tw after its
//     last message. The agent answers a server's DWR and DPR (then
//     reconnects with backoff).
//
// # Routing a downstream request (RFC 6733 §6.1), in order
//
//  1. Its Route-Record names the agent (ignoring case): 3005
//     DIAMETER_LOOP_DETECTED.
//  2. The ingress limit (profile keyed by the downstream peer's CER
//     Origin-Host and the message type, as internal/diameter names types:
//     gx-ccr-i, gy-ccr-t, …): refused as configured.
//  3. No Destination-Realm: 3002 DIAMETER_UNABLE_TO_DELIVER when a
//     Destination-Host is given (RFC 6733 §7.1.3), else 5005
//     DIAMETER_MISSING_AVP.
//  4. Destination-Host naming an OKAY server of the peer table: that
//     server, in the routed group if it is a member, else in its first
//     group. A server not OKAY, or a host not in the table, is ignored and
//     the request routed by realm.
//  5. The realm routing table, first match of (realm, application),
//     (realm, any), (any realm, application), (any realm, any), then the
//     default group. None: 3003 DIAMETER_REALM_NOT_SERVED when no route
//     names the realm, else 3002 (the realm is served, not for this
//     application).
//  6. The Session-Id's binding, while its server is an OKAY member of the
//     group (3004 if that server is full). Otherwise the group's policy picks among its OKAY
//     members with room: round_robin, least_outstanding (fewest pending,
//     ties in turn) or latency_bucket (the lowest internal/latency bucket,
//     bucket_width wide (32 ms), of the moving average of its answer
//     latency; no answer yet counts as the lowest; ties in turn). None OKAY: 3002; all OKAY ones full: 3004.
//  7. The group's bound on pending requests (max_pending, default 4096):
//     when reached, 3004 DIAMETER_TOO_BUSY at once, never a queue; each
//     server also has its own bound (max_pending_per_peer, default 1024).
//     A slow group fills only its own bound, so other groups' traffic is
//     not delayed.
//  8. The group's egress limit (profile keyed by the group's name and the
//     message type), after routing and just before forwarding.
//  9. Forward: a Route-Record naming the downstream peer is appended, the
//     Hop-by-Hop id is the agent's own on that upstream connection (mapped
//     back on the answer), the End-to-End id is kept. The session is bound
//     to the server, or its binding ends if the request is a CCR-T or STR.
//
// Refusals by a limit carry the agent's Origin-Host and Origin-Realm, the
// request's Session-Id, the configured Result-Code (default 3002; the E
// bit set for 3xxx) and Error-Message (default "rate limit exceeded"), or
// the request is dropped unanswered. Every answer the agent writes itself
// has its identity. The P bit is not checked: clients that leave it clear
// are routed too.
//
// # Answers, timeouts and failover (RFC 6733 §5.5.4)
//
//   - An answer is matched by its Hop-by-Hop id on the connection it came
//     on, given the sender's id back, and passed to the connection the
//     request came from. An answer matching nothing pending (already
//     answered, timed out, or failed over elsewhere) is late: discarded
//     and counted.
//   - A request unanswered request_timeout (default 3 s) after the agent
//     received it is answered 3002 by the agent; the timeout runs from
//     arrival and is not restarted by a failover. So a SUSPECT failover
//     (2 × Tw) can re-send only requests whose timeout is longer: set
//     request_timeout above 2 × Tw for that, or keep it short to answer
//     3002 sooner.
//   - When an upstream connection fails or goes SUSPECT, each request
//     pending on it is re-sent once, with the T flag, to another OKAY
//     member of its group with room (by the group's policy), and its
//     session's binding moves there. A request already re-sent, or with
//     no other member to take it, is answered 3002. Sessions bound to a
//     server that is not OKAY move at their next request.
//   - Server-initiated requests (RAR, ASR) go to the downstream peer named
//     by their Destination-Host (ignoring case), with a Route-Record
//     naming the server; not connected: 3002; loop: 3005. Unanswered
//     server_request_timeout (5 s) later, or when that peer disconnects:
//     3002 to the server.
//
// # Bindings
//
// A Session-Id is bound to the server its first request (or the first
// after its server left OKAY) went to. The table is internal/bounded's:
// at most max_bindings entries (default 1 000 000, evicting one not used
// recently when full), each forgotten after binding_ttl idle (default
// 1 h, to the second; swept every quarter TTL), ended by CCR-T or STR.
// Keys are 64-bit hashes of the Session-Id: about 44 bytes a binding
// (BenchmarkBindingBytes).
//
// With Config.BindingStore the replicas of one agent share bindings
// through a store (internal/diambind; bindshare.go): a local hit asks
// nothing of it; a local miss of a request that is not a CCR-Initial
// reads it once, bounded by its timeout; new, moved and ended bindings
// are written off the request's path (SET NX: the first writer wins, and
// a replica that lost adopts the winner; SET; DEL), with binding_ttl as
// the entry's expiry, renewed once per TTL/2 of use. While the store is
// down the bindings stay local and those writes are queued (bounded), to
// be written when it answers again. The module README's Cluster section
// gives the whole rule.
//
// # Connections and back-pressure
//
// Each connection has one writer goroutine fed by a bounded queue (4096
// messages): a burst goes out in one write, and no routing decision waits
// on a slow peer. A full queue counts as a full server (3004), or, for an
// answer, a message undelivered (counted). A connection the agent ends
// after a last answer (a refused CER, a DPA) closes once that is written,
// or Tw later if the peer does not read it. A message longer than
// max_length (default 65536) or malformed ends the connection it came on.
// The agent answers downstream peers' DWRs but sends them none: a
// downstream peer's own watchdog watches that link.
//
// # Overload control and load (Config.DOIC; RFC 7683, 8581, 8583)
//
// Off (no doic block), DOIC and Load AVPs pass through untouched. On, the
// agent is the reacting node for every request it routes and a reporting
// node towards its clients; internal/doic states how AVPs are read, which
// are ignored (counted by reason) and the sequence, expiry and loss rules.
//
//   - Reacting. Each answer from a server is read for OC-OLR and Load.
//     A HOST report is kept under the answer's Origin-Host, a REALM report
//     under its Origin-Realm, a PEER report under the server's host when
//     its SourceID names that server. Before a request is forwarded: a
//     REALM report of its Destination-Realm throttles it by the loss
//     algorithm; then the HOST or PEER report (the larger reduction) of
//     the server picked throttles it. A throttled request whose server was
//     picked by the group's policy goes to the member the policy picks
//     next, unless that one's report throttles it too (the diversion takes
//     no turn of the policy, so the reported server's share falls by
//     exactly its reduction); one whose server was fixed by its
//     Destination-Host or Session-Id binding, or throttled by a REALM
//     report, is answered by the doic refusal (default 3004 "overload:
//     throttled by DOIC", or dropped).
//   - Advertising and stripping (RFC 7683 §5.2). A request from a client
//     without OC-Supported-Features is forwarded with the agent's
//     (OLR_DEFAULT_ALGO and OLR_PEER_REPORT, SourceID the agent); a
//     client's own is left as it is. The servers' OC-OLR,
//     OC-Supported-Features and Load are taken out of every answer the
//     agent relays, since the agent has acted on them.
//   - Reporting. To a client that advertised OC-Supported-Features the
//     agent's answers (relayed ones, and its refusals of requests routed
//     to a group: the egress limit's and the doic refusal) carry its own
//     OC-Supported-Features and, while the
//     routed group's dynamic throttle is above 0, a PEER report (RFC 8581,
//     SourceID the agent's Origin-Host) of the throttle percent, if the
//     client listed OLR_PEER_REPORT, and a REALM report of it with
//     report_realm. (A HOST report in a relayed answer would name the
//     server's Origin-Host, so the agent reports itself as a peer.) The
//     sequence number is the time in ms the throttle last changed; the
//     validity is doic.validity, or else the group's reversal_hold (the
//     throttle cannot drop sooner), whole seconds in 1 s–24 h. When the
//     throttle falls to 0 the report is sent once more with validity 0
//     (ended) for a validity's time. Clients without DOIC get refusals
//     by the egress limit as before.
//   - Load. Every relayed answer carries the agent's Load (PEER, SourceID
//     the agent): 65 535 × the larger of the routed group's pending over
//     max_pending and its dynamic load source's last reading. A server's
//     Load (PEER from it, or HOST naming a peer of the table) is kept as
//     its last value; the least_loaded policy spreads new sessions over
//     the members in proportion to 65 536 − Load-Value (a member without
//     one counts at the mean of those with one), so 10 000 and 60 000
//     give 90.9 % and 9.1 %.
//
// # Reloads
//
// Close sends a DPR to every peer, upstream and downstream (RFC 6733
// §5.4), and returns once each DPA came (at most a second later); a DPR
// it sent ends its connection at the DPA, or Tw later.
//
// Update installs a new configuration from the next request on. Servers
// whose host, realm and address are unchanged keep their connection and
// watchdog; changed ones are connected anew; removed ones get a DPR and
// their pending requests fail over. Downstream connections, bindings,
// group counters and pending requests are kept.
package diameteragent
