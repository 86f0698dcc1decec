// The jobs list: polled every two seconds, filtered by state (server side) and by text.

import { get, query } from "../api.js";
import { badge, card, fill, h, ms, short, table, when } from "../dom.js";

const STATES = ["", "accepted", "running", "completed", "failed", "cancelled"];
const POLL_MS = 2000;

function sum(...parts) {
  return parts.some((p) => p === null || p === undefined) ? null : parts.reduce((a, b) => a + b);
}

function row(job, admin) {
  const link = `#/jobs/${encodeURIComponent(job.id)}`;
  return h("tr", { class: "job-row", dataset: { jobId: job.id, state: job.state } },
    h("td", {}, h("a", { href: link, class: "mono job-link" }, short(job.id, 20))),
    admin ? h("td", { class: "mono" }, short(job.tenant_id, 16)) : null,
    h("td", {}, badge(job.state)),
    h("td", {}, job.reason || ""),
    h("td", {}, job.runtime || "—"),
    h("td", {}, job.image),
    h("td", { class: "num" }, ms(job.queue_ms)),
    h("td", { class: "num" }, ms(sum(job.queue_ms, job.start_ms))),
    h("td", { class: "num" }, ms(sum(job.queue_ms, job.start_ms, job.run_ms))),
    h("td", {}, when(job.accepted_at)));
}

const HEADERS = [
  "Job", "State", "Reason", "Runtime", "Image",
  ["Ack", "accepted → claimed by a worker"],
  ["Ready", "accepted → sandbox ready, code about to run"],
  ["Done", "accepted → finished"],
  "Submitted",
];

export function jobsPage({ app, who }) {
  const filters = { state: sessionStorage.getItem("sandcell.filter.state") || "", text: "" };
  const holder = h("div", { id: "jobs-table" });
  const counter = h("span", { class: "muted", id: "jobs-count" });
  const live = h("span", { class: "live", title: "refreshes every 2 s" }, "live");
  let jobs = [];
  let timer = null;
  let stopped = false;

  const chips = h("div", { class: "chips", role: "group", "aria-label": "state" },
    STATES.map((state) => h("button", {
      type: "button", class: "chip", dataset: { filter: state || "all" },
      onclick: () => {
        filters.state = state;
        sessionStorage.setItem("sandcell.filter.state", state);
        markChips();
        refresh();
      },
    }, state || "all")));
  const markChips = () => {
    for (const chip of chips.children) {
      chip.classList.toggle("active", chip.dataset.filter === (filters.state || "all"));
    }
  };
  const search = h("input", {
    type: "search", class: "search", placeholder: "Filter by id, image, reason…", id: "jobs-search",
    oninput: () => { filters.text = search.value.trim().toLowerCase(); draw(); },
  });

  function draw() {
    const shown = jobs.filter((job) => !filters.text || [job.id, job.image, job.reason,
      job.runtime, job.tenant_id].some((v) => v && v.toLowerCase().includes(filters.text)));
    const headers = who.admin ? [HEADERS[0], "Tenant", ...HEADERS.slice(1)] : HEADERS;
    fill(holder, table(headers, shown.map((job) => row(job, who.admin)), {
      empty: filters.state || filters.text ? "No job matches these filters."
        : "No jobs yet. Submit one with `sandcell run script.py`.",
      cls: "jobs",
    }));
    counter.textContent = `${shown.length} shown`;
  }

  async function refresh() {
    clearTimeout(timer);
    const path = who.admin ? "/v1/admin/overview/jobs" : "/v1/jobs";
    try {
      const page = await get(path + query({ state: filters.state, limit: 100 }));
      if (stopped) return;
      jobs = page.items;
      live.classList.remove("stale");
      draw();
    } catch (error) {
      live.classList.add("stale");
      live.title = `refresh failed: ${error.message}`;
    }
    if (!stopped) timer = setTimeout(refresh, POLL_MS);
  }

  markChips();
  app.append(
    h("div", { class: "page-head" },
      h("h1", {}, who.admin ? "Jobs — all tenants" : "Jobs"), live, counter),
    card(null, h("div", { class: "toolbar" }, chips, search), holder));
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
