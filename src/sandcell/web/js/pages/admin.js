// The operator's pages: health, tenants (and their quotas, editable), keys (created — shown
// once — and revoked), audit.

import { del, get, patch, post, query } from "../api.js";
import { latencyChart, quantile } from "../chart.js";
import {
  card, fill, confirmAction, copyButton, field, h, short, table, toast, when,
} from "../dom.js";

const TABS = [["health", "Health"], ["tenants", "Tenants"], ["keys", "Keys"], ["audit", "Audit log"]];
const HEALTH_POLL_MS = 5000;
const PHASES = {
  sandcell_submit_ack_seconds: "ack: submit → acknowledged",
  sandcell_job_queue_seconds: "queue: accepted → claimed",
  sandcell_job_start_seconds: "start: claimed → sandbox ready",
  sandcell_job_run_seconds: "run: ready → finished",
};

function seconds(value) {
  if (value === null) return "—";
  if (value === Infinity) return "> max";
  return value < 1 ? `≤ ${Math.round(value * 1000)} ms` : `≤ ${value} s`;
}

function stat(label, value, id) {
  return h("div", { class: "stat", id }, h("div", { class: "stat-value" }, value),
    h("div", { class: "stat-label" }, label));
}

function healthView(health) {
  const runtimes = health.workers.map((w) => `${w.runtime} ${w.runtime_version}`);
  const stats = h("div", { class: "stats" },
    stat("version", health.version, "stat-version"),
    stat("runtime", [...new Set(runtimes)].join(", ") || "no live worker", "stat-runtime"),
    stat("queue depth", health.queue_depth, "stat-queue"),
    stat("sandboxes running", health.sandboxes_running, "stat-running"),
    stat("store", health.store_up ? "up" : "DOWN", "stat-store"));
  const images = table(["Image", "Version", "Digest"], health.images.map((i) => h("tr", {},
    h("td", {}, i.name), h("td", {}, i.version), h("td", { class: "mono sha" }, i.digest))),
  { empty: "No image is built: run `sandcell image build python`." });
  const workers = table(["Worker", "Host", "Runtime", "Up since"], health.workers.map((w) =>
    h("tr", {}, h("td", { class: "mono" }, w.id), h("td", {}, w.host),
      h("td", {}, `${w.runtime} ${w.runtime_version}`), h("td", {}, when(w.started_at)))),
  { empty: "No worker has reported in." });
  const pools = table(["Pool figure", "Labels", "Value"], health.pools.map((p) => h("tr", {},
    h("td", { class: "mono" }, p.name),
    h("td", {}, Object.entries(p.labels).map(([k, v]) => `${k}=${v}`).join(" ")),
    h("td", { class: "num" }, p.value))),
  { empty: "No warm pools are reported: every job boots a fresh sandbox." });
  const states = h("div", { class: "chips" }, Object.entries(health.jobs_by_state).map(
    ([state, count]) => h("span", { class: "chip static" }, `${state} ${count}`)));
  const order = Object.keys(PHASES);
  const latency = [...health.latency].sort((a, b) =>
    (order.indexOf(a.name) + 1 || 99) - (order.indexOf(b.name) + 1 || 99));
  const charts = h("div", { class: "charts" }, latency.map((hist) => h("figure",
    { class: "chart-box" },
    h("figcaption", {}, h("strong", {}, PHASES[hist.name] || hist.name),
      h("span", { class: "muted small" },
        ` n=${hist.count} · p50 ${seconds(quantile(hist, 0.5))} · p95 ${seconds(quantile(hist, 0.95))}`)),
    latencyChart(hist))));
  return [stats, h("div", { class: "grid" }, card("Images", images), card("Workers", workers)),
    card("Latency (the histograms of /metrics)", charts),
    h("div", { class: "grid" }, card("Jobs by state", states), card("Warm pools", pools))];
}

function healthTab(body) {
  let timer = null;
  let stopped = false;
  const holder = h("div", { id: "health" });
  body.append(holder);
  async function refresh() {
    try {
      const health = await get("/v1/admin/overview/health");
      if (stopped) return;
      fill(holder, ...healthView(health));
    } catch (error) { toast(`Health: ${error.message}`, "bad"); }
    if (!stopped) timer = setTimeout(refresh, HEALTH_POLL_MS);
  }
  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}

function kv(object) {
  const entries = Object.entries(object || {});
  return entries.length ? entries.map(([k, v]) => `${k}=${v}`).join("  ") : "defaults";
}

const QUOTAS = [
  ["concurrent_jobs", "Concurrent jobs", "queued or running at once", "1"],
  ["sessions", "Live sessions", "running or paused at once", "1"],
  ["storage_mb", "Storage (MiB)", "input files and artifacts", "1"],
  ["jobs_per_minute", "Jobs per minute", "sustained submission rate", "any"],
  ["burst", "Burst", "submissions at once above the rate", "1"],
];

