// edgesteer dashboard: the load part of a latency_bucket policy's card —
// what `within p2c` compares per publisher (requests in flight, cost, load
// factor), the backends' own load reports (ORCA) and slow start — drawn by
// app.js with its helpers (h): every value from the network goes in
// through h.v / h.table, as text.
"use strict";
// publisherLoad adds the load table and the ORCA counts to card c of
// policy p, only when the policy has something to show: within p2c, ORCA
// read, or a slow_start window. ORCA columns only with p.orca, the slow
// start column only with slow_start_ms > 0; with within p2c, charts of
// the requests in flight and the cost per publisher.
window.edgesteerPublisherLoad = function (h, c, p, src, id) {
  var v = h.v, fmt = h.fmt, str = h.str, obj = h.obj, orca = p.orca ? obj(p.orca) : null;
  var slow = typeof p.slow_start_ms === "number" && p.slow_start_ms > 0;
  if (p.within !== "p2c" && !orca && !slow) return;
  var head = ["publisher", h.abbr("in flight", "requests (HTTP) or connections (layer 4) in flight to it now"),
    h.abbr("per request ms", "the latency p2c charges a request: its estimate (the observed moving average once traffic is counted, else the probe latency) ÷ the mean in flight its requests began with"),
    h.abbr("cost ms", "per request × (in flight + 1) × load factor: what p2c compares"),
    h.abbr("load factor", "1 / (1 − min(u, 0.95)) of a fresh ORCA utilization u, else 1")];
  var num = [1, 2, 3, 4];
  if (orca) {
    head.push(h.abbr("ORCA", "the latest endpoint-load-metrics report: none, blackout, fresh or expired"),
      h.abbr("util.", "its utilization: application_utilization if above 0, else cpu_utilization"),
      h.abbr("age s", "how long ago it came"));
    num.push(6, 7);
  }
  if (slow) head.push(h.abbr("slow start", "progress through slow_start after (re)entering the lowest bucket"));
  h.add(c.info, h.table(head, h.arr(p.publishers).map(function (u) {
    u = obj(u);
    var row = [str(u.address), fmt(u.in_flight, 0), fmt(u.per_request_ms, 2), fmt(u.cost_ms, 2), fmt(u.load_factor, 2)];
    if (orca) {
      var none = !u.orca_state || u.orca_state === "none";
      row.push(h.el("span", {"class": u.orca_state === "fresh" ? "yes" : "muted"}, v(u.orca_state || "—")),
        none ? "—" : fmt(u.orca_utilization, 2), none ? "—" : fmt(u.orca_age_ms / 1000, 1));
    }
    if (slow) row.push(u.slow_start ? ["warming ", v(fmt(100 * u.slow_start_progress, 0)), " %"] : "done");
    return row;
  }), num));
  var meta = ["within ", v(p.within || "—")];
  if (slow) meta.push(" · slow start ", v(fmt(p.slow_start_ms / 1000, 1)), " s");
  if (orca) {
    // Headers by outcome: ok (taken) or the reason they changed nothing.
    var by = obj(orca.reports), names = Object.keys(by).sort();
    meta.push(" · ORCA blackout ", v(fmt(orca.blackout_ms / 1000, 1)), " s, expiration ", v(fmt(orca.expiration_ms / 1000, 1)),
      " s · headers absent ", v(orca.absent), names.map(function (k) { return [" · ", v(k), " ", v(by[k])]; }));
  }
  h.add(c.info, h.el("div", {"class": "meta"}, meta));
  if (p.within !== "p2c") return;
  [["inflight", "in_flight", "requests in flight per publisher", ""], ["cost", "cost_ms", "p2c cost ms per publisher", "ms"]].forEach(function (f) {
    h.chart(c, id + h.SEP + f[0], f[2], h.arr(p.publishers).map(function (u) {
      return {key: h.pkey(src, "latency_bucket", str(p.name), str(obj(u).address), f[1]), label: str(obj(u).address)};
    }), f[3]);
  });
};
