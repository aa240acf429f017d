// The tokenfuse dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// The admin token is kept in this tab's sessionStorage and sent as a bearer header on every
// request (never a cookie, so another site cannot make the browser send it). Everything the
// server says is put on the page as text (textContent), never as HTML: labels are untrusted.
"use strict";

(() => {
  const TOKEN = "tokenfuse-admin-token";
  const $ = (id) => document.getElementById(id);
  const state = {
    info: null,
    selected: null, // key id of the key shown in detail
    listing: null,
    seen: new Set(), // event ids already in the feed
    stream: null, // AbortController of the running event stream
    retry: 1000,
  };

  // -- token and requests ---------------------------------------------------------------------

  function takeTokenFromFragment() {
    const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (match) {
      sessionStorage.setItem(TOKEN, decodeURIComponent(match[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  const token = () => sessionStorage.getItem(TOKEN);
  const url = (path) => new URL(path, document.baseURI).toString();

  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = { Authorization: "Bearer " + token() };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url(path), {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      cache: "no-store",
      signal: options.signal,
    });
    if (response.status === 401) throw new Unauthorized("the admin token was refused");
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.error || response.statusText);
    return data;
  }

  // -- formatting -----------------------------------------------------------------------------

  function number(value, digits = 1) {
    if (value === null || value === undefined) return "—";
    const size = Math.abs(value);
    if (size >= 1e6) return (value / 1e6).toFixed(digits) + "M";
    if (size >= 1e4) return (value / 1e3).toFixed(digits) + "k";
    return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  }

  const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString();

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function say(message, isError = false) {
    const status = $("status");
    status.textContent = message;
    status.className = isError ? "error" : "muted";
  }

  // -- the key table --------------------------------------------------------------------------

  function keyCell(key) {
    const cell = element("td", null, "key");
    cell.append(element("span", key.label || "(label unknown)", key.label ? "label" : "label muted"));
    cell.append(element("code", key.key_id, "key-id"));
    return cell;
  }

  // What is left in the key's bucket (0..1); a bucket not used yet is full. null: none.
  function bucketFill(key) {
    if (key.bucket_capacity === null) return null;
    return key.bucket_level === null ? 1 : key.bucket_level / key.bucket_capacity;
  }

  function bucketCell(key) {
    const cell = element("td", null, "bucket");
    const left = bucketFill(key);
    if (left === null) {
      cell.textContent = "—";
      return cell;
    }
    const level = key.bucket_level === null ? key.bucket_capacity : key.bucket_level;
    const bar = element("span", null, "bar");
    const fill = element("span", null, left < 0.2 ? "fill low" : "fill");
    fill.style.width = Math.round(Math.max(0, Math.min(1, left)) * 100) + "%";
    bar.append(fill);
    cell.append(bar, element("span", `${number(level)} / ${number(key.bucket_capacity)}`, "muted"));
    return cell;
  }

  function actionButton(label, className, action, key, disabledReason) {
    const button = element("button", label, className);
    button.type = "button";
    if (disabledReason) {
      button.disabled = true;
      button.title = disabledReason;
    }
    button.addEventListener("click", (event) => {
      event.stopPropagation();
      action(key);
    });
    return button;
  }

  function row(key) {
    const tr = element("tr", null, key.state);
    tr.dataset.keyId = key.key_id;
    if (key.key_id === state.selected) tr.classList.add("selected");
    const badge = element("span", key.state, "state " + key.state);
    badge.title = {
      open: `tripped: refusing every call until ${key.open_until ? clock(key.open_until) : "it is reset"}`,
      near: "close to its threshold, or its bucket nearly empty",
      ok: "spending, within its limits",
      idle: "nothing in the last minute",
    }[key.state] || "";
    const stateCell = element("td");
    stateCell.append(badge);
    const actions = element("td", null, "actions");
    const noForgive = state.info && !state.info.forgive ? "this tokenfuse has no Fuse.forgive" : "";
    actions.append(
      actionButton("Reset", "reset", reset, key),
      actionButton("Forgive", "forgive", forgive, key, noForgive),
      actionButton("Limits", "edit", (k) => select(k.key_id, true), key),
    );
    tr.append(
      stateCell,
      keyCell(key),
      element("td", number(key.rate), "num rate"),
      element("td", number(key.baseline), "num"),
      element("td", key.multiple === null ? "—" : key.multiple.toFixed(1) + "×", "num"),
      element("td", number(key.threshold), "num"),
      element("td", number(key.limit), "num"),
      bucketCell(key),
      actions,
    );
    tr.addEventListener("click", () => select(key.key_id));
    return tr;
  }

  function renderKeys(listing) {
    state.listing = listing;
    const body = $("keys").tBodies[0];
    body.replaceChildren(...listing.keys.map(row));
    if (!listing.keys.length) {
      const empty = element("td", "No keys yet: they appear with their first decision.", "muted");
      empty.colSpan = 9;
      body.append(element("tr")).append(empty);
    }
    const open = listing.keys.filter((key) => key.state === "open").length;
    $("summary").textContent = `${listing.total} keys, ${open} open · ${clock(listing.at)}`;
  }

  // -- one key --------------------------------------------------------------------------------

  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Bars (each {value, title}) against horizontal lines (each {value, label, kind}).
  function chart(target, bars, lines, emptyText) {
    const width = 640, height = 200, left = 48, bottom = 20, top = 10;
    const shown = lines.filter((line) => line.value !== null && line.value !== undefined);
    const peak = Math.max(1, ...bars.map((bar) => bar.value), ...shown.map((line) => line.value)) * 1.1;
    const y = (value) => top + (height - top - bottom) * (1 - value / peak);
    const step = (width - left) / Math.max(bars.length, 1);
    const nodes = [
      svg("line", { x1: left, x2: width, y1: y(0), y2: y(0), class: "axis" }),
      svg("text", { x: left - 6, y: y(peak / 1.1) + 4, class: "tick", "text-anchor": "end" }, number(Math.round(peak / 1.1))),
      svg("text", { x: left - 6, y: y(0) + 4, class: "tick", "text-anchor": "end" }, "0"),
    ];
    bars.forEach((bar, index) => {
      const rect = svg("rect", {
        x: left + index * step + 1, y: y(bar.value), width: Math.max(step - 2, 1),
        height: Math.max(y(0) - y(bar.value), 0), class: "column",
      });
      rect.append(svg("title", {}, bar.title));
      nodes.push(rect);
    });
    shown.forEach((line, index) => {
      // Labels alternate sides, so that lines close together stay readable.
      const [x, anchor] = index % 2 ? [left + 4, "start"] : [width - 4, "end"];
      nodes.push(svg("line", { x1: left, x2: width, y1: y(line.value), y2: y(line.value), class: "line " + line.kind }));
      nodes.push(svg("text", { x, y: y(line.value) - 4, class: "line-label " + line.kind, "text-anchor": anchor },
        `${line.label} ${number(line.value)}`));
    });
    if (!bars.some((bar) => bar.value > 0)) {
      nodes.push(svg("text", { x: (width + left) / 2, y: height / 2, class: "empty", "text-anchor": "middle" }, emptyText));
    }
    target.replaceChildren(...nodes);
  }

  function facts(list, pairs) {
    list.replaceChildren();
    for (const [name, value] of pairs) list.append(element("dt", name), element("dd", value));
  }

  function eventItem(event) {
    const item = element("li", null, "event " + event.kind);
    item.append(
      element("time", clock(event.at)),
      element("span", event.kind.replace("_", " "), "kind"),
      element("span", event.label || "", "label"),
      element("code", event.key_id || "", "key-id"),
      element("span", event.detail, "detail"),
    );
    return item;
  }

  function renderDetail(detail) {
    const key = detail.key;
    $("detail").hidden = false;
    $("detail-title").textContent = `${key.label || "(label unknown)"} · ${key.key_id}`;
    const reason = detail.trip_reason ? detail.trip_reason.replace(/_/g, " ") : "tripped";
    facts($("detail-facts"), [
      ["State", key.state === "open" ? `open until ${clock(key.open_until)} (${reason})` : key.state],
      ["Rate", `${number(key.rate)} ${key.unit}/min`],
      ["Baseline", key.baseline === null ? `learning (${number(key.learned_baseline)} so far, ${key.samples} minutes)` : number(key.baseline)],
      ["Threshold", number(key.threshold)],
      ["Manual limit", number(key.limit)],
      ["Bucket", key.bucket_capacity === null ? "—" : `${number(key.bucket_level)} of ${number(key.bucket_capacity)}, refills ${number(key.bucket_rate)}/s`],
      ["Last trip", detail.last_trip ? `${clock(detail.last_trip)}, ${reason} (${detail.strikes} in a row)` : "never"],
    ]);
    const lines = [
      { value: key.baseline, label: "baseline", kind: "baseline" },
      { value: key.threshold, label: "threshold", kind: "threshold" },
      { value: key.limit, label: "limit", kind: "limit" },
    ];
    // The window added up slot by slot: the last column is the 60 s rate the checks judge.
    let total = 0;
    const slots = detail.window.map((slot) => {
      total += slot.amount;
      return { value: total, title: `${clock(slot.start)}: +${number(slot.amount)} ${key.unit}` };
    });
    chart($("chart-window"), slots, lines, "nothing spent in the last 60 s");
    const byMinute = new Map(detail.minutes.map((minute) => [minute.minute, minute.rate]));
    const now = Math.floor(Date.now() / 60000);
    const minutes = [];
    for (let minute = now - 59; minute <= now; minute += 1) {
      const rate = byMinute.get(minute) || 0;
      minutes.push({ value: rate, title: `${clock(minute * 60)}: ${number(rate)} ${key.unit}/min` });
    }
    chart($("chart-hour"), minutes, lines, "no minutes seen yet");
    $("history-since").textContent = detail.history_since
      ? `(seen by this dashboard since ${clock(detail.history_since)})` : "";
    $("detail-events").replaceChildren(...detail.events.slice().reverse().map(eventItem));
    const form = $("limits-form");
    if (!form.contains(document.activeElement)) {
      fill($("edit-limit"), key.limit === null ? "" : `${key.limit}/min`);
      fill($("edit-rate"), key.bucket_rate === null ? "" : `${key.bucket_rate}/s`);
      fill($("edit-capacity"), key.bucket_capacity === null ? "" : String(key.bucket_capacity));
    }
  }

  function fill(input, value) {
    input.value = value;
    input.dataset.initial = value;
  }

  async function showDetail() {
    if (!state.selected) return;
    try {
      renderDetail(await api(`api/keys/${encodeURIComponent(state.selected)}?by=id`));
    } catch (error) {
      handle(error);
    }
  }

  function select(keyId, focusLimits = false) {
    state.selected = keyId;
    for (const tr of $("keys").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.keyId === keyId);
    showDetail().then(() => focusLimits && $("edit-limit").focus());
  }

  // -- actions --------------------------------------------------------------------------------

  async function change(key, what, request) {
    try {
      await request();
      say(`${what}: ${key.label || key.key_id} (${key.key_id})`);
      await refreshKeys();
      if (state.selected === key.key_id) await showDetail();
    } catch (error) {
      handle(error);
    }
  }

  const reset = (key) => change(key, "reset", () =>
    api(`api/keys/${encodeURIComponent(key.key_id)}/reset?by=id`, { method: "POST" }));

  const forgive = (key) => change(key, "forgiven", () =>
    api(`api/keys/${encodeURIComponent(key.key_id)}/forgive?by=id`, { method: "POST" }));

  async function saveLimits(event) {
    event.preventDefault();
    const key = (state.listing?.keys || []).find((k) => k.key_id === state.selected) || { key_id: state.selected };
    const path = `api/keys/${encodeURIComponent(state.selected)}`;
    const changed = (input) => input.value.trim() !== (input.dataset.initial || "");
    await change(key, "limits saved", async () => {
      if (changed($("edit-limit"))) {
        await api(`${path}/limit?by=id`, { method: "PUT", body: { limit: $("edit-limit").value.trim() || null } });
      }
      const bucket = {};
      if (changed($("edit-rate"))) bucket.rate = $("edit-rate").value.trim() || null;
      if (changed($("edit-capacity"))) bucket.capacity = $("edit-capacity").value.trim() || null;
      if (Object.keys(bucket).length) await api(`${path}/bucket?by=id`, { method: "PUT", body: bucket });
    });
    document.activeElement.blur();
  }

  // -- live updates: Server-Sent Events read with fetch, so the token goes in a header -------

  function query() {
    const params = new URLSearchParams({ state: $("filter-state").value, sort: $("sort").value });
    const search = $("search").value.trim();
    if (search) params.set("q", search);
    return params.toString();
  }

  async function refreshKeys() {
    renderKeys(await api(`api/keys?${query()}&limit=200`));
  }

  function addEvent(event) {
    if (!event.id || state.seen.has(event.id)) return;
    state.seen.add(event.id);
    const list = $("events");
    list.prepend(eventItem(event));
    while (list.children.length > 100) list.lastChild.remove();
  }

  function dispatch(block) {
    let kind = "message", data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) kind = line.slice(6).trim();
      else if (line.startsWith("data:")) data += line.slice(5).trim();
    }
    if (!data) return;
    const payload = JSON.parse(data);
    if (kind === "keys") {
      renderKeys(payload);
      showDetail();
    } else if (kind === "fuse") {
      addEvent(payload);
    } else if (kind === "problem") {
      say(payload.error, true);
    }
  }

  async function follow() {
    if (state.stream) state.stream.abort();
    const controller = (state.stream = new AbortController());
    while (!controller.signal.aborted && token()) {
      try {
        const response = await fetch(url(`api/stream?${query()}`), {
          headers: { Authorization: "Bearer " + token() }, cache: "no-store", signal: controller.signal,
        });
        if (response.status === 401) throw new Unauthorized("the admin token was refused");
        if (!response.ok) throw new Error(`the event stream answered ${response.status}`);
        $("connection").textContent = "live";
        $("connection").className = "pill live";
        state.retry = 1000;
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            dispatch(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        if (error instanceof Unauthorized) return handle(error);
      }
      $("connection").textContent = "reconnecting";
      $("connection").className = "pill";
      await new Promise((resolve) => setTimeout(resolve, state.retry));
      state.retry = Math.min(state.retry * 2, 10000);
    }
  }

  // -- signing in and out ---------------------------------------------------------------------

  function handle(error) {
    if (error instanceof Unauthorized) return signOut(error.message);
    say(error.message, true);
  }

  function signOut(reason) {
    sessionStorage.removeItem(TOKEN);
    if (state.stream) state.stream.abort();
    $("board").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = reason || "";
    $("connection").textContent = "offline";
    $("connection").className = "pill";
  }

  async function start() {
    if (!token()) return signOut("");
    try {
      state.info = await api("api/info");
    } catch (error) {
      return signOut(error.message);
    }
    $("fuse-name").textContent = `fuse ${state.info.fuse} · ${state.info.unit} · ${state.info.store}`;
    $("login").hidden = true;
    $("board").hidden = false;
    $("logout").hidden = false;
    follow();
  }

  let typing = null;
  function restartSoon() {
    clearTimeout(typing);
    typing = setTimeout(follow, 300);
  }

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN, $("token").value.trim());
      $("token").value = "";
      start();
    });
    $("logout").addEventListener("click", () => signOut("signed out"));
    $("limits-form").addEventListener("submit", saveLimits);
    $("filter-state").addEventListener("change", follow);
    $("sort").addEventListener("change", follow);
    $("search").addEventListener("input", restartSoon);
    start();
  });
})();
