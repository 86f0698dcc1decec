// Sessions: the list, and one session's page with its cells (text output and PNG charts),
// a cell to run, and pause / resume / stop.
//
// The cells come from the server's history of the session (GET …/cells), so they are the
// same in every tab and after a reload, a pause or a stop; new ones are appended as they run.

import { ApiError, del, get, post, query } from "../api.js";
import { AnsiState, renderAnsi } from "../ansi.js";
import { badge, card, clear, fill, confirmAction, field, h, ms, short, table, toast, when } from "../dom.js";
import { notFound } from "./job.js";

const KEEP_CELLS = 100; // what the server keeps per session
const FIRST_CELLS = 30; // the newest, on opening the page (each may hold images)
const POLL_MS = 3000;
const DONE = { pause: "paused", resume: "resumed", stop: "stopped" };
const PAUSE_MODES = { memory: "memory (variables kept)", workspace: "workspace (files only)" };

export function sessionsPage({ app }) {
  const holder = h("div", { id: "sessions-table" });
  let timer = null;
  let stopped = false;
  const start = h("button", {
    class: "btn btn-primary", type: "button", id: "new-session",
    onclick: async () => {
      start.disabled = true;
      try {
        const created = await post("/v1/sessions", {});
        location.hash = `#/sessions/${encodeURIComponent(created.id)}`;
      } catch (error) { toast(`Could not start a session: ${error.message}`, "bad"); }
      start.disabled = false;
    },
  }, "New session");

  async function refresh() {
    try {
      const page = await get("/v1/sessions");
      if (stopped) return;
      const rows = page.items.map((s) => h("tr", { dataset: { sessionId: s.id } },
        h("td", {}, h("a", { href: `#/sessions/${encodeURIComponent(s.id)}`, class: "mono" },
          short(s.id, 22))),
        h("td", {}, badge(s.state)),
        h("td", {}, s.image),
        h("td", { class: "num" }, s.executions),
        h("td", {}, s.pause_mode || "—"),
        h("td", {}, when(s.created_at)),
        h("td", {}, when(s.last_used_at))));
      fill(holder, table(
        ["Session", "State", "Image", "Cells", "Pause mode", "Started", "Last used"], rows,
        { empty: "No sessions. Start one here or with `sandcell session start`." }));
    } catch (error) { toast(`Could not list sessions: ${error.message}`, "bad"); }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }

  app.append(h("div", { class: "page-head" }, h("h1", {}, "Sessions"),
    h("span", { class: "spacer" }), start), card(null, holder));
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}

function output(text, cls) {
  if (!text) return null;
  const pre = h("pre", { class: `cell-out ${cls}` });
  renderAnsi(pre, text, new AnsiState());
  return pre;
}

const BASE64 = /^[A-Za-z0-9+/=\s]*$/;

function display(item) {
  if (item.mime === "image/png" && BASE64.test(item.data)) {
    return h("img", { class: "cell-img", alt: "chart", src: `data:image/png;base64,${item.data}` });
  }
  // HTML and everything else is shown as its source text, never rendered.
  return h("div", { class: "cell-display" }, h("div", { class: "muted small" }, item.mime),
    h("pre", { class: "cell-out" }, item.data));
}

// One cell: a record of the server's history, or (`pending`, `failed`) one of this page's.
function cellView(cell) {
  const error = cell.error ? output([`${cell.error.ename}: ${cell.error.evalue}`,
    ...(cell.error.traceback || [])].join("\n"), "stderr") : null;
  const at = cell.started_at ? new Date(cell.started_at).toLocaleTimeString() : "";
  return h("article", { class: `cell${cell.pending ? " cell-pending" : ""}`,
    dataset: cell.seq ? { seq: cell.seq } : {} },
  h("div", { class: "cell-head" },
    h("span", { class: "cell-count" }, `[${cell.pending ? "*" : cell.execution_count ?? " "}]`),
    h("span", { class: "muted small" }, at),
    h("span", { class: "muted small" }, cell.duration_ms != null ? ms(cell.duration_ms) : ""),
    cell.pending ? h("span", { class: "badge badge-running" }, "running") : null,
    cell.timed_out ? h("span", { class: "badge badge-bad" }, "timed out") : null,
    cell.truncated ? h("span", { class: "badge badge-muted",
      title: "output was cut: by the kernel's limit or the history's cap per cell" },
    "truncated") : null,
    h("span", { class: "spacer" }),
    cell.seq ? h("span", { class: "muted small mono" }, `#${cell.seq}`) : null),
  h("pre", { class: "cell-code" }, cell.code),
  output(cell.stdout, ""), output(cell.stderr, "stderr"),
  cell.result ? h("pre", { class: "cell-out cell-result" }, cell.result) : null,
  (cell.display || []).map(display), error,
  cell.failed ? h("p", { class: "form-error" }, cell.failed) : null);
}

