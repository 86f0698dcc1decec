// The dashboard shell: sign-in, navigation and a hash router (#/jobs, #/jobs/<id>, …).
// Each page renders into <main> and returns a function that stops its timers and streams.

import { ApiError, get, session } from "./api.js";
import { clear, fill, h } from "./dom.js";
import { adminPage } from "./pages/admin.js";
import { jobPage } from "./pages/job.js";
import { jobsPage } from "./pages/jobs.js";
import { sessionPage, sessionsPage } from "./pages/sessions.js";
import { signInPage } from "./pages/signin.js";

const app = document.getElementById("app");
const state = { who: null, stop: null, turn: 0 };

const ROUTES = [
  [/^\/jobs$/, (ctx) => jobsPage(ctx)],
  [/^\/jobs\/([\w-]+)$/, (ctx, id) => jobPage(ctx, id)],
  [/^\/sessions$/, (ctx) => sessionsPage(ctx)],
  [/^\/sessions\/([\w-]+)$/, (ctx, id) => sessionPage(ctx, id)],
  [/^\/admin(?:\/(health|tenants|keys|audit))?$/, (ctx, tab) => adminPage(ctx, tab || "health")],
];

function navLinks(who) {
  const links = who.admin
    ? [["#/jobs", "Jobs"], ["#/admin/health", "Health"], ["#/admin/tenants", "Tenants"],
      ["#/admin/keys", "Keys"], ["#/admin/audit", "Audit log"]]
    : [["#/jobs", "Jobs"], ["#/sessions", "Sessions"]];
  return links.map(([href, text]) => h("a", { href, class: "nav-link" }, text));
}

function renderChrome() {
  const nav = clear(document.getElementById("nav"));
  const who = clear(document.getElementById("who"));
  if (!state.who) return;
  nav.append(...navLinks(state.who));
  const label = state.who.admin ? "admin" : state.who.tenant_name || state.who.tenant_id;
  who.append(
    h("span", { class: `who-role ${state.who.admin ? "who-admin" : ""}`, id: "who-name",
      title: `key ${state.who.key_id}` }, label),
    h("button", { class: "btn btn-ghost", id: "sign-out", type: "button", onclick: signOut },
      "Sign out"),
  );
}

function highlightNav(path) {
  for (const link of document.querySelectorAll(".nav-link")) {
    const target = link.getAttribute("href").slice(1);
    link.classList.toggle("active", path === target || path.startsWith(`${target}/`));
  }
}

export function signOut() {
  session.signOut();
  state.who = null;
  renderChrome();
  if (location.hash !== "#/signin") location.hash = "#/signin";
  else route();
}

async function signIn(key) {
  state.who = await get("/v1/ui/whoami", { key });
  session.signIn(key);
  renderChrome();
  location.hash = "#/jobs";
}

async function route() {
  if (state.stop) { state.stop(); state.stop = null; }
  const turn = ++state.turn; // a later navigation wins over this one's pending sign-in check
  const path = location.hash.replace(/^#/, "") || "/jobs";
  if (!session.key()) {
    if (state.who) { state.who = null; renderChrome(); }
    fill(app, signInPage(signIn));
    return;
  }
  if (!state.who) {
    let who;
    try { who = await get("/v1/ui/whoami"); } catch (error) {
      if (turn !== state.turn) return;
      if (error instanceof ApiError && error.status === 401) { signOut(); return; }
      throw error;
    }
    if (turn !== state.turn || !session.key()) return;
    state.who = who;
    renderChrome();
  }
  if (path === "/signin") { location.hash = "#/jobs"; return; }
  highlightNav(path);
  const ctx = { app: clear(app), who: state.who };
  for (const [pattern, render] of ROUTES) {
    const match = path.match(pattern);
    if (match) {
      state.stop = render(ctx, ...match.slice(1)) || null;
      return;
    }
  }
  app.append(h("section", { class: "notfound" }, h("h1", {}, "Not found"),
    h("p", {}, "There is no page here."), h("a", { href: "#/jobs" }, "Back to jobs")));
}

window.addEventListener("hashchange", route);
window.addEventListener("sandcell:unauthorized", () => signOut());
route();
