// The OpenEnv web playground: one session per tab, through the routes of openenv.core.env_server.web.
// Plain DOM code. Text from the server is only ever inserted as text (textContent), never as HTML;
// the environment's render_web HTML goes to a sandboxed, script-less iframe.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const TOKEN_KEY = "openenv-token";
  // The render_web frame's own policy, ahead of the environment's HTML: it loads nothing but data: images.
  const FRAME_POLICY = "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\">";
  const LONG_TEXT = /message|code|script|command|content|text|prompt|body/i;

  let token = sessionStorage.getItem(TOKEN_KEY);
  let about = null;       // GET metadata
  let sessionId = null;
  let tools = [];         // MCP environments: tools/list of the session
  let readAction = null;  // () => the action the form describes
  let resetArgs = {};     // the last reset's keywords, for the snippet
  let sentAction = null;  // the last action sent (a web_actions button's too): the snippet's step
  let formEdited = false; // the form changed since: the snippet shows what Step would send instead
  let log = [];
  let busy = false;

  class PageError extends Error {}

  function make(tag, props, ...children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    for (const child of children) node.append(child);
    return node;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }

  function describeFailure(data, status) {
    if (!data) return `the server answered HTTP ${status}`;
    const detail = data.detail;
    if (Array.isArray(detail)) {
      return "Invalid input:\n" + detail.map((e) => `${(e.loc || []).join(".") || "(action)"}: ${e.msg}`).join("\n");
    }
    return typeof detail === "string" ? detail : JSON.stringify(data);
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (token) headers.Authorization = "Bearer " + token;
    if (sessionId) headers["X-OpenEnv-Session"] = sessionId;
    const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await response.json(); } catch (_) { /* no JSON body */ }
    if (response.status === 401) {
      askToken(token ? "The server did not accept this token; enter it again." : null);
      throw new PageError("This server needs its access token (above).");
    }
    if (response.status === 404 && data && data.code === "SESSION_ERROR") {
      setSession(null);
      throw new PageError(describeFailure(data, 404) + "\nReset starts a new session.");
    }
    if (!response.ok) throw new PageError(describeFailure(data, response.status));
    return data;
  }

  function askToken(reason) {
    $("token-form").hidden = false;
    if (reason) $("token-reason").textContent = reason;
    $("token-input").focus();
  }

  function setSession(id) {
    sessionId = id;
    $("session").textContent = id ? id.slice(0, 8) : "none (Reset starts one)";
  }

  // --- forms from JSON schemas -------------------------------------------------------------------

  function resolve(schema, root) {
    let s = schema || {};
    for (let i = 0; s.$ref && i < 32; i++) s = (root.$defs || root.definitions || {})[s.$ref.split("/").pop()] || {};
    const alternatives = s.anyOf || s.oneOf;
    if (alternatives) {  // Optional[X]: X, not required
      const rest = alternatives.map((a) => resolve(a, root)).filter((a) => a.type !== "null");
      if (rest.length === 1) return { ...rest[0], title: s.title || rest[0].title, description: s.description || rest[0].description, default: s.default };
    }
    return s;
  }

  function fieldLabel(name, schema, required) {
    const label = make("label", {}, name + (required ? " *" : ""));
    if (schema.description) label.append(" ", make("span", { className: "hint", textContent: schema.description }));
    return label;
  }

  // Fields for the object `schema` in `container`; returns a reader of their value.
  function buildObject(container, schema, root, prefix) {
    const readers = [];
    const required = new Set(schema.required || []);
    for (const [name, raw] of Object.entries(schema.properties || {})) {
      if (name === "metadata" && !prefix) continue;
      const s = resolve(raw, root);
      readers.push([name, buildField(container, name, s, root, prefix + name, required.has(name))]);
    }
    return () => {
      const value = {};
      for (const [name, read] of readers) {
        const got = read();
        if (got !== undefined) value[name] = got;
      }
      return value;
    };
  }

  function buildField(container, name, s, root, path, required) {
    const label = fieldLabel(name, s, required);
    container.append(label);
    const has = (v) => v !== undefined && v !== null;
    if (s.const !== undefined) {
      label.hidden = true;
      return () => s.const;
    }
    if (Array.isArray(s.enum)) {
      const select = make("select", { name: path });
      if (!required) select.append(make("option", { value: "", textContent: "(default)" }));
      s.enum.forEach((v, i) => select.append(make("option", { value: String(i), textContent: String(v), selected: v === s.default })));
      label.append(select);
      return () => (select.value === "" ? undefined : s.enum[Number(select.value)]);
    }
    if (s.type === "boolean") {
      label.className = "check";
      const box = make("input", { type: "checkbox", name: path, checked: s.default === true });
      label.prepend(box);
      return () => box.checked;
    }
    if (s.type === "integer" || s.type === "number") {
      const input = make("input", { type: "number", name: path, step: s.type === "integer" ? "1" : "any" });
      if (has(s.minimum)) input.min = s.minimum;
      if (has(s.maximum)) input.max = s.maximum;
      if (has(s.default)) input.placeholder = String(s.default);
      label.append(input);
      return () => (input.value === "" ? undefined : Number(input.value));
    }
    if (s.type === "string") {
      const long = (s.maxLength || 0) > 100 || LONG_TEXT.test(name);
      const input = make(long ? "textarea" : "input", { name: path });
      if (!long) input.type = "text";
      if (has(s.default)) input.placeholder = String(s.default);
      label.append(input);
      return () => (input.value === "" && !required ? undefined : input.value);
    }
    if (s.type === "object" && s.properties) {
      const box = make("fieldset", {}, make("legend", { textContent: name }));
      label.after(box);
      return buildObject(box, s, root, path + ".");
    }
    // anything else (dicts, lists, unions): JSON
    const area = make("textarea", { name: path, placeholder: has(s.default) ? JSON.stringify(s.default) : "JSON" });
    label.append(area);
    return () => {
      if (area.value.trim() === "") return undefined;
      try { return JSON.parse(area.value); } catch (_) { throw new PageError(`${path}: not valid JSON`); }
    };
  }

  function buildActionForm() {
    const box = $("action-fields");
    box.replaceChildren();
    if (about.mcp) {
      const tool = tools.find((t) => t.name === $("tool-select").value);
      if (!tool) { readAction = null; return; }
      $("tool-description").textContent = tool.description || "";
      const schema = tool.inputSchema || tool.input_schema || {};
      const read = buildObject(box, schema, schema, "");
      readAction = () => ({ type: "call_tool", tool_name: tool.name, arguments: read() });
    } else {
      const schema = about.schema.action;
      const read = buildObject(box, schema, schema, "");
      readAction = read;
    }
    updateSnippet();
  }

  function buildResetForm() {
    const box = $("reset-fields");
    box.replaceChildren();
    const readers = [];
    for (const field of about.reset.fields) {
      const s = { type: field.type === "json" ? undefined : field.type, default: field.default };
      readers.push([field.name, buildField(box, field.name, s, {}, "reset." + field.name, false)]);
    }
    let extra = null;
    if (about.reset.any) {
      const s = { description: "more reset keywords, as a JSON object" };
      extra = buildField(box, "keywords", s, {}, "reset.keywords", false);
    }
    return () => {
      const args = {};
      const seed = $("seed").value;
      if (seed !== "") args.seed = Number(seed);
      for (const [name, read] of readers) {
        const v = read();
        if (v !== undefined) args[name] = v;
      }
      const more = extra && extra();
      if (more !== undefined && more !== null) Object.assign(args, more);
      return args;
    };
  }

  // --- the observation ---------------------------------------------------------------------------

  function arrayShape(value) {
    const shape = [];
    let x = value;
    while (Array.isArray(x) && shape.length < 4) { shape.push(x.length); x = x[0]; }
    return typeof x === "number" ? shape : null;
  }

  // A canvas for a 2-D (grey) or 3-D (H x W x 1|3|4) numeric array; null for anything else.
  function arrayImage(value) {
    const shape = arrayShape(value);
    if (!shape || shape.length < 2 || shape.length > 3 || shape[0] < 2 || shape[1] < 2) return null;
    const [h, w] = shape;
    const c = shape.length === 3 ? shape[2] : 1;
    if (![1, 3, 4].includes(c) || h > 2048 || w > 2048) return null;
    let top = 0;
    for (const row of value) {
      if (!Array.isArray(row) || row.length !== w) return null;
      for (const px of row) for (const v of (c === 1 && !Array.isArray(px) ? [px] : px)) top = Math.max(top, v);
    }
    const scale = top <= 1 ? 255 : 1;
    const canvas = make("canvas", { width: w, height: h });
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(w, h);
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const px = value[y][x];
        const v = Array.isArray(px) ? px : [px];
        const rgb = c >= 3 ? [v[0], v[1], v[2]] : [v[0], v[0], v[0]];
        const at = 4 * (y * w + x);
        for (let k = 0; k < 3; k++) image.data[at + k] = Math.max(0, Math.min(255, rgb[k] * scale));
        image.data[at + 3] = c === 4 ? Math.max(0, Math.min(255, v[3] * scale)) : 255;
      }
    }
    ctx.putImageData(image, 0, 0);
    canvas.style.width = Math.max(128, Math.min(512, w * 8)) + "px";
    return canvas;
  }

  function renderValue(value) {
    if (typeof value === "string") {
      if (/^data:image\/(png|jpeg|gif|webp);base64,/.test(value)) return make("img", { src: value, alt: "image" });
      return make("pre", { textContent: value });
    }
    const box = make("div");
    const picture = arrayImage(value);
    if (picture) box.append(picture);
    const numbers = Array.isArray(value) && arrayShape(value) !== null;  // kept on few lines
    const text = typeof value === "object" && value !== null ? JSON.stringify(value, null, numbers ? 0 : 1) : String(value);
    box.append(make("pre", { textContent: text.length > 20000 ? text.slice(0, 20000) + " …" : text }));
    return box;
  }

  function renderView(view) {
    $("reward").textContent = view.reward === null || view.reward === undefined ? "–" : String(view.reward);
    $("done").textContent = view.done ? "done" : "running";
    const rendered = $("rendered");
    rendered.replaceChildren();
    if (typeof view.html === "string") {
      // sandbox="": no scripts, forms, popups or navigation, and an origin of its own
      const frame = make("iframe", { title: "render_web" });
      frame.setAttribute("sandbox", "");
      frame.srcdoc = FRAME_POLICY + view.html;
      rendered.append(frame);
    } else if (view.html && view.html.error) {
      rendered.append(make("p", { className: "muted", textContent: view.html.error }));
    }
    const fields = $("observation");
    fields.replaceChildren();
    for (const [key, value] of Object.entries(view.observation || {})) {
      if (key === "metadata" && (!value || Object.keys(value).length === 0)) continue;
      fields.append(make("div", { className: "field" }, make("b", { textContent: key }), renderValue(value)));
    }
    const offered = $("web-actions");
    offered.replaceChildren();
    if (Array.isArray(view.actions) && !view.done) {
      for (const { label, action } of view.actions) {
        offered.append(make("button", { type: "button", textContent: label, onclick: () => step(action) }));
      }
    } else if (view.actions && view.actions.error) {
      offered.append(make("p", { className: "muted", textContent: view.actions.error }));
    }
    $("state").textContent = JSON.stringify(view.state, null, 1);
  }

  function renderLog() {
    const body = $("log").tBodies[0];
    body.replaceChildren();
    for (const entry of log) {
      const row = make("tr");
      row.append(make("td", { textContent: String(entry.step) }));
      row.append(make("td", {}, make("code", { textContent: entry.label })));
      row.append(make("td", { textContent: entry.reward === null ? "–" : String(entry.reward) }));
      row.append(make("td", { textContent: entry.done ? "yes" : "" }));
      body.append(row);
    }
    drawChart();
  }

  function drawChart() {
    const box = $("chart");
    box.replaceChildren();
    const rewards = log.filter((e) => e.step > 0).map((e) => Number(e.reward) || 0);
    if (rewards.length === 0) return;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    const width = 300, height = 80;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("preserveAspectRatio", "none");
    const top = Math.max(...rewards, 0), bottom = Math.min(...rewards, 0);
    const span = top - bottom || 1;
    const zero = (top / span) * height;
    const barWidth = width / rewards.length;
    const axis = document.createElementNS(ns, "line");
    Object.entries({ x1: 0, x2: width, y1: zero, y2: zero }).forEach(([k, v]) => axis.setAttribute(k, v));
    svg.append(axis);
    rewards.forEach((r, i) => {
      const bar = document.createElementNS(ns, "rect");
      const h = (Math.abs(r) / span) * height;
      bar.setAttribute("x", i * barWidth + barWidth * 0.1);
      bar.setAttribute("width", Math.max(barWidth * 0.8, 0.5));
      bar.setAttribute("y", r >= 0 ? zero - h : zero);
      bar.setAttribute("height", Math.max(h, 0.5));
      bar.setAttribute("class", r >= 0 ? "pos" : "neg");
      svg.append(bar);
    });
    const total = rewards.reduce((a, b) => a + b, 0);
    box.append(svg, make("p", { className: "muted", textContent: `${rewards.length} steps, total reward ${+total.toFixed(4)}` }));
  }

  // --- the same call in Python -------------------------------------------------------------------

  function py(value) {
    if (value === null || value === undefined) return "None";
    if (value === true) return "True";
    if (value === false) return "False";
    if (typeof value === "number") return String(value);
    if (typeof value === "string") return JSON.stringify(value);
    if (Array.isArray(value)) return "[" + value.map(py).join(", ") + "]";
    return "{" + Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${py(v)}`).join(", ") + "}";
  }

  function currentAction() {
    try { return readAction ? readAction() : null; } catch (_) { return null; }
  }

  function updateSnippet() {
    const base = new URL("..", location.href).href.replace(/\/$/, "");
    const headers = token ? ', headers={"Authorization": "Bearer " + os.environ["OPENENV_AUTH_TOKEN"]}' : "";
    const resetCall = Object.entries(resetArgs).map(([k, v]) => `${k}=${py(v)}`).join(", ");
    const action = formEdited ? currentAction() : sentAction;
    const lines = [
      ...(token ? ["import os", ""] : []),
      "from openenv import GenericEnvClient",
      "",
      `with GenericEnvClient(base_url=${py(base)}${headers}).sync() as env:`,
      `    result = env.reset(${resetCall})`,
    ];
    if (action) lines.push(`    result = env.step(${py(action)})`);
    lines.push("    print(result.observation, result.reward, result.done)");
    $("snippet").textContent = lines.join("\n");
  }

  // --- the calls ---------------------------------------------------------------------------------

  async function guarded(work) {
    if (busy) return;
    busy = true;
    $("reset-button").disabled = $("step-button").disabled = true;
    try {
      showError("");
      await work();
    } catch (error) {
      showError(error instanceof PageError ? error.message : `The page failed: ${error}`);
    } finally {
      busy = false;
      $("reset-button").disabled = false;
      $("step-button").disabled = sessionId === null || readAction === null;
    }
  }

  async function openSession() {
    const reply = await api("POST", "session", {});
    setSession(reply.session_id);
    if (about.mcp) {
      tools = reply.tools || [];
      const select = $("tool-select");
      select.replaceChildren(...tools.map((t) => make("option", { value: t.name, textContent: t.name })));
      $("tool-picker").hidden = tools.length === 0;
      if (reply.tools_error) throw new PageError("tools/list failed: " + reply.tools_error);
      buildActionForm();
    }
  }

  let readReset = () => ({});

  function reset() {
    return guarded(async () => {
      const args = readReset();
      if (sessionId === null) await openSession();
      const view = await api("POST", "reset", args);
      resetArgs = args;
      sentAction = null;
      formEdited = false;
      log = [{ step: 0, label: "reset(" + Object.entries(args).map(([k, v]) => `${k}=${py(v)}`).join(", ") + ")", reward: view.reward, done: view.done }];
      $("act-hint").hidden = true;
      $("start").textContent = JSON.stringify(view.observation, null, 1);
      renderView(view);
      renderLog();
      updateSnippet();
    });
  }

  function step(action) {
    return guarded(async () => {
      if (sessionId === null) throw new PageError("No session: press Reset first.");
      const chosen = action || readAction();
      const view = await api("POST", "step", { action: chosen });
      log.push({ step: log.length, label: JSON.stringify(chosen), reward: view.reward, done: view.done });
      sentAction = chosen;
      formEdited = false;
      renderView(view);
      renderLog();
      updateSnippet();
    });
  }

  async function start() {
    try {
      about = await api("GET", "metadata");
    } catch (error) {
      showError(error.message);
      return;
    }
    $("token-form").hidden = true;
    showError("");
    const name = (about.metadata && about.metadata.name) || about.env_name;
    $("title").textContent = name;
    document.title = name + " · OpenEnv playground";
    $("description").textContent = (about.metadata && about.metadata.description) || "";
    $("readme").textContent = about.readme || "(no README)";
    if (about.custom) {  // the package's own Gradio UI, mounted beside this page
      $("custom-link").href = about.custom.path;
      $("custom-link").textContent = about.custom.name;
      $("custom-token").hidden = !token;
      $("custom").hidden = false;
    }
    readReset = buildResetForm();
    if (!about.mcp) buildActionForm();
    updateSnippet();
    $("reset-button").disabled = false;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("reset-button").disabled = true;
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      token = $("token-input").value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token-input").value = "";
      start();
    });
    $("reset-form").addEventListener("submit", (event) => { event.preventDefault(); reset(); });
    $("action-form").addEventListener("submit", (event) => { event.preventDefault(); step(null); });
    $("action-form").addEventListener("input", () => { formEdited = true; updateSnippet(); });
    $("tool-select").addEventListener("change", () => { formEdited = true; buildActionForm(); });
    // The tab goes away: close its session at once (the idle timeout is the fallback).
    window.addEventListener("pagehide", () => {
      if (sessionId === null) return;
      const headers = { "X-OpenEnv-Session": sessionId };
      if (token) headers.Authorization = "Bearer " + token;
      fetch("session", { method: "DELETE", headers, keepalive: true }).catch(() => {});
      setSession(null);
    });
    start();
  });
})();
