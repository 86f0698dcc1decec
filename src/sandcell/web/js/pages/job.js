// One job: its record (polled while it runs), its logs (streamed), stages, attempts, egress
// decisions and artifacts, and cancel / retire with a confirmation.

import { ApiError, del, get, post, stream } from "../api.js";
import { AnsiState, renderAnsi } from "../ansi.js";
import {
  badge, bytes, card, clear, fill, confirmAction, field, h, ms, table, toast, when,
} from "../dom.js";

const POLL_MS = 1500;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);

export function notFound(app, what) {
  app.append(h("section", { class: "notfound", id: "not-found" },
    h("h1", {}, "Not found"),
    h("p", {}, `There is no ${what} with this id for your key.`),
    h("a", { href: what === "session" ? "#/sessions" : "#/jobs" }, "Back to the list")));
}

function plain(value) {
  if (value === null || value === undefined || value === "") return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// A table of records whose keys vary (attempts, egress decisions, stages).
export function recordTable(items, empty, preferred = []) {
  const keys = [...new Set([...preferred.filter((k) => items.some((i) => k in i)),
    ...items.flatMap((item) => Object.keys(item))])];
  const rows = items.map((item) => h("tr", {}, keys.map((key) => {
    const value = item[key];
    const cell = h("td", {}, plain(value));
    if (key === "allowed" || key === "decision" || key === "outcome") {
      const ok = value === true || value === "allowed" || value === "allow" || value === "ok";
      cell.className = ok ? "good" : "warn";
    }
    return cell;
  })));
  return table(keys.length ? keys : preferred.slice(0, 1), rows, { empty });
}

function summary(job) {
  const total = [job.queue_ms, job.start_ms, job.run_ms];
  const done = total.some((v) => v === null) ? null : total.reduce((a, b) => a + b);
  return h("dl", { class: "facts" },
    field("Image", h("span", {}, job.image, " ",
      h("span", { class: "mono muted", title: job.image_digest || "" },
        job.image_digest ? job.image_digest.slice(0, 19) : ""))),
    field("Runtime", job.runtime ? `${job.runtime} ${job.runtime_version || ""}` : "—"),
    field("Exit code", job.exit_code ?? "—"),
    field("Reason", job.reason || "—"),
    field("Detail", job.detail || "—"),
    field("Submitted", when(job.accepted_at)),
    field("Ack · ready · done", `${ms(job.queue_ms)} · ${ms(
      job.queue_ms === null || job.start_ms === null ? null : job.queue_ms + job.start_ms)} · ${
      ms(done)}`),
    field("Run time", ms(job.run_ms)),
    field("Limits", Object.entries(job.limits || {}).map(([k, v]) => `${k}=${v}`).join("  ")),
    field("Usage", Object.entries(job.usage || {}).map(([k, v]) => `${k}=${v}`).join("  ")
      || "—"),
    job.cancel_requested ? field("Cancel", "requested") : null,
    job.retired_at ? field("Retired", when(job.retired_at)) : null,
    job.tenant_id ? field("Tenant", h("span", { class: "mono" }, job.tenant_id)) : null,
  );
}

async function download(output) {
  try {
    const signed = await post(`/v1/artifacts/${encodeURIComponent(output.artifact_id)}/url`);
    const link = h("a", { href: signed.url, download: output.path.split("/").pop(),
      rel: "noopener" });
    document.body.append(link);
    link.click();
    link.remove();
  } catch (error) {
    toast(`Download failed: ${error.message}`, "bad");
  }
}

function artifacts(job, canDownload) {
  const rows = job.outputs.map((output) => h("tr", { dataset: { artifact: output.path } },
    h("td", { class: "mono" }, output.path),
    h("td", { class: "num" }, bytes(output.size)),
    h("td", { class: "mono sha", title: output.sha256 }, output.sha256),
    h("td", {}, canDownload ? h("button", {
      class: "btn btn-small download", type: "button", onclick: () => download(output),
    }, "Download") : null)));
  return table(["Path", "Size", "sha256", ""], rows, { empty: "No artifacts." });
}

function actions(job, who, reload) {
  if (who.admin) return h("span", { class: "muted" }, "read-only (admin view)");
  const cancel = async () => {
    if (!await confirmAction("Cancel this job?",
      `${job.id} will be stopped; its sandbox and every process in it are destroyed.`,
      "Cancel job")) return;
    try { await post(`/v1/jobs/${encodeURIComponent(job.id)}/cancel`); toast("Cancel requested"); }
    catch (error) { toast(`Cancel failed: ${error.message}`, "bad"); }
    reload();
  };
  const retire = async () => {
    if (!await confirmAction("Retire this job?",
      `${job.id}'s artifacts, logs, code and inputs are deleted now. This cannot be undone.`,
      "Retire job")) return;
    try {
      const report = await del(`/v1/jobs/${encodeURIComponent(job.id)}`);
      toast(`Retired: ${report.removed.artifacts.length} artifacts removed`);
    } catch (error) { toast(`Retire failed: ${error.message}`, "bad"); }
    reload();
  };
  return h("div", { class: "actions" },
    !TERMINAL.has(job.state) ? h("button", {
      class: "btn btn-danger", id: "cancel-job", type: "button", onclick: cancel,
      disabled: job.cancel_requested,
    }, job.cancel_requested ? "Cancelling…" : "Cancel") : null,
    TERMINAL.has(job.state) && !job.retired_at ? h("button", {
      class: "btn", id: "retire-job", type: "button", onclick: retire,
    }, "Retire") : null);
}

function logView() {
  const pre = h("pre", { class: "log", id: "job-log", tabindex: "0" });
  const status = h("span", { class: "muted", id: "log-status" }, "connecting…");
  const states = { stdout: new AnsiState(), stderr: new AnsiState() };
  const add = (streamName, text) => {
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    renderAnsi(pre, text, states[streamName], streamName === "stderr" ? "stderr" : "");
    if (stick) pre.scrollTop = pre.scrollHeight;
  };
  return { pre, status, add };
}

export function jobPage({ app, who }, id) {
  const base = who.admin ? "/v1/admin/overview/jobs/" : "/v1/jobs/";
  const url = base + encodeURIComponent(id);
  const controller = new AbortController();
  const parts = {
    head: h("div", { class: "page-head" }), summary: h("div"), artifacts: h("div"),
    stages: h("div"), attempts: h("div"), egress: h("div"),
  };
  const log = logView();
  let timer = null;
  let stopped = false;
  let streaming = false;

  function draw(job) {
    fill(parts.head, 
      h("a", { href: "#/jobs", class: "back" }, "← Jobs"),
      h("h1", { class: "mono", id: "job-id" }, job.id), badge(job.state),
      job.reason ? h("span", { class: "reason", id: "job-reason" }, job.reason) : null,
      h("span", { class: "spacer" }), actions(job, who, reload));
    parts.head.dataset.state = job.state;
    fill(parts.summary, summary(job));
    fill(parts.artifacts, artifacts(job, !who.admin));
    fill(parts.stages, recordTable(job.stages, "No stages committed.", ["name"]));
    fill(parts.attempts, recordTable(job.attempts, "No attempts yet.", ["attempt"]));
    fill(parts.egress, 
      recordTable(job.egress, "No network connections (the default: no network).",
        ["host", "port", "allowed", "decision"]));
  }

  async function reload() {
    clearTimeout(timer);
    let job;
    try { job = await get(url, { signal: controller.signal }); } catch (error) {
      if (stopped) return;
      if (error instanceof ApiError && error.status === 404) {
        clear(app); notFound(app, "job"); stopped = true; return;
      }
      toast(`Could not load the job: ${error.message}`, "bad");
      timer = setTimeout(reload, POLL_MS * 2);
      return;
    }
    if (stopped) return;
    if (!app.contains(parts.head)) mount();
    draw(job);
    if (!streaming) startLogs();
    if (!TERMINAL.has(job.state)) timer = setTimeout(reload, POLL_MS);
  }

  async function startLogs() {
    streaming = true;
    try {
      if (who.admin) {
        const logs = await get(`${url}/logs`, { signal: controller.signal });
        log.add("stdout", logs.stdout);
        log.add("stderr", logs.stderr);
        log.status.textContent = "complete";
        return;
      }
      log.status.textContent = "streaming";
      log.status.classList.add("live");
      await stream(`${url}/logs`, (event, data) => {
        if (event === "stdout" || event === "stderr") log.add(event, data);
        if (event === "end") {
          log.status.textContent = `ended: ${data.state}`;
          log.status.classList.remove("live");
          reload();
        }
      }, controller.signal);
    } catch (error) {
      if (!stopped) log.status.textContent = `log stream stopped: ${error.message}`;
    }
  }

  function mount() {
    fill(app, parts.head,
      h("div", { class: "grid" },
        card("Summary", parts.summary),
        card("Artifacts", parts.artifacts)),
      card("Logs", h("div", { class: "card-sub" }, log.status), log.pre),
      h("div", { class: "grid" },
        card("Stages", parts.stages), card("Attempts", parts.attempts)),
      card("Egress decisions", parts.egress));
  }

  app.append(h("p", { class: "muted" }, "Loading…"));
  reload();
  return () => { stopped = true; clearTimeout(timer); controller.abort(); };
}
