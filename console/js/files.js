// Files of a function: the caller's own area and, for those who manage a provider's function,
// the provider's area. List, upload, download (fetched with the token and saved from a blob, so
// the token never goes into a link) and delete.

import * as api from "./api.js";
import { h, fill, field, notice, route, functionName } from "./dom.js";

export async function filesView(root, { query, scope }) {
  document.title = "Files · Gantry";
  const area = query.area === "provider" ? "provider" : "user";
  const chooser = h("select", { name: "function" }, h("option", { value: "" }, "Choose a function…"));
  const areaSelect = h(
    "select",
    { name: "area" },
    h("option", { value: "user" }, "My files"),
    h("option", { value: "provider" }, "The provider's files"),
  );
  areaSelect.value = area;
  const form = h(
    "form",
    { class: "filters" },
    field("Function", chooser),
    field("Area", areaSelect),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Show")),
  );
  const body = h("div", { class: "files-body" });
  fill(root, h("h1", {}, "Files"), form, body);

  const go = () => {
    const [provider, title] = chooser.value.includes("/") ? chooser.value.split("/", 2) : ["", chooser.value];
    location.hash = route("files", { function: title, provider, area: areaSelect.value === "provider" ? "provider" : "" });
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go();
  });

  const selected = query.function ? functionName(query.function, query.provider) : "";
  try {
    const functions = await api.get("programs/");
    for (const fn of functions) {
      const name = functionName(fn.title, fn.provider);
      chooser.append(h("option", { value: name }, name));
    }
  } catch (error) {
    body.append(notice("error", error.message));
  }
  if (selected && ![...chooser.options].some((option) => option.value === selected)) {
    chooser.append(h("option", { value: selected }, selected));
  }
  chooser.value = selected;
  if (!scope.alive || !query.function) {
    if (!query.function) fill(body, h("p", { class: "muted" }, "Choose a function to see its files."));
    return;
  }
  if (area === "provider" && !query.provider) {
    fill(body, notice("error", "Only a provider's function has provider files."));
    return;
  }

  const base = area === "provider" ? "files/provider/" : "files/";
  const target = { function: query.function, provider: query.provider };
  const list = h("div", { class: "table-wrap", id: "file-list" });
  const answer = h("div", { id: "file-answer", "aria-live": "polite" });
  const picker = h("input", { type: "file", name: "file" });
  const uploadButton = h("button", { type: "submit" }, "Upload");
  const upload = h("form", { class: "inline-form", novalidate: true }, field("File to upload", picker), uploadButton);
  fill(
    body,
    h("h2", {}, area === "provider" ? `Provider files of ${selected}` : `My files of ${selected}`),
    upload,
    answer,
    list,
  );

  const say = (kind, text) => fill(answer, notice(kind, text));

  const load = async () => {
    let names;
    try {
      const listing = await api.get(base, target);
      names = listing.results || listing.files || [];
    } catch (error) {
      fill(list, notice("error", error.message));
      return;
    }
    if (!names.length) {
      fill(list, h("p", { class: "muted" }, "No files yet."));
      return;
    }
    fill(
      list,
      h(
        "table",
        { class: "files" },
        h("caption", { class: "visually-hidden" }, "Files"),
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "File"), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))),
        h("tbody", {}, names.map(fileRow)),
      ),
    );
  };

  const fileRow = (name) => {
    const actions = h("td", { class: "links" });
    const row = h("tr", { "data-file": name }, h("td", { class: "mono" }, name), actions);
    const downloadButton = h("button", { type: "button", class: "quiet", "aria-label": `Download ${name}` }, "Download");
    const deleteButton = h("button", { type: "button", class: "quiet danger", "aria-label": `Delete ${name}` }, "Delete");
    downloadButton.addEventListener("click", async () => {
      downloadButton.disabled = true;
      try {
        await api.download(`${base}download/`, { ...target, file: name }, name);
      } catch (error) {
        say("error", error.message);
      } finally {
        downloadButton.disabled = false;
      }
    });
    const normal = () => fill(actions, downloadButton, " ", deleteButton);
    deleteButton.addEventListener("click", () => {
      const confirm = h("button", { type: "button", class: "danger" }, `Yes, delete ${name}`);
      const cancel = h("button", { type: "button", class: "quiet" }, "Cancel");
      cancel.addEventListener("click", () => {
        normal();
        deleteButton.focus();
      });
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        try {
          const reply = await api.call("DELETE", `${base}delete/`, { query: { ...target, file: name } });
          say("ok", reply && reply.message ? reply.message : `${name} deleted.`);
          await load();
          picker.focus();
        } catch (error) {
          say("error", error.message);
          normal();
        }
      });
      fill(actions, confirm, " ", cancel);
      confirm.focus();
    });
    normal();
    return row;
  };

  upload.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!picker.files.length) {
      say("error", "Choose a file first.");
      picker.focus();
      return;
    }
    const form = new FormData();
    form.set("file", picker.files[0], picker.files[0].name);
    uploadButton.disabled = true;
    say("info", `Uploading ${picker.files[0].name}…`);
    try {
      await api.call("POST", `${base}upload/`, { query: target, body: form });
      say("ok", `Uploaded ${picker.files[0].name}.`);
      picker.value = "";
      await load();
    } catch (error) {
      say("error", error.message);
    } finally {
      uploadButton.disabled = false;
    }
  });

  await load();
}
