// The page at / of `linearrag serve` (docs/serving.md#the-page): asks the server's explain route and draws how each
// hit was reached. No build step and no library: the drawing is plain SVG. It computes nothing of its own: the
// limits come from /openapi.json, the hits and every number from /v1/explain or /v1/indexes/{name}/explain, and
// the key stays in this page (sent as the API's Authorization header, stored nowhere).
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const MAX_PATHS = 5; // paths drawn per hit (the rest counted): more make the drawing unreadable
const state = { store: false, ready: false };

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("key").value.trim();
  if (key) h.authorization = "Bearer " + key;
  return h;
}

// The API's error as one line per item: "STATUS: detail" or, for a 422, "STATUS: loc: msg" for each field.
function errorText(status, body) {
  const detail = body && body.detail !== undefined ? body.detail : body;
  if (Array.isArray(detail)) {
    return detail.map((d) => `${status}: ${(d.loc || []).join(".")}: ${d.msg}`).join("\n");
  }
  return `${status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`;
}

function showError(text) {
  const e = $("error");
  e.textContent = text;
  e.hidden = !text;
}

async function getJson(url, options) {
  const resp = await fetch(url, options);
  let body = null;
  try {
    body = await resp.json();
  } catch (err) {
    body = { detail: resp.statusText };
  }
  if (!resp.ok) throw new Error(errorText(resp.status, body));
  return body;
}

// The form's limits from the request schema the server publishes (its --max-question-chars, --max-questions,
// --max-top-k, the settings' ranges): shown beside the fields; the server still checks them (422 shown here).
function applyLimits(spec) {
  const path = spec.paths["/v1/indexes/{name}/explain"] || spec.paths["/v1/explain"];
  state.store = "/v1/indexes/{name}/explain" in spec.paths;
  if (!path) throw new Error("this server has no explain route (its engine host cannot explain hits)");
  const schema = path.post.requestBody.content["application/json"].schema;
  const p = schema.properties;
  const opt = (x) => (x.anyOf ? x.anyOf.find((a) => a.type !== "null") : x);
  const topK = opt(p.top_k), delta = opt(p.delta), mode = opt(p.mode);
  $("top_k").min = topK.minimum; $("top_k").max = topK.maximum;
  $("delta").min = delta.minimum; $("delta").max = delta.maximum;
  const sel = $("mode");
  sel.length = 1;
  for (const m of mode.enum) sel.add(new Option(m, m));
  $("limits").textContent = `At most ${p.question.maxLength} characters a question, ${p.questions.maxItems} ` +
    `questions, top_k ${topK.minimum}..${topK.maximum} (this server's limits).`;
}

async function connect() {
  showError("");
  try {
    applyLimits(await getJson("openapi.json", { headers: headers() }));
    if (state.store) {
      const got = await getJson("v1/indexes", { headers: headers() });
      const sel = $("index");
      const was = sel.value;
      sel.length = 0;
      for (const ix of got.indexes) sel.add(new Option(`${ix.name} (${ix.status})`, ix.name));
      if (was) sel.value = was;
      $("index-field").hidden = false;
    }
    state.ready = true;
  } catch (err) {
    state.ready = false;
    showError(err.message);
  }
}

function body() {
  const text = $("questions").value;
  const lines = text.split("\n").filter((l) => l.trim());
  // one line: "question"; several: "questions"; nothing typed: sent as it is, and the server's 422 is shown
  const b = lines.length > 1 ? { questions: lines } : { question: lines.length ? lines[0] : text };
  b.include_text = true;
  const num = (id, parse) => {
    const v = $(id).value.trim();
    if (v !== "") b[id] = parse(v);
  };
  num("top_k", Number);
  num("delta", Number);
  if ($("mode").value) b.mode = $("mode").value;
  if ($("rerank").value) b.rerank = $("rerank").value === "true";
  return b;
}

// body[data-state]: "asking", then "shown" or "error" (what a test waits for)
async function ask(event) {
  event.preventDefault();
  document.body.dataset.state = "asking";
  if (!state.ready) await connect();
  if (!state.ready) {
    document.body.dataset.state = "error";
    return;
  }
  showError("");
  $("status").textContent = "asking...";
  const url = state.store ? `v1/indexes/${encodeURIComponent($("index").value)}/explain` : "v1/explain";
  try {
    const got = await getJson(url, { method: "POST", headers: headers(), body: JSON.stringify(body()) });
    render(got.results);
    $("status").textContent = "";
    document.body.dataset.state = "shown";
  } catch (err) {
    // the question, the key and the settings stay as typed, and so do the results shown before
    $("status").textContent = "";
    showError(err.message);
    document.body.dataset.state = "error";
  }
}

