// edgesteer dashboard: the Diameter routing agent's panel (diameter_agent
// view), drawn by app.js with its helpers (h): every value from the
// network goes in through h.v / h.table, as text.
"use strict";
// agentDOIC adds the overload control state (view field doic): the servers'
// reports in force (the reductions the agent applies, with their expiry),
// what the agent reports per group, the servers' Load values and the
// counts.
function agentDOIC(h, c, a) {
  var v = h.v, arr = h.arr, obj = h.obj, str = h.str, o = obj(a.doic);
  h.add(c.info, h.table(["DOIC report in force", "name", h.abbr("reduction %", "of the requests it applies to, by the loss algorithm"),
    "expires", h.abbr("applied", "requests it applied to"), "throttled"],
    arr(o.reports).slice(0, h.MAX_ROWS).map(function (r) {
      r = obj(r);
      return [str(r.type), v(r.name), str(r.reduction_percent), str(r.expires), str(r.applied), str(r.throttled)];
    }), [2, 4, 5]));
  var sent = arr(a.groups).filter(function (g) { return obj(g).doic_report; });
  var loads = arr(a.peers).filter(function (p) { return typeof obj(p).load === "number"; });
  if (loads.length) h.add(c.info, h.table(["peer", h.abbr("load", "its last RFC 8583 Load-Value, 0-65535")],
    loads.map(function (p) { p = obj(p); return [str(p.host), str(p.load)]; }), [1]));
  var ign = obj(o.ignored), bad = Object.keys(ign).sort().filter(function (k) { return ign[k]; });
  h.add(c.info, h.el("div", {"class": "meta"}, "DOIC: reports received ", v(o.reports_received), " · sent ", v(o.reports_sent),
    " · throttled ", v(o.throttled),
    sent.map(function (g) { g = obj(g); return [" · group ", v(g.name), " reports ", v(obj(g.doic_report).reduction_percent), " %"]; }),
    bad.length ? [" · ignored:", bad.map(function (k) { return [" ", k.replace(/_/g, " "), " ", v(ign[k])]; })] : null));
}
// agentBindingStore adds the bindings' shared level (view field
// binding_store): the store, its health — a store marked down is flagged
// DOWN with the time since, as bindings then stay local — the writes
// queued for it against their bound, its last error and its counts.
function agentBindingStore(h, c, a) {
  var v = h.v, obj = h.obj, s = obj(a.binding_store), n = obj(s.counts);
  var state = s.healthy ? h.el("span", {"class": "yes"}, "healthy")
    : h.el("span", {"class": "down"}, "DOWN", s.down_since ? [" since ", v(s.down_since)] : null);
  var counts = ["lookups", "found", "not_found", "malformed", "skipped", "errors", "written", "ended", "adopted", "reconciled", "dropped", "downs"];
  h.add(c.info, h.el("div", {"class": "meta binding-store"}, "binding store ", v(s.store), " (prefix ", v(s.prefix), "): ", state,
    " · queued ", v(s.queued), " / ", v(s.backlog),
    s.last_error ? [" · last error ", v(s.last_reason), ": ", v(s.last_error, "err")] : null));
  h.add(c.info, h.el("div", {"class": "meta"}, "binding store counts:", counts.map(function (k) {
    return [" ", k.replace(/_/g, " "), " ", v(n[k])];
  })));
}
(window.edgesteerPanels = window.edgesteerPanels || []).push({
  module: "diameter_agent",
  panel: "diameter_agent",
  render: function (h, src, seen) {
    var v = h.v, arr = h.arr, obj = h.obj, str = h.str, fmt = h.fmt;
    arr(src.modules.diameter_agent).forEach(function (a) {
      seen.diameter_agent = true;
      var name = str(a.name), id = "da" + h.SEP + src.prefix.join(h.SEP) + h.SEP + name;
      var c = h.card("diameter_agent", id, ["agent ", v(name), src.label()]);
      var downs = arr(a.downstreams);
      h.add(c.info, h.el("div", {"class": "meta"}, "bindings ", v(a.bindings), " / ", v(a.max_bindings),
        " · downstream peers ", v(downs.length), a.default_group ? [" · default group ", v(a.default_group)] : null));
      h.extras(c, a, ["name", "peers", "groups", "routes", "default_group", "downstreams", "bindings", "max_bindings", "counts", "doic", "binding_store"]);
      if (a.binding_store) agentBindingStore(h, c, a);
      // The peer table: watchdog state (only OKAY is routed to), its
      // exchanges, requests awaiting an answer, answer latency, last error.
      var peers = arr(a.peers);
      h.add(c.info, h.table(["peer", "realm", "address", "state", h.abbr("watchdog", "DWR sent / DWA received / peer's DWR answered"),
        h.abbr("outst.", "requests awaiting the server's answer"), h.abbr("answer ms", "moving average of the answer latency"), "last error"],
        peers.map(function (p) {
          p = obj(p);
          var lat = typeof p.latency_ns === "number" ? p.latency_ns / 1e6 : null;
          return [str(p.host), str(p.realm), str(p.address), h.el("span", {"class": p.state === "OKAY" ? "yes" : "no"}, v(p.state)),
            [v(p.dwr_sent), " / ", v(p.dwa_received), " / ", v(p.dwr_received)], str(p.outstanding), fmt(lat, 2), v(p.last_error, "err")];
        }), [4, 5, 6]));
      h.add(c.info, h.table(["route: realm", "applications", "group"], arr(a.routes).map(function (r) {
        r = obj(r);
        var apps = arr(r.applications);
        return [str(r.realm), apps.length ? h.vlist(apps) : "any", str(r.group)];
      })));
      // Per group: counts since the agent was made, and admitted per second.
      var groups = arr(a.groups);
      h.add(c.info, h.table(["group", "policy", "pending", "admitted", h.abbr("adm./s", "admitted per second"), "refused",
        h.abbr("busy", "answered 3004: a pending bound reached"), h.abbr("unavail.", "answered 3002: no member OKAY"),
        h.abbr("failed over", "re-sent with the T flag"), h.abbr("timed out", "answered 3002 at request_timeout")],
        groups.map(function (g) {
          g = obj(g);
          return [str(g.name), str(g.policy), str(g.pending), str(g.admitted),
            fmt(h.last(h.pkey(src, "diameter_agent", name, str(g.name), "admitted")), 1), str(g.refused),
            str(g.busy), str(g.unavailable), str(g.failed_over), str(g.timed_out)];
        }), [2, 3, 4, 5, 6, 7, 8, 9]));
      if (downs.length) h.add(c.info, h.table(["downstream peer", "realm", h.abbr("pending", "server-initiated requests awaiting its answer")],
        downs.slice(0, h.MAX_ROWS).map(function (d) { d = obj(d); return [v(d.host, "peer"), str(d.realm), str(d.pending)]; }), [2]));
      if (a.doic) agentDOIC(h, c, a);
      var counts = obj(a.counts), cn = Object.keys(counts).sort();
      if (cn.length) h.add(c.info, h.el("div", {"class": "meta"}, cn.map(function (k, i) {
        return [i ? " · " : null, k.replace(/_/g, " "), " ", v(counts[k])];
      })));
      h.chart(c, id + h.SEP + "lat", "answer latency ms per peer", peers.map(function (p) {
        return {key: h.pkey(src, "diameter_agent", name, str(obj(p).host), "latency_ns"), label: str(obj(p).host), scale: 1e-6};
      }), "ms");
      var flow = [];
      groups.forEach(function (g) {
        ["admitted", "refused", "failed_over"].forEach(function (f) {
          flow.push({key: h.pkey(src, "diameter_agent", name, str(obj(g).name), f), label: [v(obj(g).name), " " + f.replace("_", " ")]});
        });
      });
      h.chart(c, id + h.SEP + "flow", "requests per second by group", flow, "/s");
      h.chart(c, id + h.SEP + "out", "outstanding per peer", peers.map(function (p) {
        return {key: h.pkey(src, "diameter_agent", name, str(obj(p).host), "outstanding"), label: str(obj(p).host)};
      }), "");
    });
  }
});
