// Package quota divides a cluster-wide per-peer rate limit among the
// replicas that enforce it, with a shared store (Redis) as the only shared
// part and no store call per request. It is the quota-assignment scheme of
// Envoy's rate-limit-quota service with the store in the server's place.
//
// Each replica enforces a local share of the limit per peer with a GCRA
// bucket (the rule of internal/ratelimit, plus rescaling the debt when the
// share changes: see limiter; with the default burst, at least
// shareTolerance of the share). Every sync interval (default 250 ms) it sends
// its counts of the peers that had traffic since the last sync, adding them
// to the store's per-peer totals of the current epoch (epoch = now ÷
// interval), reads the totals of the previous, complete epoch for the peers
// it saw in the last two intervals, and re-divides:
//
//   - own demand d > 0 in the previous epoch, cluster demand D (both per
//     epoch, limit as requests per epoch): share = max(floor, limit × d ÷ D)
//     when D ≥ limit; below it, d + (limit − D) ÷ replicas — its demand and
//     an equal part of the rest, so a replica whose demand rises a little
//     is not refused while the cluster is under the limit;
//   - own demand 0, cluster demand 0 (a peer new to the cluster):
//     share = limit ÷ replicas, the equal share;
//   - own demand 0, cluster demand > 0, or no traffic here in the last two
//     intervals: share = floor = Floor × limit ÷ replicas, so an idle
//     replica starts admitting at once (its first requests at once, within
//     the burst) and gets its proportional share from the next sync.
//
// Demand is offered requests (admitted or not), so a starved replica's
// demand is not understated. The shares of replicas with demand add up to
// the limit; the floor is on top of it (a replica uses it only when traffic
// arrives, and for at most one or two intervals before it becomes
// proportional). Syncs should fall mid-epoch (NextSync): every replica's
// counts of epoch e are written by the middle of epoch e+1, when they are
// read. The limit is the effective one: dynamic throttling (SetThrottle)
// lowers every share at once.
//
// Replicas register with a heartbeat whose lifetime is ReplicaTTL (default
// 4 intervals); the replica count sets the floor and the fallback.
//
// One replica cut off (its peers' keys refused, its sync past its deadline
// or reset) while the others are not: its fallback share would come on top
// of the others' shares, which add up to the limit. So a replica at the
// fallback share for a peer (its last sync failed, or the peer's keys were
// refused; see reserving in prepare) marks its heartbeat (Batch.Reserving:
// its score negated) and writes no counts of that peer, and a live
// replica whose heartbeat is older than the previous epoch (it missed its
// last sync: Batch.Fresh) is counted the same way: the others count each
// such replica at its fallback share, limit ÷ replicas, for every peer —
// less the marked replicas that counted the peer in e−1 (field r: they
// are at their proportional share there) — and divide the rest,
// limit × (replicas − reserved) ÷ replicas, by the rules above among
// themselves (share). A dead replica is such a replica until its heartbeat
// expires; then its share returns to the others at the next sync. A live
// replica whose syncs fail keeps its heartbeat from expiring by writing it
// alone, marked (KeepAlive), on a connection whose deadlines allow a link
// slower than the sync's (the caller's: the Caddy adapter keeps one open).
//
// Every store error is classified once, by the store (Store.Classify; the
// Redis store is internal/quotaredis). Store trouble
// (NOPERM, LOADING, READONLY, OOM, CLUSTERDOWN, TRYAGAIN, MOVED, a timeout
// or reset on any command of the pipeline) is trouble for the keys the
// command touched: on the replicas key (the heartbeat), or no command
// answering (store unreachable), every peer's share is limit ÷ (last known
// replica count) (State.Fallback); on a peer's epoch key, that peer's share
// is (State.FallbackPeers, Troubles: the key and the reason). The next
// successful sync resyncs — keeping the fallback share one more interval
// for peers whose previous epoch this replica could not write, or did not
// (it writes no counts of peers at the fallback share). Store
// answers that do not parse (another program's key, a value of the wrong
// type, a total below this replica's own contribution) are ignored and
// counted (State.Malformed), never used as a limit; the limiter's own keys
// that held them (replicas key, epoch hashes) are deleted at the next sync
// (Batch.Repair, State.Repaired).
//
// Tracked peers are bounded (MaxPeers; peers are client-controlled keys):
// a peer with no traffic for IdleSyncs syncs whose bucket has refilled is
// dropped; beyond the bound, new peers share one overflow bucket at the
// floor rate until room is made, and are counted.
//
// # Store layout (Redis commands, one pipelined round trip per sync)
//
//	TIME
//	ZADD {prefix}:replicas <±now ms> <replica>      (− while reserving)
//	ZREMRANGEBYSCORE {prefix}:replicas (-<cutoff> (<cutoff>   cutoff = now ms − ReplicaTTL ms
//	ZCARD {prefix}:replicas
//	ZCOUNT {prefix}:replicas -inf (<start of epoch−1, ms>
//	per peer with traffic since the last sync (and not at the fallback
//	share), K = {prefix:peer}:<epoch>:
//	  HINCRBY K a <admitted>; HINCRBY K d <demanded>;
//	  HINCRBY K r 1 (while reserving); PEXPIRE K <3 intervals>
//	per peer whose keys the store refused at the last sync it answered
//	(a probe, whatever its traffic):
//	  HINCRBY K a 0; HINCRBY K d 0; PEXPIRE K <3 intervals>
//	per peer with traffic in the last two intervals, or in trouble, K' = {prefix:peer}:<epoch−1>:
//	  HMGET K' a d r
//
// "now" and the epoch are the store's clock: the local clock plus the
// offset measured by TIME (of the last few syncs, the measure of least
// round trip; before the first sync, a TIME alone), so replicas whose
// clocks disagree still agree on epochs and heartbeats (NewWithClock takes
// the local clock as a parameter). Keys that a value of another program
// spoiled are deleted first (DEL, Batch.Repair).
//
// Peer keys are hash-tagged by prefix and peer, so Redis Cluster spreads
// peers over its shards (a cluster client splits the pipeline per shard,
// still one round trip per shard, in parallel). Values are decimal
// integers, validated on read.
//
// # Groups
//
// SyncGroup syncs several quotas of one replica — a profile's overall
// limit and its message-type limits, each a Quota with its own Prefix —
// in one round trip of the first one's store (a GroupStore: quotaredis.Store
// and FakeStore run all batches in one pipeline). Only the first batch
// carries the heartbeat (Batch.NoHeartbeat on the others); the others take
// its replica count. Refund gives back an admission that a later check
// refused (a message type's, when the overall limit refuses the message).
//
// # Cost model
//
// R replicas, A active (replica, peer) pairs per interval per replica —
// peers with traffic at that replica; idle peers cost nothing — and Δ the
// interval. Per replica per sync: 5 + 3A + A' commands, A' ≤ 2A the peers
// with traffic in the last two intervals, in one round trip. Cluster-wide:
//
//	ops/s = R × (5 + 3A + A') ÷ Δ   (A' ≈ 1.7 A under Zipf demand)
//	bytes/sync per replica ≈ 5·k + A × (3·k + 15) + A' × (k + 45)
//
// A group of quotas ℓ (SyncGroup) costs one heartbeat and each quota's
// counts and reads, still in one round trip per replica per interval:
//
//	ops/s = R × (5 + Σℓ (3Aℓ + A'ℓ)) ÷ Δ,  round trips/s = R ÷ Δ
//
// (a reserving replica adds one command per peer it counts)
//
// with k ≈ 60 B a command carrying a key of ~27 B (the measured figures,
// from the fake store's RESP accounting, are in BENCHMARKS.md). Store memory: one small hash per active peer per epoch,
// three epochs live.
package quota
