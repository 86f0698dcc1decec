// Sessions: the list, and one session's page with its cells (text output and PNG charts),
// a cell to run, and pause / resume / stop.
//
// The API keeps no history of cells, so the page shows the cells run from this browser tab
// (kept in sessionStorage with the key, and forgotten at sign-out).

import { ApiError, del, get, post } from "../api.js";
import { AnsiState, renderAnsi } from "../ansi.js";
import { badge, card, clear, fill, confirmAction, field, h, ms, short, table, toast, when } from "../dom.js";
import { notFound } from "./job.js";

const KEEP_CELLS = 20;
const POLL_MS = 3000;

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

function cellsKey(id) { return `sandcell.cells.${id}`; }

function loadCells(id) {
  try { return JSON.parse(sessionStorage.getItem(cellsKey(id)) || "[]"); } catch { return []; }
}

function saveCells(id, cells) {
  try {
    sessionStorage.setItem(cellsKey(id), JSON.stringify(cells.slice(-KEEP_CELLS)));
  } catch { sessionStorage.setItem(cellsKey(id), JSON.stringify(cells.slice(-3))); }
}

function output(text, cls) {
  if (!text) return null;
  const pre = h("pre", { class: `cell-out ${cls}` });
  renderAnsi(pre, text, new AnsiState());
  return pre;
}

function display(item) {
  if (item.mime === "image/png") {
    return h("img", { class: "cell-img", alt: "chart", src: `data:image/png;base64,${item.data}` });
  }
  // HTML and everything else is shown as its source text, never rendered.
  return h("div", { class: "cell-display" }, h("div", { class: "muted small" }, item.mime),
    h("pre", { class: "cell-out" }, item.data));
}

function cellView(cell) {
  const r = cell.result || {};
  const error = r.error ? output([`${r.error.ename}: ${r.error.evalue}`,
    ...(r.error.traceback || [])].join("\n"), "stderr") : null;
  return h("article", { class: "cell" },
    h("div", { class: "cell-head" },
      h("span", { class: "cell-count" }, `[${r.execution_count ?? " "}]`),
      h("span", { class: "muted small" }, cell.at ? new Date(cell.at).toLocaleTimeString() : ""),
      h("span", { class: "muted small" }, r.duration_ms !== undefined ? ms(r.duration_ms) : ""),
      r.timed_out ? h("span", { class: "badge badge-bad" }, "timed out") : null),
    h("pre", { class: "cell-code" }, cell.code),
    output(r.stdout, ""), output(r.stderr, "stderr"),
    r.result ? h("pre", { class: "cell-out cell-result" }, r.result) : null,
    (r.display || []).map(display), error,
    cell.failed ? h("p", { class: "form-error" }, cell.failed) : null);
}

export function sessionPage({ app }, id) {
  const url = `/v1/sessions/${encodeURIComponent(id)}`;
  const head = h("div", { class: "page-head" });
  const facts = h("div");
  const cellsBox = h("div", { class: "cells", id: "cells" });
  let cells = loadCells(id);
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
    const shown = cells.map((cell) => cellView(cell)).reverse();
    fill(cellsBox, ...(shown.length ? shown
      : [h("p", { class: "muted" }, "No cells run from this tab yet.")]));
  }

  async function runCell() {
    if (!code.value.trim()) return;
    run.disabled = true;
    const cell = { code: code.value, at: Date.now() };
    try { cell.result = await post(`${url}/execute`, { code: code.value }); code.value = ""; }
    catch (error) { cell.failed = error.message; }
    cells.push(cell);
    cells = cells.slice(-KEEP_CELLS);
    saveCells(id, cells);
    run.disabled = false;
    drawCells();
    refresh();
  }

  const act = (verb, method) => async () => {
    if (verb === "stop" && !await confirmAction("Stop this session?",
      "The sandbox and its workspace are destroyed.", "Stop session")) return;
    try { await (method === "DELETE" ? del(url) : post(`${url}/${verb}`)); toast(`Session ${verb}`); }
    catch (error) { toast(`Could not ${verb}: ${error.message}`, "bad"); }
    refresh();
  };

  function draw(s) {
    const live = s.state !== "stopped" && s.state !== "failed";
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
      field("Pause mode", s.pause_mode || "—"),
      s.reason ? field("Reason", `${s.reason} ${s.detail || ""}`) : null));
    run.disabled = s.state !== "running";
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const s = await get(url);
      if (stopped) return;
      draw(s);
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
  card("Recent cells", cellsBox));
  drawCells();
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
