// Functions: the list (own and catalog, narrowed by provider), one function's detail with its
// run form (arguments checked live by `validate_arguments/`), and the upload form.

import * as api from "./api.js";
import { h, fill, field, notice, when, route, functionName } from "./dom.js";

const SIZE_ORDER = ["S", "M", "L", "XL"];

export async function functionsView(root, { query }) {
  document.title = "Functions · Gantry";
  const show = h(
    "select",
    { name: "filter" },
    h("option", { value: "" }, "All I can see"),
    h("option", { value: "serverless" }, "My own functions"),
    h("option", { value: "catalog" }, "Catalog (provider functions I can run)"),
  );
  show.value = query.filter || "";
  const provider = h("input", { name: "provider", type: "text", autocomplete: "off", value: query.provider || "" });
  const form = h(
    "form",
    { class: "filters", role: "search" },
    field("Show", show),
    field("Provider", provider),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Apply")),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = route("functions", { filter: show.value, provider: provider.value.trim() });
  });
  const list = h("div", { class: "table-wrap", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  fill(
    root,
    h("div", { class: "title-row" }, h("h1", {}, "Functions"), h("a", { class: "button", href: "#/upload" }, "Upload a function")),
    form,
    list,
  );
  let functions;
  try {
    functions = await api.get("programs/", { filter: query.filter, provider: query.provider });
  } catch (error) {
    fill(list, notice("error", error.message));
    return;
  }
  if (!functions.length) {
    fill(list, h("p", { class: "muted" }, "No functions here yet. ", h("a", { href: "#/upload" }, "Upload one.")));
    return;
  }
  fill(
    list,
    h(
      "table",
      { class: "functions" },
      h("caption", { class: "visually-hidden" }, "Functions"),
      h("thead", {}, h("tr", {}, ["Function", "Provider", "Version", "Type", "Description", ""].map((name) => h("th", { scope: "col" }, name)))),
      h(
        "tbody",
        {},
        functions.map((fn) => {
          const link = route("function", { title: fn.title, provider: fn.provider });
          return h(
            "tr",
            { "data-function": functionName(fn.title, fn.provider) },
            h("td", {}, h("a", { href: link }, fn.title)),
            h("td", {}, fn.provider || h("span", { class: "muted" }, "mine")),
            h("td", {}, fn.version || ""),
            h("td", {}, fn.type || ""),
            h("td", { class: "wrap" }, fn.description || ""),
            h(
              "td",
              { class: "links" },
              h("a", { href: route("jobs", { function: fn.title, provider: fn.provider }) }, "Jobs"),
              " ",
              h("a", { href: route("files", { function: fn.title, provider: fn.provider }) }, "Files"),
            ),
          );
        }),
      ),
    ),
  );
}

function sortSizes(labels) {
  return [...labels].sort((a, b) => {
    const [x, y] = [SIZE_ORDER.indexOf(a), SIZE_ORDER.indexOf(b)];
    return (x < 0 ? 99 : x) - (y < 0 ? 99 : y) || a.localeCompare(b);
  });
}

/** A JSON Pointer for a schema error's path (`/items/0`), "" for the whole document. */
function pointer(path) {
  return path.map((part) => `/${String(part).replace(/~/g, "~0").replace(/\//g, "~1")}`).join("");
}

/** A random Idempotency-Key, so a double submit runs one job (works outside secure contexts). */
function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

export async function functionView(root, { query, scope }) {
  const { title, provider } = query;
  const name = functionName(title, provider);
  document.title = `${name} · Gantry`;
  fill(root, h("h1", {}, name), h("p", { class: "muted" }, "Loading…"));
  if (!title) {
    fill(root, h("h1", {}, "Function"), notice("error", "No function named in the address."));
    return;
  }
  let fn;
  try {
    fn = await api.get(`programs/get_by_title/${encodeURIComponent(title)}/`, { provider });
  } catch (error) {
    fill(root, h("h1", {}, name), notice("error", error.message));
    return;
  }
  const sizes = sortSizes(Object.keys(fn.sizes || {}));
  const details = h(
    "dl",
    { class: "facts" },
    [
      ["Entry point", fn.entrypoint || "—"],
      ["Version", fn.version || "—"],
      ["Provider", fn.provider || "— (your own function)"],
      ["Type", fn.type],
      ["Runner", fn.runner],
      ["Sizes", sizes.length ? sizes.join(", ") : "—"],
      ["Default size", fn.default_size || "—"],
      ["Image", fn.image],
      ["Dependencies", (fn.dependencies || []).join(", ") || "—"],
      ["Description", fn.description || "—"],
      ["Documentation", safeLink(fn.documentation_url)],
      ["Created", when(fn.created)],
      ["Updated", when(fn.updated)],
      ["Disabled", fn.disabled ? "yes" : null],
    ]
      .filter(([, value]) => value !== null && value !== undefined && value !== "")
      .map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]),
  );
  const schema = fn.arguments_schema
    ? h("pre", { class: "code", tabindex: "0", "aria-label": "Arguments schema" }, JSON.stringify(fn.arguments_schema, null, 2))
    : h("p", { class: "muted" }, "No arguments schema: any JSON object is accepted.");

  fill(
    root,
    h(
      "div",
      { class: "title-row" },
      h("h1", {}, name),
      h(
        "div",
        { class: "links" },
        h("a", { class: "button quiet", href: route("jobs", { function: fn.title, provider: fn.provider }) }, "Jobs"),
        h("a", { class: "button quiet", href: route("files", { function: fn.title, provider: fn.provider }) }, "Files"),
        // Every user's use of the provider's functions: its admins read it (others get a 403).
        fn.provider
          ? h("a", { class: "button quiet", href: route("usage", { provider: fn.provider }), title: `Every user's use of ${fn.provider}'s functions (its admins)` }, `${fn.provider} usage`)
          : null,
      ),
    ),
    h("div", { class: "columns" }, h("section", { class: "card" }, h("h2", {}, "Details"), details), runForm(fn, sizes, scope)),
    h("section", { class: "card" }, h("h2", {}, "Arguments schema"), schema),
  );
}

