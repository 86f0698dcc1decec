// The JSON API, with the key from sessionStorage as a Bearer header. The key never goes in a
// URL or a cookie: nothing another site could make the browser send for it.

const KEY = "sandcell.key";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export const session = {
  key: () => sessionStorage.getItem(KEY),
  signIn: (key) => sessionStorage.setItem(KEY, key),
  signOut: () => {
    for (const name of Object.keys(sessionStorage)) {
      if (name.startsWith("sandcell.")) sessionStorage.removeItem(name);
    }
  },
};

function headers(extra = {}, key = session.key()) {
  return key ? { Authorization: `Bearer ${key}`, ...extra } : extra;
}

async function problemOf(response) {
  try { return await response.json(); } catch { return { title: response.statusText }; }
}

export async function call(method, path, body, { signal, key } = {}) {
  const init = {
    method, headers: headers({}, key || session.key()), signal, credentials: "omit",
    cache: "no-store",
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  if (response.status === 401 && !key && session.key()) {
    window.dispatchEvent(new CustomEvent("sandcell:unauthorized"));
  }
  if (!response.ok) throw new ApiError(response.status, await problemOf(response));
  return response.status === 204 ? null : response.json();
}

export const get = (path, opts) => call("GET", path, undefined, opts);
export const post = (path, body, opts) => call("POST", path, body, opts);
export const del = (path, opts) => call("DELETE", path, undefined, opts);
export const patch = (path, body, opts) => call("PATCH", path, body, opts);

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// Server-sent events over fetch (EventSource cannot send an Authorization header).
export async function stream(path, onEvent, signal) {
  const response = await fetch(path, {
    headers: headers({ Accept: "text/event-stream" }), signal, credentials: "omit",
    cache: "no-store",
  });
  if (!response.ok) throw new ApiError(response.status, await problemOf(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = { event: "message", data: [] };
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (name === "event") event.event = text;
        else if (name === "data") event.data.push(text);
      }
      onEvent(event.event, JSON.parse(event.data.join("\n") || "null"));
    }
  }
}
