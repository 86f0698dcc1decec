import { h } from "../dom.js";

export function signInPage(signIn) {
  const input = h("input", {
    id: "api-key", type: "password", name: "key", autocomplete: "off", spellcheck: "false",
    placeholder: "sc_… or the admin key", required: true,
  });
  const error = h("p", { class: "form-error", id: "signin-error", role: "alert" });
  const form = h("form", {
    class: "signin-form", id: "signin",
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = "";
      try { await signIn(input.value.trim()); } catch (problem) {
        error.textContent = problem.status === 401
          ? "That key was not accepted." : `Sign-in failed: ${problem.message}`;
      }
    },
  },
  h("label", { for: "api-key" }, "API key"),
  input,
  h("button", { class: "btn btn-primary", type: "submit", id: "signin-submit" }, "Sign in"),
  error);
  setTimeout(() => input.focus(), 0);
  return h("section", { class: "signin" },
    h("div", { class: "signin-card" },
      h("div", { class: "signin-mark", "aria-hidden": "true" }),
      h("h1", {}, "sandcell"),
      h("p", { class: "muted" },
        "Sign in with a tenant's API key to see its jobs and sessions, or with the admin key "
        + "to manage tenants. The key stays in this browser tab only and is sent as an "
        + "Authorization header; signing out forgets it."),
      form));
}