function safeLink(url) {
  if (!url) return null;
  try {
    const parsed = new URL(url);
    if (parsed.protocol === "https:" || parsed.protocol === "http:") {
      return h("a", { href: parsed.href, rel: "noopener noreferrer", target: "_blank" }, parsed.href);
    }
  } catch {
    /* shown as text */
  }
  return url;
}

/** An example value for one property of an arguments schema: its default, else one it allows. */
function exampleValue(property) {
  if (!property || typeof property !== "object") return null;
  if (property.default !== undefined) return property.default;
  if (property.const !== undefined) return property.const;
  if (Array.isArray(property.enum) && property.enum.length) return property.enum[0];
  if (Array.isArray(property.examples) && property.examples.length) return property.examples[0];
  const type = Array.isArray(property.type) ? property.type[0] : property.type;
  switch (type) {
    case "integer":
    case "number":
      return property.minimum ?? (property.exclusiveMinimum !== undefined ? property.exclusiveMinimum + 1 : 0);
    case "boolean":
      return false;
    case "array":
      return [];
    case "object":
      return {};
    case "null":
      return null;
    default:
      return "";
  }
}

/** The run form's starting text: the schema's properties (required ones first) with examples. */
function argumentsTemplate(schema) {
  const properties = schema && typeof schema === "object" && schema.properties && typeof schema.properties === "object" ? schema.properties : null;
  if (!properties || !Object.keys(properties).length) return "{}";
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const names = Object.keys(properties).sort((a, b) => Number(required.has(b)) - Number(required.has(a)));
  const template = {};
  for (const name of names) template[name] = exampleValue(properties[name]);
  return JSON.stringify(template, null, 2);
}

