// acp-replay view: draws the model embedded in this page (lanes, turns, marks, waits) and shows frames on click.
// Everything a peer sent is put into the page as text (textContent), never as markup.
"use strict";
(function () {
  const M = JSON.parse(document.getElementById("model").textContent);
  const ROW = 22;
  const MAX_WIDTH = 16000000; // browsers stop drawing far beyond this many pixels
  const FRAMES_SHOWN = 40;
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const span = Math.max(M.end, 1) * 1.02;
  const pct = (t) => ((t / span) * 100).toFixed(5) + "%";

  function fmtTime(t, step) {
    if (M.clock !== null && M.clock !== undefined) {
      const d = new Date(M.clock + t);
      const s = d.toISOString().slice(11, 23);
      return step >= 1000 ? s.slice(0, 8) : s;
    }
    return step >= 1000 ? "+" + (t / 1000).toFixed(0) + " s" : "+" + t.toFixed(0) + " ms";
  }
  function fmtOffset(t) {
    return t < 1000 ? t.toFixed(1) + " ms" : (t / 1000).toFixed(3) + " s";
  }

  // Lanes in tree order: each child session right under the session that announced it.
  const children = M.lanes.map(() => []);
  const roots = [];
  M.lanes.forEach((l, i) => (l.parent === null || l.parent === undefined ? roots : children[l.parent]).push(i));
  children.forEach((c) => c.sort((a, b) => M.lanes[a].start - M.lanes[b].start));
  const order = [];
  const depth = [];
  const visit = (i, d) => {
    if (depth[i] !== undefined) return;
    depth[i] = d;
    order.push(i);
    children[i].forEach((c) => visit(c, d + 1));
  };
  roots.forEach((i) => visit(i, 0));
  M.lanes.forEach((_, i) => visit(i, 0));
  const used = M.lanes.map(() => false);
  M.items.forEach((it) => (used[it.lane] = true));

  // Header: numbers, bad lines, legend.
  const sessions = M.lanes.filter((l) => l.session !== "").length;
  const started = M.clock !== null && M.clock !== undefined ? " · from " + new Date(M.clock).toISOString() : "";
  $("stats").textContent =
    M.frames.length + " records · " + sessions + " sessions · " + M.items.length + " marks · " + fmtOffset(M.end) + started;
  if (M.bad.length) {
    const bad = $("bad");
    bad.hidden = false;
    bad.querySelector("summary").textContent =
      M.bad.length + (M.bad.length === 1 ? " line" : " lines") + " of the trace could not be shown as they are";
    const ol = bad.querySelector("ol");
    M.bad.forEach((b) => {
      const li = el("li", "", "line " + b.line + ": " + b.reason + " ");
      li.appendChild(el("code", "", b.excerpt));
      ol.appendChild(li);
    });
  }
  const legend = [
    ["turn", "--turn"], ["agent's own turn", "--own"], ["text", "--text"], ["thinking", "--thinking"],
    ["tool call", "--tool"], ["permission", "--perm"], ["waiting", "--waiting"], ["handling", "--handling"],
    ["done", "--done"], ["failed / error", "--failed"], ["cancelled", "--cancelled"], ["shim changed", "--shim"],
  ];
  legend.forEach(([name, v]) => {
    const s = el("span", "", name);
    s.style.setProperty("--c", "var(" + v + ")");
    $("legend").appendChild(s);
  });

  // Lanes and items.
  const labels = $("labels");
  const lanesBox = $("lanes");
  labels.appendChild(el("div", "axis-pad"));
  const laneEl = [];
  order.forEach((i) => {
    const lane = M.lanes[i];
    if (!used[i] && lane.session === "") return;
    const rows = Math.max(lane.rows.length, 1);
    const h = rows * ROW + 4 + "px";
    const lab = el("div", "lane-label" + (depth[i] ? " child" : ""));
    lab.style.height = h;
    lab.style.paddingLeft = 6 + 12 * depth[i] + "px";
    const sid = el("span", "sid", lane.session === "" ? "connection (no session)" : lane.session);
    sid.title = lane.session;
    lab.appendChild(sid);
    lane.rows.forEach((r, n) => {
      const rn = el("span", "row-name", r);
      rn.style.top = n * ROW + 4 + "px";
      lab.appendChild(rn);
    });
    labels.appendChild(lab);
    const box = el("div", "lane");
    box.style.height = h;
    box.dataset.lane = i;
    box.dataset.session = lane.session;
    box.dataset.start = lane.start;
    if (lane.parent !== null && lane.parent !== undefined) box.dataset.parent = M.lanes[lane.parent].session;
    const life = el("div", "life");
    life.style.left = pct(lane.start);
    box.appendChild(life);
    lanesBox.appendChild(box);
    laneEl[i] = box;
  });

  const POINTS = { cancel: 1, update: 1, other: 1, shim: 1, file: 1, bad: 1 };
  const itemEl = [];
  M.items.forEach((it, n) => {
    const box = laneEl[it.lane];
    if (!box) return;
    const end = it.end !== undefined ? it.end : it.open ? M.end : it.t;
    const point = POINTS[it.kind] || end <= it.t;
    const e = el("div", "item k-" + it.kind + (point && it.kind !== "wait" ? " point" : ""));
    if (it.open) e.classList.add("open");
    if (it.red) e.classList.add("red");
    if (it.changed) e.classList.add("changed");
    e.style.left = pct(it.t);
    if (!point || it.kind === "wait") e.style.width = pct(end - it.t);
    e.style.top = it.row * ROW + "px";
    e.dataset.i = n;
    e.dataset.kind = it.kind;
    e.dataset.t = it.t;
    if (it.end !== undefined) e.dataset.end = it.end;
    if (it.state) e.dataset.state = it.state;
    if (it.wait) e.dataset.wait = it.wait;
    e.title = it.kind + (it.state ? " · " + it.state : "") + (it.label ? ": " + it.label : "");
    if (it.kind === "wait") {
      const d = Math.max(end - it.t, 1e-9);
      it.segs.forEach(([state, t], k) => {
        const next = k + 1 < it.segs.length ? it.segs[k + 1][1] : end;
        const s = el("div", (next > t ? "seg" : "cap") + " s-" + state);
        if (next > t) {
          s.style.left = (((t - it.t) / d) * 100).toFixed(4) + "%";
          s.style.width = (((next - t) / d) * 100).toFixed(4) + "%";
        }
        s.dataset.state = state;
        e.appendChild(s);
      });
      e.appendChild(el("span", "wlabel", it.label + " · " + it.state));
    } else if (!point) {
      e.textContent = it.label + (it.state ? " · " + it.state : "");
    }
    box.appendChild(e);
    itemEl[n] = e;
  });

  // The time axis and zoom: items are placed in % of the canvas, so zooming only sets its width.
  const scroll = $("scroll");
  const canvas = $("canvas");
  const axis = $("axis");
  let width = 0;
  function drawAxis() {
    axis.textContent = "";
    const msPerPx = span / width;
    const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 3e4, 6e4, 12e4, 3e5, 6e5, 18e5, 36e5];
    const step = steps.find((s) => s / msPerPx >= 90) || 36e5;
    for (let t = 0; t <= span; t += step) {
      const tk = el("div", "tick", fmtTime(t, step));
      tk.style.left = pct(t);
      axis.appendChild(tk);
    }
  }
  function setWidth(w, anchorPx) {
    const fit = scroll.clientWidth || 1200;
    const old = width || fit;
    const anchor = anchorPx === undefined ? scroll.clientWidth / 2 : anchorPx;
    const tAt = ((scroll.scrollLeft + anchor) / old) * span;
    width = Math.min(Math.max(w, fit), MAX_WIDTH);
    canvas.style.width = width + "px";
    canvas.dataset.span = span;
    canvas.dataset.width = width;
    scroll.scrollLeft = (tAt / span) * width - anchor;
    drawAxis();
  }
  $("zoom-in").onclick = () => setWidth(width * 2);
  $("zoom-out").onclick = () => setWidth(width / 2);
  $("zoom-fit").onclick = () => setWidth(0);
  scroll.addEventListener(
    "wheel",
    (ev) => {
      if (!ev.ctrlKey && !ev.metaKey) return;
      ev.preventDefault();
      const x = ev.clientX - scroll.getBoundingClientRect().left;
      setWidth(width * (ev.deltaY < 0 ? 1.25 : 0.8), x);
    },
    { passive: false }
  );
  scroll.addEventListener("scroll", () => (labels.scrollTop = scroll.scrollTop));
  setWidth(0);

  // Frames as formatted JSON, every number and string kept as it was written.
  function pretty(text) {
    let out = "";
    let ind = 0;
    let inStr = false;
    const nl = () => "\n" + "  ".repeat(ind);
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (inStr) {
        out += c;
        if (c === "\\") out += text[++i] || "";
        else if (c === '"') inStr = false;
        continue;
      }
      if (c === '"') { inStr = true; out += c; }
      else if (c === "{" || c === "[") {
        const close = c === "{" ? "}" : "]";
        let j = i + 1;
        while (j < text.length && /\s/.test(text[j])) j++;
        if (text[j] === close) { out += c + close; i = j; } else { ind++; out += c + nl(); }
      } else if (c === "}" || c === "]") { ind = Math.max(ind - 1, 0); out += nl() + c; }
      else if (c === ",") out += "," + nl();
      else if (c === ":") out += ": ";
      else if (!/\s/.test(c)) out += c;
    }
    return out;
  }
  const FATES = ["", "edited by the shim", "made by the shim", "not passed on as it came"];
  function frameBox(f) {
    const [line, t, dir, fate, pair, changes, raw] = M.frames[f];
    const box = el("div", "frame");
    box.dataset.frame = f;
    const head = el("div", "fh");
    head.appendChild(el("b", "", dir));
    head.appendChild(document.createTextNode(" · line " + line + " · " + fmtTime(t, 1) + " "));
    if (fate) head.appendChild(el("span", "fate", FATES[fate]));
    box.appendChild(head);
    if (fate === 1 && pair >= 0) {
      const other = M.frames[pair];
      const before = f < pair ? M.frames[f] : other;
      const after = f < pair ? other : M.frames[f];
      if (changes.length) {
        const ul = el("ul");
        changes.forEach((c) => ul.appendChild(el("li", "", c)));
        box.appendChild(ul);
      }
      const v = el("div", "versions");
      [["as received (" + before[2] + ", line " + before[0] + ")", before[6]],
        ["as passed on (" + after[2] + ", line " + after[0] + ")", after[6]]].forEach(([h, text]) => {
        const col = el("div");
        col.appendChild(el("div", "vh", h));
        col.appendChild(el("pre", "", pretty(text)));
        v.appendChild(col);
      });
      box.appendChild(v);
    } else {
      box.appendChild(el("pre", "", pretty(raw)));
    }
    return box;
  }
  let selected = null;
  function show(n) {
    const it = M.items[n];
    if (selected !== null && itemEl[selected]) itemEl[selected].classList.remove("sel");
    selected = n;
    if (itemEl[n]) itemEl[n].classList.add("sel");
    const body = $("detail-body");
    body.textContent = "";
    const state = it.state && !it.label.startsWith(it.state) ? " · " + it.state : "";
    body.appendChild(el("h2", "", it.kind + state + (it.label ? ": " + it.label : "")));
    const lane = M.lanes[it.lane];
    const when = fmtTime(it.t, 1) + (it.end !== undefined ? " → " + fmtTime(it.end, 1) + " (" + fmtOffset(it.end - it.t) + ")" : it.open ? " → still open at the end of the trace" : "");
    body.appendChild(el("div", "meta", "session " + (lane.session || "(none)") + " · " + when));
    if (it.segs && it.segs.length) {
      body.appendChild(el("div", "meta", it.segs.map(([s, t]) => s + " at " + fmtTime(t, 1)).join(" → ")));
    }
    if (it.text && it.kind !== "shim") body.appendChild(el("pre", "", it.text));
    const seen = new Set();
    let shown = 0;
    for (const f of it.frames) {
      if (seen.has(f)) continue;
      seen.add(f);
      const pair = M.frames[f][4];
      if (M.frames[f][3] === 1 && pair >= 0) seen.add(pair);
      if (shown++ === FRAMES_SHOWN) {
        body.appendChild(el("div", "meta", "… and " + (it.frames.length - FRAMES_SHOWN) + " more frames"));
        break;
      }
      body.appendChild(frameBox(f));
    }
    $("detail").hidden = false;
  }
  lanesBox.addEventListener("click", (ev) => {
    const e = ev.target.closest(".item");
    if (e) show(Number(e.dataset.i));
  });
  $("close").onclick = () => ($("detail").hidden = true);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") $("detail").hidden = true;
  });

  // Search over method, session, label and text.
  let hay = null;
  let hits = [];
  let hitAt = -1;
  function search() {
    const q = $("search").value.trim().toLowerCase();
    if (!hay) {
      hay = M.items.map((it) =>
        [it.kind, it.method, M.lanes[it.lane].session, it.label, it.state || "", it.wait || "", it.text || ""].join("\n").toLowerCase()
      );
    }
    hits.forEach((n) => itemEl[n] && itemEl[n].classList.remove("hit"));
    hits = [];
    hitAt = -1;
    document.body.classList.toggle("searching", q !== "");
    if (q !== "") {
      hay.forEach((h, n) => {
        if (h.includes(q) && itemEl[n]) hits.push(n);
      });
      hits.forEach((n) => itemEl[n].classList.add("hit"));
    }
    $("hits").textContent = q === "" ? "" : hits.length + (hits.length === 1 ? " match" : " matches");
  }
  let timer = 0;
  $("search").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(search, 120);
  });
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    search();
    if (!hits.length) return;
    hitAt = (hitAt + 1) % hits.length;
    itemEl[hits[hitAt]].scrollIntoView({ block: "center", inline: "center" });
    show(hits[hitAt]);
  });
  // A link to one mark: PAGE.html#item=N opens it.
  const linked = /^#item=(\d+)$/.exec(location.hash);
  if (linked && M.items[Number(linked[1])] && itemEl[Number(linked[1])]) {
    const e = itemEl[Number(linked[1])];
    e.scrollIntoView({ block: "center" });
    scroll.scrollLeft = Math.max(0, e.offsetLeft - 150);
    show(Number(linked[1]));
  }
  lanesBox.addEventListener("click", () => selected !== null && history.replaceState(null, "", "#item=" + selected));
  document.body.dataset.ready = "1";
})();