// ------------------------------------------------------------------------------------------ results
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const fmt = (x) => (x === null || x === undefined ? "" : Number(x).toPrecision(4));

function render(results) {
  const out = $("results");
  out.textContent = "";
  for (const r of results) {
    const sec = el("section", "question");
    sec.append(el("h2", null, r.question));
    const seeds = (r.seeds || []).map(([n, s]) => `${n} (${fmt(s)})`).join(", ");
    sec.append(el("p", "seeds", r.dense_fallback ? "No entity found: dense retrieval." :
      `Question entities: ${(r.question_entities || []).join(", ") || "none"}. Seeds: ${seeds || "none"}.`));
    const ol = el("ol", "hits");
    r.hits.forEach((h, i) => ol.append(hitCard(r, h, i)));
    sec.append(ol);
    out.append(sec);
  }
}

function hitCard(r, h, i) {
  const li = el("li", "hit");
  li.dataset.title = h.title;
  const found = r.found ? r.found[i] : null;
  const head = el("div", "hit-head");
  head.append(el("span", "title", h.title || String(h.id)), el("span", "score", `score ${fmt(h.score)}`));
  if (found && found.round) head.append(el("span", "round", `round ${found.round} (rank ${found.round_rank} there)`));
  const rr = r.rerank && r.rerank.find((x) => x.id === h.id);
  if (rr) head.append(el("span", "rerank", `reranker ${fmt(rr.reranker_logit)}, graph rank ${rr.graph_rank}`));
  li.append(head);
  const text = el("p", "passage-text", h.text);
  text.hidden = true;
  const paths = r.paths ? r.paths[i] : [];
  li.append(drawing(r.question, h, found, paths, () => { text.hidden = !text.hidden; }));
  if (paths.length > MAX_PATHS) li.append(el("p", "more", `${paths.length - MAX_PATHS} more paths not drawn`));
  if (!paths.length) li.append(el("p", "more", "no entity of the question's reached this passage: PageRank alone"));
  li.append(text);
  return li;
}

// ------------------------------------------------------------------------------------------ the drawing
// Columns left to right: question, seed entities, sentences, entities (and a second sentence and entity for a
// two-hop path), passage. A node appears once per column; each edge is labelled with the number the engine
// computed for the node it enters: cos (a seed's cosine with a question entity), sigma (a sentence's with the
// question), a (an entity's activation) or w (a chain seed's weight).
const FIRST_COLUMN = { seed: 1, sentence: 2, entity: 3 };

function label(n) {
  return n.kind === "sentence" || n.kind === "question" ? n.text : n.name;
}

function weight(n) {
  if (n.kind === "seed") return `cos ${fmt(n.score)}`;
  if (n.kind === "sentence") return `σ ${fmt(n.sigma)}`;
  return n.weight !== undefined ? `w ${fmt(n.weight)}` : `a ${fmt(n.activation)}`;
}

function pick(paths) {
  // the first MAX_PATHS, activation and chain paths in turn (each list as the server ordered it)
  const a = paths.filter((p) => p.via === "activation"), c = paths.filter((p) => p.via !== "activation");
  const out = [];
  while (out.length < MAX_PATHS && (a.length || c.length)) {
    if (c.length) out.push(c.shift());
    if (a.length && out.length < MAX_PATHS) out.push(a.shift());
  }
  return out;
}

