// pitstop inspector: live updates, the JSON editors and the action buttons.
// Every value from the server is put in the page with textContent (never innerHTML), except
// the fragments the server rendered itself (escaped by its templates).
"use strict";

(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const csrf = body.dataset.csrf || "";

  // -- the JSON API ---------------------------------------------------------------------------

  async function call(method, path, payload) {
    const options = {
      method,
      headers: { "Accept": "application/json", "X-Pitstop-CSRF": csrf },
      credentials: "same-origin",
    };
    if (payload !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(payload);
    }
    const response = await fetch(base + path, options);
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      const message = (data && data.message) || (response.status + " " + response.statusText);
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return data;
  }

  function say(form, text, ok) {
    const out = form.querySelector(".result");
    if (!out) return;
    out.textContent = text;
    out.classList.toggle("ok", ok);
    out.classList.toggle("bad", !ok);
  }

  const enc = encodeURIComponent;

  // -- JSON editors: checked as you type, before anything is sent -----------------------------

  function position(text, error) {
    const match = /position (\d+)/.exec(error.message);
    if (!match) return "";
    const at = Number(match[1]);
    const before = text.slice(0, at).split("\n");
    return "line " + before.length + ", column " + (before[before.length - 1].length + 1) + ": ";
  }

  function check(area) {
    const text = area.value;
    const out = area.parentElement.querySelector(".json-error");
    if (text.trim() === "") {
      area.classList.remove("valid");
      area.classList.add("invalid");
      if (out) out.textContent = "enter a JSON value (a string needs quotes: \"yes\")";
      return false;
    }
    try {
      JSON.parse(text);
      area.classList.remove("invalid");
      area.classList.add("valid");
      if (out) out.textContent = "";
      return true;
    } catch (error) {
      area.classList.remove("valid");
      area.classList.add("invalid");
      if (out) out.textContent = "not valid JSON: " + position(text, error) + error.message;
      return false;
    }
  }

  function refreshSubmit(form) {
    const button = form.querySelector("button[type=submit]");
    if (!button) return;
    const areas = [...form.querySelectorAll("textarea[data-json]")];
    button.disabled = !areas.every((a) => a.dataset.checked === "ok");
  }

  function watch(root) {
    root.querySelectorAll("textarea[data-json]").forEach((area) => {
      if (area.dataset.watched) return;
      area.dataset.watched = "1";
      const form = area.closest("form");
      const update = () => {
        area.dataset.checked = check(area) ? "ok" : "bad";
        if (form) refreshSubmit(form);
      };
      area.addEventListener("input", () => { area.dataset.dirty = "1"; update(); });
      if (area.value.trim() !== "") update();
    });
  }

  // -- actions -----------------------------------------------------------------------------------

  async function send(form) {
    const area = form.querySelector("textarea[data-json]");
    if (!check(area)) { say(form, "fix the JSON first", false); return; }
    const run = form.dataset.run;
    const data = await call("POST", "/api/runs/" + enc(run) + "/inputs",
                            { name: form.dataset.name, payload: JSON.parse(area.value) });
    area.dataset.dirty = "";
    say(form, data.message, true);
    form.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  }

  async function cancel(form) {
    if (!window.confirm("Cancel run " + form.dataset.run + "? No worker will take it again.")) {
      return;
    }
    const data = await call("POST", "/api/runs/" + enc(form.dataset.run) + "/cancel");
    say(form, data.message, true);
  }

  async function resume(form) {
    const data = await call("POST", "/api/runs/" + enc(form.dataset.run) + "/resume");
    say(form, data.message, true);
  }

  async function fork(form) {
    const updates = {};
    for (const edit of form.querySelectorAll(".edit")) {
      const area = edit.querySelector("textarea[data-json]");
      const custom = edit.querySelector(".new-field");
      const name = custom && !custom.hidden && custom.value.trim()
        ? custom.value.trim() : edit.querySelector("select.field").value;
      if (area.value.trim() === "" && !area.dataset.dirty) continue;
      if (!check(area)) { say(form, "fix the JSON of " + name + " first", false); return; }
      updates[name] = JSON.parse(area.value);
    }
    const request = { updates, add: form.querySelector(".add").checked };
    const runId = form.querySelector(".run-id").value.trim();
    if (runId) request.run_id = runId;
    const data = await call("POST", "/api/checkpoints/" + enc(form.dataset.checkpoint) + "/fork",
                            request);
    say(form, data.message, true);
    const link = document.createElement("a");
    link.href = base + "/runs/" + enc(data.run_id);
    link.textContent = " open " + data.run_id;
    link.className = "forked-link";
    form.querySelector(".result").appendChild(link);
  }

  async function rerun(form) {
    // An optional edit: a JSON object of field values for the new run (empty: none).
    const text = window.prompt("Rerun from " + form.dataset.step + ". Field edits as a JSON " +
                               "object (leave empty for none):", "");
    if (text === null) return;
    let updates = {};
    if (text.trim() !== "") {
      try { updates = JSON.parse(text); } catch (error) { say(form, "not JSON: " + error.message, false); return; }
      if (updates === null || typeof updates !== "object" || Array.isArray(updates)) {
        say(form, "the edits must be a JSON object of field values", false);
        return;
      }
    }
    const data = await call("POST", "/api/runs/" + enc(form.dataset.run) + "/rerun",
                            { from_step: form.dataset.step, updates });
    say(form, data.message, true);
    const link = document.createElement("a");
    link.href = base + "/runs/" + enc(data.run_id);
    link.textContent = " open " + data.run_id;
    form.querySelector(".result").appendChild(link);
  }

  const ACTIONS = { send, cancel, resume, fork, rerun };

  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-action]");
    if (!form) return;
    event.preventDefault();
    const action = ACTIONS[form.dataset.action];
    action(form).catch((error) => say(form, error.message, false));
  });

  document.addEventListener("click", (event) => {
    const target = event.target;
    if (target.matches("button.fill")) {
      const area = target.closest("form").querySelector("textarea[data-json]");
      area.value = target.dataset.fill;
      area.dispatchEvent(new Event("input"));
    } else if (target.matches("button.format")) {
      const area = target.closest("form").querySelector("textarea[data-json]");
      try { area.value = JSON.stringify(JSON.parse(area.value), null, 2); } catch (e) { /* shown */ }
      area.dispatchEvent(new Event("input"));
    } else if (target.matches("button.expand")) {
      expand(target).catch((error) => { target.textContent = error.message; });
    } else if (target.matches("button.add-edit")) {
      const form = target.closest("form");
      const first = form.querySelector(".edit");
      const copy = first.cloneNode(true);
      const area = copy.querySelector("textarea");
      area.value = "";
      delete area.dataset.watched;
      area.classList.remove("valid", "invalid");
      copy.querySelector(".json-error").textContent = "";
      form.querySelector(".edits").appendChild(copy);
      watch(copy);
      fill(copy);
    } else if (target.matches("button.find-forks")) {
      forks(target).catch((error) => { target.textContent = error.message; });
    } else if (target.matches("button.reload")) {
      document.querySelectorAll("[data-live]").forEach((r) => refresh(r, true));
    }
  });

  async function expand(button) {
    const data = await call("GET", "/api/checkpoints/" + enc(button.dataset.checkpoint) +
                            "?path=" + enc(button.dataset.path));
    const value = button.parentElement.querySelector("[data-value]");
    value.textContent = typeof data.value === "string" ? data.value : JSON.stringify(data.value);
    button.remove();
  }

  async function forks(button) {
    const place = button.parentElement;
    const data = await call("GET", "/api/runs/" + enc(place.dataset.run) + "/forks");
    place.textContent = data.runs.length ? "" : "none";
    for (const run of data.runs) {
      const link = document.createElement("a");
      link.href = base + "/runs/" + enc(run.id);
      link.textContent = run.id;
      const badge = document.createElement("span");
      badge.className = "status s-" + run.status;
      badge.textContent = run.status;
      place.append(link, " ", badge, " ");
    }
  }

  // -- fork: start each edit from the field's current value ----------------------------------------

  async function fill(edit) {
    const form = edit.closest("form");
    const select = edit.querySelector("select.field");
    const area = edit.querySelector("textarea[data-json]");
    if (!select || !select.value) return;
    // Each fill is tagged: when the field changes twice quickly (the page's own fill on load,
    // then the user's choice), only the newest answer may land, and never over text the user
    // typed while it was on its way.
    const token = String(Number(area.dataset.fillToken || "0") + 1);
    area.dataset.fillToken = token;
    const before = area.value;
    try {
      const data = await call("GET", "/api/checkpoints/" + enc(form.dataset.checkpoint) +
                              "?path=" + enc(select.value));
      if (area.dataset.fillToken !== token || area.value !== before) return;
      area.value = JSON.stringify(data.value, null, 2);
      area.dataset.dirty = "";
      area.dispatchEvent(new Event("input"));
      area.dataset.dirty = "";
    } catch (error) {
      say(form, error.message, false);
    }
  }

  document.addEventListener("change", (event) => {
    const target = event.target;
    if (target.matches("form.fork select.field")) {
      fill(target.closest(".edit"));
    } else if (target.matches("form.fork input.add")) {
      target.closest("form").querySelectorAll(".new-field").forEach((input) => {
        input.hidden = !target.checked;
      });
    }
  });

  // -- live updates --------------------------------------------------------------------------------

  function dirty(region) {
    return [...region.querySelectorAll("textarea[data-json]")].some((a) => a.dataset.dirty);
  }

  async function refresh(region, force) {
    if (!region) return;
    if (!force && region.dataset.keepDirty && dirty(region)) {
      const stale = document.querySelector(".stale");
      if (stale) stale.hidden = false;
      return;
    }
    const response = await fetch(region.dataset.src, {
      credentials: "same-origin", headers: { "Accept": "text/html" },
    });
    if (!response.ok) return;
    region.innerHTML = await response.text();  // rendered and escaped by the server
    const stale = document.querySelector(".stale");
    if (stale) stale.hidden = true;
    watch(region);
    body.dataset.refreshed = String(Number(body.dataset.refreshed || "0") + 1);
  }

  function listen(events, regions) {
    if (!window.EventSource) return;
    const source = new EventSource(base + "/events?" + events);
    source.addEventListener("ready", () => { body.dataset.live = "on"; });
    source.addEventListener("changed", () => { regions.forEach((r) => refresh(r, false)); });
    source.onerror = () => { body.dataset.live = "retrying"; };
  }

  watch(document);
  document.querySelectorAll("form.fork .edit").forEach(fill);
  // One stream per distinct view, however many regions of the page it refreshes.
  const streams = new Map();
  document.querySelectorAll("[data-live]").forEach((region) => {
    const key = region.dataset.events;
    if (!streams.has(key)) streams.set(key, []);
    streams.get(key).push(region);
  });
  streams.forEach((regions, events) => listen(events, regions));
})();
