// The attention page: draws the heatmap of the chosen layer, head and view from the data that
// page.py embedded (window.PAGE), shows a cell's numbers on hover, lists each query's entropy
// and top keys, and switches every label between English and Chinese (remembered in the page).
// With a key/value cache policy (page.cache), it also draws what the cache held at the chosen
// decoding step: the text's tokens (dropped ones struck through), the memory and the weights.
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const svgNS = "http://www.w3.org/2000/svg";
  const state = { layer: 0, head: 0, view: "weights", lang: "en" };
  // The reader's language: the page's address (#lang=zh, kept by a reload), else the one chosen
  // on an earlier visit (localStorage, which Chromium may fail to hand a file:// page), else the
  // page's own. The address is the page's only when it is the whole document (<html
  // data-minitensor-page>), not a notebook's output cell.
  const ownsAddress = document.documentElement.hasAttribute("data-minitensor-page");
  const inAddress = ownsAddress ? /(?:^#|&)lang=([\w-]+)/.exec(location.hash) : null;
  let remembered = null;
  try { remembered = localStorage.getItem("minitensor-lang"); } catch (e) { /* file:// may refuse storage */ }
  state.lang = (inAddress && page.labels[inAddress[1]] ? inAddress[1] : null) || remembered || page.lang;

  const t = (key) => (page.labels[state.lang] || page.labels.en)[key] || key;
  const el = (id) => document.getElementById(id);

  function translate() {
    document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-label]").forEach((node) => { node.textContent = t(node.dataset.label); });
    el("lang").value = state.lang;
    fillLayers();
    if (page.cache) fillCache();
  }

  function fillLayers() {
    const select = el("layer");
    select.innerHTML = "";
    page.layers.forEach((layer, i) => {
      const option = document.createElement("option");
      option.value = i;
      option.textContent = t(layer.kind) + (layer.block ? " · " + t("block") + " " + layer.block : "");
      select.appendChild(option);
    });
    select.value = state.layer;
    fillHeads();
  }

  function fillHeads() {
    const select = el("head");
    select.innerHTML = "";
    const layer = page.layers[state.layer];
    for (let h = 0; h < layer.weights.length; h++) {
      const option = document.createElement("option");
      option.value = h;
      option.textContent = t("head") + " " + (h + 1);
      select.appendChild(option);
    }
    state.head = Math.min(state.head, layer.weights.length - 1);
    select.value = state.head;
    el("view-bias").disabled = !layer.bias;
    if (!layer.bias && state.view === "bias") state.view = "weights";
    el("view").value = state.view;
    draw();
  }

  function colour(value, low, high) {
    if (!isFinite(value)) return "#ffffff";
    const x = high > low ? (value - low) / (high - low) : 0;
    const light = Math.round(96 - 62 * x);  // a single blue hue, darker = larger
    return "hsl(215, 70%, " + light + "%)";
  }

  function draw() {
    const layer = page.layers[state.layer];
    const matrix = layer[state.view] ? layer[state.view][state.view === "bias" ? Math.min(state.head, layer.bias.length - 1) : state.head] : null;
    const weights = layer.weights[state.head], scores = layer.scores[state.head];
    const allowed = layer.allowed[state.head];
    const rows = layer.queries, cols = layer.keys;
    const cell = 22, left = 90, top = 70;
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("width", left + cols.length * cell + 10);
    svg.setAttribute("height", top + rows.length * cell + 10);
    svg.setAttribute("id", "heatmap");
    const open = allowed.flat();
    const finite = matrix.flat().filter((v, k) => v !== null && open[k]);  // the colour scale: allowed cells
    const low = Math.min(...finite), high = Math.max(...finite);
    cols.forEach((token, j) => {
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("transform", "translate(" + (left + j * cell + cell / 2 + 4) + "," + (top - 6) + ") rotate(-60)");
      label.textContent = token;
      svg.appendChild(label);
    });
    rows.forEach((token, i) => {
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("x", left - 6);
      label.setAttribute("y", top + i * cell + cell / 2 + 4);
      label.setAttribute("text-anchor", "end");
      label.textContent = token;
      svg.appendChild(label);
      cols.forEach((key, j) => {
        const rect = document.createElementNS(svgNS, "rect");
        const value = matrix[i][j];
        rect.setAttribute("x", left + j * cell);
        rect.setAttribute("y", top + i * cell);
        rect.setAttribute("width", cell - 1);
        rect.setAttribute("height", cell - 1);
        rect.setAttribute("class", allowed[i][j] ? "cell" : "cell masked");
        rect.setAttribute("fill", allowed[i][j] ? colour(value === null ? -Infinity : value, low, high) : "#e4e4e4");
        rect.dataset.row = i;
        rect.dataset.col = j;
        rect.dataset.weight = weights[i][j];
        rect.dataset.score = scores[i][j] === null ? "-inf" : scores[i][j];
        rect.addEventListener("mouseenter", () => hover(i, j));
        svg.appendChild(rect);
      });
    });
    el("heatmap-box").replaceChildren(svg);
    el("tooltip").textContent = t("hover");
    listQueries(weights, allowed, rows, cols);
  }

  function hover(i, j) {
    const layer = page.layers[state.layer];
    const score = layer.scores[state.head][i][j];
    const parts = [
      t("query") + " " + (i + 1) + " “" + layer.queries[i] + "” → " + t("key") + " " + (j + 1) + " “" + layer.keys[j] + "”",
      t("score") + " " + (score === null ? "−∞" : score.toFixed(4)),
      t("weights") + " " + layer.weights[state.head][i][j].toFixed(4),
    ];
    if (layer.bias) parts.push(t("bias") + " " + fmt(layer.bias[Math.min(state.head, layer.bias.length - 1)][i][j]));
    if (!layer.allowed[state.head][i][j]) parts.push(t("masked"));
    el("tooltip").textContent = parts.join(" · ");
  }

  const fmt = (v) => (v === null ? "−∞" : v.toFixed(4));

  function listQueries(weights, allowed, rows, cols) {
    const list = el("queries");
    list.innerHTML = "";
    rows.forEach((token, i) => {
      let entropy = 0;
      weights[i].forEach((w) => { if (w > 0) entropy -= w * Math.log(w); });
      const top = weights[i].map((w, j) => [w, j]).filter(([w, j]) => allowed[i][j]).sort((a, b) => b[0] - a[0]).slice(0, 3);
      const item = document.createElement("li");
      item.textContent = "“" + token + "”: " + t("entropy") + " " + entropy.toFixed(3) + " · " + t("top") + " " +
        top.map(([w, j]) => "“" + cols[j] + "” " + w.toFixed(3)).join(", ");
      list.appendChild(item);
    });
  }

  // -- the key/value cache, step by step ---------------------------------------------------------
  const cacheState = page.cache ? { step: page.cache.steps.length - 1, block: 0 } : null;  // the last step: the most dropped

  function fillCache() {
    const tokens = page.cache.tokens;
    const steps = el("cache-step");
    steps.innerHTML = "";
    page.cache.steps.forEach((step, i) => {
      const option = document.createElement("option");
      option.value = i;
      const next = step.query + 1 < tokens.length ? " → “" + tokens[step.query + 1] + "”" : "";
      option.textContent = (i + 1) + " · “" + tokens[step.query] + "”" + next;
      steps.appendChild(option);
    });
    steps.value = cacheState.step;
    const blocks = el("cache-block");
    blocks.innerHTML = "";
    page.cache.steps[0].blocks.forEach((_, b) => {
      const option = document.createElement("option");
      option.value = b;
      option.textContent = t("block") + " " + (b + 1);
      blocks.appendChild(option);
    });
    blocks.value = cacheState.block;
    drawCache();
  }

  const bytes = (n) => (n < 1024 ? n + " B" : (n / 1024).toFixed(1) + " KiB");

  function drawCache() {
    const step = page.cache.steps[cacheState.step], block = step.blocks[cacheState.block];
    const held = new Map(block.kept.map((p, j) => [p, j]));  // text position -> column
    const sinks = new Set(block.sinks);
    const heads = block.weights.length;
    const mean = block.kept.map((_, j) => block.weights.reduce((sum, row) => sum + row[j], 0) / heads);
    const high = Math.max(...mean.filter((w, j) => block.attended[j]), 1e-9);
    const total = step.blocks.reduce((sum, b) => sum + b.bytes, 0);
    const full = step.blocks.reduce((sum, b) => sum + b.full_bytes, 0);
    el("cache-memory").textContent = t("memory") + ": " + bytes(block.bytes) + " (" + t("tokens_held") + " " +
      block.kept.length + " / " + (step.query + 1) + ") · " + t("all_blocks") + " " + bytes(total) + " · " +
      t("full_memory") + " " + bytes(full);
    const strip = el("cache-tokens");
    strip.innerHTML = "";
    for (let p = 0; p <= step.query; p++) {
      const span = document.createElement("span");
      const j = held.get(p);
      span.textContent = page.cache.tokens[p];
      span.dataset.position = p;
      if (j === undefined) {
        span.className = "dropped";
        span.title = t("dropped") + " · " + t("text_position") + " " + p;
      } else {
        span.className = !block.attended[j] ? "not_seen" : sinks.has(p) ? "in_cache sink" : "in_cache";
        span.dataset.weight = mean[j];
        if (block.attended[j]) span.style.background = colour(mean[j], 0, high);
        if (block.attended[j] && mean[j] / high > 0.6) span.style.color = "#fff";
        span.title = t(block.attended[j] ? (sinks.has(p) ? "sink" : "in_cache") : "not_seen") + " · " +
          t("text_position") + " " + p + " · " + t("cache_position") + " " + block.positions[j] + " · " +
          t("weights") + " " + mean[j].toFixed(4);
      }
      strip.appendChild(span);
    }
    drawCacheHeatmap(block);
  }

  function drawCacheHeatmap(block) {
    const cell = 22, left = 90, top = 70;
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("width", left + block.kept.length * cell + 10);
    svg.setAttribute("height", top + block.weights.length * cell + 10);
    svg.setAttribute("id", "cache-heatmap");
    const open = block.weights.flatMap((row) => row.filter((w, j) => block.attended[j]));
    const low = Math.min(...open), high = Math.max(...open);
    block.kept.forEach((p, j) => {
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("transform", "translate(" + (left + j * cell + cell / 2 + 4) + "," + (top - 6) + ") rotate(-60)");
      label.textContent = page.cache.tokens[p];
      if (block.sinks.includes(p)) label.setAttribute("class", "sink");
      svg.appendChild(label);
    });
    block.weights.forEach((row, h) => {
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("x", left - 6);
      label.setAttribute("y", top + h * cell + cell / 2 + 4);
      label.setAttribute("text-anchor", "end");
      label.textContent = t("head") + " " + (h + 1);
      svg.appendChild(label);
      row.forEach((w, j) => {
        const rect = document.createElementNS(svgNS, "rect");
        rect.setAttribute("x", left + j * cell);
        rect.setAttribute("y", top + h * cell);
        rect.setAttribute("width", cell - 1);
        rect.setAttribute("height", cell - 1);
        rect.setAttribute("class", block.attended[j] ? "cell" : "cell masked");
        rect.setAttribute("fill", block.attended[j] ? colour(w, low, high) : "#e4e4e4");
        rect.dataset.head = h;
        rect.dataset.position = block.kept[j];
        rect.dataset.weight = w;
        const title = document.createElementNS(svgNS, "title");
        title.textContent = t("head") + " " + (h + 1) + " · “" + page.cache.tokens[block.kept[j]] + "” · " +
          t("text_position") + " " + block.kept[j] + " · " + t("cache_position") + " " + block.positions[j] +
          " · " + t("weights") + " " + w.toFixed(4);
        rect.appendChild(title);
        svg.appendChild(rect);
      });
    });
    el("cache-heatmap-box").replaceChildren(svg);
  }

  if (page.cache) {
    el("cache-step").addEventListener("change", (e) => { cacheState.step = +e.target.value; drawCache(); });
    el("cache-block").addEventListener("change", (e) => { cacheState.block = +e.target.value; drawCache(); });
  }

  el("layer").addEventListener("change", (e) => { state.layer = +e.target.value; fillHeads(); });
  el("head").addEventListener("change", (e) => { state.head = +e.target.value; draw(); });
  el("view").addEventListener("change", (e) => { state.view = e.target.value; draw(); });
  el("lang").addEventListener("change", (e) => {
    state.lang = e.target.value;
    if (ownsAddress) location.replace("#lang=" + state.lang);  // no new history entry, no load
    try { localStorage.setItem("minitensor-lang", state.lang); } catch (err) { /* file:// may refuse storage */ }
    translate();
  });
  translate();
})();
