// baton dashboard: the plots (uPlot, data from the page's JSON endpoint),
// the file upload on the push page, and the live-update status in words,
// so a stream that stops is never silent. No inline script: the CSP
// forbids it.
(function () {
  "use strict";

  function status(state, text) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  // A live refresh never takes the focus away from someone moving
  // through the table with the keyboard: it waits until they leave it.
  document.body.addEventListener("htmx:beforeRequest", function (e) {
    var t = e.detail && e.detail.elt;
    if (t && t.id === "fleet-table" && t.contains(document.activeElement)) e.preventDefault();
  });

  var lastEvent = null;
  var lastPlot = Date.now();
  document.body.addEventListener("htmx:sseOpen", function () {
    status("up", "Live updates: connected.");
  });
  document.body.addEventListener("htmx:sseError", function () {
    status("down", "Live updates: disconnected, reconnecting… (what you see may be out of date)");
  });
  document.body.addEventListener("htmx:sseMessage", function (e) {
    lastEvent = new Date();
    var kind = e.detail && e.detail.type;
    if (kind === "lagged") {
      status("down", "Live updates: " + e.detail.data + " update(s) missed; reload the page.");
    } else if (kind === "ended") {
      status("down", "Live updates stopped: " + e.detail.data + ".");
    } else {
      status("up", "Live updates: connected, last " + (local ? localText(lastEvent) : lastEvent.toISOString()) + ".");
    }
    // A report every few seconds: the plot is read again at most every
    // 10 s (it is up to an hour of reports).
    if (kind === "clock" && Date.now() - lastPlot > 10000) {
      lastPlot = Date.now();
      refreshPlot("clock-plot");
    }
  });

  function fetchJson(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status + " " + r.statusText); return r.json(); });
  }

  function marksPlugin(marks) {
    return {
      hooks: {
        draw: function (u) {
          var ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#888";
          ctx.fillStyle = getComputedStyle(document.body).color;
          ctx.setLineDash([4, 4]);
          marks.forEach(function (m) {
            var x = u.valToPos(m.t, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.fillText(m.label, x + 3, u.bbox.top + 12);
          });
          ctx.restore();
        }
      }
    };
  }

  // One time zone per page, the reader's choice (remembered), named in
  // the footer: every <time> the server wrote (UTC) and the plots' axes.
  var local = false;
  try { local = localStorage.getItem("baton-tz") === "local"; } catch (e) { /* private mode */ }
  function pad(n, w) { n = String(n); while (n.length < (w || 2)) n = "0" + n; return n; }
  function localText(d) {
    var off = -d.getTimezoneOffset();
    var sign = off >= 0 ? "+" : "-";
    off = Math.abs(off);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." + pad(d.getMilliseconds(), 3) +
      " " + sign + pad(Math.floor(off / 60)) + ":" + pad(off % 60);
  }
  function zoneName() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "local time"; } catch (e) { return "local time"; }
  }
  function showTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (t) {
      var iso = t.getAttribute("datetime");
      t.textContent = local ? localText(new Date(iso)) : iso;
    });
    var label = document.getElementById("tz-label");
    var toggle = document.getElementById("tz-toggle");
    if (label) label.textContent = local ? "Times in local time (" + zoneName() + ")." : "Times in UTC.";
    if (toggle) toggle.textContent = local ? "Show UTC" : "Show local time";
  }
  var tzToggle = document.getElementById("tz-toggle");
  if (tzToggle) {
    tzToggle.addEventListener("click", function () {
      local = !local;
      try { localStorage.setItem("baton-tz", local ? "local" : "utc"); } catch (e) { /* not kept */ }
      showTimes();
      ["clock-plot", "timeline-plot"].forEach(refreshPlot);
    });
  }
  document.body.addEventListener("htmx:afterSwap", function (e) { showTimes(e.target); });
  document.body.addEventListener("htmx:sseMessage", function () { showTimes(); });
  showTimes();

  // Axis values with their unit, short enough never to be cut: µs up to
  // 10 000, then ms, then s.
  function micros(v) {
    var a = Math.abs(v);
    if (a >= 1e7) return (v / 1e6).toFixed(a >= 1e8 ? 0 : 1) + " s";
    if (a >= 1e4) return (v / 1e3).toFixed(a >= 1e5 ? 0 : 1) + " ms";
    return (Math.round(v * 10) / 10) + " µs";
  }
  function axisSize(u, values, axisIdx, cycleNum) {
    var axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    var longest = (values || []).reduce(function (m, v) { return Math.max(m, String(v).length); }, 0);
    // Tick length, gap, and ~8 px per character at the axis font.
    return Math.max(48, 16 + longest * 8);
  }

  var plots = {};
  function draw(id, data, series, marks, yLabel) {
    var el = document.getElementById(id);
    if (!el || typeof uPlot === "undefined") return;
    var width = Math.max(300, el.clientWidth || 800);
    var opts = {
      width: width, height: 240, series: series, plugins: [marksPlugin(marks)],
      tzDate: local ? function (ts) { return new Date(ts * 1e3); } : function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      axes: [
        { label: local ? "time (" + zoneName() + ")" : "time (UTC)" },
        { label: yLabel, size: axisSize, values: function (u, vals) { return vals.map(micros); } }
      ]
    };
    if (plots[id]) plots[id].destroy();
    el.textContent = "";
    plots[id] = new uPlot(opts, data, el);
    el.dataset.points = String(data[0].length);
  }

  function refreshPlot(id) {
    var el = document.getElementById(id);
    if (!el) return;
    fetchJson(el.dataset.src).then(function (d) {
      if (id === "clock-plot") {
        var marks = d.changes.map(function (c) { return { t: c.t, label: c.source + " " + c.state }; });
        draw(id, [d.t, d.offset_us, d.low_us, d.high_us], [
          {},
          { label: "offset (µs)", stroke: "#0b57d0", width: 2 },
          { label: "offset − uncertainty", stroke: "#888", dash: [4, 4] },
          { label: "offset + uncertainty", stroke: "#888", dash: [4, 4] }
        ], marks, "clock offset");
        var list = document.getElementById("clock-changes");
        if (list) {
          list.textContent = d.changes.length ? "Source / state changes: " +
            d.changes.map(function (c) { var t = new Date(c.t * 1000); return (local ? localText(t) : t.toISOString()) + " → " + c.source + " " + c.state; }).join("; ") :
            "No source or state change in this window.";
        }
      } else {
        draw(id, [d.t, d.lateness_us], [{}, { label: "lateness (µs)", stroke: "#0b57d0", width: 0, points: { show: true, size: 4 } }], d.marks, "lateness");
      }
    }).catch(function (e) {
      el.textContent = "The plot could not load: " + e.message;
    });
  }

  ["clock-plot", "timeline-plot"].forEach(refreshPlot);

  var file = document.getElementById("pack-file");
  if (file) {
    file.addEventListener("change", function () {
      var f = file.files && file.files[0];
      if (!f) return;
      f.text().then(function (t) {
        var area = document.getElementById("yaml");
        area.value = t;
        area.dispatchEvent(new Event("input", { bubbles: true }));
      });
    });
  }
})();