function problemText(error) {
  const fields = (error.problem && error.problem.errors) || [];
  return fields.length ? fields.map((e) => `${e.field}: ${e.message}`).join("; ") : error.message;
}

// The quota editor of one tenant: every quota in effect; an empty field means the default.
function quotaForm(tenant, done) {
  const message = h("p", { class: "form-error", id: "quota-error", role: "alert" });
  const inputs = QUOTAS.map(([name, label, help, step]) => {
    const own = name in (tenant.quota_overrides || {});
    const input = h("input", { id: `quota-${name}`, name, type: "number", min: step === "any" ? "0.001" : "0",
      step, value: own ? tenant.quota_overrides[name] : "", placeholder: `${tenant.quotas[name]} (default)`,
      "aria-describedby": `quota-${name}-help` });
    const reset = h("button", { class: "btn btn-small", type: "button", title: "back to the default",
      onclick: () => { input.value = ""; input.focus(); } }, "Default");
    return [name, input, h("label", { class: "quota-field", for: `quota-${name}` },
      h("span", { class: "quota-label" }, label),
      h("span", { class: "muted small", id: `quota-${name}-help` }, help),
      h("span", { class: "quota-input" }, input, reset))];
  });
  async function save(event) {
    event.preventDefault();
    const quotas = {};
    for (const [name, input] of inputs) {
      const before = (tenant.quota_overrides || {})[name];
      const value = input.value.trim() === "" ? null : Number(input.value);
      if (value !== (before ?? null)) quotas[name] = value;
    }
    message.textContent = "";
    try {
      await patch(`/v1/admin/tenants/${encodeURIComponent(tenant.id)}`, { quotas });
      toast(`Quotas of ${tenant.name} saved`);
      done(true);
    } catch (error) { message.textContent = problemText(error); }
  }
  return h("form", { class: "quota-form", id: "quota-form", onsubmit: save },
    h("h3", { class: "quota-title" }, `Quotas of ${tenant.name}`),
    h("p", { class: "muted small" }, "Empty means the server's default. New quotas hold from the "
      + "next submission or session; nothing running is stopped."),
    h("div", { class: "quota-grid" }, inputs.map(([, , label]) => label)), message,
    h("div", { class: "toolbar" },
      h("button", { class: "btn btn-primary", type: "submit", id: "quota-save" }, "Save quotas"),
      h("button", { class: "btn", type: "button", onclick: () => done(false) }, "Cancel")));
}

function quotaText(t) {
  return QUOTAS.map(([name]) => {
    const own = name in (t.quota_overrides || {});
    return h("span", { class: own ? "quota-own" : "muted", title: own ? "set for this tenant"
      : "the default" }, `${name}=${t.quotas[name]}`);
  }).flatMap((item) => [item, "  "]).slice(0, -1);
}

function tenantsTab(body) {
  const holder = h("div", { id: "tenants" });
  const editor = h("div", { id: "quota-editor" });
  const name = h("input", { id: "tenant-name", placeholder: "new tenant name", required: true,
    maxlength: 200 });
  const form = h("form", { class: "inline-form", onsubmit: async (event) => {
    event.preventDefault();
    try {
      await post("/v1/admin/tenants", { name: name.value.trim() });
      toast(`Tenant ${name.value.trim()} created`);
      name.value = "";
      load();
    } catch (error) { toast(`Could not create: ${error.message}`, "bad"); }
  } }, name, h("button", { class: "btn btn-primary", type: "submit" }, "Create tenant"));
  function edit(tenant) {
    fill(editor, card(null, quotaForm(tenant, (saved) => {
      fill(editor);
      if (saved) load().catch((error) => toast(error.message, "bad"));
    })));
    editor.scrollIntoView({ block: "nearest" });
    document.getElementById(`quota-${QUOTAS[0][0]}`).focus();
  }
  async function load() {
    const page = await get("/v1/admin/overview/tenants");
    fill(holder, table(["Tenant", "Id", "Created", "Limits", "Images", "Quotas", ""],
      page.items.map((t) => h("tr", { dataset: { tenantId: t.id } },
        h("td", {}, h("strong", {}, t.name)),
        h("td", { class: "mono" }, t.id), h("td", {}, when(t.created_at)),
        h("td", { class: "small" }, kv(t.limits)),
        h("td", {}, t.images ? t.images.join(", ") : "all"),
        h("td", { class: "small quotas" }, quotaText(t)),
        h("td", {}, h("button", { class: "btn btn-small edit-quotas", type: "button",
          onclick: () => edit(t) }, "Edit quotas")))), { empty: "No tenants yet." }));
  }
  body.append(card("Tenants", form, holder), editor);
  load().catch((error) => toast(error.message, "bad"));
}

