// The review page: the list of journals with filters (a reply's attempts grouped under it),
// one turn stepped through on the machine with a timeline of its passes and tools and the
// model's input per pass, a heat map of several. Journal content is user content: it only
// ever reaches the page as text (textContent), never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
const FILTERS = ["state", "status", "notice", "tool", "min_duration", "max_duration", "since",
                 "until", "q"];
const OUTCOME_WORDS = { ok: "answered", failed: "failed", timeout: "timed out",
                        stopped: "stopped", other: "ended", unknown: "unknown" };
const LEGIBLE_ZOOM = 0.7;
// The drawing's labels are 13 pt (taken edges) at zoom 1; at 0.7 they are about 12 px high.
const selected = new Set();
let listed = [];
let turn = null;
let step = 0;
let searchTimer = null;
let zoom = LEGIBLE_ZOOM;

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

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function secs(t) {
  if (t === null || t === undefined) return "…";
  return `${Number(t.toFixed(3))} s`;
}

function json(value) {
  return JSON.stringify(value ?? null);
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

function badge(state, status, outcome, terminal) {
  // Coloured by how the turn ended, not by its state: a failed turn is Done too.
  const kind = terminal === false ? "running" : (outcome || "unknown");
  return el("span", { class: `rv-badge rv-outcome-${kind}`, title: `${state}: ${status ?? "?"}` },
            state);
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

function replyHead(reply, shown) {
  const parts = [`reply of ${reply.attempts} attempts`,
                 reply.answered_by ? `answered by attempt ${reply.answered_by}`
                                   : "no attempt answered"];
  if (reply.notices.length) parts.push(`the user saw: ${reply.notices.join(", ")}`);
  if (shown < reply.attempts) parts.push(`${shown} of them match the filters`);
  return el("tr", { class: "rv-reply-head", "data-reply": reply.id },
    el("td", {}),
    el("td", { colspan: "10" },
       el("span", { class: `rv-badge rv-outcome-${reply.outcome}` },
          OUTCOME_WORDS[reply.outcome] || reply.status),
       " ", parts.join(" · "), " ", el("span", { class: "rv-muted rv-small" }, reply.id)));
}

function listRow(row, grouped) {
  const box = el("input", { type: "checkbox", class: "rv-pick", "data-id": row.id,
                            title: "include in the heat map" });
  box.checked = selected.has(row.id);
  box.addEventListener("change", () => {
    if (box.checked) selected.add(row.id); else selected.delete(row.id);
    updateHeatButton();
  });
  const open = el("a", { href: `#turn=${encodeURIComponent(row.id)}`, class: "rv-open" },
                  row.name);
  const attempt = grouped
    ? el("div", { class: "rv-small rv-attempt-of" },
         `attempt ${row.reply.attempt} of ${row.reply.attempts}` +
         (row.reply.answered_by === row.reply.attempt ? " · answered" : ""))
    : null;
  return el("tr", { "data-id": row.id, class: grouped ? "rv-attempt" : "" },
    el("td", {}, box),
    el("td", {}, attempt, open, el("div", { class: "rv-muted rv-small" }, row.id)),
    el("td", {}, badge(row.final_state, row.status, row.outcome, row.terminal)),
    el("td", {}, row.status),
    el("td", {}, row.notices.join(", ")),
    el("td", {}, row.tools.join(", ")),
    el("td", { class: "rv-num" }, secs(row.duration)),
    el("td", { class: "rv-num" }, row.passes),
    el("td", { class: "rv-num" }, row.restarts),
    el("td", { class: "rv-small" }, row.recorded.replace("T", " ").replace("+00:00", "Z")),
    el("td", { class: "rv-preview" }, row.text));
}

function renderRows(data) {
  listed = data.rows;
  $("rv-folder").textContent = data.folder;
  $("rv-count").textContent = (data.matching === data.total
    ? `${data.total} turns`
    : `${data.matching} of ${data.total} turns match` +
      (data.matching > data.rows.length ? ` (newest ${data.rows.length} shown)` : "")) +
    (data.pending ? ` · ${data.pending} files not read yet (reload)` : "");
  const shown = new Map();
  for (const row of data.rows) {
    if (row.reply) shown.set(row.reply.id, (shown.get(row.reply.id) || 0) + 1);
  }
  const lines = [];
  let group = null;
  for (const row of data.rows) {
    const grouped = Boolean(row.reply && row.reply.attempts > 1);
    if (grouped && row.reply.id !== group) lines.push(replyHead(row.reply, shown.get(row.reply.id)));
    group = grouped ? row.reply.id : null;
    lines.push(listRow(row, grouped));
  }
  $("rv-rows").replaceChildren(...lines);
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
  // The server rebuilt the drawing from an allow-list already; this is a second line.
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName !== "svg" || doc.getElementsByTagName("parsererror").length) {
    throw new Error("the server sent a diagram that is not SVG");
  }
  for (const bad of svg.querySelectorAll("script, foreignObject, a, image, use, style")) {
    bad.remove();
  }
  for (const node of svg.querySelectorAll("*")) {
    for (const attr of [...node.attributes]) {
      if (attr.name.startsWith("on") || attr.name.endsWith("href") || attr.name === "style") {
        node.removeAttribute(attr.name);
      }
    }
  }
  const width = parseFloat(svg.getAttribute("width") || "0") * 4 / 3;  // pt to px
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  const node = document.importNode(svg, true);
  node.dataset.naturalWidth = String(width || 1000);
  return node;
}

async function drawInto(container, ids) {
  const params = new URLSearchParams();
  for (const id of ids) params.append("id", id);
  container.replaceChildren(el("p", { class: "rv-muted" }, "drawing…"));
  container.replaceChildren(sanitizedSvg(await fetchText(`/api/diagram.svg?${params}`)));
  applyZoom(container);
}

function applyZoom(container) {
  // Zoom as a width in pixels (CSSOM, which the page's CSP allows); "fit" fills the box.
  const svg = container.querySelector("svg");
  if (!svg) return;
  const fit = zoom === "fit";
  svg.style.width = fit ? "100%" : `${Math.round(Number(svg.dataset.naturalWidth) * zoom)}px`;
  $("rv-zoom-level").textContent = fit ? "fit" : `${Math.round(zoom * 100)} %`;
}

function setZoom(next) {
  zoom = next === "fit" ? "fit" : Math.min(3, Math.max(0.2, next));
  for (const box of [$("rv-diagram"), $("rv-heat")]) applyZoom(box);
}

function zoomBy(factor) {
  const svg = $("rv-diagram").querySelector("svg") || $("rv-heat").querySelector("svg");
  const current = zoom === "fit" && svg
    ? svg.getBoundingClientRect().width / Number(svg.dataset.naturalWidth) : zoom;
  setZoom((current === "fit" ? 1 : current) * factor);
}

// ---------------------------------------------------------------- one turn

function show(view) {
  for (const id of ["rv-list-view", "rv-turn-view", "rv-heat-view"]) $(id).hidden = id !== view;
  $("rv-zoom").hidden = view === "rv-list-view";
}

function outcomeText(outcome) {
  if (!outcome) return "(not recorded)";
  if (outcome.hang) return "hung (never returned)";
  if (outcome.raise !== undefined) return `raised ${outcome.raise}`;
  if (outcome.refused !== undefined) return `refused: ${outcome.refused}`;
  const took = outcome.after !== undefined ? ` after ${secs(outcome.after)}` : "";
  if (outcome.success === true) return `success${took}: ${json(outcome.data)}`;
  if (outcome.success === false) return `failure${took}: ${outcome.error}`;
  return json(outcome);
}

function renderReply(data) {
  const box = $("rv-reply");
  const reply = data.reply;
  box.hidden = !reply;
  if (!reply) return;
  const attempts = reply.attempts.map((a) => {
    const label = `attempt ${a.attempt}: ${a.label} (${a.status ?? "?"})`;
    const here = a.attempt === reply.attempt;
    const item = here || !a.id
      ? el("span", { class: here ? "rv-here" : "rv-muted" }, label + (here ? " · this one" : ""))
      : el("a", { href: `#turn=${encodeURIComponent(a.id)}`, class: "rv-other-attempt" }, label);
    return el("li", { "data-attempt": a.attempt }, item,
              a.attempt === reply.answered_by ? el("b", {}, " · answered") : null);
  });
  box.replaceChildren(
    el("div", {},
       el("span", { class: `rv-badge rv-outcome-${reply.answered_by ? "ok" : "failed"}` },
          reply.answered_by ? "answered" : "not answered"),
       ` attempt ${reply.attempt} of ${reply.attempts.length} of reply `,
       el("span", { class: "rv-muted" }, reply.id),
       reply.notices.length ? ` · the user saw: ${reply.notices.join(", ")}` : " · no notice"),
    el("ol", { class: "rv-attempts" }, ...attempts));
}

function renderTurn(data) {
  $("rv-turn-title").textContent = data.name;
  $("rv-turn-badge").replaceChildren(badge(data.final_state, data.status, data.outcome,
                                           data.terminal));
  $("rv-turn-facts").textContent =
    `ended ${data.final_state} (${data.status}) at ${secs(data.duration)}` +
    (data.notices.length ? ` · notices: ${data.notices.join(", ")}` : "") +
    (data.error ? ` · error: ${data.error}` : "");
  renderReply(data);
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
    el("td", { class: "rv-code" }, json(c.args)),
    el("td", { class: "rv-code" }, outcomeText(c.outcome))))
    : [el("tr", {}, el("td", { colspan: "5", class: "rv-muted" }, "no tool calls"))]));
  $("rv-restarts").replaceChildren(...(data.restarts.length
    ? data.restarts.map((r) => el("li", {}, `${secs(r.t)}: ${r.event} ${r.source} → ${r.dest}`))
    : [el("li", { class: "rv-muted" }, "no restarts")]));
  if (data.flags.length) {
    $("rv-restarts").append(el("li", { class: "rv-muted" }, `flags set: ${data.flags.join(", ")}`));
  }
  $("rv-summary").textContent = data.summary;
  $("rv-input-tabs").replaceChildren(...data.passes.map((p) =>
    el("button", { type: "button", class: "rv-input-pass", "data-pass": p.index,
                   onclick: () => goTo(beginOf(p.index)) }, `pass ${p.index}`)));
  renderLanes(data);
  const slider = $("rv-slider");
  slider.max = String(Math.max(data.steps.length - 1, 0));
}

