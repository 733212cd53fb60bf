// The review page: the list of journals with filters, one turn stepped through on the
// machine, a heat map of several. Journal content is user content: it only ever reaches the
// page as text (textContent), never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const FILTERS = ["state", "status", "notice", "tool", "min_duration", "max_duration", "since",
                 "until", "q"];
const selected = new Set();
let listed = [];
let turn = null;
let step = 0;
let searchTimer = null;

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function secs(t) {
  if (t === null || t === undefined) return "…";
  return `${Number(t.toFixed(3))} s`;
}

function showError(message) {
  const box = $("rv-error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function fetchText(url) {
  const response = await fetch(url);
  const body = await response.text();
  if (!response.ok) throw new Error(body.trim() || `${response.status} ${response.statusText}`);
  return body;
}

async function fetchJson(url) {
  return JSON.parse(await fetchText(url));
}

// ---------------------------------------------------------------- the list

function filterQuery() {
  const params = new URLSearchParams();
  const form = $("rv-filters");
  for (const name of FILTERS) {
    const value = form.elements[name].value.trim();
    if (value) params.set(name, value);
  }
  return params;
}

function fillSelect(select, values) {
  const keep = select.value;
  select.replaceChildren(el("option", { value: "" }, "any"),
                         ...values.map((v) => el("option", { value: v }, v)));
  select.value = values.includes(keep) ? keep : "";
}

function stateBadge(row) {
  return el("span", { class: `rv-badge rv-state-${row.terminal ? row.final_state : "running"}` },
            row.final_state);
}

function renderRows(data) {
  listed = data.rows;
  $("rv-folder").textContent = data.folder;
  $("rv-count").textContent = data.matching === data.total
    ? `${data.total} turns`
    : `${data.matching} of ${data.total} turns match` +
      (data.matching > data.rows.length ? ` (newest ${data.rows.length} shown)` : "");
  const body = $("rv-rows");
  body.replaceChildren(...data.rows.map((row) => {
    const box = el("input", { type: "checkbox", class: "rv-pick", "data-id": row.id,
                              title: "include in the heat map" });
    box.checked = selected.has(row.id);
    box.addEventListener("change", () => {
      if (box.checked) selected.add(row.id); else selected.delete(row.id);
      updateHeatButton();
    });
    const open = el("a", { href: `#turn=${encodeURIComponent(row.id)}`, class: "rv-open" },
                    row.name);
    return el("tr", { "data-id": row.id },
      el("td", {}, box),
      el("td", {}, open, el("div", { class: "rv-muted rv-small" }, row.id)),
      el("td", {}, stateBadge(row)),
      el("td", {}, row.status),
      el("td", {}, row.notices.join(", ")),
      el("td", {}, row.tools.join(", ")),
      el("td", { class: "rv-num" }, secs(row.duration)),
      el("td", { class: "rv-num" }, row.passes),
      el("td", { class: "rv-num" }, row.restarts),
      el("td", { class: "rv-small" }, row.recorded.replace("T", " ").replace("+00:00", "Z")),
      el("td", { class: "rv-preview" }, row.text));
  }));
  for (const [name, values] of Object.entries(data.facets)) {
    fillSelect($(`rv-f-${name}`), values);
  }
  const problems = $("rv-problems");
  problems.hidden = data.problems.length === 0;
  $("rv-problems-title").textContent =
    `${data.problems.length} file${data.problems.length === 1 ? "" : "s"} not readable as a journal`;
  $("rv-problem-list").replaceChildren(
    ...data.problems.map((p) => el("li", {}, el("code", {}, p.id), `: ${p.error}`)));
  updateHeatButton();
}

function updateHeatButton() {
  const button = $("rv-heat-button");
  button.disabled = selected.size < 2;
  button.textContent = `heat map of selected (${selected.size})`;
}

async function loadList() {
  try {
    renderRows(await fetchJson(`/api/journals?${filterQuery()}`));
    document.body.dataset.listLoaded = String(Number(document.body.dataset.listLoaded || 0) + 1);
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

// ---------------------------------------------------------------- diagrams

function sanitizedSvg(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName !== "svg" || doc.getElementsByTagName("parsererror").length) {
    throw new Error("the server sent a diagram that is not SVG");
  }
  for (const bad of svg.querySelectorAll("script, foreignObject")) bad.remove();
  for (const node of svg.querySelectorAll("*")) {
    for (const attr of [...node.attributes]) {
      if (attr.name.startsWith("on") ||
          (attr.name.endsWith("href") && /^\s*javascript:/i.test(attr.value))) {
        node.removeAttribute(attr.name);
      }
    }
  }
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  return document.importNode(svg, true);
}

async function drawInto(container, ids) {
  const params = new URLSearchParams();
  for (const id of ids) params.append("id", id);
  container.replaceChildren(el("p", { class: "rv-muted" }, "drawing…"));
  container.replaceChildren(sanitizedSvg(await fetchText(`/api/diagram.svg?${params}`)));
}

// ---------------------------------------------------------------- one turn

function show(view) {
  for (const id of ["rv-list-view", "rv-turn-view", "rv-heat-view"]) $(id).hidden = id !== view;
}

function outcomeText(outcome) {
  if (!outcome) return "(not recorded)";
  if (outcome.hang) return "hung (never returned)";
  if (outcome.raise !== undefined) return `raised ${outcome.raise}`;
  if (outcome.refused !== undefined) return `refused: ${outcome.refused}`;
  const took = outcome.after !== undefined ? ` after ${secs(outcome.after)}` : "";
  if (outcome.success === true) return `success${took}: ${JSON.stringify(outcome.data ?? null)}`;
  if (outcome.success === false) return `failure${took}: ${outcome.error}`;
  return JSON.stringify(outcome);
}

function renderTurn(data) {
  $("rv-turn-title").textContent = data.name;
  $("rv-turn-facts").textContent =
    `ended ${data.final_state} (${data.status}) at ${secs(data.duration)}` +
    (data.notices.length ? ` · notices: ${data.notices.join(", ")}` : "") +
    (data.error ? ` · error: ${data.error}` : "");
  $("rv-timeline").replaceChildren(...data.steps.map((s, i) =>
    el("li", { class: `rv-kind-${s.kind}`, "data-step": i, onclick: () => goTo(i) },
       el("span", { class: "rv-t" }, secs(s.t)), " ",
       el("b", {}, s.event), ` ${s.source} → ${s.dest}`)));
  $("rv-passes").replaceChildren(...data.passes.map((p) => el("tr", { "data-pass": p.index },
    el("td", {}, p.index), el("td", {}, secs(p.start)), el("td", {}, secs(p.end)),
    el("td", {}, p.ended_by), el("td", {}, p.status ?? ""), el("td", {}, p.finish_reason ?? ""),
    el("td", {}, p.usage ? `${p.usage.input_tokens ?? "?"}/${p.usage.output_tokens ?? "?"}` : ""),
    el("td", { class: "rv-preview" }, p.text ?? ""))));
  $("rv-tools").replaceChildren(...(data.tools.length ? data.tools.map((c) => el("tr", { "data-pass": c.pass },
    el("td", {}, c.pass), el("td", {}, secs(c.at)), el("td", {}, c.name),
    el("td", { class: "rv-code" }, JSON.stringify(c.args ?? null)),
    el("td", { class: "rv-code" }, outcomeText(c.outcome))))
    : [el("tr", {}, el("td", { colspan: "5", class: "rv-muted" }, "no tool calls"))]));
  $("rv-restarts").replaceChildren(...(data.restarts.length
    ? data.restarts.map((r) => el("li", {}, `${secs(r.t)}: ${r.event} ${r.source} → ${r.dest}`))
    : [el("li", { class: "rv-muted" }, "no restarts")]));
  if (data.flags.length) {
    $("rv-restarts").append(el("li", { class: "rv-muted" }, `flags set: ${data.flags.join(", ")}`));
  }
  $("rv-summary").textContent = data.summary;
  const slider = $("rv-slider");
  slider.max = String(Math.max(data.steps.length - 1, 0));
}

function textAt(t) {
  // The text delivered by time t, rebuilt from the chunks the story sends once each: the
  // kept text of every pass that had ended, the chunks that had arrived of the one running.
  let out = "";
  for (const p of turn.passes) {
    if (p.start > t) continue;
    if (p.end !== null && t >= p.end && p.text !== null) {
      out += p.text;
      continue;
    }
    for (const [at, text] of p.chunks) if (at <= t) out += text;
  }
  return out;
}

function mark(id, on) {
  const node = id ? $("rv-diagram").querySelector(`#${CSS.escape(id)}`) : null;
  if (node) node.classList.toggle("rv-current", on);
}

function goTo(index) {
  if (!turn || !turn.steps.length) {
    $("rv-step-label").textContent = "no transitions";
    return;
  }
  const before = turn.steps[step];
  mark(`${before.event}:${before.source}:${before.dest}`, false);
  mark(before.dest, false);
  step = Math.max(0, Math.min(index, turn.steps.length - 1));
  const s = turn.steps[step];
  mark(`${s.event}:${s.source}:${s.dest}`, true);
  mark(s.dest, true);
  $("rv-step-label").textContent = `transition ${step + 1} of ${turn.steps.length}`;
  $("rv-slider").value = String(step);
  $("rv-now-edge").textContent = `@${secs(s.t)}  ${s.event}: ${s.source} → ${s.dest}`;
  $("rv-now-does").textContent = `${s.kind}: ${s.does}`;
  $("rv-now-pass").textContent = s.pass ? `pass ${s.pass}` : "";
  $("rv-now-text").textContent = textAt(s.t) || "(nothing yet)";
  const toolsRunning = s.source === "ToolCall" ? passOfTools(s) : null;
  for (const row of $("rv-passes").children) {
    row.classList.toggle("rv-current", s.pass !== null && Number(row.dataset.pass) === s.pass);
  }
  for (const row of $("rv-tools").children) {
    row.classList.toggle("rv-current",
                         toolsRunning !== null && Number(row.dataset.pass) === toolsRunning);
  }
  for (const item of $("rv-timeline").children) {
    item.classList.toggle("rv-current", Number(item.dataset.step) === step);
  }
  $("rv-timeline").children[step]?.scrollIntoView({ block: "nearest" });
  $("rv-first").disabled = $("rv-prev").disabled = step === 0;
  $("rv-last").disabled = $("rv-next").disabled = step === turn.steps.length - 1;
}

function passOfTools(s) {
  // The pass whose tool calls ran in the ToolCall visit this step leaves.
  const ended = turn.passes.filter((p) => p.ended_by === "tool_call" && p.end !== null &&
                                          p.end <= s.t);
  return ended.length ? ended[ended.length - 1].index : null;
}

async function openTurn(id) {
  show("rv-turn-view");
  turn = null;
  step = 0;
  $("rv-turn-title").textContent = id;
  try {
    const data = await fetchJson(`/api/story?id=${encodeURIComponent(id)}`);
    turn = data;
    renderTurn(data);
    goTo(0);
    await drawInto($("rv-diagram"), [id]);
    goTo(step);
    document.body.dataset.turnLoaded = id;
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

async function openHeat(ids) {
  show("rv-heat-view");
  $("rv-heat-title").textContent = `heat map of ${ids.length} turns`;
  try {
    await drawInto($("rv-heat"), ids);
    document.body.dataset.heatLoaded = String(ids.length);
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

// ---------------------------------------------------------------- routing

function route() {
  const hash = location.hash.slice(1);
  const params = new URLSearchParams(hash);
  if (params.has("turn")) return openTurn(params.get("turn"));
  if (params.has("heat")) return openHeat(params.getAll("heat"));
  show("rv-list-view");
  return loadList();
}

function start() {
  const form = $("rv-filters");
  form.addEventListener("change", loadList);
  form.addEventListener("submit", (event) => { event.preventDefault(); loadList(); });
  form.addEventListener("reset", () => setTimeout(loadList, 0));
  $("rv-f-q").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(loadList, 250);
  });
  $("rv-select-all").addEventListener("change", (event) => {
    for (const row of listed) {
      if (event.target.checked) selected.add(row.id); else selected.delete(row.id);
    }
    for (const box of document.querySelectorAll(".rv-pick")) box.checked = event.target.checked;
    updateHeatButton();
  });
  $("rv-heat-button").addEventListener("click", () => {
    const params = new URLSearchParams();
    for (const id of selected) params.append("heat", id);
    location.hash = params.toString();
  });
  for (const back of document.querySelectorAll(".rv-back")) {
    back.addEventListener("click", () => { location.hash = ""; });
  }
  $("rv-first").addEventListener("click", () => goTo(0));
  $("rv-prev").addEventListener("click", () => goTo(step - 1));
  $("rv-next").addEventListener("click", () => goTo(step + 1));
  $("rv-last").addEventListener("click", () => goTo(Infinity));
  $("rv-slider").addEventListener("input", (event) => goTo(Number(event.target.value)));
  document.addEventListener("keydown", (event) => {
    if ($("rv-turn-view").hidden || event.target.matches("input, select, textarea")) return;
    const moves = { ArrowLeft: step - 1, ArrowRight: step + 1, Home: 0, End: Infinity };
    if (event.key in moves) { event.preventDefault(); goTo(moves[event.key]); }
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
