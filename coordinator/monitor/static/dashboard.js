// streamfl fleet view: polls the coordinator's read-only API every 2 s and draws the fleet.
// Vanilla JavaScript, no library: the table is built with textContent (never markup from the
// data), and the charts are drawn on <canvas> by the small plotter below. Paths are relative, so
// the page works behind a reverse proxy under a sub-path too. A token in the page's own URL
// (?token=...) is sent along with every API call as a bearer header.
//
// It says what is known: "live" only while the coordinator itself is connected to its broker
// (else "broker lost since HH:MM:SS", and the devices' states are unknown, with when each was last
// heard); devices not online show no power, clocks or temperature as current; watts are labelled
// modelled (a board profile's model) or of unknown source unless a meter measured them.
(function () {
  "use strict";

  var POLL_MS = 2000;          // how often the page asks for the fleet and its new points
  var MAX_POINTS = 5000;       // points kept per line (the oldest go first)
  var MAX_EVENTS = 200;        // method events listed
  var OVERLAP_S = 5;           // series are asked again from this much before the newest point
  var MAX_LEGEND = 12;         // legend entries per chart
  var COLORS = ["#3f6fd8", "#d8633f", "#2a9d5b", "#a347c2", "#c29b1d", "#1fa5b3", "#d83f7a",
                "#6b7385", "#7a5c2e", "#4a8f2a"];

  var token = new URLSearchParams(window.location.search).get("token");
  var store = emptyStore();
  var runId = null;

  function emptyStore() {
    return {since: 0, time: -1, accuracy: [], versions: [], energy: [], clocks: {}, events: []};
  }

  function $(id) { return document.getElementById(id); }

  function api(path) {
    var headers = {};
    if (token) { headers.Authorization = "Bearer " + token; }
    return fetch(path, {headers: headers, cache: "no-store"}).then(function (r) {
      if (!r.ok) {
        return r.text().then(function (text) {
          throw new Error(r.status + " " + (text.trim() || r.statusText));
        });
      }
      return r.json();
    });
  }

  // ---- formatting ---------------------------------------------------------------------------

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function fmt(v, digits) {
    if (v === null || v === undefined) { return "-"; }
    if (typeof v === "boolean") { return v ? "yes" : "no"; }
    if (!isNum(v)) { return String(v); }
    if (digits === undefined) {
      if (Number.isInteger(v) || Math.abs(v) >= 1000) { return v.toFixed(0); }
      return String(Number(v.toPrecision(4)));
    }
    return v.toFixed(digits);
  }
  function ago(s) {
    if (!isNum(s)) { return "-"; }
    if (s < 60) { return s.toFixed(1) + " s"; }
    if (s < 3600) { return (s / 60).toFixed(1) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }
  function pairs(obj) {
    return Object.keys(obj || {}).sort().map(function (k) { return k + " " + fmt(obj[k]); }).join(", ");
  }
  function setText(id, text) { $(id).textContent = text; }
  function clock(wallS) {
    return isNum(wallS) ? new Date(wallS * 1000).toLocaleTimeString() : "-";
  }
  function state(d) {
    if (d.state === "online" && d.paused === true) { return "paused"; }  // fleet control's pause
    if (d.state === "online" || d.state === "offline" || d.state === "unknown") { return d.state; }
    return d.online ? "online" : "offline";
  }
  // Watts with where they came from: plain when measured, else labelled.
  function watts(w, source) {
    if (!isNum(w)) { return {text: "-", note: ""}; }
    return {text: w.toFixed(2), note: source === "measured" ? "" :
            source === "modelled" ? "modelled" : "source unknown"};
  }
  // The coordinator's broker link: null when the snapshot does not say, else the badge's text.
  function brokerLost(s) {
    var b = s.broker;
    if (!b || b.connected) { return null; }
    return (b.connects ? "broker lost since " : "no broker yet, since ") + clock(b.since_wall_s) +
      (b.reason ? " (" + b.reason + ")" : "") +
      " · " + fmt(b.disconnects) + " disconnect(s)";
  }

  // ---- the fleet ----------------------------------------------------------------------------

  // Shows the snapshot; false when it is of another run than the points kept (they are dropped).
  function showFleet(s) {
    var same = runId === null || s.run_id === runId;
    if (!same) { store = emptyStore(); }
    runId = s.run_id;
    setText("fleet", s.fleet || "");
    setText("run", "run " + (s.run_id || "-") + " · method " + (s.method || "-") + " · up " + ago(s.time_s));
    var c = s.coordinator || {}, b = s.broker;
    setText("whose", (c.pid ? "coordinator pid " + c.pid + " on " + (c.host || "-") + " · run folder " +
                      (c.run_dir || "-") : "") +
            (b && b.connected ? " · broker connected since " + clock(b.since_wall_s) + ", " +
                               fmt(b.disconnects) + " disconnect(s)" : ""));
    var m = s.monitor || {}, notice = $("notice");
    notice.hidden = !m.port_taken;
    notice.textContent = m.port_taken ? "monitor.port " + m.port + " was taken (another coordinator on " +
      "this machine?): this coordinator's fleet view listens on " + m.url : "";
    setText("version", fmt(s.version));
    setText("vps", fmt(s.versions_per_s, 2));
    setText("accuracy", isNum(s.accuracy) ? (100 * s.accuracy).toFixed(1) + " %" : "-");
    setText("accuracy-at", isNum(s.eval_version) ? "at version " + s.eval_version +
            (isNum(s.loss) ? ", loss " + s.loss.toFixed(3) : "") : "no held-out data yet");
    setText("devices-online", fmt(s.devices_online) + " / " + fmt(s.devices_known));
    setText("devices-unknown", s.devices_unknown ? s.devices_unknown + " unknown" +
            (brokerLost(s) ? ": the coordinator lost the broker" : ": last will with the broker's loss") : "");
    var p = s.power_w_by_source, n = s.devices_powered_by_source || {};
    if (p) {
      setText("power", fmt(p.measured, 1) + " W");
      setText("power-more", "measured (" + fmt(n.measured) + " device(s)) · modelled " + fmt(p.modelled, 1) +
              " W (" + fmt(n.modelled) + ")" + (p.unknown || n.unknown ? " · source unknown " +
              fmt(p.unknown, 1) + " W (" + fmt(n.unknown) + ")" : ""));
    } else {
      setText("power", "-");
      setText("power-more", "");
    }
    var e = s.energy_j_by_source;
    setText("energy-more", e ? "measured " + fmt(e.measured, 0) + " J · modelled " + fmt(e.modelled, 0) +
            " J" + (e.unknown ? " · source unknown " + fmt(e.unknown, 0) + " J" : "") : "");
    var u = s.updates || {};
    setText("updates", fmt(u.received) + " received, " + fmt(u.aggregated) + " aggregated, " +
            fmt(u.rejected) + " rejected");
    var more = Object.keys(u).filter(function (k) {
      return ["received", "aggregated", "rejected"].indexOf(k) < 0;
    }).sort().map(function (k) { return k + " " + fmt(u[k]); });
    setText("updates-more", more.join(", "));
    setText("reasons", pairs(s.rejected_by_reason) || "none");
    setText("implausible", Object.keys(s.implausible || {}).length ?
            "implausible reports: " + pairs(s.implausible) : "");
    setText("energy", isNum(s.energy_j) ? fmt(s.energy_j, 0) + " J" : "-");
    var methods = Object.keys(s.methods || {}).sort().map(function (m) {
      return m + ": " + (pairs(s.methods[m]) || "-");
    });
    setText("methods", methods.join("; ") || "-");
    var shown = (s.devices || []).length, total = isNum(s.devices_total) ? s.devices_total : shown;
    setText("rows-note", (shown < total ? "(showing " + shown + " of " + total + ", online first)"
                                        : "(" + total + ")") +
            (s.devices_untracked ? " · " + s.devices_untracked + " more not tracked" : ""));
    showTable(s.devices || []);
    return same;
  }

  // Column list: fixed columns, then one per clock domain and per method value seen in the rows.
  function columns(rows) {
    var domains = {}, methodKeys = {};
    rows.forEach(function (d) {
      Object.keys(d.clocks_mhz || {}).forEach(function (k) { domains[k] = true; });
      Object.keys(d.methods || {}).forEach(function (m) {
        Object.keys(d.methods[m] || {}).forEach(function (k) { methodKeys[m + "\u0000" + k] = [m, k]; });
      });
    });
    var cols = [
      {h: "device", cls: "text", get: function (d) { return d.device; }},
      {h: "state", cls: "state text", get: function (d) {
        var st = state(d);
        if (st === "unknown") { return "unknown (last heard " + ago(d.last_seen_s) + " ago)"; }
        return st === "online" ? "online" : "offline" + (d.offline_reason ? " (" + d.offline_reason + ")" : "");
      }},
      {h: "last seen", get: function (d) { return ago(d.last_seen_s); }},
      {h: "board", cls: "text", get: function (d) { return d.board || "-"; }},
      {h: "software", cls: "text", get: function (d) { return d.software || "-"; }},
      {h: "version", get: function (d) { return fmt(d.version); }},
      {h: "staleness", get: function (d) { return fmt(d.staleness); }},
      {h: "rounds", get: function (d) { return fmt(d.rounds); }},
      {h: "accepted", get: function (d) { return fmt((d.updates || {}).accepted); }},
      {h: "clipped", get: function (d) { return fmt((d.updates || {}).clipped); }},
      {h: "rejected", get: function (d) { return fmt((d.updates || {}).rejected); }},
      {h: "rejected by reason", cls: "text", get: function (d) { return pairs(d.rejected_by_reason) || "-"; }}
    ];
    Object.keys(domains).sort().forEach(function (k) {
      cols.push({h: k + " MHz", get: function (d) { return fmt((d.clocks_mhz || {})[k], 0); }});
    });
    cols.push({h: "power W", power: true, get: function (d) {
      var now = watts(d.power_w, d.power_source), last = d.last_heard || {};
      if (now.text === "-" && isNum(last.power_w)) {
        var was = watts(last.power_w, last.power_source);
        return {text: "-", note: "last " + was.text + (was.note ? " " + was.note : "")};
      }
      return now;
    }});
    cols.push({h: "energy J", get: function (d) { return fmt(d.energy_j, 0); }});
    cols.push({h: "temp °C", get: function (d) { return fmt(d.temperature_c, 1); }});
    cols.push({h: "buffer", buffer: true, get: function (d) {
      return fmt(d.buffer_fill) + " / " + fmt(d.buffer_capacity);
    }});
    cols.push({h: "predictions/s", get: function (d) { return fmt(d.predictions_per_s, 2); }});
    cols.push({h: "confidence", get: function (d) { return fmt(d.prediction_confidence, 2); }});
    Object.keys(methodKeys).sort().forEach(function (id) {
      var m = methodKeys[id][0], k = methodKeys[id][1];
      cols.push({h: m + " " + k, get: function (d) { return fmt(((d.methods || {})[m] || {})[k]); }});
    });
    return cols;
  }

  function showTable(rows) {
    var cols = columns(rows);
    var head = document.createElement("tr");
    cols.forEach(function (c) {
      var th = document.createElement("th");
      th.textContent = c.h;
      if (c.cls) { th.className = c.cls; }
      head.appendChild(th);
    });
    var table = $("devices");
    table.tHead.replaceChildren(head);
    var body = document.createElement("tbody");
    rows.forEach(function (d) {
      var tr = document.createElement("tr");
      tr.className = state(d);
      tr.dataset.device = d.device;
      cols.forEach(function (c) {
        var td = document.createElement("td");
        if (c.cls) { td.className = c.cls; }
        td.dataset.col = c.h;
        var value = c.get(d);
        if (c.power) {
          td.textContent = value.text;
          if (value.note) {
            var note = document.createElement("span");
            note.className = "source";
            note.textContent = value.note;
            td.appendChild(note);
          }
        } else {
          td.textContent = value;
        }
        if (c.buffer && isNum(d.buffer_fill) && isNum(d.buffer_capacity) && d.buffer_capacity > 0) {
          var bar = document.createElement("span"), fill = document.createElement("span");
          bar.className = "bar";
          fill.style.width = Math.min(100, 100 * d.buffer_fill / d.buffer_capacity).toFixed(0) + "%";
          bar.appendChild(fill);
          td.appendChild(bar);
        }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    table.replaceChild(body, table.tBodies[0]);
  }

  // ---- the series ---------------------------------------------------------------------------

  // Appends the points of `fresh` newer than the newest of `line` (the overlap is asked twice).
  function extend(line, fresh) {
    var last = line.length ? line[line.length - 1][0] : -Infinity;
    (fresh || []).forEach(function (p) { if (Array.isArray(p) && p[0] > last) { line.push(p); } });
    if (line.length > MAX_POINTS) { line.splice(0, line.length - MAX_POINTS); }
  }

  // Keeps the new points; a coordinator that restarted (its clock went back) starts them afresh
  // with the next poll, which asks from 0.
  function addSeries(s) {
    if (isNum(s.time_s) && s.time_s < store.time) { store = emptyStore(); return; }
    if (isNum(s.time_s)) { store.time = s.time_s; }
    extend(store.accuracy, s.accuracy);
    extend(store.versions, s.versions);
    extend(store.energy, s.energy_j);
    Object.keys(s.clocks_mhz || {}).forEach(function (dev) {
      Object.keys(s.clocks_mhz[dev] || {}).forEach(function (dom) {
        var key = dev + " " + dom;
        store.clocks[key] = store.clocks[key] || [];
        extend(store.clocks[key], s.clocks_mhz[dev][dom]);
      });
    });
    var lastEvent = store.events.length ? store.events[store.events.length - 1][0] : -Infinity;
    (s.events || []).forEach(function (e) { if (e[0] > lastEvent) { store.events.push(e); } });
    if (store.events.length > MAX_EVENTS) { store.events.splice(0, store.events.length - MAX_EVENTS); }
    var newest = store.since;
    [store.accuracy, store.versions, store.energy].concat(Object.keys(store.clocks).map(function (k) {
      return store.clocks[k];
    })).forEach(function (line) { if (line.length) { newest = Math.max(newest, line[line.length - 1][0]); } });
    store.since = Math.max(0, newest - OVERLAP_S);
  }

  function showSeries() {
    function col(line, i) { return line.map(function (p) { return [p[0], p[i]]; }); }
    plot($("chart-accuracy"), [{label: "accuracy", pts: col(store.accuracy, 2)}], {ymin: 0, ymax: 1});
    plot($("chart-versions"), [{label: "versions/s", pts: col(store.versions, 2)}], {ymin: 0});
    // Points of today's coordinators carry the sources apart: (t, all, measured, modelled, unknown).
    var bySource = store.energy.length && store.energy[store.energy.length - 1].length >= 5;
    plot($("chart-energy"), bySource ? [
      {label: "measured J", pts: col(store.energy, 2)}, {label: "modelled J", pts: col(store.energy, 3)},
      {label: "source unknown J", pts: col(store.energy, 4)}
    ] : [{label: "energy J", pts: col(store.energy, 1)}], {ymin: 0});
    plot($("chart-clocks"), Object.keys(store.clocks).sort().map(function (k) {
      return {label: k, pts: col(store.clocks[k], 1)};
    }), {ymin: 0});
    var list = $("events");
    var items = store.events.slice().reverse().map(function (e) {
      var li = document.createElement("li"), m = document.createElement("span");
      m.className = "method";
      m.textContent = String(e[1]);
      li.appendChild(document.createTextNode(fmt(e[0], 1) + " s  "));
      li.appendChild(m);
      li.appendChild(document.createTextNode("  " + String(e[2])));
      return li;
    });
    list.replaceChildren.apply(list, items);
    if (!items.length) { list.textContent = "none yet"; }
  }

  // ---- the plotter --------------------------------------------------------------------------

  // Tick values between lo and hi at a step of 1, 2 or 5 times a power of ten (about n of them).
  function ticks(lo, hi, n) {
    var span = hi - lo, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (f) { return f * mag; }).filter(function (s) { return s >= raw; })[0];
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) { out.push(v); }
    return {values: out, step: step};
  }
  function label(v, step) {
    var digits = Math.max(0, -Math.floor(Math.log10(step)));
    return Math.abs(v) >= 1e4 ? v.toExponential(1) : v.toFixed(Math.min(digits, 6));
  }

  // Draws the lines [{label, pts: [[x, y], ...]}] into the canvas, with axes, grid and legend.
  function plot(canvas, lines, opts) {
    var dpr = window.devicePixelRatio || 1, w = canvas.clientWidth, h = canvas.clientHeight;
    if (!w || !h) { return; }
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    var xs = [], ys = [];
    lines.forEach(function (l) {
      l.pts = l.pts.filter(function (p) { return isNum(p[0]) && isNum(p[1]); });
      l.pts.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); });
    });
    if (!xs.length) {
      ctx.fillStyle = "#6b7385";
      ctx.fillText("no data yet", w / 2 - 28, h / 2);
      return;
    }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (opts.ymin !== undefined) { y0 = Math.min(y0, opts.ymin); }
    if (opts.ymax !== undefined) { y1 = Math.max(y1, opts.ymax); }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= 1; y1 += 1; }
    var left = 52, right = 10, top = 8, bottom = 24;
    var pw = w - left - right, ph = h - top - bottom;
    function px(x) { return left + (x - x0) / (x1 - x0) * pw; }
    function py(y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; }
    ctx.strokeStyle = "#dde1e8";
    ctx.fillStyle = "#6b7385";
    ctx.lineWidth = 1;
    var ty = ticks(y0, y1, 4), tx = ticks(x0, x1, 6);
    ty.values.forEach(function (v) {
      ctx.beginPath(); ctx.moveTo(left, py(v)); ctx.lineTo(left + pw, py(v)); ctx.stroke();
      ctx.fillText(label(v, ty.step), 4, py(v) + 4);
    });
    tx.values.forEach(function (v) {
      ctx.fillText(label(v, tx.step), px(v) - 10, h - 8);
    });
    ctx.fillText("s", left + pw - 6, h - 8);
    ctx.strokeStyle = "#9aa1b0";
    ctx.strokeRect(left, top, pw, ph);
    lines.forEach(function (l, i) {
      ctx.strokeStyle = COLORS[i % COLORS.length];
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      l.pts.forEach(function (p, j) {
        if (j === 0) { ctx.moveTo(px(p[0]), py(p[1])); } else { ctx.lineTo(px(p[0]), py(p[1])); }
      });
      ctx.stroke();
      if (l.pts.length === 1) { ctx.fillStyle = ctx.strokeStyle; ctx.fillRect(px(l.pts[0][0]) - 2, py(l.pts[0][1]) - 2, 4, 4); }
    });
    if (lines.length > 1) {
      var shown = Math.min(lines.length, MAX_LEGEND) + (lines.length > MAX_LEGEND ? 1 : 0);
      var widest = Math.max.apply(null, lines.slice(0, MAX_LEGEND).map(function (l) {
        return ctx.measureText(l.label).width;
      }));
      ctx.fillStyle = "rgba(255, 255, 255, 0.85)";
      ctx.fillRect(left + 4, top + 2, widest + 24, shown * 13 + 6);
      lines.slice(0, MAX_LEGEND).forEach(function (l, i) {
        ctx.fillStyle = COLORS[i % COLORS.length];
        ctx.fillRect(left + 8, top + 6 + i * 13, 10, 3);
        ctx.fillStyle = "#1d2330";
        ctx.fillText(l.label, left + 22, top + 10 + i * 13);
      });
      if (lines.length > MAX_LEGEND) {
        ctx.fillText("+" + (lines.length - MAX_LEGEND) + " more", left + 22, top + 10 + MAX_LEGEND * 13);
      }
    }
  }

  // ---- the loop -----------------------------------------------------------------------------

  function status(text, cls) {
    var el = $("status");
    el.textContent = text;
    el.className = "status " + cls;
  }

  function poll() {
    Promise.all([api("api/fleet"), api("api/series?since=" + store.since)]).then(function (got) {
      if (showFleet(got[0])) { addSeries(got[1]); }
      showSeries();
      var lost = brokerLost(got[0]);
      if (lost) {
        status(lost, "broker-lost");
      } else {
        status("live · " + new Date().toLocaleTimeString(), "live");
      }
    }).catch(function (err) {
      status("cannot read the fleet: " + err.message, "error");
    }).then(function () {
      window.setTimeout(poll, POLL_MS);
    });
  }

  window.addEventListener("resize", showSeries);
  poll();
}());