function beginOf(passIndex) {
  const at = turn.steps.findIndex((s) => s.event === "begin" && s.pass === passIndex);
  return at < 0 ? 0 : at;
}

// ------------------------------------------------ the timeline of passes and tools

function toolSpans(data) {
  // A tool call runs from the end of the pass that asked for it to the step that leaves
  // ToolCall; calls of one pass share that span, side by side.
  const spans = [];
  for (const call of data.tools) {
    const leave = data.steps.find((s) => s.source === "ToolCall" && s.dest !== "ToolCall" &&
                                         s.t >= call.at);
    spans.push({ call, start: call.at, end: leave ? leave.t : data.duration,
                 step: leave ? leave.index - 1 : data.steps.length - 1 });
  }
  return spans;
}

function renderLanes(data) {
  const svg = $("rv-lanes");
  const width = 1000;
  const lanes = ["passes", "tools", "events"];
  const top = (lane) => 6 + lanes.indexOf(lane) * 26;
  const end = Math.max(data.duration, 0.001);
  const x = (t) => 84 + (width - 96) * Math.min(Math.max(t, 0), end) / end;
  svg.setAttribute("viewBox", `0 0 ${width} ${top("events") + 40}`);
  const parts = [];
  for (const lane of lanes) {
    parts.push(svgEl("text", { x: 4, y: top(lane) + 15, class: "rv-lane-name" }, lane));
    parts.push(svgEl("line", { x1: 84, x2: width - 12, y1: top(lane) + 10, y2: top(lane) + 10,
                               class: "rv-lane-axis" }));
  }
  for (const p of data.passes) {
    const bar = svgEl("rect", { x: x(p.start), y: top("passes"), height: 20,
                                width: Math.max(3, x(p.end ?? data.duration) - x(p.start)),
                                rx: 3, class: `rv-lane-pass rv-ended-${p.ended_by || "running"}`,
                                "data-pass": p.index });
    bar.append(svgEl("title", {}, `pass ${p.index}: ${secs(p.start)} → ${secs(p.end)}, ` +
                                  `${p.ended_by || "running"}`));
    bar.addEventListener("click", () => goTo(beginOf(p.index)));
    parts.push(bar);
    parts.push(svgEl("text", { x: x(p.start) + 4, y: top("passes") + 14,
                               class: "rv-lane-label" }, String(p.index)));
  }
  for (const span of toolSpans(data)) {
    const bar = svgEl("rect", { x: x(span.start), y: top("tools"), height: 20,
                                width: Math.max(3, x(span.end) - x(span.start)), rx: 3,
                                class: `rv-lane-tool${span.call.outcome && span.call.outcome.success === false ? " rv-failed" : ""}`,
                                "data-pass": span.call.pass });
    bar.append(svgEl("title", {}, `${span.call.name}: ${outcomeText(span.call.outcome)}`));
    bar.addEventListener("click", () => goTo(span.step));
    parts.push(bar);
    parts.push(svgEl("text", { x: x(span.start) + 4, y: top("tools") + 14,
                               class: "rv-lane-label" }, span.call.name));
  }
  for (const s of data.steps) {
    if (!["timer", "kill", "error"].includes(s.kind) && !s.event.startsWith("restart")) continue;
    const mark = svgEl("circle", { cx: x(s.t), cy: top("events") + 10, r: 6,
                                   class: `rv-lane-event rv-kind-${s.kind}` });
    mark.append(svgEl("title", {}, `${secs(s.t)} ${s.event}: ${s.source} → ${s.dest}`));
    mark.addEventListener("click", () => goTo(s.index - 1));
    parts.push(mark);
  }
  parts.push(svgEl("line", { id: "rv-lanes-now", x1: 84, x2: 84, y1: 0, y2: top("events") + 24,
                             class: "rv-lane-now" }));
  svg.replaceChildren(...parts);
  svg.dataset.end = String(end);
}