function drawing(question, hit, found, paths, onPassage) {
  const cols = [[{ kind: "question", text: question }]];
  const index = new Map();
  const edges = [];
  const node = (col, n) => {
    const key = `${col}|${n.kind}|${label(n)}`;
    if (!index.has(key)) {
      while (cols.length <= col) cols.push([]);
      cols[col].push(n);
      index.set(key, { col, row: cols[col].length - 1, n });
    }
    return index.get(key);
  };
  const q = { col: 0, row: 0, n: cols[0][0] };
  const chosen = pick(paths);
  const ends = [];
  for (const p of chosen) {
    let prev = q;
    let col = FIRST_COLUMN[p.nodes[0].kind];
    for (const n of p.nodes) {
      const at = node(col, n);
      edges.push({ from: prev, to: at, label: weight(n), via: p.via });
      prev = at;
      col += 1;
    }
    const last = p.nodes[p.nodes.length - 1];
    ends.push({ from: prev, label: last.kind === "seed" && last.activation !== undefined ? `a ${fmt(last.activation)}` : "", via: p.via });
  }
  const passageCol = Math.max(cols.length, 2);
  const roundText = found && found.round ? `, round ${found.round}` : "";
  const passage = { col: passageCol, row: 0, n: { kind: "passage", name: hit.title || String(hit.id),
    sub: `score ${fmt(hit.score)}${roundText}` } };
  while (cols.length <= passageCol) cols.push([]);
  cols[passageCol].push(passage.n);
  for (const e of ends) edges.push({ from: e.from, to: passage, label: e.label, via: e.via });
  if (!chosen.length) edges.push({ from: q, to: passage, label: "", via: "pagerank" });

  // geometry
  const W = { question: 180, seed: 150, sentence: 250, entity: 150, passage: 170 };
  const width = (c) => Math.max(...cols[c].map((n) => W[n.kind] || 150), 120);
  const GAP = 64, H = 40, VGAP = 16, PAD = 10;
  const x = [PAD];
  for (let c = 1; c < cols.length; c++) x.push(x[c - 1] + width(c - 1) + GAP);
  const rows = Math.max(...cols.map((c) => c.length));
  const height = PAD * 2 + rows * H + (rows - 1) * VGAP;
  const yOf = (c, r) => PAD + (height - PAD * 2 - (cols[c].length * H + (cols[c].length - 1) * VGAP)) / 2 + r * (H + VGAP);
  const total = x[cols.length - 1] + width(cols.length - 1) + PAD;

  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "path-drawing");
  svg.setAttribute("viewBox", `0 0 ${total} ${height}`);
  svg.setAttribute("width", total);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `how ${hit.title} was reached`);
  const mk = (tag, attrs, parent) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    (parent || svg).append(e);
    return e;
  };
  const edgeLayer = mk("g", { class: "edges" });
  const labelLayer = mk("g", { class: "labels" });
  const labelled = new Map(); // node -> the labels already written at its entry (stacked upwards, each once)
  const drawn = new Set();
  for (const e of edges) {
    const key = `${e.from.col},${e.from.row}>${e.to.col},${e.to.row}|${e.via}`;
    if (drawn.has(key)) continue;
    drawn.add(key);
    const x1 = x[e.from.col] + width(e.from.col), y1 = yOf(e.from.col, e.from.row) + H / 2;
    const x2 = x[e.to.col], y2 = yOf(e.to.col, e.to.row) + H / 2;
    const mid = (x1 + x2) / 2;
    mk("path", { class: `edge ${e.via}`, d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}` }, edgeLayer);
    const at = `${e.to.col},${e.to.row}`;
    const seen = labelled.get(at) || [];
    if (e.label && !seen.includes(e.label)) {
      const t = mk("text", { class: `edge-label ${e.via}`, x: x2 - 6, y: y2 - 5 - 13 * seen.length,
                             "text-anchor": "end" }, labelLayer);
      t.textContent = e.label;
      seen.push(e.label);
      labelled.set(at, seen);
    }
  }
  const nodeLayer = mk("g", { class: "nodes" });
  cols.forEach((col, c) => col.forEach((n, r) => {
    const g = mk("g", { class: `node ${n.kind}`, "data-kind": n.kind, "data-label": label(n) }, nodeLayer);
    const w = width(c);
    mk("rect", { x: x[c], y: yOf(c, r), width: w, height: H, rx: 6 }, g);
    const title = mk("title", {}, g);
    title.textContent = n.kind === "sentence" && n.passage ? `${n.text} (in ${n.passage})` : label(n);
    const maxChars = Math.floor(w / 6.6);
    const full = label(n) || "";
    const short = full.length > maxChars ? full.slice(0, maxChars - 1) + "…" : full;
    const t = mk("text", { x: x[c] + 8, y: yOf(c, r) + (n.sub || n.passage ? 16 : 24) }, g);
    t.textContent = short;
    const sub = n.sub || (n.passage ? `in ${n.passage}` : "");
    if (sub) {
      const s = mk("text", { class: "sub", x: x[c] + 8, y: yOf(c, r) + 32 }, g);
      s.textContent = sub.length > maxChars ? sub.slice(0, maxChars - 1) + "…" : sub;
    }
    if (n.kind === "passage") {
      g.setAttribute("tabindex", "0");
      g.addEventListener("click", onPassage);
      g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") onPassage(); });
    }
  }));
  const wrap = el("div", "drawing");
  wrap.append(svg);
  return wrap;
}

$("ask").addEventListener("submit", ask);
$("key").addEventListener("change", connect);
connect();