function runForm(fn, sizes, scope) {
  const argsError = h("div", { id: "arguments-check", class: "field-check", "aria-live": "polite" });
  const argumentsInput = h("textarea", {
    name: "arguments",
    rows: 8,
    spellcheck: "false",
    class: "code",
    "aria-describedby": "arguments-check",
  });
  argumentsInput.value = argumentsTemplate(fn.arguments_schema);
  // The first focus selects the template, so typing replaces it.
  let touched = false;
  argumentsInput.addEventListener("focus", () => {
    if (!touched) argumentsInput.select();
  });
  const size = h(
    "select",
    { name: "function_size" },
    fn.default_size ? null : h("option", { value: "" }, "The function's default"),
    sizes.map((label) => h("option", { value: label }, label)),
  );
  if (fn.default_size && sizes.includes(fn.default_size)) size.value = fn.default_size;
  const button = h("button", { type: "submit" }, "Run");
  const status = h("div", { class: "form-status", "aria-live": "polite" });
  const argsField = h(
    "div",
    { class: "field" },
    h("label", { for: (argumentsInput.id = "run-arguments") }, "Arguments (JSON object)"),
    argumentsInput,
    argsError,
  );
  const form = h(
    "form",
    { class: "card run", novalidate: true },
    h("h2", {}, "Run"),
    argsField,
    field("Size", size, sizes.length ? "From the function's sizes." : "This function offers no sizes."),
    button,
    status,
  );
  let key = newKey();
  let checking = null; // the validation in flight
  let timer = null;
  let valid = null; // the last checked text and its verdict

  const show = (verdict) => {
    argumentsInput.setAttribute("aria-invalid", verdict.ok ? "false" : "true");
    if (verdict.ok) {
      fill(argsError, h("p", { class: "check ok" }, "✓ The arguments match the function's schema."));
      return;
    }
    const parts = [h("span", { class: "check-message" }, verdict.message)];
    if (verdict.path) {
      parts.push(" ", h("span", { class: "check-path" }, "at ", h("code", {}, pointer(verdict.path) || "/ (the whole object)")));
    }
    fill(argsError, h("p", { class: "check error", role: "alert" }, parts));
  };

  const check = async () => {
    const text = argumentsInput.value;
    if (valid && valid.text === text) return valid.verdict;
    let verdict;
    try {
      const parsed = JSON.parse(text);
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        verdict = { ok: false, message: "The arguments must be a JSON object, like {\"n\": 1}." };
      }
    } catch (error) {
      verdict = { ok: false, message: `Not valid JSON: ${error.message}` };
    }
    if (!verdict) {
      if (checking) checking.abort();
      checking = new AbortController();
      try {
        await api.call("POST", "programs/validate_arguments/", {
          body: { title: fn.title, provider: fn.provider, arguments: text },
          signal: checking.signal,
        });
        verdict = { ok: true };
      } catch (error) {
        if (error.name === "AbortError") return null;
        verdict = { ok: false, message: error.message, path: error.path };
      }
    }
    if (argumentsInput.value === text) {
      valid = { text, verdict };
      if (scope.alive) show(verdict);
    }
    return verdict;
  };

  argumentsInput.addEventListener("input", () => {
    touched = true;
    clearTimeout(timer);
    fill(argsError, h("p", { class: "check muted" }, "Checking…"));
    timer = setTimeout(check, 350);
  });
  scope.add(() => {
    clearTimeout(timer);
    if (checking) checking.abort();
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearTimeout(timer);
    button.disabled = true;
    fill(status);
    try {
      const verdict = await check();
      if (!verdict || !verdict.ok) {
        argumentsInput.focus();
        return;
      }
      fill(status, notice("info", "Starting the job…"));
      const job = await api.call("POST", "programs/run/", {
        body: { title: fn.title, provider: fn.provider, arguments: argumentsInput.value, function_size: size.value || undefined },
        extraHeaders: { "Idempotency-Key": key },
      });
      key = newKey();
      location.hash = `#/job/${encodeURIComponent(job.id)}`;
    } catch (error) {
      if (error.path) show({ ok: false, message: error.message, path: error.path });
      fill(status, notice("error", error.message));
      key = newKey();
    } finally {
      button.disabled = false;
    }
  });
  // The form starts neutral: the template is checked when the reader changes it or runs.
  fill(argsError, h("p", { class: "check muted" }, fn.arguments_schema ? "Fill in the arguments; they are checked against the function's schema as you type." : "Any JSON object."));
  return form;
}

