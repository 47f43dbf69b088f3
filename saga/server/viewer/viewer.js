// The saga run viewer: plain DOM, no framework, nothing fetched from outside this service.
// Every value from a run is put on the page as text (never as HTML). It offers only what
// the API would accept now (the run's `actions`), and shows one status word per step, the
// same in the graph, the table and the header.
"use strict";

var saga = (function () {
  var EVENTS = ["RunStarted", "StepStarted", "StepCompleted", "StepFailed", "StepSkipped",
    "HealStarted", "RemedyApplied", "ApprovalRequested", "ApprovalGranted", "ApprovalRejected",
    "CompensationStarted", "StepCompensated", "CompensationFailed", "RunRetried",
    "RunCompleted", "RunFailed", "RunCompensated", "RunCancelled", "RunPaused", "RunUnpaused",
    "StepWaiting", "SignalReceived", "RunTimedOut", "RetentionApplied", "RunTakenOver"];
  var ENDINGS = ["RunCompleted", "RunFailed", "RunCompensated", "RunCancelled"];
  var FINISHED = ["completed", "failed", "compensated", "cancelled"];
  var PAGE = 50;  // runs per page of the list
  var LONG = 160;  // an output longer than this (or of several lines) starts collapsed

  // The session cookie is HttpOnly (this script never sees the token); a change carries
  // the session's CSRF token, which only a page of this service can read.
  var csrf = null;
  function session() {
    if (!csrf) csrf = fetch("/api/v1/session", {headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json(); })
      .then(function (s) { return s.csrf || ""; });
    return csrf;
  }

  function api(path, options) {
    options = options || {};
    var method = options.method || "GET";
    var headers = {"Accept": "application/json"};
    var ready = Promise.resolve();
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      ready = session().then(function (t) { headers["X-Saga-CSRF"] = t; });
    }
    return ready.then(function () {
      return fetch(path, {method: method, headers: headers, credentials: "same-origin",
                          body: options.body === undefined ? undefined : JSON.stringify(options.body)});
    }).then(function (r) {
        if (r.status === 401) { location.reload(); throw new Error("unauthorised"); }
        var kind = r.headers.get("content-type") || "";
        var body = kind.indexOf("json") >= 0 ? r.json() : r.text();
        return body.then(function (b) {
          if (!r.ok) {
            var error = new Error((b && b.detail) || r.statusText);
            error.status = r.status;
            throw error;
          }
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
      else if (attrs[k] !== null && attrs[k] !== undefined && attrs[k] !== false)
        node.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var child = arguments[i];
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function cls(status) { return "s-" + String(status || "pending").replace(/ /g, "-"); }

  function badge(status) {
    return el("span", {"class": "badge " + cls(status), text: status || "pending"});
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "-";
    if (ms < 1000) return Math.round(ms) + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    if (ms < 3600000) return Math.floor(ms / 60000) + "m " + Math.round(ms % 60000 / 1000) + "s";
    return Math.floor(ms / 3600000) + "h " + Math.round(ms % 3600000 / 60000) + "m";
  }

  function exact(iso) {
    // the exact moment, to the second, in UTC and here
    var d = new Date(iso);
    if (isNaN(d)) return String(iso);
    return d.toISOString().replace(/\.\d+Z$/, "Z").replace("T", " ") + " UTC (" +
      d.toLocaleString() + ")";
  }

  function ago(iso, now) {
    var ms = (now || Date.now()) - Date.parse(iso);
    if (isNaN(ms)) return String(iso);
    var future = ms < 0, s = Math.abs(ms) / 1000, text;
    if (s < 5) return "just now";
    if (s < 60) text = Math.round(s) + "s";
    else if (s < 3600) text = Math.round(s / 60) + " min";
    else if (s < 86400) text = Math.round(s / 3600) + " h";
    else text = Math.round(s / 86400) + " d";
    return future ? "in " + text : text + " ago";
  }

  function when(iso) {
    // a relative time; the exact one on hover
    if (!iso) return el("span", {"class": "muted", text: "-"});
    return el("time", {datetime: iso, title: exact(iso), text: ago(iso)});
  }

  function json(value) {
    return value === undefined ? "" : JSON.stringify(value, null, 2);
  }

  function collapsible(text, open) {
    // a long value starts folded, its first line showing
    if (!text) return el("span", {"class": "muted", text: ""});
    var flat = text.replace(/\s+/g, " ");
    if (flat.length <= LONG) return el("pre", {text: flat});
    return el("details", {"class": "fold", open: open ? "open" : null},
      el("summary", {text: flat.length > 90 ? flat.slice(0, 89) + "…" : flat}),
      el("pre", {text: text}));
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

  function refreshTimes() {
    // relative times age: redraw them each half minute
    setInterval(function () {
      Array.prototype.forEach.call(document.querySelectorAll("time[datetime]"), function (t) {
        t.textContent = ago(t.getAttribute("datetime"));
      });
    }, 30000);
  }

  // ---- a confirmation, with a comment or a reason ------------------------------------
  function ask(title, text, field, verb, danger) {
    // resolves with the comment (possibly "") on confirm, with null on cancel
    return new Promise(function (resolve) {
      var dialog = document.getElementById("ask") || document.body.appendChild(
        el("dialog", {id: "ask", "class": "ask"}));
      dialog.textContent = "";
      var box = el("textarea", {id: "ask-text", rows: 3, placeholder: field + " (optional)",
                                "aria-label": field});
      function done(value) { dialog.close(); resolve(value); }
      dialog.appendChild(el("form", {method: "dialog"},
        el("h2", {text: title}), el("p", {text: text}),
        el("label", {"for": "ask-text", text: field}), box,
        el("p", {"class": "ask-buttons"},
          el("button", {type: "button", "class": "plain", "data-answer": "no", text: "Back",
                        onclick: function () { done(null); }}),
          el("button", {type: "button", "class": danger ? "danger" : null,
                        "data-answer": "yes", text: verb,
                        onclick: function () { done(box.value.trim()); }}))));
      dialog.oncancel = function () { resolve(null); };
      dialog.showModal();
      box.focus();
    });
  }

  // ---- the list of runs ------------------------------------------------------------
  function listPage() {
    var form = document.getElementById("filters");
    function params() { return new URLSearchParams(location.search); }
    Array.prototype.forEach.call(form.elements, function (input) {
      if (input.name && params().get(input.name)) input.value = params().get(input.name);
    });
    function go(query) {
      history.replaceState(null, "", "?" + query.toString());
      load();
    }
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var query = new URLSearchParams();
      Array.prototype.forEach.call(form.elements, function (input) {
        if (input.name && input.value) query.set(input.name, input.value.trim());
      });
      if (params().get("limit")) query.set("limit", params().get("limit"));
      go(query);  // a new search starts at the first page
    });

    // ?limit= in the page's address sets the page size (50 by default)
    var size = Math.min(Math.max(parseInt(params().get("limit") || "", 10) || PAGE, 1), 500);

    function pager(offset, shown, more) {
      var nav = document.getElementById("pages");
      nav.textContent = "";
      function to(at) {
        return function () {
          var query = params();
          if (at > 0) query.set("offset", String(at)); else query.delete("offset");
          go(query);
        };
      }
      nav.appendChild(el("button", {"class": "plain", "data-page": "newer", text: "← Newer",
                                    disabled: offset <= 0 ? "disabled" : null,
                                    onclick: to(Math.max(offset - size, 0))}));
      nav.appendChild(el("span", {"class": "muted", "data-range": "",
        text: shown ? "runs " + (offset + 1) + "–" + (offset + shown) : "no runs"}));
      nav.appendChild(el("button", {"class": "plain", "data-page": "older", text: "Older →",
                                    disabled: more ? null : "disabled",
                                    onclick: to(offset + size)}));
    }

    function load() {
      var query = params();
      var offset = Math.max(parseInt(query.get("offset") || "0", 10) || 0, 0);
      query.set("limit", String(size + 1));  // one more than shown: is there a next page
      return api("/api/v1/runs?" + query.toString()).then(function (runs) {
        var more = runs.length > size;
        runs = runs.slice(0, size);
        var body = document.querySelector("#runs tbody");
        body.textContent = "";
        runs.forEach(function (run) {
          body.appendChild(el("tr", {"data-run": run.run_id, "data-status": run.status},
            el("td", {}, el("a", {href: "/runs/" + encodeURIComponent(run.run_id),
                                  text: run.run_id})),
            el("td", {text: run.name}),
            el("td", {}, badge(run.status)),
            el("td", {text: run.actor || ""}),
            el("td", {}, when(run.started_at)),
            el("td", {text: duration(run.duration_ms)})));
        });
        document.getElementById("empty").hidden = runs.length > 0;
        pager(offset, runs.length, more);
      }).catch(function (e) {
        document.getElementById("empty").hidden = false;
        document.getElementById("empty").textContent = e.message;
      });
    }

    var refresh = debounce(load, 250);
    refreshTimes();
    // the caller's tenant: its name in the header, and its log's position to follow from
    Promise.all([api("/api/v1/health"), showTenant()]).then(function (both) {
      document.getElementById("store").textContent = both[0].store;
      load();
      follow("/api/v1/events?after=" + (both[1].position || 0), refresh, null);
    });
  }

  // The tenant the viewer's token acts on, shown in the header (#tenant).
  function showTenant() {
    return api("/api/v1/whoami").then(function (who) {
      var shown = document.getElementById("tenant");
      if (shown) shown.textContent = "tenant " + who.tenant;
      return who;
    });
  }

  // ---- one run -----------------------------------------------------------------------
  function runPage() {
    var runId = decodeURIComponent(location.pathname.replace(/^\/runs\//, ""));
    showTenant();
    var base = "/api/v1/runs/" + encodeURIComponent(runId);
    document.title = "saga · " + runId;
    var view = {zoom: null};  // the graph's viewBox, kept across redraws once changed
    var failedOnly = false;
    var current = null;  // the last run and layout drawn

    function act(path, body) {
      return api(base + path, {method: "POST", body: body || {}})
        .then(load).catch(function (e) { showError(e.message); });
    }

    function showError(message) {
      var box = document.getElementById("notice");
      box.hidden = false;
      box.textContent = message;
    }

    // One status word per step, whatever shows it: the graph's (which knows waits and
    // what a rollback left), else the step's own.
    function statusOf(run, layout, key) {
      var node = layout.byId[key];
      if (node && node.status) return node.status;
      var s = run.steps[key] || {};
      if (s.compensation_error) return "not undone";
      if ((run.waiting_for || []).indexOf(key) >= 0) return "waiting";
      return s.status || "pending";
    }

    var CONTROLS = {
      retry: {label: "Retry…", verb: "Retry", text: "Run the failed steps again, keeping the completed ones.",
              field: "Reason", danger: false},
      compensate: {label: "Undo…", verb: "Undo", text: "Undo the completed steps, newest first.",
                   field: "Reason", danger: true},
      cancel: {label: "Cancel run…", verb: "Cancel run", text: "Stop the run and undo its completed steps.",
               field: "Reason", danger: true},
      pause: {label: "Pause…", verb: "Pause", text: "No new step starts; attempts in flight finish.",
              field: "Reason", danger: false},
      unpause: {label: "Resume", text: "Let the run go on.", field: null, danger: false}
    };

    function summary(run, layout, keys) {
      var box = document.getElementById("summary");
      box.textContent = "";
      var left = run.not_undone || [];
      var shown = keys.map(function (k) { return statusOf(run, layout, k); });
      var head = el("h1", {}, run.run_id + " ", badge(run.status));
      if (left.length && (run.status === "failed" || run.status === "cancelled" ||
                          run.status === "compensated" || run.status === "compensating"))
        head.appendChild(el("span", {"class": "badge " + cls("not undone"), "data-not-undone": left.join(","),
          title: "their effects are still in place: " + left.join(", "),
          text: left.length + (left.length === 1 ? " step" : " steps") + " not undone"}));
      box.appendChild(head);
      var done = shown.filter(function (s) { return ["pending", "running", "waiting"].indexOf(s) < 0; });
      box.appendChild(el("p", {"class": "progress", id: "progress",
        text: done.length + " of " + keys.length + " steps finished" +
              (run.failed_step ? " · failed at " + run.failed_step : "") +
              (left.length ? " · not undone: " + left.join(", ") : "")}));
      var facts = el("div", {"class": "facts"});
      [["definition", run.name], ["definition version", run.definition_version],
       ["actor", run.actor], ["version", run.version],
       ["queue", run.queue]].forEach(function (f) {
        if (f[1] !== null && f[1] !== undefined && f[1] !== "")
          facts.appendChild(el("div", {}, el("span", {text: f[0]}), String(f[1])));
      });
      var moved = run.migrations || [];  // saga migrate: the last move, when and why
      if (moved.length) {
        var m = moved[moved.length - 1];
        facts.appendChild(el("div", {"data-migrated": m.version}, el("span", {text: "migrated"}),
          when(m.at), " to version " + m.version + " by " + m.actor + (m.reason ? ": " + m.reason : "")));
      }
      facts.appendChild(el("div", {}, el("span", {text: "started"}), when(run.started_at)));
      if (run.finished_at) {
        facts.appendChild(el("div", {}, el("span", {text: "finished"}), when(run.finished_at)));
        facts.appendChild(el("div", {}, el("span", {text: "took"}),
          duration(Date.parse(run.finished_at) - Date.parse(run.started_at))));
      }
      box.appendChild(facts);
      if (run.error) box.appendChild(collapsible(json(run.error), false)).classList.add("bad");
      var buttons = el("p", {"class": "controls"});
      (run.actions || []).forEach(function (a) {
        var c = CONTROLS[a.action];
        if (!c) return;
        buttons.appendChild(el("button", {"class": c.danger ? "danger" : null,
          "data-action": a.action, text: c.label, onclick: function () {
            if (!c.field) { act("/" + a.action); return; }
            ask(c.verb + " run " + run.run_id + "?", c.text, c.field, c.verb, c.danger)
              .then(function (reason) {
                if (reason !== null) act("/" + a.action, reason ? {reason: reason} : {});
              });
          }}));
      });
      if (FINISHED.indexOf(run.status) < 0)
        buttons.appendChild(el("button", {"data-action": "migrate", text: "Migrate…",
          onclick: function () { migrate(run); }}));
      box.appendChild(buttons);
      (run.waiting_for_pools || []).forEach(function (w) {
        // a step waits for a worker of its pool (saga worker --pool NAME)
        box.appendChild(el("p", {"class": "pool-wait", "data-pool": w.pool || ""},
          "waiting: " + (w.pool ? "pool " + w.pool : "a worker of unpooled steps") + " ("
          + (w.compensation ? "the undo of step " : "step ") + w.step + ")"));
      });
      (run.waiting_for_resources || []).forEach(function (w) {
        // a step waits for a slot of a resource (saga.toml [resources.NAME])
        box.appendChild(el("p", {"class": "resource-wait", "data-step": w.step},
          "waiting: resource " + w.resources.join(", ") + " (step " + w.step + ", since ",
          el("time", {datetime: w.since, text: ago(w.since)}), ")"));
      });
      (run.waiting_for_children || []).forEach(function (w) {
        // a decision a child run waits for is made on the child's page
        var what = (w.waiting_for || []).map(function (x) {
          return x.approval !== undefined ? "approval of " + x.step : x.signal ? "signal " + x.signal
            : x.child ? "its child run" : "a timer";
        }).join(", ");
        box.appendChild(el("p", {"class": "child-wait", "data-child": w.run_id},
          "step " + w.step + " waits for child run ",
          el("a", {href: "/runs/" + encodeURIComponent(w.run_id), text: w.run_id}),
          what ? ", which waits for " + what : ""));
      });
      var approvals = document.getElementById("approvals");
      approvals.textContent = "";
      var asked = {};
      (run.actions || []).forEach(function (a) {
        if (a.step && (a.action === "approve" || a.action === "reject")) asked[a.step] = true;
      });
      Object.keys(asked).forEach(function (step) {
        var info = (run.steps[step] || {}).approval || {};
        function decide(verb, danger) {
          return function () {
            ask((verb === "approve" ? "Approve " : "Reject ") + step + "?",
                info.message || "This step waits for a person's decision.", "Comment",
                verb === "approve" ? "Approve" : "Reject", danger).then(function (comment) {
              if (comment !== null)
                act("/" + verb + "/" + encodeURIComponent(step), comment ? {comment: comment} : {});
            });
          };
        }
        approvals.appendChild(el("div", {"class": "approval", "data-approval": step},
          el("strong", {text: step}),
          el("span", {"class": "msg", text: info.message || "waiting for approval"}),
          el("button", {text: "Approve…", "data-action": "approve", onclick: decide("approve", false)}),
          el("button", {"class": "danger", text: "Reject…", "data-action": "reject",
                        onclick: decide("reject", true)})));
      });
    }

    // saga migrate: a dry run first, then (only when replay proves it safe) the move
    function migrate(run) {
      var body = null;
      ask("Migrate run " + run.run_id + "?", "The new definition: a template's name, or the " +
          "composition as JSON. A dry run checks it first; nothing changes unless every " +
          "recorded decision comes out the same.", "Definition", "Check", false)
        .then(function (text) {
          if (!text) return null;
          try {
            body = text.charAt(0) === "{" ? {composition: JSON.parse(text)} : {template: text};
          } catch (e) { throw new Error("not JSON: " + e.message); }
          return api(base + "/migrate", {method: "POST",
                                         body: Object.assign({dry_run: true}, body)});
        }).then(function (check) {
          if (!check) return null;
          if (!check.safe) throw new Error("Not safe to migrate: " + check.divergence.message);
          return ask("Migrate run " + run.run_id + "?", "Safe: every recorded decision comes " +
                     "out the same. Move it to " + check.to_hash.slice(0, 12) + "?", "Reason",
                     "Migrate", false);
        }).then(function (reason) {
          if (reason !== null && reason !== undefined && body)
            act("/migrate", Object.assign({reason: reason || null}, body));
        }).catch(function (e) { showError(e.message); });
    }

    // saga reset: what it undoes and re-runs is shown before it is confirmed
    function reset(key) {
      api(base + "/reset/" + encodeURIComponent(key)).then(function (plan) {
        return ask("Reset to " + key + "?", "Undoes, newest first: " +
                   (plan.undo.join(", ") || "nothing") + ". Then runs again: " +
                   plan.reopen.join(", ") + ".", "Reason", "Reset", true);
      }).then(function (reason) {
        if (reason !== null) act("/reset", {step: key, reason: reason || null});
      }).catch(function (e) { showError(e.message); });
    }

    function stepKeys(run, layout) {
      // every step of the plan, in the graph's order, and each execution the run recorded
      // (loop iterations, gates) after its step
      var keys = layout.nodes.map(function (n) { return n.id; });
      Object.keys(run.steps).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); });
      return keys;
    }

    function steps(run, layout, keys) {
      var body = document.querySelector("#steps tbody");
      body.textContent = "";
      var shown = 0;
      keys.forEach(function (key) {
        var s = run.steps[key] || {};
        var status = statusOf(run, layout, key);
        var bad = status === "failed" || status === "not undone";
        if (failedOnly && !bad) return;
        shown++;
        var detail = s.error ? json(s.error) : json(s.output);
        if (s.reason) detail = detail || s.reason;
        var cell = el("td", {}, collapsible(detail, false));
        if (s.heartbeat && s.status !== "completed")  // what a long call last reported
          cell.appendChild(el("div", {"class": "heartbeat"}, "heartbeat ",
            el("time", {datetime: s.heartbeat.at || "", text: ago(s.heartbeat.at)}), ": ",
            collapsible(json(s.heartbeat.details), false)));
        if (s.compensation_error)
          cell.appendChild(el("div", {"class": "bad"}, "undo failed: ",
                               collapsible(json(s.compensation_error), false)));
        if (s.status && key.indexOf("[") < 0 && run.status !== "compensating")
          cell.appendChild(el("button", {"class": "plain", "data-reset": key,
            text: "Reset to this step…", onclick: function () { reset(key); }}));
        body.appendChild(el("tr", {"data-step": key, "data-status": status},
          el("td", {text: key}), el("td", {}, badge(status)),
          el("td", {text: s.attempt || 0}), el("td", {text: duration(s.duration_ms)}), cell));
      });
      document.getElementById("steps-count").textContent = failedOnly
        ? shown + " of " + keys.length + " steps failed or not undone"
        : keys.length + " steps";
      var outputs = document.getElementById("outputs");
      outputs.textContent = "";
      outputs.appendChild(collapsible(json(run.outputs), false));
    }

    function graph(layout) {
      var W = 210, H = 70, GX = 80, GY = 34, NS = "http://www.w3.org/2000/svg";
      var undoes = (layout.links || []).some(function (l) { return l.kind === "undo"; });
      var levels = 0, rows = 0, at = {};
      layout.nodes.forEach(function (n) {
        levels = Math.max(levels, n.level + 1);
        rows = Math.max(rows, n.row + 1);
        at[n.id] = {x: 20 + n.level * (W + GX), y: 20 + n.row * (H + GY)};
      });
      var full = {x: 0, y: 0, w: 40 + levels * (W + GX) - GX,
                  h: 40 + rows * (H + GY) - GY + (undoes ? 34 : 0)};
      var svg = document.createElementNS(NS, "svg");
      svg.setAttribute("width", "100%");
      svg.setAttribute("preserveAspectRatio", "xMinYMin meet");
      function add(parent, tag, attrs, text) {
        var node = document.createElementNS(NS, tag);
        Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
        if (text !== undefined) node.textContent = text;
        parent.appendChild(node);
        return node;
      }
      var defs = add(svg, "defs", {});
      [["arrow", "#8a93a3"], ["undo", "#7b2cbf"]].forEach(function (m) {
        var marker = add(defs, "marker", {id: "m-" + m[0], viewBox: "0 0 10 10", refX: "10",
          refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto"});
        add(marker, "path", {d: "M0,0 L10,5 L0,10 z", fill: m[1]});
      });
      var world = add(svg, "g", {"class": "world"});
      (layout.links || layout.edges.map(function (e) {
        return {from: e[0], to: e[1], kind: "flow"};
      })).forEach(function (link) {
        var a = at[link.from], b = at[link.to];
        if (!a || !b) return;
        var g = add(world, "g", {"class": "link", "data-kind": link.kind,
                                 "data-from": link.from, "data-to": link.to});
        if (link.kind === "undo") {
          // below the boxes, from the later step back to the earlier one
          var y1 = a.y + H, y2 = b.y + H, dip = Math.max(y1, y2) + 26;
          add(g, "path", {d: "M" + (a.x + W / 2) + "," + y1 + " C" + (a.x + W / 2) + "," + dip +
                             " " + (b.x + W / 2) + "," + dip + " " + (b.x + W / 2) + "," + y2,
                          fill: "none", stroke: "#7b2cbf", "stroke-width": 1.5,
                          "stroke-dasharray": "5 4", "marker-end": "url(#m-undo)"});
          return;
        }
        var back = b.x <= a.x;  // a loop edge goes back: draw it above
        var d = back
          ? "M" + (a.x + W / 2) + "," + a.y + " C" + (a.x + W / 2) + "," + (a.y - 30) + " " +
            (b.x + W / 2) + "," + (b.y - 30) + " " + (b.x + W / 2) + "," + b.y
          : "M" + (a.x + W) + "," + (a.y + H / 2) + " L" + b.x + "," + (b.y + H / 2);
        add(g, "path", {d: d, fill: "none", stroke: "#8a93a3", "stroke-width": 1.5,
                        "stroke-dasharray": link.kind === "loop" ? "2 3" : "none",
                        "marker-end": "url(#m-arrow)"});
        var own = (layout.byId[link.to] || {}).when;
        if (own && link.label === own) {
          // the target's own condition, written in its box: the edge only says "if"
          g.setAttribute("data-condition", own);
          add(g, "text", {x: (a.x + W + b.x) / 2, y: (a.y + b.y + H) / 2 - 6,
                          "text-anchor": "middle", "class": "edge-label"}, "if");
          add(g, "title", {}, own);
        } else if (link.label) {
          var mx = back ? (a.x + b.x + W) / 2 : (a.x + W + b.x) / 2;
          var my = back ? Math.min(a.y, b.y) - 26 : (a.y + b.y + H) / 2 - 6;
          var fits = back ? 40 : Math.floor((b.x - a.x - W) / 6.5);
          var text = link.label.length > fits ? link.label.slice(0, fits - 1) + "…" : link.label;
          var label = add(g, "text", {x: mx, y: my, "text-anchor": "middle",
                                      "class": "edge-label"}, text);
          add(label, "title", {}, link.label);
        }
      });
      layout.nodes.forEach(function (n) {
        var p = at[n.id], status = n.status || "pending";
        var g = add(world, "g", {"class": "node " + cls(status), "data-step": n.id,
                                 "data-status": status});
        var cond = n.when || n.condition;
        add(g, "title", {}, n.label + (cond ? "\n" + cond : "") +
                            (n.undo ? "\nundo: " + n.undo : "") + "\n" + status);
        add(g, "rect", {x: p.x, y: p.y, width: W, height: H, rx: 7, fill: n.colour,
                        stroke: status === "not undone" ? "#b3261e" : "#5b6473",
                        "stroke-width": status === "not undone" ? 2.5 : 1});
        add(g, "text", {x: p.x + 8, y: p.y + 17},
            n.label.length > 30 ? n.label.slice(0, 29) + "…" : n.label);
        add(g, "text", {x: p.x + 8, y: p.y + 33, "class": "node-status"}, status);
        function cut(t) { return t.length > 33 ? t.slice(0, 32) + "…" : t; }
        if (cond) add(g, "text", {x: p.x + 8, y: p.y + 48, "class": "node-cond"}, cut(cond));
        if (n.undo) add(g, "text", {x: p.x + 8, y: p.y + (cond ? 63 : 48), "class": "node-undo"},
                        cut("↩ undo: " + n.undo));
      });
      var box = document.getElementById("graph");
      box.textContent = "";
      box.appendChild(svg);
      function show(v) {
        // fit to width, but never blow a small graph up past its natural size; zoomed in,
        // the view is as tall as the graph at that scale (within 240 to 520 px)
        var room = box.clientWidth || full.w;
        var fitted = Math.min(full.w, room);
        var wide = v.w >= full.w ? fitted : room;
        var high = full.h * fitted / full.w;
        if (v.w < full.w) {
          high = Math.min(Math.max(full.h * room / v.w, high, 240), 520);
          v.h = v.w * high / wide;
          // keep the graph in view: pan no further than its edges
          v.x = Math.min(Math.max(v.x, 0), Math.max(full.w - v.w, 0));
          v.y = v.h >= full.h ? 0 : Math.min(Math.max(v.y, 0), full.h - v.h);
        }
        svg.setAttribute("viewBox", [v.x, v.y, v.w, v.h].join(" "));
        svg.style.maxWidth = wide + "px";
        svg.setAttribute("height", Math.round(high));
        box.setAttribute("data-zoom", (full.w / v.w).toFixed(2));
      }
      function zoom(factor, cx, cy) {
        var v = view.zoom || Object.assign({}, full);
        cx = cx === undefined ? v.x + v.w / 2 : cx;
        cy = cy === undefined ? v.y + v.h / 2 : cy;
        var w = Math.min(Math.max(v.w / factor, 150), full.w * 2);
        var h = v.h * w / v.w;
        view.zoom = {x: cx - (cx - v.x) * w / v.w, y: cy - (cy - v.y) * h / v.h, w: w, h: h};
        show(view.zoom);
      }
      box.onwheel = function (e) {
        if (!e.ctrlKey && !e.metaKey) return;  // a plain wheel scrolls the page
        e.preventDefault();
        var r = svg.getBoundingClientRect(), v = view.zoom || full;
        zoom(e.deltaY < 0 ? 1.2 : 1 / 1.2, v.x + (e.clientX - r.left) / r.width * v.w,
             v.y + (e.clientY - r.top) / r.height * v.h);
      };
      var drag = null;
      svg.onmousedown = function (e) { drag = {x: e.clientX, y: e.clientY, v: view.zoom || full}; };
      window.onmouseup = function () { drag = null; };
      svg.onmousemove = function (e) {
        if (!drag) return;
        var r = svg.getBoundingClientRect(), v = drag.v;
        view.zoom = {x: v.x - (e.clientX - drag.x) / r.width * v.w,
                     y: v.y - (e.clientY - drag.y) / r.height * v.h, w: v.w, h: v.h};
        show(view.zoom);
      };
      document.getElementById("zoom-in").onclick = function () { zoom(1.25); };
      document.getElementById("zoom-out").onclick = function () { zoom(1 / 1.25); };
      document.getElementById("zoom-fit").onclick = function () { view.zoom = null; show(full); };
      show(view.zoom || full);
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
      var card = document.getElementById("timeline-card");
      if (!card.hasAttribute("data-seen")) {  // a long run's starts folded, once
        card.setAttribute("data-seen", "");
        card.open = order.length <= 20;
      }
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
      document.getElementById("history-count").textContent = events.length + " events";
      var t0 = events.length ? Date.parse(events[0].timestamp) : 0;
      events.forEach(function (e) {
        var p = Object.assign({}, e.payload || {});
        delete p.definition;
        var offset = Date.parse(e.timestamp) - t0;
        body.appendChild(el("tr", {"data-version": e.version},
          el("td", {text: e.version}),
          el("td", {}, el("time", {datetime: e.timestamp, title: exact(e.timestamp),
                                   text: "+" + duration(offset)})),
          el("td", {text: e.type}), el("td", {}, collapsible(JSON.stringify(p), false))));
      });
    }

    function audit(result) {
      var box = document.getElementById("audit");
      box.textContent = "";
      box.appendChild(el("p", {"class": result.ok ? "ok" : "bad", "data-ok": String(result.ok),
        text: result.ok ? "verified: the hash chain is intact and replay reproduces every decision"
                        : "NOT verified"}));
      box.appendChild(collapsible(json(result), false));
    }

    function notificationsTable(list) {
      // the webhooks derived from this run's events, and how their delivery went
      var body = document.querySelector("#notifications tbody");
      body.textContent = "";
      document.getElementById("notifications-count").textContent = list.length
        ? list.length + " · " + list.filter(function (n) { return n.status === "delivered"; }).length
          + " delivered" : "none";
      if (list.some(function (n) { return n.status !== "delivered"; }))
        document.getElementById("notifications-card").open = true;  // one needs a look
      list.forEach(function (n) {
        var tries = n.attempts_log || [], last = tries[tries.length - 1];
        var said = !last ? "not tried yet" : last.outcome + (last.error ? ": " + last.error
          : last.status_code ? " (HTTP " + last.status_code + ")" : "");
        body.appendChild(el("tr", {"data-notification": n.id, "data-status": n.status},
          el("td", {text: n.type, title: "event " + n.event_id}), el("td", {text: n.target}),
          el("td", {}, el("span", {"class": "badge " + cls(n.status === "delivered" ? "completed"
            : n.status === "failed" ? "failed" : "waiting"), text: n.status})),
          el("td", {text: n.attempts}),
          el("td", {}, last ? el("time", {datetime: last.started_at, title: exact(last.started_at),
                                          text: ago(last.started_at)}) : "", " " + said)));
      });
      return list;
    }
    function notifications() {
      return api(base + "/notifications").then(notificationsTable).catch(function () { return []; });
    }

    function draw() {
      var run = current.run, layout = current.layout;
      var keys = stepKeys(run, layout);
      summary(run, layout, keys);
      steps(run, layout, keys);
    }

    document.getElementById("failed-only").addEventListener("change", function (e) {
      failedOnly = e.target.checked;
      if (current) draw();
    });

    var last = 0;
    function load() {
      return Promise.all([api(base), api(base + "/graph?format=json"), api(base + "/events"),
                          api(base + "/verify")]).then(function (r) {
        var layout = r[1];
        layout.byId = {};
        layout.nodes.forEach(function (n) { layout.byId[n.id] = n; });
        current = {run: r[0], layout: layout};
        draw(); graph(layout); timeline(r[2]); historyTable(r[2]); audit(r[3]); notifications();
        document.getElementById("notice").hidden = true;
        if (r[2].length) last = r[2][r[2].length - 1].version;
        return r[0];
      }).catch(function (e) {
        showError(e.message);
      });
    }
    var refresh = debounce(load, 150);
    refreshTimes();
    setInterval(function () {
      // a long call's heartbeats are not events: while a step runs, its row is re-read
      var steps = current ? current.run.steps || {} : {};
      if (!Object.keys(steps).some(function (k) { return steps[k].status === "running"; }))
        return;
      api(base).then(function (r) { current.run = r; draw(); }).catch(function () {});
    }, 5000);
    var looks = 0;
    setInterval(function () {
      // notifications are sent after the events that make them: re-read while any is
      // pending, and for a while after the run ends (a worker derives them then)
      var waiting = document.querySelectorAll('#notifications tr[data-status="pending"]');
      var ended = current && FINISHED.indexOf(current.run.status) >= 0;
      if (waiting.length || (ended && looks++ < 24)) notifications();
    }, 5000);
    load().then(function (run) {
      if (run && FINISHED.indexOf(run.status) < 0)
        follow(base + "/events?after=" + last, refresh, refresh);
    });
  }

  return {listPage: listPage, runPage: runPage, api: api, ago: ago};
})();
