// The console's shell: sign-in, navigation and the hash router. Each view renders into a fresh
// section and registers what must stop when the user leaves it (polls, followed streams), so
// leaving a page ends its requests.

import * as api from "./api.js";
import { h, fill, field, notice } from "./dom.js";
import { jobsView } from "./jobs.js";
import { jobView } from "./job.js";
import { functionsView, functionView, uploadView } from "./functions.js";
import { filesView } from "./files.js";
import { queueView } from "./queue.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signOutButton = document.getElementById("sign-out");

const VIEWS = {
  jobs: jobsView,
  job: jobView,
  functions: functionsView,
  function: functionView,
  upload: uploadView,
  files: filesView,
  queue: queueView,
  // Loaded when first opened: not part of the first page load.
  usage: (root, context) => import("./usage.js").then((module) => module.usageView(root, context)),
};

let scope = null;
let lastView = null;

/** What a view may rely on: its stops run when the user leaves; `alive` until then. */
class Scope {
  constructor() {
    this.stops = [];
    this.alive = true;
  }
  add(stop) {
    if (this.alive) this.stops.push(stop);
    else stop();
  }
  end() {
    this.alive = false;
    for (const stop of this.stops.splice(0)) {
      try {
        stop();
      } catch (error) {
        console.warn(error);
      }
    }
  }
}

function parseHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const at = hash.indexOf("?");
  const path = at < 0 ? hash : hash.slice(0, at);
  const parts = path.split("/").filter(Boolean).map((part) => decodeURIComponent(part));
  return {
    name: parts[0] || "jobs",
    args: parts.slice(1),
    query: Object.fromEntries(new URLSearchParams(at < 0 ? "" : hash.slice(at + 1))),
  };
}

function chrome(signedIn) {
  nav.hidden = !signedIn;
  signOutButton.hidden = !signedIn;
}

function render(message) {
  if (scope) scope.end();
  scope = new Scope();
  if (!api.token()) {
    lastView = null;
    chrome(false);
    signIn(message);
    return;
  }
  chrome(true);
  const { name, args, query } = parseHash();
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.view.split(" ").includes(name)) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const root = h("section", { class: `view view-${name}` });
  fill(main, root);
  const view = VIEWS[name];
  let done;
  if (!view) {
    document.title = "Not found · Gantry";
    fill(root, h("h1", {}, "Not found"), h("p", {}, "This page does not exist. ", h("a", { href: "#/jobs" }, "Go to the jobs.")));
    done = Promise.resolve();
  } else {
    done = Promise.resolve(view(root, { args, query, scope })).catch((error) => {
      root.append(notice("error", error.message));
    });
  }
  // When the page changes (not when its filters do), focus moves to its heading once it has
  // rendered, unless the reader has already moved into the new page.
  const viewKey = `${name}/${args.join("/")}`;
  if (viewKey !== lastView) {
    lastView = viewKey;
    const current = scope;
    done.then(() => {
      const active = document.activeElement;
      const settled = active && active !== document.body && active.isConnected && main.contains(active);
      const heading = root.querySelector("h1");
      if (current.alive && heading && !settled) {
        heading.tabIndex = -1;
        heading.focus({ preventScroll: true });
      }
    });
  }
}

function signIn(message) {
  document.title = "Sign in · Gantry";
  const input = h("input", { type: "password", name: "token", autocomplete: "off", spellcheck: "false", required: true });
  const status = h("div", { class: "form-status", "aria-live": "polite" }, message ? notice("error", message) : null);
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "card sign-in", novalidate: true },
    h("h1", {}, "Sign in to Gantry"),
    h("p", {}, "Paste an API token. It is kept in this tab only and sent only in the Authorization header."),
    field("API token", input),
    button,
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) {
      fill(status, notice("error", "Paste a token first."));
      input.focus();
      return;
    }
    button.disabled = true;
    fill(status, notice("info", "Checking the token…"));
    try {
      // Any authenticated call checks the token; this one is cheap.
      await api.get("jobs/queue/", { limit: 0 }, { bearer: value });
      api.saveToken(value);
      render();
    } catch (error) {
      fill(status, notice("error", error.message));
      input.select();
    } finally {
      button.disabled = false;
    }
  });
  fill(main, h("section", { class: "view view-sign-in" }, form));
  requestAnimationFrame(() => input.focus());
}

signOutButton.addEventListener("click", () => {
  api.forgetToken();
  render();
});

api.onUnauthorized((error) => {
  if (api.token()) {
    api.forgetToken();
    render(error.message);
  }
});

window.addEventListener("hashchange", () => render());
render();