function markLanes(s) {
  const now = $("rv-lanes-now");
  if (!now) return;
  const end = Number($("rv-lanes").dataset.end);
  const at = 84 + (1000 - 96) * Math.min(Math.max(s.t, 0), end) / end;
  now.setAttribute("x1", String(at));
  now.setAttribute("x2", String(at));
  for (const bar of $("rv-lanes").querySelectorAll(".rv-lane-pass")) {
    bar.classList.toggle("rv-current", s.pass !== null && Number(bar.dataset.pass) === s.pass);
  }
}

// ------------------------------------------------ the model's input per pass

function inputPass(s) {
  // The pass whose input the panel shows: the one running at this step, else the last one
  // begun before it (the next pass's input is being prepared from it).
  if (s.pass !== null) return s.pass;
  const begun = turn.passes.filter((p) => p.start <= s.t);
  return begun.length ? begun[begun.length - 1].index : (turn.passes[0]?.index ?? null);
}

function section(title, ...body) {
  return el("div", { class: "rv-input-part" }, el("h4", {}, title), ...body);
}

function renderInput(passIndex) {
  const box = $("rv-input");
  const input = turn.input;
  const p = turn.passes.find((q) => q.index === passIndex);
  for (const tab of $("rv-input-tabs").children) {
    tab.classList.toggle("rv-current", Number(tab.dataset.pass) === passIndex);
  }
  box.dataset.pass = passIndex === null ? "" : String(passIndex);
  if (!p) {
    box.replaceChildren(el("p", { class: "rv-muted" }, "no provider pass began"));
    return;
  }
  const fed = turn.tools.slice(0, p.fed_back);
  const context = input.context.filter((c) => c.at === null || c.at <= p.start);
  const parts = [
    section("system prompt", input.system_prompt
      ? el("pre", { class: "rv-text rv-system" }, input.system_prompt)
      : el("p", { class: "rv-muted" }, "(none)")),
    section(`dialogue (${input.history.length} messages)`, input.history.length
      ? el("ol", { class: "rv-dialogue" }, ...input.history.map((m) =>
          el("li", {}, el("b", {}, m.author || "?"), el("span", { class: "rv-muted rv-small" },
             m.at ? ` ${m.at}` : ""), el("div", { class: "rv-message" }, m.content))))
      : el("p", { class: "rv-muted" }, "(none recorded)")),
    input.prefill ? section("prefill (continued from)", el("pre", { class: "rv-text" }, input.prefill)) : null,
    input.request_notices.length
      ? section("notices in the request", el("ul", {}, ...input.request_notices.map((n) => el("li", {}, n))))
      : null,
    input.replayed.length
      ? section("calls replayed from an earlier attempt", el("ul", { class: "rv-fed" },
          ...input.replayed.map((c) => el("li", {}, el("b", {}, c.name), ` ${json(c.args)} → `,
                                         el("span", { class: "rv-code" }, json(c.result))))))
      : null,
    section(`tool results fed back (${fed.length})`, fed.length
      ? el("ol", { class: "rv-fed" }, ...fed.map((c) => el("li", {},
          el("b", {}, c.name), ` (pass ${c.pass}) ${json(c.args)} → `,
          el("span", { class: "rv-code" }, outcomeText(c.outcome)))))
      : el("p", { class: "rv-muted" }, "none yet")),
    context.length
      ? section("context added by a restart", el("ul", {}, ...context.map((c) =>
          el("li", {}, el("b", {}, c.name), " ", el("span", { class: "rv-code" }, json(c.item))))))
      : null];
  box.replaceChildren(...parts.filter((part) => part !== null));
}

