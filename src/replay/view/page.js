// acp-replay view: draws the model embedded in this page (lanes, turns, marks, waits) on a canvas, only what is
// on screen, and shows a mark's frames on click (read from the page's compressed chunks when asked for).
// Everything a peer sent is put into the page as text (textContent, fillText), never as markup.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const M = JSON.parse($("model").textContent);
  const ROW = 22;
  const AXIS = 24;
  const LABELS = 220;
  const LANE_PAD = 4;
  const MAX_WIDTH = 16000000; // browsers stop scrolling far beyond this many pixels
  const FRAMES_SHOWN = 40;
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const span = Math.max(M.end, 1) * 1.02;
  const clock = M.clock !== null && M.clock !== undefined;
  const CHUNKED = { text: "chunks", thinking: "chunks", user: "chunks" };

  function fmtTime(t, step) {
    if (clock) {
      const s = new Date(M.clock + t).toISOString().slice(11, 23);
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

  // Where each shown lane sits (px from the top of the lanes), and each lane's rows: items by start time,
  // with the running maximum of their ends, so the items on screen are found by two binary searches.
  const shown = order.filter((i) => used[i] || M.lanes[i].session !== "");
  const laneTop = new Float64Array(M.lanes.length).fill(-1);
  const laneH = new Float64Array(M.lanes.length);
  let height = 0;
  shown.forEach((i) => {
    laneTop[i] = height;
    laneH[i] = Math.max(M.lanes[i].rows.length, 1) * ROW + LANE_PAD + 1;
    height += laneH[i];
  });
  const tops = shown.map((i) => laneTop[i]);
  const POINTS = { cancel: 1, update: 1, usage: 1, other: 1, shim: 1, file: 1, bad: 1 };
  const ends = new Float64Array(M.items.length);
  const point = new Uint8Array(M.items.length);
  const rowsOf = M.lanes.map((l) => Array.from({ length: Math.max(l.rows.length, 1) }, () => []));
  M.items.forEach((it, n) => {
    const end = it.end !== undefined ? it.end : it.open ? M.end : it.t;
    ends[n] = end;
    point[n] = it.kind !== "wait" && (POINTS[it.kind] || end <= it.t) ? 1 : 0;
    const rows = rowsOf[it.lane];
    if (rows && rows[it.row]) rows[it.row].push(n);
  });
  const rowIndex = rowsOf.map((rows) =>
    rows.map((list) => {
      list.sort((a, b) => M.items[a].t - M.items[b].t || a - b);
      const maxEnd = new Float64Array(list.length);
      let m = -Infinity;
      list.forEach((n, k) => (maxEnd[k] = m = Math.max(m, ends[n])));
      return { list, maxEnd };
    })
  );
  // The frames the shim did not pass on as they came: [fate, other version, changes] by frame.
  const changedOf = new Map();
  M.changed.forEach(([f, fate, pair, changes]) => changedOf.set(f, [fate, pair, changes]));

  // Header: numbers, bad lines, legend.
  const sessions = M.lanes.filter((l) => l.session !== "").length;
  const started = clock ? " · from " + new Date(M.clock).toISOString() : "";
  $("stats").textContent =
    M.frames + " records · " + sessions + " sessions · " + M.items.length + " marks · " + fmtOffset(M.end) + started;
  if (M.bad.length) {
    const bad = $("bad");
    bad.hidden = false;
    bad.querySelector("summary").textContent =
      M.bad.length + (M.bad.length === 1 ? " line" : " lines") + " of the trace could not be shown as they are";
    const ol = bad.querySelector("ol");
    M.bad.slice(0, 1000).forEach((b) => {
      const li = el("li", "", "line " + b.line + ": " + b.reason + " ");
      li.appendChild(el("code", "", b.excerpt));
      ol.appendChild(li);
    });
  }
  const css = getComputedStyle(document.documentElement);
  const C = (name) => css.getPropertyValue("--" + name).trim() || "#999";
  const COLOR = {
    turn: C("turn"), own: C("own"), cancel: C("red"), text: C("text"), thinking: C("thinking"), user: "#7a8a9a",
    tool: C("tool"), permission: C("perm"), request: "#6b7280", update: "#b8b8bc", other: "#b8b8bc",
    file: "#b8b8bc", stop: C("ink"), shim: C("shim"), bad: C("red"), compact: C("compact"), usage: C("usage"),
  };
  const STATE = {
    waiting: C("waiting"), handling: C("handling"), done: C("done"), completed: C("done"), failed: C("failed"),
    cancelled: C("cancelled"), stopped: C("cancelled"),
  };
  [
    ["turn", "--turn"], ["agent's own turn", "--own"], ["text", "--text"], ["thinking", "--thinking"],
    ["tool call", "--tool"], ["permission", "--perm"], ["compaction", "--compact"], ["usage", "--usage"],
    ["waiting", "--waiting"], ["handling", "--handling"],
    ["done", "--done"], ["failed / error", "--failed"], ["cancelled", "--cancelled"], ["shim changed", "--shim"],
  ].forEach(([name, v]) => {
    const s = el("span", "", name);
    s.style.setProperty("--c", "var(" + v + ")");
    $("legend").appendChild(s);
  });

  // The canvas covers the view; the scroll box over the time area gives scroll bars and takes the mouse.
  const view = $("view");
  const canvas = $("canvas");
  const scroll = $("scroll");
  const space = $("space");
  const ctx = canvas.getContext("2d");
  const hatch = (() => {
    const c = document.createElement("canvas");
    c.width = c.height = 9;
    const g = c.getContext("2d");
    g.strokeStyle = "rgba(255,255,255,0.35)";
    g.lineWidth = 3;
    g.beginPath();
    g.moveTo(-2, 11);
    g.lineTo(11, -2);
    g.stroke();
    return ctx.createPattern(c, "repeat");
  })();
  let width = 0;
  let selected = null;
  let hitSet = null;
  // What the page drew, for a reader of the page (and its tests): the model, the lanes' places, the marks of
  // the last draw with their place in px from the start of the time axis and the top of the lanes.
  const api = { model: M, draws: 0, lastDraw: 0, drawn: [], readyAt: 0, labels: LABELS, axis: AXIS };
  api.lanes = () =>
    shown.map((i) => {
      const l = M.lanes[i];
      const parent = l.parent === null || l.parent === undefined ? null : M.lanes[l.parent].session;
      return { session: l.session, parent, top: laneTop[i], height: laneH[i], life: X(l.start) };
    });
  window.acpView = api;

  const X = (t) => (t / span) * width; // px from the start of the time axis
  function geom(n) {
    const it = M.items[n];
    const x = X(it.t);
    if (point[n]) return [x - 3, x + 3];
    return [x, Math.max(X(ends[n]), x + 4)];
  }
  /// First k with list[k]'s running end >= t (items before it end before t).
  function firstEnding(ix, t) {
    let lo = 0;
    let hi = ix.list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ix.maxEnd[mid] + (span / width) * 4 < t) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
  function laneAt(y) {
    let lo = 0;
    let hi = tops.length - 1;
    if (hi < 0) return -1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (tops[mid] <= y) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
  function label(it, n) {
    let s = it.label + (it.state ? " · " + it.state : "");
    if (CHUNKED[it.kind] && it.frames.length > 1) s += " · " + it.frames.length + " chunks";
    return it.kind === "wait" ? it.label + " · " + it.state : s;
  }

  function draw() {
    const started = performance.now();
    const dpr = window.devicePixelRatio || 1;
    const w = view.clientWidth;
    const h = view.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
      canvas.style.width = w + "px";
      canvas.style.height = h + "px";
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = C("bg");
    ctx.fillRect(0, 0, w, h);
    const sl = scroll.scrollLeft;
    const st = scroll.scrollTop;
    const tw = scroll.clientWidth;
    const th = scroll.clientHeight;
    const tL = ((sl - 8) / width) * span;
    const tR = ((sl + tw + 8) / width) * span;
    const drawn = [];
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABELS, AXIS, w - LABELS, h - AXIS);
    ctx.clip();
    ctx.font = "11px -apple-system, BlinkMacSystemFont, 'Segoe UI', 'Helvetica Neue', 'PingFang SC', 'Noto Sans CJK SC', sans-serif";
    ctx.textBaseline = "middle";
    const first = Math.max(laneAt(st), 0);
    for (let k = first; k < shown.length && tops[k] < st + th; k++) {
      const lane = shown[k];
      const y0 = AXIS + tops[k] - st;
      ctx.fillStyle = "rgba(91,123,213,0.05)";
      const life = LABELS + X(M.lanes[lane].start) - sl;
      ctx.fillRect(Math.max(life, LABELS), y0, w, laneH[lane] - 1);
      ctx.fillStyle = "rgba(91,123,213,0.5)";
      ctx.fillRect(life, y0, 2, laneH[lane] - 1);
      ctx.fillStyle = C("line");
      ctx.fillRect(LABELS, y0 + laneH[lane] - 1, w, 1);
      rowIndex[lane].forEach((ix, r) => {
        const ry = y0 + r * ROW;
        let lastPx = -1e9;
        for (let j = firstEnding(ix, tL); j < ix.list.length; j++) {
          const n = ix.list[j];
          const it = M.items[n];
          if (it.t > tR) break;
          if (ends[n] < tL - (span / width) * 4) continue;
          const g = geom(n);
          const x0 = LABELS + g[0] - sl;
          const x1 = LABELS + g[1] - sl;
          // Marks that fall on a pixel already drawn in this row add nothing to see: one stands for them.
          if (x1 - x0 <= 6 && Math.round(x0) === lastPx && n !== selected) continue;
          lastPx = Math.round(x0);
          const painted = drawItem(it, n, x0, x1, ry);
          drawn.push({ i: n, kind: it.kind, session: M.lanes[lane].session, x: [g[0], g[1]], y: ry - AXIS + st, painted });
        }
      });
    }
    ctx.restore();
    drawLabels(first, st, th, w);
    drawAxis(sl, tw, w);
    api.drawn = drawn;
    api.draws += 1;
    api.lastDraw = performance.now() - started;
  }
  function drawItem(it, n, x0, x1, ry) {
    const dim = hitSet && !hitSet.has(n);
    ctx.globalAlpha = dim ? 0.15 : 1;
    const red = it.red;
    const painted = [];
    if (point[n]) {
      ctx.fillStyle = red ? C("red") : COLOR[it.kind] || "#999";
      ctx.beginPath();
      ctx.arc((x0 + x1) / 2, ry + 11, 3, 0, 2 * Math.PI);
      ctx.fill();
      if (it.changed) {
        ctx.strokeStyle = C("shim");
        ctx.lineWidth = 2;
        ctx.stroke();
      }
    } else {
      const y = ry + 3;
      const hgt = ROW - 6;
      const wd = x1 - x0;
      if (it.kind === "wait") {
        const segs = it.segs || [];
        segs.forEach(([state, t], k) => {
          const next = k + 1 < segs.length ? segs[k + 1][1] : ends[n];
          ctx.fillStyle = STATE[state] || "#999";
          painted.push(state);
          if (next > t) {
            const a = LABELS + X(t) - (LABELS + X(it.t)) + x0;
            const b = Math.max(LABELS + X(next) - (LABELS + X(it.t)) + x0, a + 1);
            ctx.fillRect(a, y, b - a, hgt);
          } else {
            ctx.fillRect(x1 - 4, y, 4, hgt);
          }
        });
      } else {
        ctx.fillStyle = red ? C("red") : COLOR[it.kind] || "#999";
        ctx.fillRect(x0, y, wd, hgt);
      }
      if (it.open && it.kind !== "wait") {
        ctx.fillStyle = hatch;
        ctx.fillRect(x0, y, wd, hgt);
      }
      if (it.changed) {
        ctx.strokeStyle = C("shim");
        ctx.lineWidth = 2;
        ctx.strokeRect(x0 - 1, y - 1, wd + 2, hgt + 2);
      }
      if (wd > 24) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(Math.max(x0, LABELS), y, x1 - Math.max(x0, LABELS) - 3, hgt);
        ctx.clip();
        const tx = Math.max(x0, LABELS) + 3;
        if (it.kind === "wait") {
          ctx.lineWidth = 3;
          ctx.strokeStyle = "rgba(255,255,255,0.8)";
          ctx.strokeText(label(it, n), tx, y + hgt / 2);
          ctx.fillStyle = C("ink");
        } else {
          ctx.fillStyle = "#fff";
        }
        ctx.fillText(label(it, n), tx, y + hgt / 2);
        ctx.restore();
      }
    }
    if (hitSet && !dim) {
      ctx.strokeStyle = "#ffd400";
      ctx.lineWidth = 2;
      ctx.strokeRect(x0 - 2, ry + 1, x1 - x0 + 4, ROW - 2);
    }
    if (n === selected) {
      ctx.strokeStyle = C("ink");
      ctx.lineWidth = 2;
      ctx.strokeRect(x0 - 3, ry, x1 - x0 + 6, ROW);
    }
    ctx.globalAlpha = 1;
    return painted;
  }
  function drawLabels(first, st, th, w) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, AXIS, LABELS, th + 40);
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, AXIS, LABELS, th + 40);
    ctx.clip();
    ctx.textBaseline = "top";
    for (let k = first; k < shown.length && tops[k] < st + th; k++) {
      const lane = shown[k];
      const l = M.lanes[lane];
      const y0 = AXIS + tops[k] - st;
      ctx.font = "600 12px -apple-system, BlinkMacSystemFont, 'Segoe UI', 'Helvetica Neue', sans-serif";
      ctx.fillStyle = C("ink");
      const name = (depth[lane] ? "↳ " : "") + (l.session === "" ? "connection (no session)" : l.session);
      ctx.save();
      ctx.beginPath();
      ctx.rect(0, y0, LABELS - 50, laneH[lane]);
      ctx.clip();
      ctx.fillText(name, 6 + 12 * depth[lane], y0 + 4);
      ctx.restore();
      ctx.font = "10px -apple-system, BlinkMacSystemFont, 'Segoe UI', sans-serif";
      ctx.fillStyle = C("dim");
      ctx.textAlign = "right";
      l.rows.forEach((r, n) => ctx.fillText(r, LABELS - 6, y0 + n * ROW + 6));
      ctx.textAlign = "left";
      ctx.fillStyle = C("line");
      ctx.fillRect(0, y0 + laneH[lane] - 1, LABELS, 1);
    }
    ctx.restore();
    ctx.fillStyle = C("line");
    ctx.fillRect(LABELS - 1, 0, 1, AXIS + th + 40);
  }
  function drawAxis(sl, tw, w) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, AXIS);
    ctx.fillStyle = C("line");
    ctx.fillRect(0, AXIS - 1, w, 1);
    const msPerPx = span / width;
    const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 3e4, 6e4, 12e4, 3e5, 6e5, 18e5, 36e5];
    const step = steps.find((s) => s / msPerPx >= 90) || 36e5 * Math.ceil((90 * msPerPx) / 36e5);
    ctx.font = "11px -apple-system, BlinkMacSystemFont, 'Segoe UI', sans-serif";
    ctx.textBaseline = "top";
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABELS, 0, w - LABELS, AXIS);
    ctx.clip();
    const from = Math.floor((sl * msPerPx) / step) * step;
    for (let t = from; t <= Math.min(span, (sl + tw) * msPerPx + step); t += step) {
      const x = LABELS + X(t) - sl;
      ctx.fillStyle = C("line");
      ctx.fillRect(x, 0, 1, AXIS);
      ctx.fillStyle = C("dim");
      ctx.fillText(fmtTime(t, step), x + 3, 6);
    }
    ctx.restore();
  }

  // Zoom: the scroll box's content is as wide as the zoomed time axis; the canvas draws what it shows.
  function setWidth(w, anchorPx) {
    const fit = scroll.clientWidth || 1200;
    const old = width || fit;
    const anchor = anchorPx === undefined ? scroll.clientWidth / 2 : anchorPx;
    const tAt = ((scroll.scrollLeft + anchor) / old) * span;
    width = Math.min(Math.max(w, fit), MAX_WIDTH);
    space.style.width = width + "px";
    canvas.dataset.span = span;
    canvas.dataset.width = width;
    scroll.scrollLeft = (tAt / span) * width - anchor;
    draw();
  }
  api.zoom = (factor, anchorPx) => setWidth(width * factor, anchorPx);
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
  // Scroll events come once per frame, before it is painted: drawing right away shows the new place in it.
  scroll.addEventListener("scroll", draw);
  window.addEventListener("resize", () => setWidth(width));

  // The mark under a point of the view (px from the view's top left), or null.
  function itemAt(x, y) {
    const st = scroll.scrollTop;
    const ly = y - AXIS + st;
    const k = laneAt(ly);
    if (k < 0 || ly < 0 || ly >= tops[k] + laneH[shown[k]]) return null;
    const lane = shown[k];
    const r = Math.floor((ly - tops[k]) / ROW);
    const ix = rowIndex[lane][r];
    if (!ix) return null;
    const tx = x - LABELS + scroll.scrollLeft;
    const t = (tx / width) * span;
    let best = null;
    for (let j = firstEnding(ix, t - (span / width) * 4); j < ix.list.length; j++) {
      const n = ix.list[j];
      if (M.items[n].t > t + (span / width) * 4) break;
      const g = geom(n);
      if (g[0] - 1 <= tx && tx <= g[1] + 1) best = n;
    }
    return best;
  }
  api.itemAt = itemAt;
  scroll.addEventListener("click", (ev) => {
    const r = view.getBoundingClientRect();
    const n = itemAt(ev.clientX - r.left, ev.clientY - r.top);
    if (n !== null) {
      show(n);
      history.replaceState(null, "", "#item=" + n);
    }
  });
  scroll.addEventListener("mousemove", (ev) => {
    const r = view.getBoundingClientRect();
    const n = itemAt(ev.clientX - r.left, ev.clientY - r.top);
    scroll.style.cursor = n === null ? "" : "pointer";
    const it = n === null ? null : M.items[n];
    scroll.title = it ? it.kind + (it.state ? " · " + it.state : "") + (it.label ? ": " + it.label : "") : "";
  });
  // Brings mark n into the middle of the view.
  function scrollToItem(n) {
    const it = M.items[n];
    const k = shown.indexOf(it.lane);
    if (k >= 0) scroll.scrollTop = Math.max(0, tops[k] + it.row * ROW - scroll.clientHeight / 2);
    const g = geom(n);
    scroll.scrollLeft = Math.max(0, (g[0] + g[1]) / 2 - scroll.clientWidth / 2);
    draw();
  }
  api.scrollToItem = scrollToItem;

  // Frames: read from their chunk (gzip in base64) when a mark is opened; the newest chunks are kept.
  const chunks = new Map();
  function chunk(k) {
    if (!chunks.has(k)) {
      const e = $("c" + k);
      const bin = atob(e ? e.textContent : "");
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
      chunks.set(k, new Response(stream).text().then((t) => t.split("\n")));
      if (chunks.size > 64) chunks.delete(chunks.keys().next().value);
    }
    return chunks.get(k);
  }
  async function frame(f) {
    const lines = await chunk(Math.floor(f / M.chunk));
    const [line, t, dir, raw] = JSON.parse(lines[f % M.chunk]);
    const c = changedOf.get(f) || [0, -1, []];
    return { f, line, t, dir, raw, fate: c[0], pair: c[1], changes: c[2] };
  }

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
  async function frameBox(fr) {
    const box = el("div", "frame");
    box.dataset.frame = fr.f;
    const head = el("div", "fh");
    head.appendChild(el("b", "", fr.dir));
    head.appendChild(document.createTextNode(" · line " + fr.line + " · " + fmtTime(fr.t, 1) + " "));
    if (fr.fate) head.appendChild(el("span", "fate", FATES[fr.fate]));
    box.appendChild(head);
    if (fr.fate === 1 && fr.pair >= 0) {
      const other = await frame(fr.pair);
      const [before, after] = fr.f < fr.pair ? [fr, other] : [other, fr];
      if (fr.changes.length) {
        const ul = el("ul");
        fr.changes.forEach((c) => ul.appendChild(el("li", "", c)));
        box.appendChild(ul);
      }
      const v = el("div", "versions");
      [["as received (" + before.dir + ", line " + before.line + ")", before.raw],
        ["as passed on (" + after.dir + ", line " + after.line + ")", after.raw]].forEach(([h, text]) => {
        const col = el("div");
        col.appendChild(el("div", "vh", h));
        col.appendChild(el("pre", "", pretty(text)));
        v.appendChild(col);
      });
      box.appendChild(v);
    } else {
      box.appendChild(el("pre", "", pretty(fr.raw)));
    }
    return box;
  }
  // The text of ACP content blocks (a chunk's `content`).
  function contentText(c) {
    if (Array.isArray(c)) return c.map((b) => (b && typeof b.text === "string" ? b.text : "")).join("");
    return c && typeof c.text === "string" ? c.text : "";
  }
  let showing = 0;
  async function show(n) {
    const token = ++showing;
    const it = M.items[n];
    selected = n;
    draw();
    const detail = $("detail");
    delete detail.dataset.loaded;
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
    detail.hidden = false;
    const joined = CHUNKED[it.kind] && it.frames.length > 1;
    const text = el("pre", joined ? "joined" : "", it.text || "");
    if (it.text && it.kind !== "shim") body.appendChild(text);
    const list = [];
    const seen = new Set();
    for (const f of it.frames) {
      if (seen.has(f)) continue;
      seen.add(f);
      const c = changedOf.get(f);
      if (c && c[0] === 1 && c[1] >= 0) seen.add(c[1]);
      list.push(f);
    }
    try {
      if (joined) {
        // The whole message: every chunk's text, joined, with how many chunks it came in.
        const all = await Promise.all(it.frames.map(frame));
        if (token !== showing) return;
        const parts = all.map((fr) => {
          try {
            const v = JSON.parse(fr.raw);
            return contentText(v && v.params && v.params.update && v.params.update.content);
          } catch (e) {
            return "";
          }
        });
        text.textContent = parts.join("");
        if (!text.parentNode) body.appendChild(text);
        body.insertBefore(el("div", "meta", it.frames.length + " chunks, joined"), text);
      }
      let count = 0;
      for (const f of list) {
        if (count++ === FRAMES_SHOWN) {
          body.appendChild(el("div", "meta", "… and " + (list.length - FRAMES_SHOWN) + " more frames"));
          break;
        }
        const box = await frameBox(await frame(f));
        if (token !== showing) return;
        body.appendChild(box);
      }
    } catch (e) {
      body.appendChild(el("div", "meta", "the frames could not be read from this page: " + e));
    }
    if (token === showing) detail.dataset.loaded = "1";
  }
  api.show = show;
  $("close").onclick = () => ($("detail").hidden = true);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") $("detail").hidden = true;
  });

  // Search over kind, method, session, label and text.
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
    hits = [];
    hitAt = -1;
    if (q !== "") hay.forEach((h, n) => h.includes(q) && hits.push(n));
    hitSet = q === "" ? null : new Set(hits);
    $("hits").textContent = q === "" ? "" : hits.length + (hits.length === 1 ? " match" : " matches");
    draw();
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
    scrollToItem(hits[hitAt]);
    show(hits[hitAt]);
  });

  // The lanes' height first: a vertical scroll bar narrows the width the time axis fits in.
  space.style.height = height + "px";
  setWidth(0);
  // A link to one mark: PAGE.html#item=N opens it.
  const linked = /^#item=(\d+)$/.exec(location.hash);
  if (linked && M.items[Number(linked[1])]) {
    scrollToItem(Number(linked[1]));
    show(Number(linked[1]));
  }
  api.readyAt = performance.now();
  document.body.dataset.ready = "1";
})();
