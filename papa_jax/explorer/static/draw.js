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

  // Paints values (any array, n x m) into an n x m ImageData. Non-negative
  // matrices use the sequential map over [0, peak] (sqrt-compressed when
  // gamma is 0.5); signed ones the diverging map over [-peak, peak].
  function paint(ctx, vals, n, m, { signed = false, peak = null, gamma = 1 } = {}) {
    let p = peak;
    if (p === null) { p = 0; for (const v of vals) p = Math.max(p, Math.abs(v)); }
    p = p || 1;
    const img = ctx.createImageData(m, n), tb = signed ? MAPS.div : MAPS.seq;
    for (let i = 0; i < n * m; i++) {
      let t = vals[i] / p;
      t = signed ? 0.5 + 0.5 * Math.sign(t) * Math.pow(Math.min(Math.abs(t), 1), gamma)
        : Math.pow(Math.max(0, Math.min(t, 1)), gamma);
      const c = Math.round(t * 255) * 3;
      img.data[i * 4] = tb[c]; img.data[i * 4 + 1] = tb[c + 1]; img.data[i * 4 + 2] = tb[c + 2];
      img.data[i * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
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

  return { el, inflate, matrices, paint, blit, hiDpi, showTip, hideTip, headMap, colorbar,
           css, fmt, nextFrame };
})();