export function uploadView(root) {
  document.title = "Upload a function · Gantry";
  const title = h("input", { name: "title", type: "text", required: true, autocomplete: "off", pattern: "[A-Za-z0-9_\\-/]+" });
  const entrypoint = h("input", { name: "entrypoint", type: "text", value: "main.py", autocomplete: "off" });
  const artifact = h("input", { name: "artifact", type: "file", accept: ".tar,application/x-tar", required: true });
  const version = h("input", { name: "version", type: "text", autocomplete: "off", placeholder: "1.0.0" });
  const description = h("textarea", { name: "description", rows: 2 });
  const schema = h("textarea", { name: "arguments_schema", rows: 6, class: "code", spellcheck: "false" });
  const dependencies = h("textarea", { name: "dependencies", rows: 2, class: "code", spellcheck: "false" });
  const button = h("button", { type: "submit" }, "Upload");
  const status = h("div", { class: "form-status", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "card upload", novalidate: true },
    field("Title", title, "A new title creates a function; an existing one gets a new version. provider/title for a provider's function."),
    field("Entry point", entrypoint, "The Python file in the archive that runs."),
    field("Archive (.tar)", artifact),
    field("Version", version),
    field("Description", description),
    field("Arguments schema (JSON Schema, optional)", schema),
    field("Dependencies (one pinned requirement a line, optional)", dependencies, "For example qiskit==1.4.2."),
    button,
    status,
  );
  // Each field's problem stands under it (and is what the field is described by).
  const controls = { title, entrypoint, artifact, version, description, arguments_schema: schema, dependencies };
  const checks = new Map();
  for (const [name, control] of Object.entries(controls)) {
    const check = h("div", { class: "field-check", id: `upload-${name}-check`, "aria-live": "polite" });
    control.after(check);
    const described = control.getAttribute("aria-describedby");
    control.setAttribute("aria-describedby", [described, check.id].filter(Boolean).join(" "));
    checks.set(control, check);
  }
  const clearProblems = () => {
    for (const [control, check] of checks) {
      control.removeAttribute("aria-invalid");
      fill(check);
    }
  };
  const showProblem = (control, message) => {
    control.setAttribute("aria-invalid", "true");
    fill(checks.get(control), h("p", { class: "check error", role: "alert" }, message));
  };
  // The field a gateway's refusal is about, by the words its message uses.
  const FIELD_WORDS = [
    [/arguments?[_ ]schema|json schema/i, schema],
    [/dependenc|requirement|pip/i, dependencies],
    [/entry ?point/i, entrypoint],
    [/artifact|archive|\btar\b|file/i, artifact],
    [/title|function name/i, title],
    [/version/i, version],
    [/description/i, description],
  ];
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearProblems();
    const problems = [];
    if (!title.value.trim()) problems.push([title, "A title is required."]);
    if (!artifact.files.length) problems.push([artifact, "Choose a .tar archive."]);
    if (schema.value.trim()) {
      try {
        JSON.parse(schema.value);
      } catch (error) {
        problems.push([schema, `The arguments schema is not valid JSON: ${error.message}`]);
      }
    }
    if (problems.length) {
      fill(status);
      for (const [control, message] of problems) showProblem(control, message);
      problems[0][0].focus();
      return;
    }
    const body = new FormData();
    body.set("title", title.value.trim());
    body.set("entrypoint", entrypoint.value.trim());
    body.set("artifact", artifact.files[0], artifact.files[0].name);
    if (version.value.trim()) body.set("version", version.value.trim());
    if (description.value.trim()) body.set("description", description.value.trim());
    if (schema.value.trim()) body.set("arguments_schema", schema.value.trim());
    const requirements = dependencies.value.split("\n").map((line) => line.trim()).filter(Boolean);
    if (requirements.length) body.set("dependencies", JSON.stringify(requirements));
    button.disabled = true;
    fill(status, notice("info", "Uploading…"));
    try {
      const fn = await api.call("POST", "programs/upload/", { body });
      location.hash = route("function", { title: fn.title, provider: fn.provider });
    } catch (error) {
      const about = FIELD_WORDS.find(([words]) => words.test(error.message));
      if (about) {
        fill(status);
        showProblem(about[1], error.message);
        about[1].focus();
      } else {
        fill(status, notice("error", error.message));
      }
    } finally {
      button.disabled = false;
    }
  });
  fill(root, h("h1", {}, "Upload a function"), form);
}
