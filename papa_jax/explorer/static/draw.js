// Helpers of the PAPA attention explorer: decoding, colours, DOM and canvas
// drawing. Plain browser JavaScript, no libraries, no network.
"use strict";

const Draw = (() => {
  function el(tag, attrs = {}, ...children) {
    const svg = ["svg", "g", "line", "path", "polyline", "polygon", "circle", "rect", "text", "title"];
    const node = svg.includes(tag)
      ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
      else if (k === "text") node.textContent = v;
      else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  // base64 -> zlib-compressed bytes -> bytes, via the browser's DecompressionStream.
  async function inflate(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // A stack of 8-bit matrices [..., n, m] with one scale per matrix; see pack.py.
  async function matrices(rec) {
    const raw = await inflate(rec.data);
    const signed = rec.dtype === "int8";
    const codes = signed ? new Int8Array(raw.buffer, raw.byteOffset, raw.length) : raw;
    const shape = rec.shape, n = shape[shape.length - 2], m = shape[shape.length - 1];
    if (codes.length !== shape.reduce((a, b) => a * b, 1)) throw new Error(`bad matrix data ${shape}`);
    return {
      codes, shape, n, m, signed, levels: signed ? 127 : 255, scales: rec.scales,
      // Flat index of a matrix from its leading indices (e.g. layer, head).
      index(...lead) { let k = 0; lead.forEach((x, i) => { k = k * shape[i] + x; }); return k; },
      codesOf(k) { return codes.subarray(k * n * m, (k + 1) * n * m); },
      values(k) { return Float32Array.from(this.codesOf(k), (c) => c * rec.scales[k]); },
      error(k) { return rec.scales[k] / 2; },  // Largest decoding error of matrix k.
    };
  }

  // Colour maps as control points (sRGB), linearly interpolated.
  const SEQ = ["#fffff0", "#fde9a9", "#fdbb6c", "#f3844b", "#d94f3d", "#a8233f", "#6b0f3a", "#2d0a2a"];
  const DIV = ["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b"];
  const VIR = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779",
               "#6ece58", "#b5de2b", "#fde725"];
  function ramp(stops) {
    const rgb = stops.map((h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16)));
    const table = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const t = (i / 255) * (rgb.length - 1), j = Math.min(Math.floor(t), rgb.length - 2), f = t - j;
      for (let c = 0; c < 3; c++) table[i * 3 + c] = rgb[j][c] * (1 - f) + rgb[j + 1][c] * f;
    }
    return table;
  }
  const MAPS = { seq: ramp(SEQ), div: ramp(DIV), vir: ramp(VIR) };
  function css(map, t) {
    const i = Math.max(0, Math.min(255, Math.round(t * 255))) * 3, tb = MAPS[map];
    return `rgb(${tb[i]},${tb[i + 1]},${tb[i + 2]})`;
  }

  // The sRGB colour of each of `count` values (any array), 3 bytes each. Non-negative
  // matrices use the sequential map over [0, peak] (sqrt-compressed when gamma is 0.5);
  // signed ones the diverging map over [-peak, peak].
  function colours(vals, count, { signed = false, peak = null, gamma = 1 } = {}) {
    let p = peak;
    if (p === null) { p = 0; for (let i = 0; i < count; i++) p = Math.max(p, Math.abs(vals[i])); }
    p = p || 1;
    const out = new Uint8ClampedArray(count * 3), tb = signed ? MAPS.div : MAPS.seq;
    for (let i = 0; i < count; i++) {
      let t = vals[i] / p;
      t = signed ? 0.5 + 0.5 * Math.sign(t) * Math.pow(Math.min(Math.abs(t), 1), gamma)
        : Math.pow(Math.max(0, Math.min(t, 1)), gamma);
      const c = Math.round(t * 255) * 3;
      out[i * 3] = tb[c]; out[i * 3 + 1] = tb[c + 1]; out[i * 3 + 2] = tb[c + 2];
    }
    return out;
  }

  // An n x m ImageData of colours (3 bytes a cell).
  function image(ctx, rgb, n, m) {
    const img = ctx.createImageData(m, n);
    for (let i = 0; i < n * m; i++) {
      img.data[i * 4] = rgb[i * 3]; img.data[i * 4 + 1] = rgb[i * 3 + 1];
      img.data[i * 4 + 2] = rgb[i * 3 + 2]; img.data[i * 4 + 3] = 255;
    }
    return img;
  }

  // Paints values (n x m) into the top-left n x m pixels, coloured as `colours`.
  function paint(ctx, vals, n, m, opts) {
    ctx.putImageData(image(ctx, colours(vals, n * m, opts), n, m), 0, 0);
  }

  // A matrix scaled into a canvas region, pixels kept sharp.
  function blit(ctx, vals, n, m, x, y, w, h, opts) {
    const off = document.createElement("canvas");
    off.width = m; off.height = n;
    paint(off.getContext("2d"), vals, n, m, opts);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, x, y, w, h);
  }

  // A canvas sized for the device's pixel ratio, drawn in CSS pixels.
  function hiDpi(canvas, w, h) {
    const r = window.devicePixelRatio || 1;
    canvas.width = Math.round(w * r); canvas.height = Math.round(h * r);
    canvas.style.width = `${w}px`; canvas.style.height = `${h}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return ctx;
  }

  // ---- scenes: a figure recorded as data, painted on the page and exported ----
  // A scene holds matrices, text, lines and rectangles in CSS pixels. The page paints it on a
  // canvas (`show`); the export writes it as SVG (`svg`: one <rect> per matrix cell, text as
  // <text>) or paints it at any scale (`toCanvas`), so every output has the same colours.
  function scene(w, h) {
    const items = [];
    return {
      w, h, items,
      // A matrix (values, n x m) stretched over (x, y, mw, mh), coloured as `colours`.
      matrix(vals, n, m, x, y, mw, mh, opts) {
        items.push({ kind: "matrix", rgb: colours(vals, n * m, opts), n, m, x, y, w: mw, h: mh });
      },
      text(text, x, y, { size = 10, fill = "#333", anchor = "start", rotate = 0, bold = false } = {}) {
        items.push({ kind: "text", text: String(text), x, y, size, fill, anchor, rotate, bold });
      },
      line(x1, y1, x2, y2, { stroke = "#333", width = 1, opacity = 1, dash = null } = {}) {
        items.push({ kind: "line", x1, y1, x2, y2, stroke, width, opacity, dash });
      },
      rect(x, y, rw, rh, { fill = "none", stroke = null, width = 1, cls = null } = {}) {
        items.push({ kind: "rect", x, y, w: rw, h: rh, fill, stroke, width, cls });
      },
      place(sub, x, y) { items.push({ kind: "scene", sub, x, y }); },  // Another scene at (x, y).
      raw(markup) { items.push({ kind: "raw", markup }); },  // SVG markup (export only).
    };
  }
  const ALIGN = { start: "left", middle: "center", end: "right" };
  const font = (it) => `${it.bold ? "600 " : ""}${it.size}px sans-serif`;

  function paintScene(ctx, sc) {
    for (const it of sc.items) {
      if (it.kind === "matrix") {
        const off = document.createElement("canvas");
        off.width = it.m; off.height = it.n;
        const octx = off.getContext("2d");
        octx.putImageData(image(octx, it.rgb, it.n, it.m), 0, 0);
        ctx.imageSmoothingEnabled = false;
        ctx.drawImage(off, it.x, it.y, it.w, it.h);
      } else if (it.kind === "text") {
        ctx.save();
        ctx.font = font(it); ctx.fillStyle = it.fill; ctx.textAlign = ALIGN[it.anchor];
        ctx.translate(it.x, it.y);
        if (it.rotate) ctx.rotate((it.rotate * Math.PI) / 180);
        ctx.fillText(it.text, 0, 0);
        ctx.restore();
      } else if (it.kind === "line") {
        ctx.globalAlpha = it.opacity; ctx.strokeStyle = it.stroke; ctx.lineWidth = it.width;
        ctx.setLineDash(it.dash || []);
        ctx.beginPath(); ctx.moveTo(it.x1, it.y1); ctx.lineTo(it.x2, it.y2); ctx.stroke();
        ctx.globalAlpha = 1; ctx.setLineDash([]);
      } else if (it.kind === "rect") {
        if (it.fill !== "none") { ctx.fillStyle = it.fill; ctx.fillRect(it.x, it.y, it.w, it.h); }
        if (it.stroke) { ctx.strokeStyle = it.stroke; ctx.lineWidth = it.width; ctx.strokeRect(it.x, it.y, it.w, it.h); }
      } else if (it.kind === "scene") {
        ctx.save(); ctx.translate(it.x, it.y); paintScene(ctx, it.sub); ctx.restore();
      } else {
        throw new Error("an SVG-only scene cannot be painted on a canvas");
      }
    }
  }
  // The scene drawn on a page canvas (device pixel ratio), as it is shown.
  function show(canvas, sc) { paintScene(hiDpi(canvas, sc.w, sc.h), sc); }
  // The scene on a new canvas, `scale` device pixels a CSS pixel, on white.
  function toCanvas(sc, scale) {
    const c = document.createElement("canvas");
    c.width = Math.round(sc.w * scale); c.height = Math.round(sc.h * scale);
    const ctx = c.getContext("2d");
    ctx.setTransform(scale, 0, 0, scale, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, sc.w, sc.h);
    paintScene(ctx, sc);
    return c;
  }
  const hasRaw = (sc) => sc.items.some((it) => it.kind === "raw" || (it.kind === "scene" && hasRaw(it.sub)));
  const cellCount = (sc) => sc.items.reduce((a, it) => a + (it.kind === "matrix" ? it.n * it.m
    : it.kind === "scene" ? cellCount(it.sub) : 0), 0);

  // SVG text of a scene. Up to MAX_VECTOR_CELLS matrix cells in all, each cell is a <rect>
  // (in <g class="matrix">, one unit a cell); above, each matrix is an embedded PNG.
  const MAX_VECTOR_CELLS = 512 * 512;
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;");
  const num = (v) => String(Math.round(v * 1000) / 1000);
  const hex = (r, g, b) => `#${((1 << 24) | (r << 16) | (g << 8) | b).toString(16).slice(1)}`;
  function svgItems(sc, vector, out) {
    for (const it of sc.items) {
      if (it.kind === "matrix" && vector) {
        out.push(`<g class="matrix" data-rows="${it.n}" data-cols="${it.m}" shape-rendering="crispEdges" ` +
          `transform="translate(${num(it.x)} ${num(it.y)}) scale(${num(it.w / it.m)} ${num(it.h / it.n)})">`);
        const c = it.rgb;
        for (let i = 0, k = 0; i < it.n; i++) {
          for (let j = 0; j < it.m; j++, k += 3) {
            out.push(`<rect x="${j}" y="${i}" width="1" height="1" fill="${hex(c[k], c[k + 1], c[k + 2])}"/>`);
          }
        }
        out.push("</g>");
      } else if (it.kind === "matrix") {
        const off = document.createElement("canvas");
        off.width = it.m; off.height = it.n;
        const octx = off.getContext("2d");
        octx.putImageData(image(octx, it.rgb, it.n, it.m), 0, 0);
        out.push(`<image class="matrix" data-rows="${it.n}" data-cols="${it.m}" x="${num(it.x)}" y="${num(it.y)}" ` +
          `width="${num(it.w)}" height="${num(it.h)}" preserveAspectRatio="none" ` +
          `style="image-rendering:pixelated" xlink:href="${off.toDataURL("image/png")}"/>`);
      } else if (it.kind === "text") {
        const rot = it.rotate ? ` rotate(${it.rotate})` : "";
        out.push(`<text transform="translate(${num(it.x)} ${num(it.y)})${rot}" font-size="${it.size}" ` +
          `fill="${it.fill}" text-anchor="${it.anchor}"${it.bold ? ' font-weight="600"' : ""}>${esc(it.text)}</text>`);
      } else if (it.kind === "line") {
        out.push(`<line x1="${num(it.x1)}" y1="${num(it.y1)}" x2="${num(it.x2)}" y2="${num(it.y2)}" ` +
          `stroke="${it.stroke}" stroke-width="${it.width}"` + (it.opacity < 1 ? ` stroke-opacity="${num(it.opacity)}"` : "") +
          (it.dash ? ` stroke-dasharray="${it.dash.join(" ")}"` : "") + "/>");
      } else if (it.kind === "rect") {
        out.push(`<rect${it.cls ? ` class="${it.cls}"` : ""} x="${num(it.x)}" y="${num(it.y)}" width="${num(it.w)}" ` +
          `height="${num(it.h)}" fill="${it.fill}"` + (it.stroke ? ` stroke="${it.stroke}" stroke-width="${it.width}"` : "") + "/>");
      } else if (it.kind === "scene") {
        out.push(`<g transform="translate(${num(it.x)} ${num(it.y)})">`);
        svgItems(it.sub, vector, out);
        out.push("</g>");
      } else {
        out.push(it.markup);
      }
    }
  }
  function svg(sc, description = "") {
    const cells = cellCount(sc), vector = cells <= MAX_VECTOR_CELLS, out = [
      '<?xml version="1.0" encoding="UTF-8"?>',
      `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="${num(sc.w)}" ` +
        `height="${num(sc.h)}" viewBox="0 0 ${num(sc.w)} ${num(sc.h)}" font-family="sans-serif">`];
    if (description) out.push(`<desc>${esc(description)}</desc>`);
    if (!vector) {
      out.push(`<!-- ${cells} matrix cells, over ${MAX_VECTOR_CELLS}: each matrix is an embedded PNG ` +
        "<image> (one pixel a cell, drawn pixelated), not one <rect> a cell. -->");
    }
    out.push(`<rect width="${num(sc.w)}" height="${num(sc.h)}" fill="#fff"/>`);
    svgItems(sc, vector, out);
    out.push("</svg>");
    return out.join("\n");
  }

  // Text wrapped to `width` CSS pixels in the scene's font.
  function wrap(text, width, opts) {
    const ctx = document.createElement("canvas").getContext("2d"), lines = [];
    ctx.font = font({ size: 10, bold: false, ...opts });
    let line = "";
    for (const word of String(text).split(/\s+/)) {
      const next = line ? `${line} ${word}` : word;
      if (line && ctx.measureText(next).width > width) { lines.push(line); line = word; } else line = next;
    }
    return line ? lines.concat([line]) : lines;
  }

  // A colour bar as a scene: `tone(f)` (f in [0, 1] along the bar) picks the map's colour,
  // `lo` and `hi` label its ends, `note` follows it.
  function barScene(map, lo, hi, { tone = (f) => f, note = "", width = 160 } = {}) {
    const sc = scene(width + 12 + 7 * note.length, 30), steps = 64, tb = MAPS[map];
    for (let s = 0; s < steps; s++) {
      const i = Math.max(0, Math.min(255, Math.round(tone((s + 0.5) / steps) * 255))) * 3;
      sc.rect(4 + (s * width) / steps, 2, Math.min(width / steps + 0.6, width - (s * width) / steps), 10, { fill: hex(tb[i], tb[i + 1], tb[i + 2]) });
    }
    sc.rect(4, 2, width, 10, { stroke: "#999", width: 0.5 });
    sc.text(lo, 4, 25, { size: 10 });
    sc.text(hi, 4 + width, 25, { size: 10, anchor: "end" });
    if (note) sc.text(note, width + 10, 11, { size: 10, fill: "#555" });
    return sc;
  }
  // A layer x head map as a scene (headMap's colours and numbers, axes numbered).
  function headMapScene(values, { map = "vir", text = null, lo, hi }) {
    const layers = values.length, heads = values[0].length, span = hi - lo || 1;
    const cw = Math.max(12, Math.min(40, Math.floor(560 / heads))), ch = 18, ml = 34, mt = 30;
    const sc = scene(ml + heads * (cw + 2) + 4, mt + layers * (ch + 2) + 2);
    sc.text("head", ml + (heads * (cw + 2)) / 2, 10, { anchor: "middle" });
    sc.text("layer", 10, mt + (layers * (ch + 2)) / 2, { anchor: "middle", rotate: -90 });
    for (let h = 0; h < heads; h++) sc.text(h, ml + h * (cw + 2) + cw / 2, mt - 5, { size: 9, fill: "#777", anchor: "middle" });
    values.forEach((row, l) => {
      const y = mt + l * (ch + 2);
      sc.text(l, ml - 5, y + ch / 2 + 3, { size: 9, fill: "#777", anchor: "end" });
      row.forEach((v, h) => {
        const ok = v !== null && Number.isFinite(v), t = ok ? (v - lo) / span : 0, x = ml + h * (cw + 2);
        const i = Math.max(0, Math.min(255, Math.round(t * 255))) * 3, tb = MAPS[map];
        sc.rect(x, y, cw, ch, { fill: ok ? hex(tb[i], tb[i + 1], tb[i + 2]) : "#cccccc", cls: "cell" });
        const s = text ? text(l, h, v) : "";
        if (s !== "" && s !== undefined) {
          sc.text(s, x + cw / 2, y + ch / 2 + 3, { size: 9, anchor: "middle",
            fill: ok && t > 0.6 && map === "vir" ? "#222" : "#fff" });
        }
      });
    });
    return sc;
  }

  const tip = () => document.getElementById("tip");
  function showTip(ev, text) {
    const t = tip();
    t.textContent = text; t.hidden = false;
    t.style.left = `${ev.clientX + 14}px`; t.style.top = `${ev.clientY + 12}px`;
  }
  function hideTip() { tip().hidden = true; }

  // A layer x head map of per-head numbers as DOM cells (class `cls`), coloured
  // over the finite values' range; `label(l, h, v)` gives each cell's tooltip.
  function headMap(container, values, { cls, label, map = "vir", text = null, onclick = null }) {
    container.replaceChildren();
    const flat = values.flat().filter((v) => v !== null && Number.isFinite(v));
    const lo = Math.min(...flat), hi = Math.max(...flat), span = hi - lo || 1;
    const heads = values[0].length;
    container.style.gridTemplateColumns = `auto repeat(${heads}, 1fr)`;
    container.append(el("div", { class: "axis" }));
    for (let h = 0; h < heads; h++) container.append(el("div", { class: "axis", text: h }));
    values.forEach((row, l) => {
      container.append(el("div", { class: "axis", text: l }));
      row.forEach((v, h) => {
        const ok = v !== null && Number.isFinite(v);
        const cell = el("div", {
          class: cls, "data-layer": l, "data-head": h,
          style: `background:${ok ? css(map, (v - lo) / span) : "#ccc"}`,
          text: text ? text(l, h, v) : "",
          on: {
            mousemove: (ev) => showTip(ev, label(l, h, v)), mouseleave: hideTip,
            click: () => onclick && onclick(l, h),
          },
        });
        if (ok && (v - lo) / span > 0.6 && map === "vir") cell.classList.add("dark-text");
        container.append(cell);
      });
    });
    return { lo, hi };
  }

  function colorbar(container, map, lo, hi, fmt) {
    const bar = el("div", { class: "colorbar" });
    const grad = [0, 0.25, 0.5, 0.75, 1].map((t) => `${css(map, t)} ${t * 100}%`).join(",");
    bar.append(el("span", { text: fmt(lo) }),
      el("span", { class: "grad", style: `background:linear-gradient(to right,${grad})` }),
      el("span", { text: fmt(hi) }));
    container.replaceChildren(bar);
  }

  const fmt = (v, d = 3) => (v === null || v === undefined || !Number.isFinite(v) ? "n/a"
    : Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2) : v.toFixed(d));
  const nextFrame = () => new Promise((r) => setTimeout(r, 0));

  return { el, inflate, matrices, colours, paint, blit, hiDpi, showTip, hideTip, headMap, colorbar,
           css, fmt, nextFrame, scene, show, toCanvas, svg, hasRaw, wrap, barScene, headMapScene };
})();
