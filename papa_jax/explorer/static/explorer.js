// The PAPA attention explorer: views over the data embedded in #papa-data.
// Needs draw.js (inlined before this file). Exposes window.papaExplorer so
// tests and curious users can read the decoded numbers.
"use strict";

(() => {
  const { el, fmt } = Draw;
  const $ = (id) => document.getElementById(id);
  const D = JSON.parse($("papa-data").textContent);
  const M = D.meta, L = M.max_length, LAYERS = M.layers, HEADS = M.heads, TOTAL = LAYERS * HEADS;
  const MIX = new Map(M.mixing_maps || []);  // Context-mixing map name -> what it is.
  const S = { variant: Object.keys(D.means)[0], layer: 0, head: 0, k: 0, example: 0, gamma: 0.5,
              mix: MIX.size ? [...MIX.keys()][0] : null };
  const dec = { means: {}, examples: [] };  // Decoded matrix stacks.
  const shown = {};  // What the head maps show now (for the export): rank, stat.
  const rankOf = {};  // "l,h" -> 1-based position in the ranking.
  (D.ranking ? D.ranking.order : []).forEach(([l, h], i) => { rankOf[`${l},${h}`] = i + 1; });

  // ---- numbers (also the test API) ----
  const meansOf = (v) => dec.means[v];
  function constant(v, l, h) { const m = meansOf(v); return m.values(m.index(l, h)); }
  // The constant matrix on one example's real tokens, rows L1-renormalised (as
  // papa_jax.attention.constant_probs: pad rows/cols dropped).
  function maskedConstant(v, e, l, h) {
    const c = constant(v, l, h), pos = D.examples[e].positions, n = pos.length;
    const out = new Float32Array(n * n);
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let j = 0; j < n; j++) { out[i * n + j] = c[pos[i] * L + pos[j]]; s += Math.abs(out[i * n + j]); }
      s = Math.max(s, 1e-12);
      for (let j = 0; j < n; j++) out[i * n + j] /= s;
    }
    return out;
  }
  // Effective attention is stored only where it differs from the dynamic one.
  const exMat = (e, kind, l, h) => { const m = dec.examples[e][kind] || dec.examples[e].dynamic; return m.values(m.index(l, h)); };
  // A context-mixing map of one layer (all heads): [n, n] on the example's real tokens.
  const mixMat = (e, name, l) => { const m = dec.examples[e].mixing[name]; return m.values(m.index(l)); };
  const mixShort = (name) => MIX.get(name).split(":")[0];
  const staticSet = () => new Set((D.ranking ? D.ranking.order : []).slice(0, M.counts[S.k]).map((p) => `${p}`));

  // ---- constant-matrix grid and the large view ----
  function buildGrid() {
    const grid = $("grid");
    grid.replaceChildren();
    const size = Math.max(18, Math.min(56, Math.floor(620 / HEADS) - 4));
    grid.style.gridTemplateColumns = `auto repeat(${HEADS}, ${size}px)`;
    grid.append(el("div", { class: "axis" }));
    for (let h = 0; h < HEADS; h++) grid.append(el("div", { class: "axis", text: h }));
    for (let l = 0; l < LAYERS; l++) {
      grid.append(el("div", { class: "axis", text: l }));
      for (let h = 0; h < HEADS; h++) {
        const c = el("canvas", {
          class: "cell", width: L, height: L, "data-layer": l, "data-head": h,
          title: `layer ${l}, head ${h}`, style: `width:${size}px;height:${size}px`,
          on: { click: () => select(l, h) },
        });
        grid.append(c);
      }
    }
  }
  async function paintGrid() {
    const m = meansOf(S.variant), cells = [...document.querySelectorAll("#grid canvas.cell")];
    for (let i = 0; i < cells.length; i++) {
      const c = cells[i], k = m.index(+c.dataset.layer, +c.dataset.head);
      Draw.paint(c.getContext("2d"), m.codesOf(k), L, L, { signed: m.signed, peak: m.levels, gamma: S.gamma });
      if (i % 48 === 47) await Draw.nextFrame();  // Keep the page responsive on large models.
    }
  }
  function landmarks() {
    if (!M.papa_layout) return [[0, "[CLS]"]];
    return [[0, "[CLS]"], [Math.floor(L / 2), "sep / seg 2"], [L - 1, "[SEP]"]];
  }
  // The large view of the selected head's constant matrix, with its axes and landmarks.
  function bigScene() {
    const m = meansOf(S.variant), k = m.index(S.layer, S.head), vals = m.values(k);
    const size = 380, ml = 44, mt = 26, cell = size / L, sc = Draw.scene(ml + size + 10, mt + size + 40);
    sc.matrix(vals, L, L, ml, mt, size, size, { signed: m.signed, gamma: S.gamma });
    const step = L <= 32 ? 4 : L <= 64 ? 8 : 16;
    for (let p = 0; p < L; p += step) {
      sc.text(p, ml + (p + 0.5) * cell, mt + size + 12, { anchor: "middle" });
      sc.text(p, ml - 4, mt + (p + 0.5) * cell + 3, { anchor: "end" });
    }
    sc.text("key position", ml + size / 2, mt + size + 28, { anchor: "middle" });
    sc.text("query position", 10, mt + size / 2, { anchor: "middle", rotate: -90 });
    const dash = { stroke: "#145ac8", opacity: 0.8, dash: [3, 3] };
    for (const [p, name] of landmarks()) {
      const x = ml + (p + 0.5) * cell, y = mt + (p + 0.5) * cell;
      sc.line(x, mt, x, mt + size, dash); sc.line(ml, y, ml + size, y, dash);
      sc.text(name, Math.min(Math.max(x, ml + 20), ml + size - 20), mt - 6, { fill: "#145ac8", anchor: "middle" });
    }
    return { sc, m, k, vals, ml, mt, cell };
  }
  function drawBig() {
    const { sc, m, k, vals, ml, mt, cell } = bigScene(), canvas = $("big");
    Draw.show(canvas, sc);
    canvas.onmousemove = (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - ml) / cell), i = Math.floor((ev.clientY - r.top - mt) / cell);
      if (i < 0 || j < 0 || i >= L || j >= L) { Draw.hideTip(); return; }
      Draw.showTip(ev, `query ${i} → key ${j}: ${fmt(vals[i * L + j], 4)} (±${fmt(m.error(k), 4)})`);
    };
    canvas.onmouseleave = Draw.hideTip;
    const mm = D.means[S.variant].meta, r = rankOf[`${S.layer},${S.head}`];
    $("big-title").textContent = `Layer ${S.layer}, head ${S.head}: mean ${S.variant} attention over ` +
      `${mm.num_examples} ${mm.split} examples` + (r ? ` · rank ${r} of ${TOTAL} (constant from k ≥ ${r})` : "");
    const scale = S.gamma === 1 ? "linear" : "square-root";
    Draw.colorbar($("big-bar"), m.signed ? "div" : "seq", m.signed ? -m.scales[k] * m.levels : 0,
      m.scales[k] * m.levels, (v) => fmt(v, 3));
    $("big-bar").append(el("span", { class: "note", text: ` ${scale} colour scale` }));
    $("big-note").textContent = `max ${fmt(m.scales[k] * m.levels, 4)}, stored within ±${fmt(m.error(k), 5)}. ` +
      (M.papa_layout ? `PAPA layout: [CLS] at 0, first separator at ${Math.floor(L / 2)}, final separator at ${L - 1}.`
        : "This workdir did not use the PAPA layout (data.papa_layout=False): only [CLS] at 0 " +
          "has a fixed position, so positions are not aligned across examples.");
  }
  function select(l, h) {
    S.layer = l; S.head = h;
    for (const c of document.querySelectorAll(".selected")) c.classList.remove("selected");
    for (const c of document.querySelectorAll(`[data-layer="${l}"][data-head="${h}"]`)) c.classList.add("selected");
    $("ex-layer").value = l; $("ex-head").value = h;
    drawBig(); drawExample();
  }

  // ---- ranking and schedule ----
  function buildRanking() {
    const slider = $("k-slider");
    slider.max = M.counts.length - 1;
    S.k = M.counts.indexOf(M.counts.reduce((a, b) => (Math.abs(b - TOTAL / 2) < Math.abs(a - TOTAL / 2) ? b : a)));
    slider.value = S.k;
    slider.addEventListener("input", () => setK(+slider.value));
    if (!D.ranking) { $("rank-map").replaceChildren(el("p", { class: "note", text: "No sort/sorted_heads.json in this workdir: run the 'sort' stage." })); return; }
    const lam = D.ranking.lambdas || D.ranking.order.reduce((acc, [l, h], i) => { acc[l][h] = i; return acc; },
      Array.from({ length: LAYERS }, () => Array(HEADS).fill(0)));
    const what = D.ranking.lambdas ? "gate logit λ" : "rank";
    const { lo, hi } = Draw.headMap($("rank-map"), lam, {
      cls: "rank-cell", map: "vir", onclick: select,
      text: HEADS * LAYERS <= 200 ? (l, h) => rankOf[`${l},${h}`] : null,
      label: (l, h, v) => `layer ${l}, head ${h}: ${what} ${fmt(v, 4)}, rank ${rankOf[`${l},${h}`]} of ${TOTAL}`,
    });
    Draw.colorbar($("rank-bar"), "vir", lo, hi, (v) => `${what} ${fmt(v, 3)}`);
    shown.rank = { values: lam, lo, hi, what, text: HEADS * LAYERS <= 200 ? (l, h) => rankOf[`${l},${h}`] : null };
  }
  // Every head ordering side by side: position colours, the slider's constant heads framed.
  function buildOrderings() {
    const box = $("rank-compare");
    box.replaceChildren();
    for (const o of D.orderings || []) {
      const map = el("div", { class: "grid headmap", "data-ordering": o.name });
      const rho = o.spearman == null ? "" : `, Spearman with λ ${fmt(o.spearman, 2)} (p ${fmt(o.p_value, 2)})`;
      box.append(el("figure", {}, el("figcaption", { text: `${o.name}${rho}` }), map));
      Draw.headMap(map, o.positions, {
        cls: "rank-mini", map: "vir", onclick: select,
        label: (l, h, v) => `${o.name}: layer ${l}, head ${h} is number ${v} of ${TOTAL}`,
      });
    }
  }
  function setK(i) {
    S.k = i;
    const keys = staticSet(), k = M.counts[i];
    for (const c of document.querySelectorAll(".rank-cell, #grid canvas.cell")) {
      c.classList.toggle("static", keys.has(`${c.dataset.layer},${c.dataset.head}`));
    }
    for (const o of D.orderings || []) {
      for (const c of document.querySelectorAll(`[data-ordering="${o.name}"] .rank-mini`)) {
        c.classList.toggle("static", o.positions[+c.dataset.layer][+c.dataset.head] <= k);
      }
    }
    $("k-label").textContent = `${k} of ${TOTAL} heads constant (fraction ${fmt(k / TOTAL, 3)}; ` +
      `schedule ${M.fractions.join(", ")})`;
    drawCurve();
  }

  // ---- PAPA curve ----
  function drawCurve() {
    const svg = $("curve"), rows = D.results ? D.results.rows : [];
    svg.replaceChildren();
    if (!rows.length) { svg.append(el("text", { x: 20, y: 40, text: "No results.json: run the 'probe' stage." })); return; }
    const variants = [...new Set(rows.map((r) => r.variant))].sort((a, b) => (a !== "raw") - (b !== "raw"));
    const W = 460, H = 290, ml = 56, mr = 14, mt = 10 + 14 * variants.length, mb = 44;  // Legend on top.
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const ys = rows.flatMap((r) => [r.score, r.band_low, r.band_high,
      r.score_std != null ? r.score - r.score_std : null, r.score_std != null ? r.score + r.score_std : null])
      .filter((v) => v != null && Number.isFinite(v));
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    const pad = (y1 - y0) * 0.08 || 0.05; y0 -= pad; y1 += pad;
    const X = (f) => ml + f * (W - ml - mr), Y = (v) => mt + (1 - (v - y0) / (y1 - y0)) * (H - mt - mb);
    for (let t = 0; t <= 4; t++) {
      const f = t / 4, v = y0 + (t / 4) * (y1 - y0);
      svg.append(el("line", { x1: X(f), x2: X(f), y1: mt, y2: H - mb, class: "gridline" }),
        el("text", { x: X(f), y: H - mb + 14, "text-anchor": "middle", text: f.toFixed(2) }),
        el("line", { x1: ml, x2: W - mr, y1: Y(v), y2: Y(v), class: "gridline" }),
        el("text", { x: ml - 4, y: Y(v) + 3, "text-anchor": "end", text: v.toFixed(3) }));
    }
    svg.append(el("text", { x: (ml + W - mr) / 2, y: H - 8, "text-anchor": "middle", text: "fraction of heads with constant attention" }),
      el("text", { x: 12, y: (mt + H - mb) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(mt + H - mb) / 2})`, text: rows[0].metric }));
    const kf = M.counts[S.k] / TOTAL;
    svg.append(el("line", { x1: X(kf), x2: X(kf), y1: mt, y2: H - mb, class: "k-line" }));
    const colors = ["#d94f3d", "#2166ac", "#1b9e77", "#7570b3"];
    variants.forEach((v, vi) => {
      const col = colors[vi % colors.length];
      const pts = rows.filter((r) => r.variant === v || r.static_heads === 0)
        .sort((a, b) => a.fraction - b.fraction)
        .filter((r, i, a) => i === 0 || r.fraction !== a[i - 1].fraction);
      const band = pts.filter((r) => r.band_low != null && r.band_high != null);
      if (band.length > 1) {
        const path = band.map((r) => `${X(r.fraction)},${Y(r.band_high)}`)
          .concat(band.slice().reverse().map((r) => `${X(r.fraction)},${Y(r.band_low)}`));
        svg.append(el("polygon", { points: path.join(" "), class: "band", fill: col }));
      }
      svg.append(el("polyline", { points: pts.map((r) => `${X(r.fraction)},${Y(r.score)}`).join(" "), stroke: col, class: "curve-line" }));
      for (const r of pts) {
        if (r.score_std != null) {
          const x = X(r.fraction), a = Y(r.score - r.score_std), b = Y(r.score + r.score_std);
          svg.append(el("path", { d: `M${x - 4},${a}H${x + 4}M${x},${a}V${b}M${x - 4},${b}H${x + 4}`, stroke: col, class: "errbar" }));
        }
        const extra = (r.score_std != null ? ` ± ${fmt(r.score_std, 4)} (std)` : "") +
          (r.band_low != null ? `, band [${fmt(r.band_low, 4)}, ${fmt(r.band_high, 4)}]` : "");
        svg.append(el("circle", { cx: X(r.fraction), cy: Y(r.score), r: 4, fill: col, class: "pt" },
          el("title", { text: `${v}: ${r.static_heads}/${r.total_heads} constant, ${r.metric} ${fmt(r.score, 4)}${extra}` })));
      }
      svg.append(el("text", { x: W - mr, y: 12 + 14 * vi, "text-anchor": "end", fill: col, class: "legend", text: `● constant = mean ${v} attention` }));
    });
  }

  // ---- examples ----
  function buildExamples() {
    const list = $("example-list"), search = $("search");
    if (!D.examples.length) { $("sec-examples").append(el("p", { class: "note", text: "No examples stored (explore.examples is empty)." })); return; }
    D.examples.forEach((x, e) => list.append(el("button", {
      class: "example-item", "data-example": e, title: x.text,
      text: `#${x.index}${x.label != null ? ` (label ${x.label})` : ""} · ${x.tokens.length} tokens · ${x.text}`,
      on: { click: () => { S.example = e; drawExample(); } },
    })));
    const filter = () => {
      const q = search.value.trim().toLowerCase();
      let shown = 0;
      for (const b of list.children) {
        const x = D.examples[+b.dataset.example];
        const hit = !q || x.text.toLowerCase().includes(q) || x.tokens.join(" ").toLowerCase().includes(q) || `#${x.index}` === q;
        b.hidden = !hit; shown += hit;
      }
      $("search-count").textContent = `${shown} of ${D.examples.length} stored examples`;
    };
    search.addEventListener("input", filter); filter();
    for (const [id, n] of [["ex-layer", LAYERS], ["ex-head", HEADS]]) {
      for (let i = 0; i < n; i++) $(id).append(el("option", { value: i, text: i }));
      $(id).addEventListener("change", () => select(+$("ex-layer").value, +$("ex-head").value));
    }
    $("line-source").addEventListener("change", drawExample);
  }
  // The per-layer context-mixing panel and its measure selector (explore.mixing).
  function buildMixing() {
    const mixSel = $("mix-method");
    if (!MIX.size) {
      for (const id of ["mix-label", "ex-mixing-fig"]) $(id).hidden = true;
      $("line-source").querySelector('option[value="mixing"]').remove();
      if (D.examples.length) {
        $("mix-note").textContent = "No context-mixing maps stored (explore.mixing is empty, or " +
          "the model does not compute in float32: see the warnings at the top).";
      }
      return;
    }
    for (const [name] of MIX) mixSel.append(el("option", { value: name, text: mixShort(name) }));
    mixSel.value = S.mix;
    mixSel.addEventListener("change", () => { S.mix = mixSel.value; drawExample(); });
  }
  // One example's matrix (n x n tokens) with its word pieces on both axes.
  function tokenScene(vals, toks, signed, peak) {
    const n = toks.length, cell = Math.max(3, Math.min(16, Math.floor(300 / n))), lab = cell >= 7 ? 74 : 8;
    const sc = Draw.scene(lab + n * cell + 4, lab + n * cell + 4);
    sc.matrix(vals, n, n, lab, lab, n * cell, n * cell, { signed, peak, gamma: S.gamma });
    if (lab > 8) {
      const o = { size: Math.min(11, cell), fill: "#222" };
      toks.forEach((t, i) => {
        sc.text(t.slice(0, 11), lab - 3, lab + (i + 0.75) * cell, { ...o, anchor: "end" });
        sc.text(t.slice(0, 11), lab + (i + 0.75) * cell, lab - 3, { ...o, rotate: -90 });
      });
    }
    return { sc, cell, lab };
  }
  const peakOf = (vals) => { let p = 0; for (const v of vals) p = Math.max(p, Math.abs(v)); return p; };
  function tokenMatrix(canvas, vals, toks, signed, title) {
    const n = toks.length, peak = peakOf(vals), { sc, cell, lab } = tokenScene(vals, toks, signed, peak);
    Draw.show(canvas, sc);
    canvas.onmousemove = (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - lab) / cell), i = Math.floor((ev.clientY - r.top - lab) / cell);
      if (i < 0 || j < 0 || i >= n || j >= n) { Draw.hideTip(); return; }
      Draw.showTip(ev, `${title}: ${toks[i]} → ${toks[j]} = ${fmt(vals[i * n + j], 4)}`);
    };
    canvas.onmouseleave = Draw.hideTip;
    return peak;
  }
  // Lines from each query token (left) to each key token (right), opacity by |value|;
  // `hover` (["q" | "k", index]) highlights one token's lines.
  function lineScene(vals, toks, hover = null) {
    const n = toks.length, row = n > 60 ? 10 : 15, sc = Draw.scene(420, n * row + 16), y = (i) => 12 + i * row;
    const peak = peakOf(vals) || 1;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        const v = vals[i * n + j], on = !hover || (hover[0] === "q" ? hover[1] === i : hover[1] === j);
        const a = (Math.abs(v) / peak) * (on ? 0.9 : 0.06);
        if (a < 0.01) continue;
        sc.line(150, y(i) - 3, 270, y(j) - 3, { stroke: v < 0 ? "#2166ac" : "#d94f3d", opacity: a,
                                               width: on && hover ? 2 : 1.2 });
      }
    }
    toks.forEach((t, i) => {
      sc.text(t, 144, y(i), { size: row - 3, anchor: "end", fill: hover && hover[0] === "q" && hover[1] === i ? "#c00" : "#222" });
      sc.text(t, 276, y(i), { size: row - 3, fill: hover && hover[0] === "k" && hover[1] === i ? "#c00" : "#222" });
    });
    return sc;
  }
  function lineView(vals, toks) {
    const canvas = $("lines"), n = toks.length, row = n > 60 ? 10 : 15;
    let hover = null;  // ["q" | "k", index]
    const draw = () => Draw.show(canvas, lineScene(vals, toks, hover));
    canvas.onmousemove = (ev) => {
      const r = canvas.getBoundingClientRect(), x = ev.clientX - r.left;
      const i = Math.round((ev.clientY - r.top - 9) / row);
      const next = i >= 0 && i < n && (x < 150 || x > 270) ? [x < 150 ? "q" : "k", i] : null;
      if (`${next}` !== `${hover}`) { hover = next; draw(); }
    };
    canvas.onmouseleave = () => { hover = null; draw(); };
    draw();
  }
  // The selected example's panels: kind -> [values (n x n), signed, title].
  function exampleMats() {
    const e = S.example, x = D.examples[e], { layer: l, head: h } = S;
    const mats = {
      dynamic: [exMat(e, "dynamic", l, h), false, "input-dependent"],
      constant: [maskedConstant(S.variant, e, l, h), meansOf(S.variant).signed, `constant (mean ${S.variant}), masked`],
      // Without an effective block the panel is the input-dependent one: drawn on its scale.
      effective: [exMat(e, "effective", l, h), Boolean(x.effective), x.effective ? "effective (blue < 0)"
        : "effective (= input-dependent: no more tokens than the head dimension)"],
    };
    if (S.mix) mats.mixing = [mixMat(e, S.mix, l), false, `${mixShort(S.mix)}, layer ${l} (all heads)`];
    return mats;
  }
  function drawExample() {
    if (!D.examples.length) return;
    const e = S.example, x = D.examples[e], { layer: l, head: h } = S;
    for (const b of document.querySelectorAll(".example-item")) b.classList.toggle("active", +b.dataset.example === e);
    const mats = exampleMats();
    if (S.mix) {
      $("mix-note").textContent = `Context mixing of layer ${l}, row: token i, column: token j. ` +
        `${MIX.get(S.mix)}.`;
    }
    for (const [kind, [vals, signed, title]] of Object.entries(mats)) {
      const peak = tokenMatrix($(`ex-${kind}`), vals, x.tokens, signed, title);
      $(`ex-${kind}-title`).textContent = `${title} (max |a| ${fmt(peak, 3)})`;
      $(`ex-${kind}-title`).parentNode.style.maxWidth = $(`ex-${kind}`).style.width;
    }
    const [vals] = mats[$("line-source").value];
    lineView(vals, x.tokens);
    $("ex-title").textContent = `Dev example #${x.index}, layer ${l}, head ${h}: "${x.text}"`;
  }

  // ---- per-head results: every stage's maps, the gates, the scored orderings ----
  function buildStats() {
    const H = D.heads || { maps: [], agreement: [] }, sec = $("sec-stats");
    const sources = {};  // Option value (stage, or stage/subset) -> { text, maps: {label: map} }.
    for (const m of H.maps) {
      const id = m.subset ? `${m.stage}/${m.subset}` : m.stage;
      const n = m.examples == null ? "" : ` (${m.examples}${m.split ? " " + m.split : ""} examples)`;
      const src = sources[id] || (sources[id] = { text: `${m.stage}${m.subset ? ": " + m.subset + " examples" : ""}${n}`, maps: {} });
      src.maps[m.label] = m;
    }
    if (!H.maps.length) {
      sec.append(el("p", { class: "note", text: "No per-head results in this workdir: run a per-head stage (effective, mixing, ablation, finetune, linguistic, sort, orderings)." }));
      return;
    }
    const summary = (m) => {
      const what = m.higher ? `Higher = ${m.higher}.` : "";
      const unit = m.unit ? ` Unit: ${m.unit}.` : "";
      const rows = H.agreement.filter((r) => r.measure === m.key || r.score === m.key).map((r) => {
        const other = r.measure === m.key ? r.score : r.measure;
        return `${other} ${fmt(r.rho, 2)} (p within layers ${fmt(r.p_within_layers, 3)}, Holm ${fmt(r.p_holm, 3)})`;
      });
      return `${m.key}. ${what}${unit}` + (rows.length ? ` Spearman ρ over heads with ${rows.join(", ")}.` : "");
    };
    const subsetSel = $("stat-subset"), mapSel = $("stat-map");
    for (const [k, src] of Object.entries(sources)) subsetSel.append(el("option", { value: k, text: src.text }));
    const draw = () => {
      const maps = sources[subsetSel.value].maps;
      if (!maps[mapSel.value]) { mapSel.replaceChildren(...Object.keys(maps).map((k) => el("option", { value: k, text: k }))); }
      const m = maps[mapSel.value];
      const { lo, hi } = Draw.headMap($("stat-map-grid"), m.values, {
        cls: "stat-cell", map: "vir", onclick: select,
        label: (l, h, v) => `layer ${l}, head ${h}: ${mapSel.value} = ${fmt(v, 4)}`,
      });
      Draw.colorbar($("stat-bar"), "vir", lo, hi, (v) => fmt(v, 3));
      $("stat-summary").textContent = summary(m);
      shown.stat = { m, lo, hi, source: sources[subsetSel.value].text };
      $("stat-title").textContent = `${m.label}: ${sources[subsetSel.value].text}` +
        (m.note ? ` (${m.note})` : "");
    };
    subsetSel.addEventListener("change", draw); mapSel.addEventListener("change", draw); draw();
  }

  // ---- per-position results: each example's [rows, tokens] map (patching per layer and token) ----
  // One example's map: rows (layers) down, its word pieces across, one colour scale centred
  // at 0 for signed maps; `peak`: the largest |value| of the example.
  function tokenMapScene(m, ex, peak) {
    const R = m.rows.length, n = ex.tokens.length, cell = Math.max(9, Math.min(30, Math.floor(760 / n)));
    const left = 8 + 6.5 * Math.max(...m.rows.map((r) => r.length)), top = 12 + 7 * Math.min(18, Math.max(...ex.tokens.map((t) => t.length)));
    const sc = Draw.scene(left + n * cell + 4, top + R * cell + 4);
    const flat = ex.values.flat().map((v) => (v == null ? 0 : v));
    sc.matrix(flat, R, n, left, top, n * cell, R * cell, { signed: m.signed, peak, gamma: 1 });
    m.rows.forEach((r, i) => sc.text(r, left - 4, top + (i + 0.68) * cell, { size: 10, fill: "#222", anchor: "end" }));
    ex.tokens.forEach((t, j) => sc.text(t.slice(0, 18), left + (j + 0.7) * cell, top - 4,
      { size: Math.min(11, cell), fill: "#222", rotate: -90 }));
    return { sc, cell, left, top };
  }
  function buildTokens() {
    const T = D.tokens || [], sec = $("sec-tokens");
    if (!T.length) {
      sec.append(el("p", { class: "note", text: "No per-position results in this workdir: the patching stage writes them (a position site's change per pair, layer and word piece)." }));
      return;
    }
    const mapSel = $("tok-map"), exSel = $("tok-example");
    T.forEach((m, i) => mapSel.append(el("option", { value: i, text: `${m.stage}: ${m.name}` })));
    const fill = () => {
      const m = T[+mapSel.value], keep = Math.min(+exSel.value || 0, m.examples.length - 1);
      exSel.replaceChildren(...m.examples.map((ex, i) => el("option", { value: i, text: ex.title.slice(0, 90) })));
      exSel.value = keep;
    };
    const draw = () => {
      const m = T[+mapSel.value], ex = m.examples[+exSel.value];
      const peak = peakOf(ex.values.flat().map((v) => (v == null ? 0 : v))) || 1;
      const { sc, cell, left, top } = tokenMapScene(m, ex, peak), canvas = $("tok-canvas");
      Draw.show(canvas, sc);
      Draw.hideTip();
      canvas.onmousemove = (e) => {
        const r = canvas.getBoundingClientRect();
        const j = Math.floor((e.clientX - r.left - left) / cell), i = Math.floor((e.clientY - r.top - top) / cell);
        if (i < 0 || j < 0 || i >= m.rows.length || j >= ex.tokens.length) { Draw.hideTip(); return; }
        Draw.showTip(e, `${m.rows[i]}, ${ex.tokens[j]} (position ${j}): ${fmt(ex.values[i][j], 4)} ${m.unit}`);
      };
      canvas.onmouseleave = Draw.hideTip;
      Draw.colorbar($("tok-bar"), m.signed ? "div" : "seq", m.signed ? -peak : 0, peak, (v) => fmt(v, 3));
      $("tok-title").textContent = `${m.label}: ${ex.title}`;
      $("tok-summary").textContent = `${m.key}.${m.unit ? ` Unit: ${m.unit}.` : ""} Rows: ${m.rows.length}; ` +
        `${m.examples.length} examples; colour: linear, ${m.signed ? "centred at 0 over ±" : "0 to "}the example's largest |value|.` +
        (m.note ? ` ${m.note}` : "");
      shown.token = { m, ex, peak };
    };
    mapSel.addEventListener("change", () => { fill(); draw(); });
    exSel.addEventListener("change", draw);
    fill(); draw();
  }

  // ---- export: every panel as a figure (title, drawing, colour bar), SVG or PNG ----
  const MODEL = M.short_model || String(M.model).split("/").pop();
  const slug = (x) => String(x).replace(/[^A-Za-z0-9.-]+/g, "-").replace(/^-+|-+$/g, "");
  const gammaNote = () => (S.gamma === 1 ? "linear colour scale" : "square-root colour scale");
  // Colour-bar tone of a value fraction f along [lo, hi], as `Draw.colours` maps it.
  const tone = (signed) => (f) => (signed ? 0.5 + 0.5 * Math.sign(2 * f - 1) * Math.pow(Math.abs(2 * f - 1), S.gamma)
    : Math.pow(f, S.gamma));
  // A figure: its title wrapped above `body` (a scene), then `bar` (a scene) if any.
  function figure(title, body, bar = null) {
    const w = Math.max(body.w, bar ? Math.min(bar.w, body.w + 200) : 0);
    const lines = Draw.wrap(title, w - 8, { size: 12, bold: true }), top = 8 + 15 * lines.length;
    const sc = Draw.scene(w, top + body.h + (bar ? bar.h + 4 : 0));
    lines.forEach((t, i) => sc.text(t, 4, 16 + 15 * i, { size: 12, bold: true, fill: "#222" }));
    sc.place(body, 0, top);
    if (bar) sc.place(bar, 0, top + body.h + 4);
    return sc;
  }
  const exampleName = () => [`ex${D.examples[S.example].index}`, `layer${S.layer}`];
  const exampleTitle = () => `${MODEL} · ${M.task} · dev example #${D.examples[S.example].index}, layer ${S.layer}`;
  // Panel id -> () => { sc: the figure, name: file name parts (model and task come first) }.
  const FIGURES = {
    grid() {
      const m = meansOf(S.variant), mm = D.means[S.variant].meta;
      const size = Math.max(18, Math.min(56, Math.floor(620 / HEADS) - 4)), ml = 34, mt = 30;
      const body = Draw.scene(ml + HEADS * (size + 2), mt + LAYERS * (size + 2));
      body.text("head", ml + (HEADS * (size + 2)) / 2, 10, { anchor: "middle" });
      body.text("layer", 10, mt + (LAYERS * (size + 2)) / 2, { anchor: "middle", rotate: -90 });
      for (let h = 0; h < HEADS; h++) body.text(h, ml + h * (size + 2) + size / 2, mt - 5, { size: 9, fill: "#777", anchor: "middle" });
      for (let l = 0; l < LAYERS; l++) {
        body.text(l, ml - 5, mt + l * (size + 2) + size / 2 + 3, { size: 9, fill: "#777", anchor: "end" });
        for (let h = 0; h < HEADS; h++) {
          body.matrix(m.codesOf(m.index(l, h)), L, L, ml + h * (size + 2), mt + l * (size + 2), size, size,
            { signed: m.signed, peak: m.levels, gamma: S.gamma });
        }
      }
      const bar = Draw.barScene(m.signed ? "div" : "seq", m.signed ? "-max" : "0", "max",
        { tone: tone(m.signed), note: `each matrix over its own max; ${gammaNote()}` });
      return { sc: figure(`${MODEL} · ${M.task}: mean ${S.variant} attention (constant matrices) over ` +
        `${mm.num_examples} ${mm.split} examples; rows: layers, columns: heads, each query × key position`, body, bar),
      name: ["constant", S.variant] };
    },
    big() {
      const { sc, m, k } = bigScene(), hi = m.scales[k] * m.levels;
      const bar = Draw.barScene(m.signed ? "div" : "seq", fmt(m.signed ? -hi : 0, 3), fmt(hi, 3),
        { tone: tone(m.signed), note: gammaNote() });
      return { sc: figure(`${MODEL} · ${M.task} · ${$("big-title").textContent}`, sc, bar),
               name: [`layer${S.layer}`, `head${S.head}`, `constant-${S.variant}`] };
    },
    "rank-map"() {
      const r = shown.rank, body = Draw.headMapScene(r.values, { lo: r.lo, hi: r.hi, text: r.text });
      const bar = Draw.barScene("vir", `${r.what} ${fmt(r.lo, 3)}`, `${fmt(r.hi, 3)}`, { width: 200 });
      return { sc: figure(`${MODEL} · ${M.task}: head ranking, ${r.what} per head` +
        (r.text ? " (numbers: rank, 1 = made constant first)" : ""), body, bar), name: ["ranking"] };
    },
    curve() { return { sc: curveFigure(), name: ["papa-curve"] }; },
    lines() {
      const [vals, , title] = exampleMats()[$("line-source").value];
      const body = lineScene(vals, D.examples[S.example].tokens);
      const what = $("line-source").value === "mixing" ? title : `head ${S.head}, ${title}`;
      return { sc: figure(`${exampleTitle()}, ${what}: lines from query (left) to key (right) tokens; ` +
        "opacity ∝ |value|, blue < 0", body), name: [...exampleName(), `head${S.head}`, `lines-${$("line-source").value}`] };
    },
    "stat-map-grid"() {
      const { m, lo, hi, source } = shown.stat, body = Draw.headMapScene(m.values, { lo, hi });
      const bar = Draw.barScene("vir", fmt(lo, 3), fmt(hi, 3), { width: 200, note: m.unit || "" });
      return { sc: figure(`${MODEL} · ${M.task}: ${m.label} per head (${source})` +
        (m.higher ? `; higher = ${m.higher}` : ""), body, bar), name: ["heads", m.key] };
    },
    "token-map"() {
      const { m, ex, peak } = shown.token, { sc } = tokenMapScene(m, ex, peak);
      const bar = Draw.barScene(m.signed ? "div" : "seq", fmt(m.signed ? -peak : 0, 3), fmt(peak, 3),
        { width: 200, note: `linear colour scale${m.unit ? "; " + m.unit : ""}` });
      return { sc: figure(`${MODEL} · ${M.task}: ${m.label}; ${ex.title}`, sc, bar),
               name: ["positions", m.key, ex.title.split(" ").slice(0, 2).join("")] };
    },
  };
  for (const kind of ["dynamic", "constant", "effective", "mixing"]) {
    FIGURES[`ex-${kind}`] = () => {
      const [vals, signed, title] = exampleMats()[kind], peak = peakOf(vals);
      const { sc } = tokenScene(vals, D.examples[S.example].tokens, signed, peak);
      const bar = Draw.barScene(signed ? "div" : "seq", fmt(signed ? -peak : 0, 3), fmt(peak, 3),
        { tone: tone(signed), note: gammaNote(), width: 120 });
      const head = kind === "mixing" ? "" : `, head ${S.head}`;
      return { sc: figure(`${exampleTitle()}${head}: ${title}`, sc, bar),
               name: kind === "mixing" ? [...exampleName(), S.mix] : [...exampleName(), `head${S.head}`, kind] };
    };
  }
  const PANELS = Object.keys(FIGURES);
  const available = (id) => (id.startsWith("ex-") || id === "lines" ? D.examples.length > 0 && (id !== "ex-mixing" || MIX.size > 0)
    : id === "rank-map" ? Boolean(D.ranking) : id === "curve" ? Boolean(D.results && D.results.rows.length)
      : id === "stat-map-grid" ? Boolean(shown.stat) : id === "token-map" ? Boolean(shown.token) : true);

  // The PAPA curve (an SVG on the page), its computed styles written as attributes.
  function curveFigure() {
    const src = $("curve"), W = +src.getAttribute("width"), H = +src.getAttribute("height");
    const body = Draw.scene(W, H), clone = src.cloneNode(true);
    const from = [...src.querySelectorAll("*")], to = [...clone.querySelectorAll("*")];
    from.forEach((node, i) => {
      const cs = getComputedStyle(node);
      for (const p of ["fill", "stroke", "stroke-width", "stroke-dasharray", "opacity", "font-size"]) {
        to[i].setAttribute(p, cs.getPropertyValue(p).replace(/px/g, "").replace(/,\s*/g, " "));
      }
      to[i].removeAttribute("class");
    });
    const xml = new XMLSerializer();
    body.raw([...clone.childNodes].map((c) => xml.serializeToString(c).replace(/ xmlns="[^"]*"/, "")).join("\n"));
    return figure(`${MODEL} · ${M.task}: PAPA curve, probe score vs fraction of heads with constant ` +
      "attention (grey: the slider's step)", body);
  }

  const exportScale = () => Math.max(2, window.devicePixelRatio || 1);
  const panelFigure = (id) => {
    if (!FIGURES[id]) throw new Error(`no panel ${id}; panels: ${PANELS.join(", ")}`);
    if (!available(id)) throw new Error(`panel ${id} shows nothing in this workdir`);
    return FIGURES[id]();
  };
  const fileName = (fig, format) => `${[MODEL, M.task, ...fig.name].map(slug).filter(Boolean).join("_")}.${format}`;
  const exportName = (id, format) => fileName(panelFigure(id), format);
  // The figure on a canvas at 2x its CSS size (or the device pixel ratio if higher).
  async function exportCanvas(sc) {
    const scale = exportScale();
    if (!Draw.hasRaw(sc)) return Draw.toCanvas(sc, scale);
    const img = new Image();  // SVG markup inside (the curve): the browser draws the SVG.
    img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(Draw.svg(sc))}`;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = Math.round(sc.w * scale); c.height = Math.round(sc.h * scale);
    c.getContext("2d").drawImage(img, 0, 0, c.width, c.height);
    return c;
  }
  const svgNote = () => `PAPA explorer, ${M.model} on ${M.task}, written ${new Date().toISOString()} from ${M.workdir}`;
  // A panel as SVG text or a PNG data URL (`format`: "svg" or "png").
  async function exportPanel(id, format) {
    const { sc } = panelFigure(id);
    if (format === "svg") return Draw.svg(sc, svgNote());
    if (format === "png") return (await exportCanvas(sc)).toDataURL("image/png");
    throw new Error(`format ${format}: use svg or png`);
  }
  // Saves a panel as a file (a Blob and an <a download>).
  async function download(id, format) {
    const fig = panelFigure(id), name = fileName(fig, format);
    let blob;
    if (format === "svg") blob = new Blob([Draw.svg(fig.sc, svgNote())], { type: "image/svg+xml" });
    else {
      const c = await exportCanvas(fig.sc);
      blob = await new Promise((ok) => c.toBlob(ok, "image/png"));
    }
    const url = URL.createObjectURL(blob), a = el("a", { href: url, download: name });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    return name;
  }
  function showError(text) { const box = $("error"); box.hidden = false; box.textContent = text; }
  function buildExport() {
    for (const box of document.querySelectorAll(".export[data-panel]")) {
      const id = box.dataset.panel, ok = available(id);
      box.replaceChildren(...["svg", "png"].map((f) => el("button", {
        class: "export-btn", type: "button", "data-format": f, disabled: !ok,
        title: ok ? `Download this panel as ${f === "svg" ? "SVG (vector)" : `PNG (${exportScale()}x)`}` : "Nothing to export",
        text: f.toUpperCase(),
        on: { click: () => download(id, f).catch((err) => showError(`Export failed: ${err.message}`)) },
      })));
    }
  }

  // ---- start-up ----
  function header() {
    const warn = (M.warnings || []).map((w) => el("p", { class: "warn", text: w }));
    $("meta").replaceChildren(el("span", { text: `${M.model} · ${M.task} · ${LAYERS} layers × ${HEADS} heads · L = ${L} · ` +
      (M.papa_layout ? "PAPA layout" : "standard layout (not the PAPA layout)") }), ...warn);
    const vs = $("variant");
    for (const v of Object.keys(D.means)) vs.append(el("option", { value: v, text: `mean ${v} attention` }));
    vs.addEventListener("change", async () => { S.variant = vs.value; await paintGrid(); drawBig(); drawExample(); });
    $("gamma").addEventListener("change", async () => { S.gamma = +$("gamma").value; await paintGrid(); drawBig(); drawExample(); });
    $("notes").append(el("p", { text: M.quantization }));
  }
  async function main() {
    if (typeof DecompressionStream === "undefined") throw new Error("This browser lacks DecompressionStream (needs Chrome 80+, Firefox 113+ or Safari 16.4+).");
    header();
    const jobs = Object.entries(D.means).map(async ([v, rec]) => { dec.means[v] = await Draw.matrices(rec); });
    D.examples.forEach((x, e) => jobs.push((async () => {
      dec.examples[e] = { dynamic: await Draw.matrices(x.dynamic),
                          effective: x.effective ? await Draw.matrices(x.effective) : null, mixing: {} };
      for (const [name, rec] of Object.entries(x.mixing || {})) dec.examples[e].mixing[name] = await Draw.matrices(rec);
    })()));
    await Promise.all(jobs);
    buildGrid(); buildRanking(); buildOrderings(); buildExamples(); buildMixing(); buildStats(); buildTokens();
    buildExport();
    setK(S.k); select(0, 0);
    await paintGrid();
    window.papaExplorer.loadMs = performance.now();
    $("load-time").textContent = `Decoded and drawn ${fmt(window.papaExplorer.loadMs / 1000, 2)} s after the page started loading.`;
    document.body.dataset.ready = "1";
  }
  window.papaExplorer = {
    data: D, state: S, constant: (v, l, h) => Array.from(constant(v, l, h)),
    maskedConstant: (v, e, l, h) => Array.from(maskedConstant(v, e, l, h)),
    dynamic: (e, l, h) => Array.from(exMat(e, "dynamic", l, h)),
    effective: (e, l, h) => Array.from(exMat(e, "effective", l, h)),
    mixing: (e, name, l) => Array.from(mixMat(e, name, l)),
    staticHeads: () => [...staticSet()], select, setK,
    // Export (docs/explorer.md): panel ids, a panel as SVG text or PNG data URL, its file name
    // and CSS size, and the download its buttons start.
    panels: PANELS, exportPanel, exportName, download,
    panelSize: (id) => { const { sc } = panelFigure(id); return [sc.w, sc.h]; },
  };
  window.papaExplorer.ready = main().catch((err) => {
    const box = $("error");
    box.hidden = false; box.textContent = `The explorer failed to load: ${err.message}`;
    throw err;
  });
})();