export function sessionPage({ app }, id) {
  const url = `/v1/sessions/${encodeURIComponent(id)}`;
  const head = h("div", { class: "page-head", id: "session-head" });
  const facts = h("div", { id: "session-facts" });
  const cellsBox = h("div", { class: "cells", id: "cells" });
  // The server's history (oldest first), then cells of this page it did not record.
  let cells = [];
  let local = [];
  let lastSeq = null;
  let loaded = false;
  let timer = null;
  let stopped = false;

  const code = h("textarea", { class: "code-input", id: "cell-code", rows: 4,
    spellcheck: "false", placeholder: "print('hello')   — Ctrl+Enter runs the cell" });
  const run = h("button", { class: "btn btn-primary", type: "button", id: "run-cell",
    onclick: () => runCell() }, "Run");
  code.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); runCell(); }
  });

  function drawCells() {
    const shown = [...cells, ...local].map((cell) => cellView(cell)).reverse();
    fill(cellsBox, ...(shown.length ? shown : [h("p", { class: "muted", id: "no-cells" },
      loaded ? "No cells yet: run one above." : "Loading the history…")]));
  }

  // Cells recorded since the last one shown (all of the newest, the first time).
  async function loadCells() {
    const limit = lastSeq === null ? FIRST_CELLS : KEEP_CELLS;
    const page = await get(`${url}/cells${query({ after: lastSeq, limit })}`);
    if (stopped) return;
    const fresh = page.items.filter((cell) => lastSeq === null || cell.seq > lastSeq);
    if (fresh.length) lastSeq = fresh[fresh.length - 1].seq;
    cells = [...cells, ...fresh].slice(-KEEP_CELLS);
    loaded = true;
    drawCells();
  }

  async function runCell() {
    const source = code.value;
    if (!source.trim() || run.disabled) return;
    run.disabled = true;
    const cell = { code: source, pending: true, started_at: new Date().toISOString() };
    const before = lastSeq;
    local.push(cell);
    drawCells();
    let answer = null;
    try { answer = await post(`${url}/execute`, { code: source }); code.value = ""; }
    catch (error) { cell.failed = error.message; }
    local = local.filter((other) => other !== cell);
    run.disabled = false;
    // The server records every cell it ran; show its record, or this answer if it has none.
    try { await loadCells(); } catch { /* shown from the answer below */ }
    if (lastSeq === before) local.push({ ...cell, ...(answer || {}), pending: false });
    drawCells();
    refresh();
  }

  const act = (verb, method) => async () => {
    if (verb === "stop" && !await confirmAction("Stop this session?",
      "The sandbox and its workspace are destroyed; its cell history is kept.", "Stop session")) return;
    try {
      await (method === "DELETE" ? del(url) : post(`${url}/${verb}`));
      toast(`Session ${DONE[verb]}`);
    }
    catch (error) { toast(`Could not ${verb}: ${error.message}`, "bad"); }
    refresh();
  };

  function draw(s) {
    const live = s.state !== "stopped" && s.state !== "failed";
    head.dataset.state = s.state;
    fill(head, h("a", { href: "#/sessions", class: "back" }, "← Sessions"),
      h("h1", { class: "mono" }, s.id), badge(s.state), h("span", { class: "spacer" }),
      h("div", { class: "actions" },
        s.state === "running" ? h("button", { class: "btn", id: "pause", type: "button",
          onclick: act("pause", "POST") }, "Pause") : null,
        s.state === "paused" ? h("button", { class: "btn", id: "resume", type: "button",
          onclick: act("resume", "POST") }, "Resume") : null,
        live ? h("button", { class: "btn btn-danger", id: "stop", type: "button",
          onclick: act("stop", "DELETE") }, "Stop") : null));
    fill(facts, h("dl", { class: "facts" },
      field("Image", s.image), field("Cells run", s.executions),
      field("Started", when(s.created_at)), field("Last used", when(s.last_used_at)),
      field("Expires", when(s.expires_at)), field("Idle timeout", `${s.idle_timeout_s} s`),
      field("Pause mode", h("span", { id: "pause-mode" }, PAUSE_MODES[s.pause_mode] || "—")),
      s.reason ? field("Reason", `${s.reason} ${s.detail || ""}`) : null));
    run.disabled = s.state !== "running" || local.some((cell) => cell.pending);
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const s = await get(url);
      if (stopped) return;
      draw(s);
      // Cells run elsewhere (the SDK, the CLI, another tab) appear here too.
      if (!loaded || s.state === "running") await loadCells();
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        stopped = true; clear(app); notFound(app, "session"); return;
      }
      toast(`Could not load the session: ${error.message}`, "bad");
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }

  app.append(head, h("div", { class: "grid grid-wide" },
    card("Session", facts),
    card("Run a cell", code, h("div", { class: "toolbar" }, run,
      h("span", { class: "muted small" }, "Runs in the session's kernel: variables persist.")))),
  card("Cells", h("p", { class: "card-sub muted" },
    `Newest first. The server keeps the last ${KEEP_CELLS}, also after the session stops.`),
  cellsBox));
  drawCells();
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