function keysTab(body) {
  const holder = h("div", { id: "keys" });
  const shown = h("div", { id: "new-key" });
  const tenant = h("select", { id: "key-tenant" });
  const form = h("form", { class: "inline-form", onsubmit: async (event) => {
    event.preventDefault();
    try {
      const key = await post(`/v1/admin/tenants/${encodeURIComponent(tenant.value)}/keys`, {});
      fill(shown, h("div", { class: "once" },
        h("strong", {}, "New key — shown once. Copy it now; only its id is kept."),
        h("div", { class: "once-row" }, h("code", { class: "mono", id: "new-key-value" }, key.key),
          copyButton(key.key))));
      load();
    } catch (error) { toast(`Could not create a key: ${error.message}`, "bad"); }
  } }, h("label", { for: "key-tenant" }, "Tenant"), tenant,
  h("button", { class: "btn btn-primary", type: "submit" }, "Create key"));
  async function load() {
    const [tenants, keys] = await Promise.all([get("/v1/admin/overview/tenants"),
      get("/v1/admin/overview/keys")]);
    const names = Object.fromEntries(tenants.items.map((t) => [t.id, t.name]));
    const chosen = tenant.value;
    fill(tenant, ...tenants.items.map((t) => h("option", { value: t.id }, t.name)));
    if (chosen) tenant.value = chosen;
    fill(holder, table(["Key id", "Tenant", "Scopes", "Created", "Status", ""],
      keys.items.map((k) => h("tr", { dataset: { keyId: k.id } },
        h("td", { class: "mono" }, k.id),
        h("td", {}, k.tenant_id ? names[k.tenant_id] || k.tenant_id : "admin"),
        h("td", {}, k.scopes.join(", ")), h("td", {}, when(k.created_at)),
        h("td", {}, k.revoked_at ? h("span", { class: "badge badge-muted" }, "revoked")
          : h("span", { class: "badge badge-ok" }, "active")),
        h("td", {}, k.revoked_at ? null : h("button", { class: "btn btn-small btn-danger",
          type: "button", onclick: async () => {
            if (!await confirmAction("Revoke this key?",
              `Key ${k.id} stops working at once.`, "Revoke key")) return;
            try { await del(`/v1/admin/keys/${encodeURIComponent(k.id)}`); toast("Key revoked"); }
            catch (error) { toast(`Could not revoke: ${error.message}`, "bad"); }
            load();
          } }, "Revoke")))), { empty: "No stored keys." }));
  }
  body.append(card("Create a key", form, shown), card("Keys", holder));
  load().catch((error) => toast(error.message, "bad"));
}

function auditTab(body) {
  const holder = h("div", { id: "audit" });
  const action = h("input", { placeholder: "action, e.g. key.create", id: "audit-action" });
  const form = h("form", { class: "inline-form", onsubmit: (event) => {
    event.preventDefault(); load();
  } }, action, h("button", { class: "btn", type: "submit" }, "Filter"));
  async function load() {
    try {
      const page = await get(`/v1/admin/audit${query({ action: action.value.trim(), limit: 200 })}`);
      fill(holder, table(["When", "Action", "Outcome", "Actor", "Tenant", "Target", "Detail"],
        page.items.map((e) => h("tr", {}, h("td", {}, when(e.at)), h("td", { class: "mono" }, e.action),
          h("td", { class: e.outcome === "ok" ? "good" : "warn" }, e.outcome),
          h("td", { class: "mono" }, e.actor || "—"), h("td", { class: "mono" }, short(e.tenant_id)),
          h("td", { class: "mono" }, short(e.target, 20)),
          h("td", { class: "small" }, Object.keys(e.detail || {}).length ? JSON.stringify(e.detail) : ""))),
        { empty: "No events." }));
    } catch (error) { toast(`Audit: ${error.message}`, "bad"); }
  }
  body.append(card("Audit log", form, holder));
  load();
}

export function adminPage({ app, who }, tab) {
  if (!who.admin) {
    app.append(h("section", { class: "notfound" }, h("h1", {}, "Admin only"),
      h("p", {}, "Sign in with the admin key to manage tenants.")));
    return null;
  }
  const body = h("div", { class: "tab-body" });
  app.append(h("div", { class: "page-head" }, h("h1", {}, TABS.find(([t]) => t === tab)[1])),
    body);
  if (tab === "health") return healthTab(body);
  if (tab === "tenants") tenantsTab(body);
  if (tab === "keys") keysTab(body);
  if (tab === "audit") auditTab(body);
  return null;
}