// ------------------------------------------------ stepping

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
  return node;
}

function goTo(index) {
  if (!turn || !turn.steps.length) {
    $("rv-step-label").textContent = "no transitions";
    renderInput(turn && turn.passes.length ? turn.passes[0].index : null);
    return;
  }
  const before = turn.steps[step];
  mark(`${before.event}:${before.source}:${before.dest}`, false);
  mark(before.dest, false);
  step = Math.max(0, Math.min(index, turn.steps.length - 1));
  const s = turn.steps[step];
  const edge = mark(`${s.event}:${s.source}:${s.dest}`, true);
  mark(s.dest, true);
  edge?.scrollIntoView({ block: "nearest", inline: "nearest" });
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
  markLanes(s);
  renderInput(inputPass(s));
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
  delete document.body.dataset.turnLoaded;
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
  $("rv-zoom-in").addEventListener("click", () => zoomBy(1.25));
  $("rv-zoom-out").addEventListener("click", () => zoomBy(0.8));
  $("rv-zoom-fit").addEventListener("click", () => setZoom("fit"));
  $("rv-zoom-reset").addEventListener("click", () => setZoom(LEGIBLE_ZOOM));
  for (const box of [$("rv-diagram"), $("rv-heat")]) {
    box.addEventListener("wheel", (event) => {
      if (!event.ctrlKey) return;
      event.preventDefault();
      zoomBy(event.deltaY < 0 ? 1.1 : 0.9);
    }, { passive: false });
  }
  document.addEventListener("keydown", (event) => {
    if ($("rv-turn-view").hidden || event.target.matches("input, select, textarea")) return;
    const moves = { ArrowLeft: step - 1, ArrowRight: step + 1, Home: 0, End: Infinity };
    if (event.key in moves) { event.preventDefault(); goTo(moves[event.key]); }
    else if (event.key === "+" || event.key === "=") zoomBy(1.25);
    else if (event.key === "-") zoomBy(0.8);
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
