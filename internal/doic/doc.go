// Package doic is Diameter Overload Indication Conveyance (RFC 7683, with
// the peer report of RFC 8581) and Diameter load information (RFC 8583)
// for a Diameter agent, without any framework: it reads the AVPs from an
// answer's bytes, keeps the overload reports in force, decides by the loss
// algorithm which requests a report throttles, and encodes the agent's own
// reports and load.
//
// Rules (the agent obeys exactly these):
//
//   - Reading. Scan looks at the top-level AVPs of a message: every
//     OC-OLR (623), OC-Supported-Features (621) and Load (650). An OC-OLR
//     is ignored, and its reason counted, when it is malformed (a grouped
//     AVP whose inner lengths do not add up, an inner AVP of the wrong
//     size), lacks OC-Sequence-Number or OC-Report-Type, has a report type
//     other than HOST (0), REALM (1) or PEER (2, RFC 8581), a reduction
//     over 100, or a validity over 86 400 s (RFC 7683 §7.4, §7.7). A Load
//     AVP without a Load-Value, with a Load-Value over 65 535 or a
//     Load-Type other than HOST (0) or PEER (1) is ignored and counted
//     (RFC 8583 §6). A bad AVP never fails the message.
//   - Defaults. A report without OC-Validity-Duration is valid 30 s, one
//     without OC-Reduction-Percentage reduces by 0 (RFC 7683 §7.4, §7.7).
//   - Sequence (RFC 7683 §5.5.2). A report is kept under its key: (HOST,
//     the answer's Origin-Host), (REALM, the answer's Origin-Realm) or
//     (PEER, the adjacent peer's identity). A report for a key with none
//     in force is taken; one with a higher OC-Sequence-Number replaces the
//     report in force; an equal or lower one is ignored (counted as
//     "stale" when lower). A report in force ends at its expiry (receipt +
//     validity), or at once when a newer report has validity 0 or
//     reduction 0 (the overload is over).
//   - Peer reports (RFC 8581). A PEER report counts only when its SourceID
//     names the adjacent peer it came from; one from further away is
//     ignored (reason "peer_not_adjacent"). It then applies as a host
//     report of that peer.
//   - Loss algorithm (RFC 7683 §6). Of the requests a report applies to,
//     exactly reduction out of every hundred are throttled: a counter per
//     report throttles request n when ⌊n·p/100⌋ > ⌊(n−1)·p/100⌋, which
//     spreads them evenly (no randomness, so a burst is cut as evenly as a
//     steady flow).
//   - Bounds. The table holds at most MaxReports reports (default 10 000);
//     a new key beyond that is refused and counted ("table_full") until
//     expired reports are swept.
//   - Load (RFC 8583). The Load-Value (0–65 535, Unsigned64 on the wire)
//     of a HOST load is the server's; a PEER load is the adjacent peer's.
//     The agent keeps the last value per server.
//
// go-diameter v4.0.4's dictionary has the RFC 7683 AVPs but not RFC 8581's
// (OC-Peer-Algo, SourceID, PEER_REPORT) nor RFC 8583's (Load, Load-Type,
// Load-Value, the latter Unsigned64): LoadDictionary adds them to
// go-diameter's default dictionary from this package's dictionary.xml,
// without editing the library.
package doic
