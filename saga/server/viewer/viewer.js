// The saga run viewer: plain DOM, no framework, nothing fetched from outside this service.
// Every value from a run is put on the page as text (never as HTML).
"use strict";

var saga = (function () {
  var EVENTS = ["RunStarted", "StepStarted", "StepCompleted", "StepFailed", "StepSkipped",
    "HealStarted", "RemedyApplied", "ApprovalRequested", "ApprovalGranted", "ApprovalRejected",
    "CompensationStarted", "StepCompensated", "CompensationFailed", "RunRetried",
    "RunCompleted", "RunFailed", "RunCompensated", "RunCancelled", "RunPaused", "RunUnpaused",
    "StepWaiting", "SignalReceived", "RunTimedOut", "RetentionApplied", "RunTakenOver"];
  var ENDINGS = ["RunCompleted", "RunFailed", "RunCompensated", "RunCancelled"];

  function token() {
    var m = document.cookie.match(/(?:^|;\s*)saga_token=([^;]*)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  function api(path, options) {
    options = options || {};
    var headers = {"Accept": "application/json"};
    var t = token();
    if (t) headers["Authorization"] = "Bearer " + t;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    return fetch(path, {method: options.method || "GET", headers: headers,
                        body: options.body === undefined ? undefined : JSON.stringify(options.body)})
      .then(function (r) {
        if (r.status === 401) { location.reload(); throw new Error("unauthorised"); }
        var kind = r.headers.get("content-type") || "";
        var body = kind.indexOf("json") >= 0 ? r.json() : r.text();
        return body.then(function (b) {
          if (!r.ok) throw new Error((b && b.detail) || r.statusText);
          return b;
        });
      });
  }

  function el(tag, attrs) {
    var node = document.createElement(tag);
    attrs = attrs || {};
    Object.keys(attrs).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "onclick") node.addEventListener("click", attrs[k]);
      else if (attrs[k] !== null && attrs[k] !== undefined) node.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function badge(status) {
    return el("span", {"class": "badge s-" + (status || "pending"), text: status || "pending"});
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "-";
    return ms >= 1000 ? (ms / 1000).toFixed(1) + "s" : Math.round(ms) + "ms";
  }

  function json(value) {
    return value === undefined ? "" : JSON.stringify(value, null, 2);
  }

  function debounce(fn, ms) {
    var timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  function follow(url, onEvent, onEnd) {
    // EventSource reconnects by itself with Last-Event-ID, so no event is lost or repeated.
    var source = new EventSource(url);
    var live = document.getElementById("live");
    source.onopen = function () { live.classList.add("on"); };
    source.onerror = function () { live.classList.remove("on"); };
    EVENTS.forEach(function (name) {
      source.addEventListener(name, function (message) {
        onEvent(name, JSON.parse(message.data));
        if (onEnd && ENDINGS.indexOf(name) >= 0) {
          source.close();
          live.classList.remove("on");
          onEnd();
        }
      });
    });
    return source;
  }

  // ---- the list of runs ------------------------------------------------------------
  function listPage() {
    var form = document.getElementById("filters");
    var params = new URLSearchParams(location.search);
    Array.prototype.forEach.call(form.elements, function (input) {
      if (input.name && params.get(input.name)) input.value = params.get(input.name);
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var query = new URLSearchParams();
      Array.prototype.forEach.call(form.elements, function (input) {
        if (input.name && input.value) query.set(input.name, input.value);
      });
      history.replaceState(null, "", "?" + query.toString());
      load();
    });

    function load() {
      var query = new URLSearchParams(location.search);
      query.set("limit", "200");
      return api("/api/v1/runs?" + query.toString()).then(function (runs) {
        var body = document.querySelector("#runs tbody");
        body.textContent = "";
        runs.forEach(function (run) {
          body.appendChild(el("tr", {"data-run": run.run_id, "data-status": run.status},
            el("td", {}, el("a", {href: "/runs/" + encodeURIComponent(run.run_id),
                                  text: run.run_id})),
            el("td", {text: run.name}),
            el("td", {}, badge(run.status)),
            el("td", {text: run.actor || ""}),
            el("td", {text: run.started_at || ""}),
            el("td", {text: duration(run.duration_ms)})));
        });
        document.getElementById("empty").hidden = runs.length > 0;
      });
    }

    var refresh = debounce(load, 250);
    api("/api/v1/health").then(function (health) {
      document.getElementById("store").textContent = health.store;
      load();
      follow("/api/v1/events?after=" + (health.position || 0), refresh, null);
    });
  }

  // ---- one run -----------------------------------------------------------------------
  function runPage() {
    var runId = decodeURIComponent(location.pathname.replace(/^\/runs\//, ""));
    var base = "/api/v1/runs/" + encodeURIComponent(runId);
    document.title = "saga · " + runId;

    function act(path, body) {
      return api(base + path, {method: "POST", body: body || {}})
        .then(load).catch(function (e) { alert(e.message); });
    }

    function summary(run) {
      var box = document.getElementById("summary");
      box.textContent = "";
      box.appendChild(el("h1", {}, run.run_id + " ", badge(run.status)));
      var facts = el("div", {"class": "facts"});
      [["definition", run.name], ["actor", run.actor], ["started", run.started_at],
       ["finished", run.finished_at], ["version", run.version],
       ["failed step", run.failed_step]].forEach(function (f) {
        if (f[1] !== null && f[1] !== undefined && f[1] !== "")
          facts.appendChild(el("div", {}, el("span", {text: f[0]}), String(f[1])));
      });
      box.appendChild(facts);
      if (run.error) box.appendChild(el("pre", {"class": "bad", text: json(run.error)}));
      var buttons = el("p", {});
      if (["running", "waiting", "paused"].indexOf(run.status) >= 0)
        buttons.appendChild(el("button", {"class": "danger", text: "Cancel",
          onclick: function () { if (confirm("Cancel this run and undo its steps?")) act("/cancel"); }}));
      if (run.status === "failed")
        buttons.appendChild(el("button", {text: "Retry", onclick: function () { act("/retry"); }}));
      box.appendChild(buttons);
      var approvals = document.getElementById("approvals");
      approvals.textContent = "";
      (run.waiting_for || []).forEach(function (step) {
        var info = (run.steps[step] || {}).approval || {};
        approvals.appendChild(el("div", {"class": "approval", "data-approval": step},
          el("strong", {text: step}),
          el("span", {"class": "msg", text: info.message || "waiting for approval"}),
          el("button", {text: "Approve", "data-action": "approve",
                        onclick: function () { act("/approve/" + encodeURIComponent(step)); }}),
          el("button", {"class": "danger", text: "Reject", "data-action": "reject",
                        onclick: function () { act("/reject/" + encodeURIComponent(step)); }})));
      });
    }

    function steps(run) {
      var body = document.querySelector("#steps tbody");
      body.textContent = "";
      Object.keys(run.steps).forEach(function (key) {
        var s = run.steps[key];
        var detail = s.error ? json(s.error) : json(s.output);
        if (s.compensation_error) detail += "\ncompensation failed: " + json(s.compensation_error);
        var shown = s.compensation_error ? "compensation failed" : s.status;
        body.appendChild(el("tr", {"data-step": key, "data-status": s.status,
                                   "data-compensation": s.compensation_error ? "failed" : null},
          el("td", {text: key}),
          el("td", {}, el("span", {"class": "badge s-" + (s.compensation_error ? "failed" : s.status),
                                   text: shown})),
          el("td", {text: s.attempt || 0}), el("td", {text: duration(s.duration_ms)}),
          el("td", {}, el("pre", {text: detail}))));
      });
      document.getElementById("outputs").textContent = json(run.outputs);
    }

    function graph(layout) {
      var W = 190, H = 44, GX = 60, GY = 26, NS = "http://www.w3.org/2000/svg";
      var levels = 0, rows = 0, at = {};
      layout.nodes.forEach(function (n) {
        levels = Math.max(levels, n.level + 1);
        rows = Math.max(rows, n.row + 1);
        at[n.id] = {x: 10 + n.level * (W + GX), y: 10 + n.row * (H + GY)};
      });
      var svg = document.createElementNS(NS, "svg");
      svg.setAttribute("width", 20 + levels * (W + GX));
      svg.setAttribute("height", 20 + rows * (H + GY));
      function add(tag, attrs, text) {
        var node = document.createElementNS(NS, tag);
        Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
        if (text !== undefined) node.textContent = text;
        svg.appendChild(node);
        return node;
      }
      var defs = add("defs", {});
      var marker = document.createElementNS(NS, "marker");
      [["id", "arrow"], ["viewBox", "0 0 10 10"], ["refX", "10"], ["refY", "5"],
       ["markerWidth", "7"], ["markerHeight", "7"], ["orient", "auto"]].forEach(function (a) {
        marker.setAttribute(a[0], a[1]);
      });
      var tip = document.createElementNS(NS, "path");
      tip.setAttribute("d", "M0,0 L10,5 L0,10 z");
      tip.setAttribute("fill", "#8a93a3");
      marker.appendChild(tip);
      defs.appendChild(marker);
      layout.edges.forEach(function (e) {
        var a = at[e[0]], b = at[e[1]];
        add("line", {x1: a.x + W, y1: a.y + H / 2, x2: b.x, y2: b.y + H / 2,
                     stroke: "#8a93a3", "stroke-width": 1.5, "marker-end": "url(#arrow)"});
      });
      layout.nodes.forEach(function (n) {
        var p = at[n.id];
        var g = document.createElementNS(NS, "g");
        g.setAttribute("class", "node");
        g.setAttribute("data-step", n.id);
        g.setAttribute("data-status", n.status || "pending");
        svg.appendChild(g);
        var rect = document.createElementNS(NS, "rect");
        [["x", p.x], ["y", p.y], ["width", W], ["height", H], ["rx", 7],
         ["fill", n.colour], ["stroke", "#5b6473"]].forEach(function (a) {
          rect.setAttribute(a[0], a[1]);
        });
        g.appendChild(rect);
        var label = document.createElementNS(NS, "text");
        label.setAttribute("x", p.x + 8);
        label.setAttribute("y", p.y + 18);
        label.textContent = n.label.length > 28 ? n.label.slice(0, 27) + "…" : n.label;
        g.appendChild(label);
        var state = document.createElementNS(NS, "text");
        state.setAttribute("x", p.x + 8);
        state.setAttribute("y", p.y + 35);
        state.setAttribute("fill", "#5b6473");
        state.textContent = n.status || "pending";
        g.appendChild(state);
      });
      var box = document.getElementById("graph");
      box.textContent = "";
      box.appendChild(svg);
    }

    function timeline(events) {
      // Each step: its attempts as bars over the run's span; waits, retries and
      // compensations as marks.
      var box = document.getElementById("timeline");
      box.textContent = "";
      if (!events.length) return;
      var t0 = Date.parse(events[0].timestamp);
      var t1 = Date.parse(events[events.length - 1].timestamp);
      var span = Math.max(t1 - t0, 1);
      var rows = {}, order = [];
      function row(key) {
        if (!rows[key]) { rows[key] = []; order.push(key); }
        return rows[key];
      }
      events.forEach(function (e) {
        var p = e.payload || {};
        if (!p.step_id) return;
        var key = p.step_id + (p.iteration ? "[" + p.iteration + "]" : "");
        var t = Date.parse(e.timestamp);
        var r = row(key);
        if (e.type === "StepStarted") r.push({start: t, end: null, kind: "running", what: "attempt " + p.attempt});
        else if (e.type === "StepCompleted" || e.type === "StepFailed") {
          var open = r.filter(function (b) { return b.end === null && b.kind === "running"; }).pop();
          if (open) { open.end = t; open.kind = e.type === "StepCompleted" ? "completed" : "failed";
                      open.what += e.type === "StepFailed" ? " failed: " + (p.message || "") : " completed"; }
          if (p.next_retry_at) r.push({start: t, end: Date.parse(p.next_retry_at), kind: "waiting", what: "retry at " + p.next_retry_at});
        }
        else if (e.type === "StepWaiting") r.push({start: t, end: p.until ? Date.parse(p.until) : t, kind: "waiting", what: "waiting until " + (p.until || "a signal")});
        else if (e.type === "StepCompensated" || e.type === "CompensationFailed")
          r.push({start: t, end: t, kind: e.type === "StepCompensated" ? "compensated" : "failed", what: e.type});
        else if (e.type === "StepSkipped") r.push({start: t, end: t, kind: "skipped", what: "skipped: " + (p.reason || "")});
      });
      var colours = {running: "#a9d6e5", completed: "#52b788", failed: "#e5383b",
                     waiting: "#ffd166", compensated: "#9d4edd", skipped: "#adb5bd"};
      order.forEach(function (key) {
        var track = el("div", {"class": "timeline-track"});
        rows[key].forEach(function (b) {
          var end = b.end === null ? t1 : Math.min(b.end, t1);
          var left = (b.start - t0) / span * 100;
          var width = Math.max((end - b.start) / span * 100, 0.4);
          track.appendChild(el("div", {"class": "timeline-bar", title: b.what,
            "data-kind": b.kind,
            style: "left:" + left.toFixed(2) + "%;width:" + width.toFixed(2) + "%;background:" + colours[b.kind]}));
        });
        box.appendChild(el("div", {"class": "timeline-row", "data-step": key},
          el("span", {text: key}), track));
      });
    }

    function historyTable(events) {
      var body = document.querySelector("#history tbody");
      body.textContent = "";
      events.forEach(function (e) {
        var p = Object.assign({}, e.payload || {});
        delete p.definition;
        body.appendChild(el("tr", {"data-version": e.version},
          el("td", {text: e.version}), el("td", {text: e.timestamp}),
          el("td", {text: e.type}), el("td", {}, el("pre", {text: JSON.stringify(p)}))));
      });
    }

    function audit(result) {
      var box = document.getElementById("audit");
      box.textContent = "";
      box.appendChild(el("p", {"class": result.ok ? "ok" : "bad", "data-ok": String(result.ok),
        text: result.ok ? "verified: the hash chain is intact and replay reproduces every decision"
                        : "NOT verified"}));
      box.appendChild(el("pre", {text: json(result)}));
    }

    var last = 0;
    function load() {
      return Promise.all([api(base), api(base + "/graph?format=json"), api(base + "/events"),
                          api(base + "/verify")]).then(function (r) {
        summary(r[0]); steps(r[0]); graph(r[1]); timeline(r[2]); historyTable(r[2]); audit(r[3]);
        if (r[2].length) last = r[2][r[2].length - 1].version;
        return r[0];
      }).catch(function (e) {
        document.getElementById("summary").textContent = e.message;
      });
    }
    var refresh = debounce(load, 150);
    load().then(function (run) {
      if (run && ["completed", "failed", "compensated", "cancelled"].indexOf(run.status) < 0)
        follow(base + "/events?after=" + last, refresh, refresh);
    });
  }

  return {listPage: listPage, runPage: runPage, api: api};
})();
