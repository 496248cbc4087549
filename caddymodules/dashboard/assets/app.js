// edgesteer dashboard: polls api/state every 2 s and renders each module's
// panel. Every string from the network goes into the page as text
// (textContent / text nodes), never as markup, each value in its own
// <bdi> (v below), with control, bidi and invisible characters shown as
// \uXXXX, so no value can reorder or hide the text around it.
"use strict";
(function () {
  var SEP = "\u001f";
  var REFRESH_MS = 2000;
  var MAX_ROWS = 50;
  var PALETTE = ["#2f6fde", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d", "#5c940d", "#d9480f", "#1864ab", "#862e9c", "#087f5b"];
  var charts = {};   // chart id -> {u, sig, el}
  var cards = {};    // card id -> element
  var touched = {};  // card/chart ids used in this render

  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (k === "class") e.className = attrs[k]; else e.setAttribute(k, attrs[k]);
    }
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  function add(e, c) {
    if (c === null || c === undefined) return;
    if (Array.isArray(c)) { c.forEach(function (x) { add(e, x); }); return; }
    e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  // INVISIBLE: C0/C1 controls, soft hyphen, Arabic letter mark, Mongolian
  // vowel separator, zero-width and directional marks, line/paragraph
  // separators, embeddings and overrides, word joiner, invisible
  // operators, isolates, deprecated format chars, BOM, annotation chars.
  var INVISIBLE = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]/g;
  function visible(s) {
    return String(s).replace(INVISIBLE, function (ch) {
      return "\\u" + ("000" + ch.charCodeAt(0).toString(16).toUpperCase()).slice(-4);
    });
  }
  // v is one value from the network (or a figure) on the page: its own
  // isolated element, its invisible characters shown.
  function v(x, cls) {
    var e = document.createElement("bdi");
    e.className = cls ? "v " + cls : "v";
    e.textContent = visible(x === null || x === undefined ? "" : x);
    return e;
  }
  function fmt(n, d) {
    if (n === null || n === undefined || typeof n !== "number" || !isFinite(n)) return "—";
    return n.toFixed(d === undefined ? 1 : d);
  }
  function vfmt(n, d) { return v(fmt(n, d)); }
  function yesno(b, yes, no) { return el("span", {"class": b ? "yes" : "no"}, b ? (yes || "yes") : (no || "no")); }
  // list shows values separated by commas, each isolated.
  function vlist(xs) { return xs.map(function (x, k) { return [k ? ", " : null, v(x)]; }); }
  // abbr is a short column heading with its full meaning as a tooltip.
  function abbr(short, full) { return el("abbr", {"title": full}, short); }
  function arr(x) { return Array.isArray(x) ? x : []; }
  function obj(x) { return x && typeof x === "object" && !Array.isArray(x) ? x : {}; }
  function str(x) { return x === null || x === undefined ? "" : String(x); }
  function table(head, rows, numCols) {
    numCols = numCols || [];
    return el("div", {"class": "tablewrap"}, el("table", null,
      el("thead", null, el("tr", null, head.map(function (h) { return el("th", null, h); }))),
      el("tbody", null, rows.map(function (r) {
        return el("tr", null, r.map(function (c, i) {
          return el("td", numCols.indexOf(i) >= 0 ? {"class": "num"} : null, typeof c === "string" || typeof c === "number" ? v(c) : c);
        }));
      }))));
  }
  function bar(n, max) {
    var w = max > 0 ? Math.round(100 * n / max) : 0;
    var f = el("span", {"class": "fill"});
    f.style.width = Math.max(w, n > 0 ? 2 : 0) + "px";
    return el("div", {"class": "bar"}, f, v(String(n)));
  }

  // extras shows the fields of a view object the page has no place for
  // (fields added by newer modules: cluster or store state, counters), as
  // "name: value" text.
  function extras(c, o, known) {
    var parts = [];
    Object.keys(obj(o)).sort().forEach(function (k) {
      if (known.indexOf(k) >= 0) return;
      var x = o[k], t;
      if (x === null || x === undefined) return;
      if (typeof x === "object") {
        t = JSON.stringify(x);
        if (t.length > 200) t = t.slice(0, 200) + "…";
      } else t = String(x);
      parts.push(parts.length ? " · " : null, v(k), ": ", v(t));
    });
    if (parts.length) add(c.info, el("div", {"class": "meta extras"}, parts));
  }

  // card returns the persistent card for id in panel, its info part emptied.
  function card(panel, id, title) {
    touched[id] = true;
    var c = cards[id];
    if (!c) {
      c = el("div", {"class": "card"});
      c.dataset.id = id;
      c.h = el("h3"); c.info = el("div"); c.charts = el("div");
      c.appendChild(c.h); c.appendChild(c.info); c.appendChild(c.charts);
      cards[id] = c;
    }
    document.querySelector("#panel-" + panel + " .cards").appendChild(c);
    c.h.replaceChildren();
    add(c.h, title);
    c.info.replaceChildren();
    return c;
  }

  // series helpers
  var S = {times: [], values: {}};
  function last(key) {
    var v = S.values[key];
    if (!v) return null;
    for (var i = v.length - 1; i >= 0; i--) if (v[i] !== null) return v[i];
    return null;
  }
  function key() { return Array.prototype.slice.call(arguments).join(SEP); }

  // chart draws (or updates) a uPlot line chart in c of the given series
  // [{key, label}]; nothing when no series has data.
  function chart(c, id, title, list, unit) {
    list = list.filter(function (s) { return S.values[s.key]; }).slice(0, PALETTE.length);
    if (!list.length) return;
    touched[id] = true;
    // A label is a value or a list of parts (literal text and values).
    var labels = list.map(function (s) { return typeof s.label === "string" ? v(s.label) : el("span", null, s.label); });
    var sig = list.map(function (s, i) { return s.key + "=" + labels[i].textContent; }).join("\n");
    var data = [S.times.map(function (t) { return t / 1000; })];
    list.forEach(function (s) {
      var vals = S.values[s.key];
      data.push(s.scale ? vals.map(function (x) { return x === null ? null : x * s.scale; }) : vals);
    });
    var points = 0;
    data.slice(1).forEach(function (v) { v.forEach(function (x) { if (x !== null) points++; }); });
    var ch = charts[id];
    var width = Math.max(200, (c.charts.clientWidth || c.clientWidth || 500) - 4);
    if (ch && ch.sig === sig) {
      ch.u.setData(data);
      if (Math.abs(ch.u.width - width) > 8) ch.u.setSize({width: width, height: 170});
      ch.el.dataset.points = String(points);
      c.charts.appendChild(ch.el);
      return;
    }
    if (ch) { ch.u.destroy(); ch.el.remove(); }
    var box = el("div", {"class": "chart", "data-chart": id}, el("div", {"class": "title"}, title));
    box.dataset.keys = JSON.stringify(list.map(function (s) { return s.key; }));
    c.charts.appendChild(box);
    var opts = {
      width: width, height: 170,
      scales: {x: {time: true}},
      legend: {live: false},
      series: [{}].concat(list.map(function (s, i) {
        return {label: labels[i], stroke: PALETTE[i], width: 1.5, spanGaps: false,
          value: function (u, v) { return v === null ? "—" : fmt(v, 1) + (unit ? " " + unit : ""); }};
      })),
      axes: [{}, {size: 50}]
    };
    var u = new uPlot(opts, data, box);
    box.dataset.points = String(points);
    charts[id] = {u: u, sig: sig, el: box};
  }

  // sources: this Caddy's modules, then each reachable replica's.
  function sources(st) {
    // label makes a card title's suffix (a new element each call: an
    // element is in one place only).
    var out = [{label: function () { return null; }, prefix: [], modules: obj(st.modules)}];
    arr(st.replicas).forEach(function (r, i) {
      if (!r.reachable || !r.body) return;
      out.push({label: function () { return [" @ ", v(r.url)]; }, prefix: ["replica", String(i)], modules: obj(r.body)});
    });
    return out;
  }
  // pkey is a series key: the source's prefix, then the parts (an object
  // without a name adds no part, as on the server).
  function pkey(src) {
    return src.prefix.concat(Array.prototype.slice.call(arguments, 1).filter(function (p) { return p !== ""; })).join(SEP);
  }
  function show(panel, on) { document.getElementById("panel-" + panel).hidden = !on; }

  function renderLatency(src, seen) {
    arr(src.modules.latency_bucket).forEach(function (p) {
      seen.latency_bucket = true;
      var name = str(p.name), id = "lb" + SEP + src.prefix.join(SEP) + SEP + name + SEP + str(p.kind);
      var c = card("latency_bucket", id, ["policy ", v(name), " (", v(p.kind), ")", src.label()]);
      add(c.info, el("div", {"class": "meta"},
        "bucket width ", vfmt(p.bucket_width_ms, 0), " ms · latency ", v(p.latency), " · probe window ", v(p.probe_window),
        " · sticky ", p.sticky ? ["on, ", v(p.sticky_entries), " / ", v(p.sticky_max_entries), " entries"] : "off"));
      extras(c, p, ["name", "kind", "state_since", "generations", "bucket_width_ms", "latency", "probe_window", "sticky",
        "sticky_entries", "sticky_max_entries", "publishers", "traffic_half_life_ms", "within", "slow_start_ms", "orca"]);
      var pubs = arr(p.publishers);
      // latency ms is what decided the bucket (decided_by: probe or
      // traffic); observed is real traffic's moving average and peak.
      add(c.info, table(["publisher", "latency ms", "probe ms", "observed ms avg / peak", "decided by", "bucket", "active", "sticky", "picks/s", "last error"],
        pubs.map(function (u) {
          var picks = last(pkey(src, "latency_bucket", name, str(u.address), "picks_total"));
          return [str(u.address), u.measured ? fmt(u.latency_ms, 1) : "—",
            u.probe_latency_ms === undefined ? "—" : fmt(u.probe_latency_ms, 1),
            u.observed_samples ? [vfmt(u.observed_ms, 1), " / ", vfmt(u.observed_peak_ms, 1)] : "—",
            str(u.decided_by) || "—", str(u.bucket) || "—", yesno(!!u.active, "active", "inactive"),
            str(u.sticky_entries === undefined ? "—" : u.sticky_entries), fmt(picks, 1), v(u.last_error, "err")];
        }), [1, 2, 3, 7, 8]));
      chart(c, id + SEP + "lat", "latency ms per publisher (probes)", pubs.map(function (u) {
        return {key: pkey(src, "latency_bucket", name, str(u.address), "latency_ms"), label: str(u.address)};
      }), "ms");
      chart(c, id + SEP + "picks", "picks per second", pubs.map(function (u) {
        return {key: pkey(src, "latency_bucket", name, str(u.address), "picks_total"), label: str(u.address)};
      }), "/s");
      if (window.edgesteerPublisherLoad) window.edgesteerPublisherLoad(helpers, c, p, src, id);
    });
  }

  function renderRate(src, seen) {
    arr(src.modules.peer_rate_limit).forEach(function (h) {
      seen.peer_rate_limit = true;
      var name = str(h.name), id = "prl" + SEP + src.prefix.join(SEP) + SEP + name + SEP + str(h.kind);
      var c = card("peer_rate_limit", id, ["limiter ", v(name), " (", v(h.kind), ")", src.label()]);
      var d = h.dynamic;
      if (d) add(c.info, el("div", {"class": "meta"}, "dynamic: load ", vfmt(d.load_percent, 1), " % · throttle ", v(d.throttle_percent),
        " % · source ", v(d.source), d.last_error ? [" · ", v(d.last_error, "err")] : null));
      extras(c, h, ["name", "kind", "profiles", "dynamic"]);
      var rows = [], rateSeries = [], throttleSeries = [], flowSeries = [];
      arr(h.profiles).forEach(function (p) {
        var pn = str(p.name);
        ["admitted_total", "rejected_total"].forEach(function (f) {
          flowSeries.push({key: pkey(src, "peer_rate_limit", name, pn, f), label: [v(pn), " " + f.replace("_total", "")]});
        });
        arr(p.limits).forEach(function (l) {
          var ln = str(l.name);
          var adm = last(pkey(src, "peer_rate_limit", name, pn, ln, "admitted_total"));
          var rej = last(pkey(src, "peer_rate_limit", name, pn, ln, "rejected_total"));
          rows.push([pn, ln, [vfmt(l.rate_per_second, 1), " / ", v(l.burst)], [v(l.throttle_percent), " %"], [vfmt(l.effective_rate_per_second, 1), " / ", v(l.effective_burst)],
            str(p.keys), fmt(adm === null ? last(pkey(src, "peer_rate_limit", name, pn, "admitted_total")) : adm, 1),
            fmt(rej === null ? last(pkey(src, "peer_rate_limit", name, pn, "rejected_total")) : rej, 1)]);
          rateSeries.push({key: pkey(src, "peer_rate_limit", name, pn, ln, "effective_rate_per_second"), label: [v(pn), " ", v(ln)]});
          throttleSeries.push({key: pkey(src, "peer_rate_limit", name, pn, ln, "throttle_percent"), label: [v(pn), " ", v(ln), " throttle %"]});
          ["admitted_total", "rejected_total"].forEach(function (f) {
            flowSeries.push({key: pkey(src, "peer_rate_limit", name, pn, ln, f), label: [v(pn), " ", v(ln), " " + f.replace("_total", "")]});
          });
        });
      });
      add(c.info, table(["profile", "limit", abbr("rate/burst", "configured rate (per second) / burst"), "throttle",
        abbr("eff. rate/burst", "effective rate (per second) / burst, after throttling"), abbr("keys", "peers tracked"),
        abbr("adm./s", "admitted per second"), abbr("rej./s", "rejected per second")], rows, [2, 3, 4, 5, 6, 7]));
      var dyn = [{key: pkey(src, "peer_rate_limit", name, "dynamic", "load_percent"), label: "load %"},
        {key: pkey(src, "peer_rate_limit", name, "dynamic", "throttle_percent"), label: "throttle %"}];
      chart(c, id + SEP + "thr", "throttle % and load % over time", dyn.concat(throttleSeries), "%");
      chart(c, id + SEP + "flow", "admitted vs rejected per second", flowSeries, "/s");
      chart(c, id + SEP + "eff", "effective rate (requests/s)", rateSeries, "/s");
    });
  }

  function renderTenants(src, seen) {
    arr(src.modules.tenant_route).forEach(function (h) {
      seen.tenant_route = true;
      var name = str(h.name), id = "tr" + SEP + src.prefix.join(SEP) + SEP + name;
      var c = card("tenant_route", id, ["router ", v(name), src.label()]);
      add(c.info, el("div", {"class": "meta"}, "membership ", v(h.membership),
        typeof h.membership_age_ms === "number" ? [" (updated ", v((h.membership_age_ms / 1000).toFixed(1)), " s ago)"] : null,
        " · ", v(h.partitions), " partitions per tenant",
        h.membership_error ? [" · ", v(h.membership_error, "err")] : null));
      extras(c, h, ["name", "membership", "membership_age_ms", "membership_updated", "membership_error", "nodes", "open_connections", "partitions",
        "tenant_partitions", "runtime_partitions", "tenants", "partition_history"]);
      var conns = obj(h.open_connections), nodes = arr(h.nodes).map(str);
      Object.keys(conns).forEach(function (n) { if (nodes.indexOf(n) < 0) nodes.push(n); });
      var max = 0;
      nodes.forEach(function (n) { max = Math.max(max, Number(conns[n]) || 0); });
      add(c.info, table(["node", "open connections"], nodes.map(function (n) { return [n, bar(Number(conns[n]) || 0, max)]; })));
      var tenants = obj(h.tenants), names = Object.keys(tenants);
      names.sort(function (a, b) { return (Number(obj(tenants[b]).connections) || 0) - (Number(obj(tenants[a]).connections) || 0) || (a < b ? -1 : 1); });
      var rows = names.slice(0, MAX_ROWS).map(function (t) {
        var tv = obj(tenants[t]);
        return [v(t, "tenant"), vlist(arr(tv.nodes)), str(tv.connections)];
      });
      add(c.info, el("div", {"class": "meta"}, v(names.length), " tenants connected", names.length > MAX_ROWS ? [" (top ", v(MAX_ROWS), " shown)"] : null));
      if (rows.length) add(c.info, table(["tenant", "nodes", "connections"], rows, [2]));
      // Placement changes (auto partitions), newest first.
      var hist = arr(h.partition_history).slice(-MAX_ROWS).reverse();
      if (hist.length) add(c.info, table(["changed", "tenant", "k", "why"], hist.map(function (e) {
        e = obj(e);
        return [str(e.time), v(e.tenant, "tenant"), [v(e.from), " → ", v(e.to)], str(e.reason)];
      })));
      var tp = obj(h.tenant_partitions), tpn = Object.keys(tp).sort();
      if (tpn.length) add(c.info, el("div", {"class": "meta"}, "own partition counts: ", tpn.slice(0, MAX_ROWS).map(function (t, k) {
        return [k ? ", " : null, v(t, "tenant"), "=", v(tp[t])];
      })));
      chart(c, id + SEP + "conns", "open connections per node", nodes.map(function (n) {
        return {key: pkey(src, "tenant_route", name, "open_connections", n), label: n};
      }), "");
    });
  }

  function renderOGS(st) {
    var list = arr(st.ogs), now = Date.parse(str(st.generated_at));
    show("ogs", list.length > 0);
    list.forEach(function (r, i) {
      var id = "ogs" + SEP + i;
      var c = card("ogs", id, ["ogs ", v(r.url)]);
      // An unreachable URL keeps its last good answer (body), shown stale.
      var stale = !r.reachable && r.body;
      c.classList.toggle("stale", !!stale);
      add(c.info, el("div", {"class": "meta"}, r.reachable ? yesno(true, "reachable") : el("span", {"class": "err"}, "unreachable: ", v(r.error)),
        r.fetched_at ? [" · fetched ", v(r.fetched_at)] : null));
      if (stale) {
        var age = (now - Date.parse(str(r.body_fetched_at))) / 1000;
        add(c.info, el("div", {"class": "meta stale-note"}, "stale: the last answer, ", v(isFinite(age) ? fmt(age, 0) : "—"), " s old (",
          v(r.body_fetched_at), ")"));
      }
      arr(obj(r.body).servers).forEach(function (s) {
        var zone = str(s.zone);
        add(c.info, el("div", {"class": "meta"}, "zone ", v(zone), " · store ", v(s.store),
          s.redis_healthy === undefined ? null : [" · redis ", s.redis_healthy ? "healthy" : "unhealthy"],
          " · last run ", v(s.last_run), " · runs ", v(s.runs_total)));
        // Keys the shared store refused or could not answer (per key class).
        var tr = arr(s.redis_troubles);
        if (tr.length) add(c.info, table(["store trouble: keys", "operation", "reason", "since"], tr.slice(0, MAX_ROWS).map(function (x) {
          x = obj(x);
          return [el("div", null, v(x.key_pattern), " (", v(x.keys), ")"), str(x.operation),
            el("div", null, el("span", {"class": "err"}, v(x.reason)), ": ", v(x.error)), str(x.since)];
        })));
        var gws = arr(s.gateways);
        if (gws.length) add(c.info, el("div", {"class": "meta"}, "gateways: ", gws.map(function (g, k) {
          return [k ? ", " : null, v(obj(g).name), " ", v(obj(g).address)];
        })));
        var series = [];
        add(c.info, table(["location", "order (RTT ms)", "probed at", "cache age s"], arr(s.locations).slice(0, MAX_ROWS).map(function (l) {
          var rtts = obj(l.rtts_ms);
          var order = arr(l.order).map(function (g, k) { return el("div", null, v(k + 1), ". ", v(g), " (", vfmt(rtts[g], 1), ")"); });
          Object.keys(rtts).forEach(function (g) {
            series.push({key: key("ogs", String(i), zone, str(l.location), "rtts_ms", g), label: [v(l.location), " ", v(g)]});
          });
          return [str(l.location), el("div", null, order), str(l.probed_at), fmt(l.age_seconds, 1)];
        }), [3]));
        chart(c, id + SEP + zone, ["RTT ms per gateway (", v(zone), ")"], series, "ms");
      });
    });
  }

  function renderNtier(src, seen) {
    arr(src.modules.cache_redirect).forEach(function (h) {
      seen.ntier = true;
      var node = str(h.node), id = "cr" + SEP + src.prefix.join(SEP) + SEP + node;
      var c = card("ntier", id, ["cache_redirect node ", v(node), src.label()]);
      extras(c, h, ["node", "client_ip_header", "caches", "origin", "requests_total", "forged_client_ip_total"]);
      var paths = obj(h.requests_total), pn = Object.keys(paths).sort();
      add(c.info, table(["path", "requests", "per second"], pn.map(function (p) {
        return [p, str(paths[p]), fmt(last(pkey(src, "cache_redirect", node, "requests_total", p)), 1)];
      }), [1, 2]));
      add(c.info, el("div", {"class": "meta"}, "forged Client-IP replaced: ", v(h.forged_client_ip_total),
        " · caches ", arr(h.caches).map(function (x, k) { return [k ? ", " : null, v(obj(x).address), obj(x).up === false ? " (down)" : null]; })));
      chart(c, id + SEP + "rate", "requests per second by path", pn.map(function (p) {
        return {key: pkey(src, "cache_redirect", node, "requests_total", p), label: p};
      }), "/s");
    });
    arr(src.modules.port_range).forEach(function (t, k) {
      seen.ntier = true;
      var id = "pr" + SEP + src.prefix.join(SEP) + SEP + k;
      var c = card("ntier", id, ["source ports ", str(t.node) ? v(t.node) : ["ports ", v(t.ports)], src.label()]);
      var size = Number(t.size) || 0, used = Number(t.ports_in_use) || 0;
      add(c.info, table(["range", "size", "in use", "TIME_WAIT", "exhausted dials"],
        [[str(t.ports), str(size), bar(used, size), str(t.time_wait), str(t.exhausted_total)]], [1, 3, 4]));
      chart(c, id + SEP + "use", "source ports in use", [{key: pkey(src, "port_range", str(t.node), "ports_in_use"), label: ["in use of ", v(size)]}], "");
    });
  }

  // renderTiers draws the transparent N-tier app's view: the upper tier's
  // nodes (health, buckets owned, next hop and mark) and whether its rules
  // are installed; a lower node's installed interception.
  function renderTiers(src, seen) {
    arr(src.modules.ntier).forEach(function (t, k) {
      var u = t.upper, l = t.lower, id = "nt" + SEP + src.prefix.join(SEP) + SEP + k;
      if (u) {
        seen.ntier = true;
        var c = card("ntier", id + SEP + "upper", ["transparent upper tier", src.label()]);
        add(c.info, el("div", {"class": "meta"}, "rules ", yesno(!!u.installed, "installed", "not installed"),
          " · jhash ip saddr mod ", v(u.buckets), " seed ", v(u.seed), u.error ? [" · ", el("span", {"class": "err"}, v(u.error))] : null));
        extras(c, u, ["installed", "error", "buckets", "seed", "nodes"]);
        var nodes = arr(u.nodes);
        add(c.info, table(["node", "next hop", "mark", "health", "since", abbr("buckets", "buckets it serves now (of the hash)"),
          abbr("own", "buckets that are its own when every node is up"), abbr("probes", "health checks made"), "last error"],
          nodes.map(function (n) {
            return [str(n.name), str(n.next_hop), str(n.mark), yesno(!!n.up, "up", "down"), str(n.since),
              bar(Number(n.buckets_serving) || 0, Number(u.buckets) || 0), str(n.buckets_documented), str(n.probes_total), v(n.last_error, "err")];
          }), [2, 6, 7]));
        chart(c, id + SEP + "buckets", "buckets served per node", nodes.map(function (n) {
          return {key: pkey(src, "ntier", "upper", str(n.name), "buckets_serving"), label: str(n.name)};
        }), "");
      }
      if (l) {
        seen.ntier = true;
        var lc = card("ntier", id + SEP + "lower", ["transparent lower node", src.label()]);
        add(lc.info, table(["nftables table", "ports", "tproxy to port", "mark"],
          [[str(l.table), vlist(arr(l.ports)), str(l.listen_port), str(l.mark)]], [2, 3]));
      }
    });
  }

  // Panels in files of their own (assets/agent.js) register in
  // window.edgesteerPanels: {module, panel, render(h, src, seen)}, drawn
  // with these helpers.
  var panels = window.edgesteerPanels || [];
  var helpers = {el: el, add: add, v: v, fmt: fmt, vlist: vlist, abbr: abbr, arr: arr, obj: obj, str: str, table: table,
    extras: extras, card: card, chart: chart, last: last, pkey: pkey, SEP: SEP, MAX_ROWS: MAX_ROWS};
  var KNOWN = ["latency_bucket", "peer_rate_limit", "tenant_route", "cache_redirect", "port_range", "ntier"].concat(panels.map(function (p) { return p.module; }));
  function renderOther(src, seen) {
    Object.keys(src.modules).sort().forEach(function (m) {
      if (KNOWN.indexOf(m) >= 0) return;
      var mv = src.modules[m];
      if (Array.isArray(mv) && !mv.length) return;
      seen.other = true;
      var c = card("other", "other" + SEP + src.prefix.join(SEP) + SEP + m, [v(m), src.label()]);
      add(c.info, el("pre", {"class": "v"}, visible(JSON.stringify(mv, null, 1).slice(0, 20000))));
    });
  }

  function renderReplicas(st) {
    var list = arr(st.replicas);
    show("replicas", list.length > 0);
    if (!list.length) return;
    var c = card("replicas", "replicas", "other Caddy processes");
    add(c.info, table(["admin address", "state", "modules"], list.map(function (r) {
      return [str(r.url), r.reachable ? yesno(true, "reachable") : el("span", {"class": "err"}, "unreachable: ", v(r.error)),
        vlist(Object.keys(obj(r.body)).filter(function (m) { return arr(obj(r.body)[m]).length; }))];
    })));
  }

  function render(st) {
    touched = {};
    merge(st);
    var seen = {};
    sources(st).forEach(function (src) {
      renderLatency(src, seen); renderRate(src, seen); renderTenants(src, seen); renderTiers(src, seen); renderNtier(src, seen);
      panels.forEach(function (p) { p.render(helpers, src, seen); });
      renderOther(src, seen);
    });
    ["latency_bucket", "peer_rate_limit", "tenant_route", "ntier", "other"].concat(panels.map(function (p) { return p.panel; }))
      .forEach(function (p) { show(p, !!seen[p]); });
    renderOGS(st);
    renderReplicas(st);
    Object.keys(charts).forEach(function (id) { if (!touched[id]) { charts[id].u.destroy(); charts[id].el.remove(); delete charts[id]; } });
    Object.keys(cards).forEach(function (id) { if (!touched[id]) { cards[id].remove(); delete cards[id]; } });
  }

  // merge adds the samples of an answer to those held: the first answer
  // brings the whole history, later ones only the last seconds
  // (api/state?window=…), so a poll stays small however long the history.
  function nulls(n) { var a = new Array(n); for (var i = 0; i < n; i++) a[i] = null; return a; }
  function merge(st) {
    var inc = obj(st.series), times = arr(inc.times_ms), vals = obj(inc.values);
    var lastT = S.times.length ? S.times[S.times.length - 1] : -Infinity;
    var start = 0;
    while (start < times.length && times[start] <= lastT) start++;
    var n = times.length - start, held = S.times.length;
    if (n > 0) {
      S.times = S.times.concat(times.slice(start));
      Object.keys(S.values).forEach(function (k) {
        var v = vals[k];
        S.values[k] = S.values[k].concat(Array.isArray(v) ? v.slice(start) : nulls(n));
      });
      Object.keys(vals).forEach(function (k) {
        if (!S.values[k] && Array.isArray(vals[k])) S.values[k] = nulls(held).concat(vals[k].slice(start));
      });
    }
    var cutoff = (S.times.length ? S.times[S.times.length - 1] : 0) - (Number(st.history_seconds) || 900) * 1000;
    var drop = 0;
    while (drop < S.times.length && S.times[drop] < cutoff) drop++;
    if (drop) S.times = S.times.slice(drop);
    Object.keys(S.values).forEach(function (k) {
      var v = drop ? S.values[k].slice(drop) : S.values[k];
      if (v.every(function (x) { return x === null; })) delete S.values[k]; else S.values[k] = v;
    });
  }

  var status = document.getElementById("status");
  var rendered = 0, lastOK = 0, historyS = 0, intervalS = 2;
  function stateURL() {
    if (!lastOK) return "api/state";
    var w = Math.ceil((Date.now() - lastOK) / 1000) + 2 * intervalS + 2;
    return "api/state?window=" + Math.min(w, historyS) + "s";
  }
  function refresh() {
    var asked = Date.now();
    fetch(stateURL(), {cache: "no-store", credentials: "same-origin"}).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    }).then(function (st) {
      render(st);
      lastOK = asked;
      historyS = Math.floor(Number(st.history_seconds) || 900);
      intervalS = Math.ceil((Number(st.sample_interval_ms) || 2000) / 1000);
      rendered++;
      if (rendered === 1) document.body.dataset.firstRenderMs = String(Math.round(performance.now()));
      status.className = "status";
      status.textContent = "updated " + new Date(st.generated_at).toLocaleTimeString() + " · sample every " + (st.sample_interval_ms / 1000) + " s";
      document.body.dataset.renders = String(rendered);
    }).catch(function (e) {
      status.className = "status bad";
      status.textContent = "no data: " + e.message;
    }).finally(function () { setTimeout(refresh, REFRESH_MS); });
  }
  refresh();
})();
