/* heapwatch's memory page and report: draws the document of
   heapwatch/formats/view.py.  Every name from the data goes into the DOM
   through textContent or an attribute, never as markup. */
(function () {
  "use strict";

  var REFRESH_MS = 5000;
  var ROW_PX = 20;
  var MIN_SHARE = 0.002; // narrower nodes are not drawn (a fifth of a percent)
  var MAX_NODES = 4000;

  var body = document.body;
  var source = body.getAttribute("data-source");
  var flame = document.getElementById("flame");
  var search = document.getElementById("search");
  var baselineSelect = document.getElementById("baseline");
  var state = { data: null, root: null, zoom: null, kept: [], plot: null, timer: null, chosen: false };

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function size(n) {
    if (n === null || n === undefined) return "\u2014";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var value = Math.abs(n);
    var unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return (n < 0 ? "-" : "") + (unit ? value.toFixed(1) : String(value)) + " " + units[unit];
  }

  function signed(n) {
    if (n === null || n === undefined) return "\u2014";
    return (n > 0 ? "+" : "") + size(n);
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "\u2014";
    if (seconds < 120) return "\u2265 " + Math.round(seconds) + " s";
    if (seconds < 7200) return "\u2265 " + Math.round(seconds / 60) + " min";
    return "\u2265 " + (seconds / 3600).toFixed(1) + " h";
  }

  function site(file, line) { return file + ":" + line; }
  function label(frame) { return (frame[2] ? frame[2] + " " : "") + site(frame[0], frame[1]); }
  function keyOf(frame) { return frame[0] + "\u0000" + frame[1] + "\u0000" + frame[2]; }

  // ---- the tree of stacks ---------------------------------------------------

  function node(frame, parent) {
    return { frame: frame, size: 0, base: 0, children: new Map(), parent: parent };
  }

  function addStacks(root, frames, stacks, field) {
    stacks.forEach(function (stack) {
      var here = root;
      here[field] += stack[1];
      for (var i = 0; i < stack[0].length; i += 1) {
        var frame = frames[stack[0][i]];
        var key = keyOf(frame);
        var child = here.children.get(key);
        if (!child) {
          if (field === "base") break; // only in the baseline: nothing to draw
          child = node(frame, here);
          here.children.set(key, child);
        }
        child[field] += stack[1];
        here = child;
      }
    });
  }

  function buildTree(data, baseline) {
    var root = node(null, null);
    addStacks(root, data.frames, data.stacks, "size");
    if (baseline) addStacks(root, baseline.frames, baseline.stacks, "base");
    root.hasBase = !!baseline;
    return root;
  }

  function ordered(parent) {
    return Array.from(parent.children.values()).sort(function (a, b) { return b.size - a.size; });
  }

  function pathOf(target) {
    var path = [];
    for (var n = target; n && n.frame; n = n.parent) path.unshift(keyOf(n.frame));
    return path;
  }

  function follow(root, path) {
    var here = root;
    for (var i = 0; i < path.length; i += 1) {
      var next = here.children.get(path[i]);
      if (!next) break;
      here = next;
    }
    return here;
  }

  // ---- drawing ---------------------------------------------------------------

  function hue(text) {
    var h = 0;
    for (var i = 0; i < text.length; i += 1) h = (h * 31 + text.charCodeAt(i)) >>> 0;
    return h;
  }

  function colour(n, growthMax) {
    if (state.root.hasBase) {
      var delta = n.size - n.base;
      if (delta > 0 && growthMax > 0) {
        var strength = 0.25 + 0.75 * (delta / growthMax);
        return "rgba(214, 39, 40, " + strength.toFixed(3) + ")";
      }
      if (delta < 0) return "rgba(31, 119, 180, 0.45)";
      return "rgb(200, 200, 200)";
    }
    var h = hue(n.frame[0]);
    return "hsl(" + (10 + (h % 45)) + ", " + (70 + (h % 20)) + "%, " + (58 + (h % 12)) + "%)";
  }

  function matches(n, query) {
    return query !== "" && label(n.frame).toLowerCase().indexOf(query) !== -1;
  }

  function draw() {
    var root = state.root;
    if (!root) return;
    var zoom = follow(root, state.zoom || []);
    var query = search.value.trim().toLowerCase();
    var total = zoom.size || 1;
    var growthMax = 0;
    var drawn = 0;
    var matched = 0;
    var depth = 0;
    flame.replaceChildren();
    var walk = [];
    ordered(zoom).forEach(function (c) { walk.push(c); });
    (function measure(n) {
      if (n.size - n.base > growthMax) growthMax = n.size - n.base;
      n.children.forEach(measure);
    })(zoom);
    function place(n, left, level) {
      var share = n.size / total;
      if (share < MIN_SHARE || drawn >= MAX_NODES) return;
      drawn += 1;
      if (level + 1 > depth) depth = level + 1;
      var box = el("div", "frame", label(n.frame));
      box.setAttribute("role", "treeitem");
      box.setAttribute("tabindex", "0");
      box.setAttribute("aria-level", String(level + 1));
      box.setAttribute("data-site", site(n.frame[0], n.frame[1]));
      var note = label(n.frame) + "\n" + size(n.size) + " (" + (100 * n.size / (root.size || 1)).toFixed(1) + "% of all)";
      if (root.hasBase) note += "\nchange: " + signed(n.size - n.base);
      box.title = note;
      box.style.left = (100 * left).toFixed(4) + "%";
      box.style.width = (100 * share).toFixed(4) + "%";
      box.style.top = level * ROW_PX + "px";
      box.style.background = colour(n, growthMax);
      if (root.hasBase && n.size - n.base > 0) box.classList.add("grew");
      if (matches(n, query)) { box.classList.add("match"); matched += n.size; }
      box.addEventListener("click", function () { zoomTo(n); });
      box.addEventListener("keydown", function (event) { if (event.key === "Enter") zoomTo(n); });
      flame.appendChild(box);
      var x = left;
      ordered(n).forEach(function (c) { place(c, x, level + 1); x += c.size / total; });
    }
    if (zoom.frame) {
      place(zoom, 0, 0); // the frame zoomed on spans the width, its callees below
    } else {
      var x = 0;
      walk.forEach(function (c) { place(c, x, 0); x += c.size / total; });
    }
    flame.style.height = Math.max(depth, 1) * ROW_PX + "px";
    drawCrumbs(zoom);
    document.getElementById("matched").textContent = query
      ? "matches: " + size(matched) + " (" + (100 * matched / total).toFixed(1) + "% of the view)"
      : "";
    document.getElementById("legend").textContent = root.hasBase
      ? "Red: grew since the baseline (the deeper the red, the more); blue: shrank; grey: unchanged."
      : "Width: live bytes. Click a frame to zoom; search to highlight.";
  }

  function drawCrumbs(zoom) {
    var crumbs = document.getElementById("crumbs");
    crumbs.replaceChildren();
    var trail = [];
    for (var n = zoom; n; n = n.parent) trail.unshift(n);
    trail.forEach(function (n, index) {
      var text = n.frame ? label(n.frame) : "all (" + size(n.size) + ")";
      var button = el("button", "crumb", text);
      button.type = "button";
      button.addEventListener("click", function () { zoomTo(n); });
      if (index) crumbs.appendChild(el("span", "sep", " \u203a "));
      crumbs.appendChild(button);
    });
  }

  function zoomTo(n) {
    state.zoom = pathOf(n);
    draw();
  }

  function biggestAt(where) {
    var best = null;
    (function visit(n) {
      if (n.frame && site(n.frame[0], n.frame[1]) === where && (!best || n.size > best.size)) best = n;
      n.children.forEach(visit);
    })(state.root);
    return best;
  }

  function showSite(where) {
    search.value = where;
    var found = biggestAt(where);
    state.zoom = found && found.parent ? pathOf(found.parent) : [];
    draw();
    flame.scrollIntoView({ block: "nearest" });
  }

  // ---- tables, timeline ------------------------------------------------------

  function cell(row, text, cls) {
    var td = el("td", cls, text);
    row.appendChild(td);
    return td;
  }

  function siteLink(file, line) {
    var where = site(file, line);
    var link = el("a", "site", where);
    link.href = "#flame";
    link.addEventListener("click", function (event) { event.preventDefault(); showSite(where); });
    return link;
  }

  function names(data) {
    var byKey = new Map();
    data.frames.forEach(function (f) { if (f[2]) byKey.set(site(f[0], f[1]), f[2]); });
    return byKey;
  }

  function drawSites(data) {
    var tbody = document.querySelector("#sites tbody");
    var known = names(data);
    tbody.replaceChildren();
    data.sites.forEach(function (s) {
      var row = el("tr");
      cell(row, "").appendChild(siteLink(s.file, s.line));
      cell(row, known.get(site(s.file, s.line)) || "");
      cell(row, size(s.size), "num");
      cell(row, signed(s.growth), "num");
      cell(row, s.peak_share === null ? "\u2014" : (100 * s.peak_share).toFixed(1) + "%", "num");
      cell(row, s.leak_score === null ? "\u2014" : s.leak_score.toFixed(2), "num");
      cell(row, duration(s.age), "num");
      tbody.appendChild(row);
    });
    var suspects = document.querySelector("#suspects tbody");
    suspects.replaceChildren();
    if (!data.suspects.length) {
      var none = el("tr");
      var scored = data.kind === "live" || data.sites.some(function (s) { return s.leak_score !== null; });
      var td = cell(none, scored ? "no site scores as a leak" : "no leak scores: they need two dumps of one process by its agent (see the notes)");
      td.colSpan = 4;
      suspects.appendChild(none);
    }
    data.suspects.forEach(function (s) {
      var row = el("tr");
      cell(row, "").appendChild(siteLink(s.file, s.line));
      cell(row, s.score.toFixed(2), "num");
      cell(row, size(s.rate) + "/s", "num");
      cell(row, size(s.size), "num");
      suspects.appendChild(row);
    });
  }

  function drawTimeline(data) {
    var box = document.getElementById("timeline");
    var rows = data.timeline;
    if (!rows.length || typeof uPlot === "undefined") {
      box.textContent = rows.length ? "" : "no cycle yet";
      return;
    }
    var columns = [[], [], [], [], []];
    rows.forEach(function (r) { for (var i = 0; i < 5; i += 1) columns[i].push(r[i]); });
    var hasLimit = columns[4].some(function (v) { return v !== null; });
    var series = [
      {},
      { label: "traced", stroke: "#d62728", value: function (u, v) { return size(v); } },
      { label: "resident", stroke: "#1f77b4", value: function (u, v) { return size(v); } },
      { label: "untraced", stroke: "#7f7f7f", value: function (u, v) { return size(v); } }
    ];
    var values = columns.slice(0, 4);
    if (hasLimit) {
      series.push({ label: "container limit", stroke: "#000", dash: [6, 4], value: function (u, v) { return size(v); } });
      values.push(columns[4]);
    }
    var width = Math.max(320, box.clientWidth || 800);
    var options = {
      width: width,
      height: 220,
      series: series,
      axes: [{}, { values: function (u, ticks) { return ticks.map(size); }, size: 80 }]
    };
    if (state.plot && state.plot.series.length === series.length) {
      state.plot.setData(values);
      return;
    }
    if (state.plot) state.plot.destroy();
    box.replaceChildren();
    state.plot = new uPlot(options, values, box);
  }

  function drawSummary(data) {
    var parts = ["traced " + size(data.total.size) + " in " + data.total.count + " blocks"];
    if (data.peak !== null && data.peak !== undefined) parts.push("peak " + size(data.peak));
    parts.push(data.stacks.length + " stacks", data.mode + " mode");
    if (data.meta.pid) parts.push("pid " + data.meta.pid);
    if (data.meta.file) parts.push(data.meta.file);
    document.getElementById("summary").textContent = parts.join(" \u00b7 ");
    var notes = document.getElementById("notes");
    notes.replaceChildren();
    data.notes.forEach(function (n) { notes.appendChild(el("li", "", n)); });
  }

  // ---- baselines ---------------------------------------------------------------

  // The agent's readings (data.baselines, newest first), the reading the page
  // opened on, and with two dumps the older one.
  function ago(data, at) {
    var seconds = Math.max(0, (data.meta.timestamp || at) - at);
    var when = new Date(at * 1000).toLocaleTimeString();
    return (seconds < 90 ? Math.round(seconds) + " s" : Math.round(seconds / 60) + " min") + " ago (" + when + ")";
  }

  function baselineOptions(data) {
    var chosen = baselineSelect.value;
    var choices = [["", "nothing"]];
    if (data.base) choices.push(["data", data.base.label]);
    (data.baselines || []).forEach(function (b) { choices.push(["a" + b.at, ago(data, b.at)]); });
    if (state.kept.length) choices.push(["first", "page opened (" + new Date(state.kept[0].at).toLocaleTimeString() + ")"]);
    baselineSelect.replaceChildren();
    choices.forEach(function (c) {
      var option = el("option", "", c[1]);
      option.value = c[0];
      baselineSelect.appendChild(option);
    });
    // Until one chooses: two dumps open on their difference, the live page
    // on the agent's newest reading offered (5 minutes old once it has one).
    if (!state.chosen && data.base) chosen = "data";
    else if (!state.chosen && data.baselines && data.baselines.length) chosen = "a" + data.baselines[0].at;
    else if (chosen.charAt(0) === "a" && !choices.some(function (c) { return c[0] === chosen; })) {
      // The reading chosen is no longer offered: the nearest one that is.
      var at = Number(chosen.slice(1)), best = null;
      (data.baselines || []).forEach(function (b) {
        if (best === null || Math.abs(b.at - at) < Math.abs(best - at)) best = b.at;
      });
      if (best !== null) chosen = "a" + best;
    }
    if (choices.some(function (c) { return c[0] === chosen; })) baselineSelect.value = chosen;
  }

  function baseline() {
    var chosen = baselineSelect.value, data = state.data;
    if (chosen === "data") return data.base ? { frames: data.frames, stacks: data.base.stacks } : null;
    if (chosen === "first") return state.kept[0] || null;
    if (chosen.charAt(0) === "a") {
      var at = Number(chosen.slice(1));
      var found = (data.baselines || []).filter(function (b) { return b.at === at; })[0];
      return found ? { frames: data.frames, stacks: found.stacks } : null;
    }
    return null;
  }

  function keep(data) {
    if (!state.kept.length) state.kept.push({ at: Date.now(), frames: data.frames, stacks: data.stacks });
  }

  function show(data) {
    state.data = data;
    if (source) keep(data);
    baselineOptions(data);
    state.root = buildTree(data, baseline());
    drawSummary(data);
    draw();
    drawSites(data);
    drawTimeline(data);
    body.setAttribute("data-ready", String(Number(body.getAttribute("data-ready") || 0) + 1));
  }

  function status(text) { document.getElementById("status").textContent = text; }

  function refresh() {
    fetch(source, { credentials: "same-origin", headers: { Accept: "application/json" }, redirect: "manual" })
      .then(function (response) {
        if (response.status === 429) return null; // another dump is being built: the next turn
        if (response.type === "opaqueredirect" || response.status === 401) {
          status("The session has ended: reload the page to log in again.");
          return null;
        }
        if (!response.ok) { status("heapwatch answered " + response.status); return null; }
        return response.json();
      })
      .then(function (data) {
        if (!data) return;
        status("updated " + new Date().toLocaleTimeString());
        show(data);
      })
      .catch(function () { status("the service does not answer; retrying"); });
  }

  search.addEventListener("input", draw);
  document.getElementById("reset").addEventListener("click", function () { state.zoom = []; draw(); });
  baselineSelect.addEventListener("change", function () {
    state.chosen = true;
    if (!state.data) return;
    state.root = buildTree(state.data, baseline());
    draw();
  });

  if (source) {
    refresh();
    state.timer = setInterval(refresh, Number(body.getAttribute("data-refresh-ms")) || REFRESH_MS);
  } else {
    show(JSON.parse(document.getElementById("heapwatch-data").textContent));
  }
})();
