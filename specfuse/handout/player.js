// SpecFuse handout player: steps through one run's rounds. Every string from the run is inserted as
// text (textContent, createTextNode), never parsed as HTML; the page loads nothing.
"use strict";
(function () {
  var data = JSON.parse(document.getElementById("specfuse-data").textContent);
  var rounds = data.rounds;
  var n = rounds.length;
  var k = 1;
  var timer = null;
  var $ = function (id) { return document.getElementById(id); };
  var svg = $("weights");
  var SVG_NS = svg.namespaceURI; // the inline <svg>'s own namespace: no address written out here
  var colors = data.colors;
  // The page's language: the one it was exported in, then its switch; texts from the one catalogue
  // (specfuse/handout/i18n.py), English text → translation, {name} fields filled after the lookup.
  var lang = data.lang;
  function T(text, fields) {
    var table = Object.prototype.hasOwnProperty.call(data.texts, lang) ? data.texts[lang] : {};
    var out = Object.prototype.hasOwnProperty.call(table, text) ? table[text] : text;
    return out.replace(/\{(\w+)\}/g, function (m, f) {
      return fields && Object.prototype.hasOwnProperty.call(fields, f) ? String(fields[f]) : m;
    });
  }

  function color(member) {
    return Object.prototype.hasOwnProperty.call(colors, member) ? colors[member] : data.other;
  }
  // Bidi controls in trace text (a right-to-left override makes "gnp.exe" read "exe.png") are shown
  // as what they are, and every trace string stands in its own isolate (<bdi>, dir=auto).
  var BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  function shown(text) {
    return String(text).replace(BIDI, function (c) {
      return "[U+" + c.charCodeAt(0).toString(16).toUpperCase() + "]";
    });
  }
  var NAME_CHARS = 60; // a member's name past this is cut (…); its whole name is its title
  function name(member) {
    var s = shown(member);
    return s.length > NAME_CHARS ? s.slice(0, NAME_CHARS - 1) + "…" : s;
  }
  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = shown(text);
    if (cls) node.className = cls;
    return node;
  }
  function iso(member) { // a member's name, isolated, cut, whole on hover
    var node = document.createElement("bdi");
    node.textContent = name(member);
    node.title = shown(member);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmt(x, digits) { return x === null || x === undefined ? "—" : x.toFixed(digits); }
  function swatch(member) {
    var s = el("span", null, "swatch");
    s.style.background = color(member);
    return s;
  }
  function memberCell(tag, member) {
    var cell = el(tag);
    cell.appendChild(swatch(member));
    cell.appendChild(iso(member));
    return cell;
  }
  function row(cells) {
    var tr = el("tr");
    cells.forEach(function (c) { tr.appendChild(c); });
    return tr;
  }
  function hexRgb(hex) {
    var v = parseInt(hex.slice(1), 16);
    return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  }
  function tint(hex, alpha) {
    var c = hexRgb(hex);
    return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + alpha + ")";
  }
  function scaleColor(t) { // the matrix's colour scale at t in 0..1: [r, g, b]
    var stops = data.scale;
    t = Math.min(1, Math.max(0, isFinite(t) ? t : 0));
    for (var i = 1; i < stops.length; i++) {
      if (t <= stops[i][0]) {
        var a = hexRgb(stops[i - 1][1]), b = hexRgb(stops[i][1]);
        var f = (t - stops[i - 1][0]) / (stops[i][0] - stops[i - 1][0]);
        return [0, 1, 2].map(function (j) { return Math.round(a[j] + f * (b[j] - a[j])); });
      }
    }
    return hexRgb(stops[stops.length - 1][1]);
  }

  // A trace whose last round set no stop reason was not finished: paused in step mode, or stopped.
  function ended() {
    return data.stop === null ? T("paused at round {k}", { k: n }) : T("stopped: {reason}", { reason: T(data.stop) });
  }

  function renderStatic() {
    $("prompt").textContent = shown(data.prompt);
    var legend = $("legend");
    data.members.forEach(function (m) {
      var item = el("span");
      item.appendChild(swatch(m));
      item.appendChild(iso(m));
      legend.appendChild(item);
    });
    var pace = $("pace");
    for (var s = 1; s <= 10; s++) {
      var option = el("option");
      option.value = String(s);
      pace.appendChild(option);
    }
    pace.value = "3";
  }

  // Every text of the page in the language chosen (the switch calls it again, then shows the round).
  function renderTexts() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : lang;
    var title = data.title.indexOf("SpecFuse run") === 0
      ? T("SpecFuse run") + data.title.slice("SpecFuse run".length) : data.title;
    $("title").textContent = shown(title);
    document.title = shown(title);
    var exits = rounds.reduce(function (s, r) { return s + r.exits.length; }, 0);
    $("summary").textContent = T("{m} members · {n} rounds · {e} exits · {ended}",
      { m: data.members.length, n: n, e: exits, ended: ended() });
    [].forEach.call(document.querySelectorAll("[data-t]"), function (node) {
      node.textContent = T(node.getAttribute("data-t"));
    });
    [].forEach.call(document.querySelectorAll("[data-t-title]"), function (node) {
      node.title = T(node.getAttribute("data-t-title"));
    });
    [].forEach.call(document.querySelectorAll("[data-t-label]"), function (node) {
      node.setAttribute("aria-label", T(node.getAttribute("data-t-label")));
    });
    [].forEach.call($("pace").options, function (option) {
      option.textContent = T("{s} s a round", { s: option.value });
    });
    var other = Object.keys(data.languages).filter(function (code) { return code !== lang; })[0];
    $("lang").textContent = data.languages[other];
    $("lang").setAttribute("data-lang", other);
    renderKeymap();
  }

  function renderAnswer() {
    var answer = $("answer");
    clear(answer);
    var current = null;
    for (var i = 0; i < k; i++) {
      var r = rounds[i], winner = r.candidates[r.chosen];
      var seg = el("span", winner.text, "seg" + (i === k - 1 ? " current" : ""));
      seg.style.background = tint(color(winner.member), 0.28);
      seg.style.borderBottomColor = color(winner.member);
      seg.title = T("round {k}: {member}", { k: r.k, member: shown(winner.member) });
      seg.setAttribute("data-round", String(r.k));
      answer.appendChild(seg);
      current = seg;
    }
    if (current) { // keep round k's segment in view inside the answer box, never scroll the page
      var top = current.offsetTop, bottom = top + current.offsetHeight;
      if (bottom > answer.scrollTop + answer.clientHeight) answer.scrollTop = bottom - answer.clientHeight + 8;
      if (top < answer.scrollTop) answer.scrollTop = Math.max(0, top - 8);
    }
    var r = rounds[k - 1], w = r.candidates[r.chosen];
    var fields = { k: r.k, member: name(w.member), n: r.candidates.length, margin: fmt(r.margin, 3) };
    var note = r.candidates.length === 1 ? T("Round {k}: {member}'s segment was chosen from {n} candidate", fields)
      : T("Round {k}: {member}'s segment was chosen from {n} candidates", fields);
    if (r.verified && r.candidates.length > 1) note += T(", by a margin of {margin}", fields);
    if (k === n) {
      note += data.stop === null ? T(". The run was paused here")
        : T(". The run stopped here: {reason}", { reason: T(data.stop) });
    }
    $("round-note").textContent = note + T(".");
    $("answer-note").textContent = T("(rounds 1–{k}, round {k} framed)", { k: k });
  }

  function renderCandidates(r) {
    var table = $("candidates");
    clear(table);
    var room = r.room; // a class session's votes on this round (counts only), when the page has them
    var heads = [el("th", T("member")), el("th", T("candidate")), el("th", T("tokens"), "num"),
      el("th", T("score"), "num")];
    if (room) heads.push(el("th", T("the class"), "num"));
    table.appendChild(row(heads.concat([el("th", "")])));
    r.candidates.forEach(function (c, j) {
      var text = el("td", c.text === "" ? T("(empty)") : c.text, c.text === "" ? "text empty" : "text");
      var verdict = j === r.chosen ? T("✓ won") : (c.eligible ? "" : T("not eligible"));
      var cells = [memberCell("td", c.member), text, el("td", c.tokens, "num"),
        el("td", r.verified ? fmt(c.score, 3) : "—", "num")];
      // null: the same text as an earlier candidate, whose votes it shares (ditto)
      if (room) cells.push(el("td", room.votes[j] === null ? "″" : room.votes[j], "num"));
      var tr = row(cells.concat([el("td", verdict)]));
      if (j === r.chosen) tr.className = "won";
      table.appendChild(tr);
    });
    $("room-note").textContent = !room ? ""
      : T("The class: {right} of {made} votes guessed the winner.", { right: room.right, made: room.made });
  }

  function renderMatrix(r) {
    var box = $("matrix");
    clear(box);
    if (!r.verified || r.verifiers.length === 0) {
      var winner = r.candidates[r.chosen].member;
      var why = r.candidates.length === 1 ? T("a lone draft (only {member} drafted)", { member: winner })
        : T("the drafts agreed");
      var said = T("Round {k} was not verified: {why}, so {member}'s segment was taken without scoring. There is no matrix for this round.",
        { k: r.k, why: why, member: winner });
      box.appendChild(el("p", said, "note"));
      $("matrix-note").textContent = "";
      return;
    }
    var values = [].concat.apply([], r.matrix).filter(function (v) { return v !== null; });
    var lo = data.fixed ? 0 : Math.min.apply(null, values), hi = data.fixed ? 1 : Math.max.apply(null, values);
    var table = el("table");
    var head = [el("th", T("verifier ↓ candidate →"))];
    r.candidates.forEach(function (c, j) {
      var th = memberCell("th", c.member);
      if (j === r.chosen) { th.appendChild(document.createTextNode(" ✓")); th.className = "won"; }
      head.push(th);
    });
    table.appendChild(row(head));
    r.verifiers.forEach(function (v, i) {
      var cells = [memberCell("th", v)];
      r.matrix[i].forEach(function (value) {
        var td = el("td", fmt(value, 2), "cell");
        if (value !== null) {
          var rgb = scaleColor(hi > lo ? (value - lo) / (hi - lo) : 0.5);
          td.style.background = "rgb(" + rgb.join(",") + ")";
          td.style.color = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 150 ? "#000" : "#fff";
        }
        cells.push(td);
      });
      table.appendChild(row(cells));
    });
    var caption = el("caption", data.fixed
      ? T("normalized scores ŝ ({normalization}), each verifier's row sums to 1; colour scale 0..1",
        { normalization: data.normalization })
      : T("raw scores (normalization none), coloured from this round's lowest to its highest"));
    table.appendChild(caption);
    box.appendChild(table);
    $("matrix-note").textContent = T("(round {k})", { k: r.k });
  }

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs).forEach(function (a) { node.setAttribute(a, String(attrs[a])); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function renderWeights() {
    clear(svg);
    var W = 800, H = 340, left = 60, right = 20, top = 16, bottom = 46;
    var highest = 0;
    [data.start].concat(rounds.map(function (r) { return r.weights; })).forEach(function (ws) {
      ws.forEach(function (w) { if (w !== null && w > highest) highest = w; });
    });
    var ymax = highest > 0 ? Math.ceil(highest * 10) / 10 : 1;
    var x = function (round) { return left + (W - left - right) * round / Math.max(1, n); };
    var y = function (w) { return top + (H - top - bottom) * (1 - (w === null ? 0 : w) / ymax); };
    var axis = { stroke: "#888", "stroke-width": 1 };
    svg.appendChild(svgEl("line", Object.assign({ x1: left, y1: y(0), x2: W - right, y2: y(0) }, axis)));
    svg.appendChild(svgEl("line", Object.assign({ x1: left, y1: top, x2: left, y2: y(0) }, axis)));
    [0, ymax / 2, ymax].forEach(function (t) {
      svg.appendChild(svgEl("line", { x1: left, y1: y(t), x2: W - right, y2: y(t), stroke: "#eee" }));
      svg.appendChild(svgEl("text", { x: left - 8, y: y(t) + 5, "text-anchor": "end" }, t.toFixed(2)));
    });
    var step = Math.max(1, Math.ceil(n / 10));
    for (var t = 0; t <= n; t += step) {
      svg.appendChild(svgEl("text", { x: x(t), y: H - bottom + 20, "text-anchor": "middle" }, t));
    }
    svg.appendChild(svgEl("text", { x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle" },
      T("round (0 = the starting weights)")));
    svg.appendChild(svgEl("line", { x1: x(k), y1: top, x2: x(k), y2: y(0), stroke: "#111",
      "stroke-width": 2, "stroke-dasharray": "6 4" }));
    data.members.forEach(function (m, i) {
      var points = [[0, data.start[i]]].concat(rounds.map(function (r) { return [r.k, r.weights[i]]; }));
      var done = points.slice(0, k + 1), later = points.slice(k);
      [[later, 0.2], [done, 1]].forEach(function (part) {
        if (part[0].length < 2) return;
        svg.appendChild(svgEl("polyline", { fill: "none", stroke: color(m), "stroke-width": 3,
          "stroke-opacity": part[1], points: part[0].map(function (p) { return x(p[0]) + "," + y(p[1]); }).join(" ") }));
      });
      svg.appendChild(svgEl("circle", { cx: x(k), cy: y(points[k][1]), r: 6, fill: color(m), stroke: "#111" }));
    });
    rounds.slice(0, k).forEach(function (r) {
      r.exits.forEach(function (e) {
        var cx = x(r.k), cy = y(r.weights[data.members.indexOf(e.member)]), d = 7;
        var cross = { stroke: color(e.member), "stroke-width": 4 };
        svg.appendChild(svgEl("line", Object.assign({ x1: cx - d, y1: cy - d, x2: cx + d, y2: cy + d }, cross)));
        svg.appendChild(svgEl("line", Object.assign({ x1: cx - d, y1: cy + d, x2: cx + d, y2: cy - d }, cross)));
      });
    });
  }

  function renderExits() {
    var box = $("exits");
    clear(box);
    var exits = [];
    rounds.slice(0, k).forEach(function (r) { exits = exits.concat(r.exits); });
    if (exits.length === 0) {
      box.appendChild(el("p", T("No member has left the drafting set by round {k}.", { k: k }), "note"));
      return;
    }
    var table = el("table");
    table.appendChild(row([el("th", T("member")), el("th", T("after round"), "num"),
      el("th", T("keep probability"), "num"), el("th", T("threshold"), "num")]));
    exits.forEach(function (e) {
      table.appendChild(row([memberCell("td", e.member), el("td", e.k, "num"),
        el("td", fmt(e.keep, 3), "num"), el("td", fmt(e.threshold, 3), "num")]));
    });
    box.appendChild(table);
  }

  // The round shown is the address's fragment too (#round=K): a teacher copies it onto a slide.
  var linkNote = "";
  function fromLink(hash) { // #round=K (or the older #K): K, or null with linkNote saying why
    var m = /^#(?:round=)?([0-9]{1,6})$/.exec(hash);
    if (m) return parseInt(m[1], 10);
    var asked = hash;
    try { asked = decodeURIComponent(hash); } catch (err) { /* a stray % : shown as typed */ }
    if (hash && hash !== "#") { // textContent: never markup
      linkNote = T("The link's {asked} is not a round (#round=K): round 1 is shown.", { asked: shown(asked.slice(0, 40)) });
    }
    return null;
  }
  function keepLink() {
    var want = "#round=" + k;
    if (location.hash === want) return;
    try { history.replaceState(null, "", want); } catch (err) { /* a sandboxed page keeps its address */ }
  }
  function show(target) {
    k = Math.min(n, Math.max(1, target));
    var r = rounds[k - 1];
    $("counter").textContent = T("round {k} of {n}", { k: k, n: n });
    $("back").disabled = k === 1;
    $("next").disabled = k === n;
    renderAnswer();
    renderCandidates(r);
    renderMatrix(r);
    renderWeights();
    renderExits();
    keepLink();
  }

  function pace() { return parseInt($("pace").value, 10) * 1000; }
  function setState() {
    $("play").disabled = timer !== null;
    $("pause").disabled = timer === null;
    $("play-state").textContent = timer === null ? T("paused") : T("playing");
  }
  function tick() {
    if (k >= n) { pause(); return; }
    show(k + 1);
    if (k >= n) pause();
  }
  function play() {
    if (timer !== null) clearInterval(timer);
    if (k >= n && timer === null) show(1); // from the end, Play starts over
    timer = setInterval(tick, pace());
    setState();
  }
  function pause() {
    if (timer !== null) clearInterval(timer);
    timer = null;
    setState();
  }
  function toggle() { if (timer === null) play(); else pause(); }
  function step(by) {
    show(k + by);
    if (timer !== null) { clearInterval(timer); timer = setInterval(tick, pace()); } // a full pace from now
  }

  $("next").addEventListener("click", function () { step(1); });
  $("back").addEventListener("click", function () { step(-1); });
  $("play").addEventListener("click", play);
  $("pause").addEventListener("click", pause);
  $("pace").addEventListener("change", function () {
    if (timer !== null) { clearInterval(timer); timer = setInterval(tick, pace()); }
    this.blur(); // the arrow keys step rounds again, not the pace
  });
  // The keys: the app's one key map (specfuse.handout.keys), embedded as data.keys (key → action).
  var black = el("div");
  black.id = "black";
  black.hidden = true;
  document.body.appendChild(black);
  var ACT = {
    next: function () { step(1); },
    back: function () { step(-1); },
    play: toggle,
    home: function () { step(1 - k); },
    end: function () { step(n - k); },
    black: function () { black.hidden = false; },
    help: function () { $("keymap").hidden = !$("keymap").hidden; },
  };
  var swallowed = false;
  document.addEventListener("keydown", function (e) {
    swallowed = false;
    if (!black.hidden) { black.hidden = true; e.preventDefault(); swallowed = true; return; }
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    var t = e.target && e.target.tagName;
    if (t === "SELECT") return;
    if (e.key === "Escape") { $("keymap").hidden = true; return; }
    var key = e.key === "Spacebar" ? " " : e.key;
    // Space on a focused button is that button's press (Next, Pause …), never Play as well.
    if (key === " " && (t === "BUTTON" || t === "INPUT" || t === "SUMMARY")) return;
    var does = Object.prototype.hasOwnProperty.call(data.keys, key) ? data.keys[key] : null;
    if (!does || !ACT[does]) return;
    e.preventDefault(); // no scrolling
    swallowed = true;
    if (!(e.repeat && does === "play")) ACT[does]();
  });
  document.addEventListener("keyup", function (e) {
    if (swallowed && e.key === " ") e.preventDefault();
  });
  function renderKeymap() {
    var table = $("keymap-table");
    [].slice.call(table.querySelectorAll("tr")).forEach(function (tr) { tr.remove(); });
    data.keyRows.forEach(function (r) {
      var th = el("th", T(r[0]));
      th.scope = "row";
      table.appendChild(row([th, el("td", T(r[1]))]));
    });
  }

  renderStatic();
  renderTexts();
  $("lang").addEventListener("click", function () { // the switch: the page in the other language
    lang = this.getAttribute("data-lang");
    renderTexts();
    show(k);
    setState();
  });
  $("player").hidden = false;
  var start = fromLink(location.hash);
  if (start !== null && (start < 1 || start > n))
    linkNote = T("The link's round {k} is not one of the {n} rounds: round {near} is shown.",
      { k: start, n: n, near: Math.min(n, Math.max(1, start)) });
  var noted = linkNote;
  show(start === null ? 1 : start);
  $("link-note").textContent = noted;
  $("link-note").hidden = !noted;
  window.addEventListener("hashchange", function () { // a fragment typed into the address bar
    var asked = fromLink(location.hash);
    if (asked !== null && asked !== k) show(asked);
  });
  setState();
})();
