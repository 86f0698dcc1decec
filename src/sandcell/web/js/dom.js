// Building the page: every piece of text goes in through textContent (never innerHTML), so
// a job's logs, file names or error messages can never become markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = String(value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// Replace el's children; like h(), it skips null and false and flattens arrays.
export function fill(el, ...children) {
  return append(clear(el), children);
}

const STATE_CLASS = {
  accepted: "queued", running: "running", completed: "ok", failed: "bad", cancelled: "muted",
  starting: "queued", paused: "paused", stopped: "muted", ready: "ok", idle: "ok",
};

export function badge(state) {
  const kind = STATE_CLASS[state] || "muted";
  return h("span", { class: `badge badge-${kind}`, dataset: { state } }, state || "—");
}

export function ms(value) {
  if (value === null || value === undefined) return "—";
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60000) return `${(value / 1000).toFixed(value < 10000 ? 2 : 1)} s`;
  const minutes = Math.floor(value / 60000);
  return `${minutes} m ${Math.round((value % 60000) / 1000)} s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function ago(iso) {
  if (!iso) return "—";
  const seconds = (Date.now() - Date.parse(iso)) / 1000;
  if (seconds < -60) return `in ${span(-seconds)}`;
  if (seconds < 5) return "just now";
  if (seconds < 60) return `${Math.floor(seconds)} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleDateString();
}

function span(seconds) {
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

export function when(iso) {
  return h("time", { datetime: iso || "", title: iso || "" }, ago(iso));
}

export function short(id, keep = 14) {
  return id && id.length > keep ? `${id.slice(0, keep)}…` : id || "—";
}

export function table(headers, rows, { empty = "Nothing here yet.", cls = "" } = {}) {
  const head = h("thead", {}, h("tr", {}, headers.map((title) =>
    typeof title === "string" ? h("th", {}, title) : h("th", { title: title[1] }, title[0]))));
  const body = h("tbody", {}, rows.length ? rows
    : h("tr", { class: "empty" }, h("td", { colspan: headers.length }, empty)));
  return h("div", { class: "table-wrap" }, h("table", { class: `table ${cls}` }, head, body));
}

export function card(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", { class: "card-title" }, title) : null,
    ...children);
}

export function field(label, value) {
  return [h("dt", {}, label), h("dd", {}, value ?? "—")];
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast toast-${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), 5000);
}

export function confirmAction(title, text, verb) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = verb;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

export function copyButton(text) {
  return h("button", {
    class: "btn btn-small", type: "button",
    onclick: async () => {
      try { await navigator.clipboard.writeText(text); toast("Copied"); }
      catch { toast("Copy failed: select the text instead", "bad"); }
    },
  }, "Copy");
}
