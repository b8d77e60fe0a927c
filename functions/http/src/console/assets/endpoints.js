// Endpoints: state and 24-hour figures with a response-time chart, enable/disable,
// the event-type filter, and rotating the signing secret (shown once, to copy).

import { get, call, query } from "./api.js";
import { h, svg, show, statusText, time, field, notify, tenantField, filterForm } from "./dom.js";

/** Endpoints per page: each card reads its own 24-hour figures. */
const PAGE_SIZE = 20;
const CHART_WIDTH = 480;
const CHART_HEIGHT = 90;

/** Median response time per hour as bars; an hour with failures is drawn red and says so. */
function chart(stats) {
  const hours = stats.hours || [];
  const peak = Math.max(1, ...hours.map((x) => x.median_ms || 0));
  const slot = CHART_WIDTH / Math.max(1, hours.length);
  const bars = hours.map((hour, i) => {
    const height = hour.median_ms ? Math.max(2, (hour.median_ms / peak) * (CHART_HEIGHT - 14)) : 0;
    return svg("rect", {
      class: hour.failed ? "bar failing" : "bar",
      x: (i * slot + 1).toFixed(1), y: (CHART_HEIGHT - 12 - height).toFixed(1),
      width: Math.max(1, slot - 2).toFixed(1), height: height.toFixed(1),
    }, svg("title", {}, `${new Date(hour.start).toLocaleString()}: ${hour.attempts} attempts, ${hour.failed} failed, median ${hour.median_ms ?? "—"} ms`));
  });
  return svg("svg", {
    class: "chart", width: CHART_WIDTH, height: CHART_HEIGHT, role: "img",
    "aria-label": `Median response time per hour over the last 24 hours; the slowest hour's median is ${peak} ms`,
  },
  svg("line", { class: "axis", x1: 0, x2: CHART_WIDTH, y1: CHART_HEIGHT - 12, y2: CHART_HEIGHT - 12 }),
  bars,
  svg("text", { x: 0, y: CHART_HEIGHT - 1 }, "24 h ago"),
  svg("text", { x: CHART_WIDTH - 24, y: CHART_HEIGHT - 1 }, "now"),
  svg("text", { x: 0, y: 10 }, `${peak} ms`));
}

/** Health in a word, from the last 24 hours: what support looks at first. */
function health(stats) {
  if (stats.attempts === 0) return ["idle", "no attempts in 24 h"];
  if (stats.failed === 0) return ["healthy", "every attempt in 24 h succeeded"];
  if (stats.delivered === 0) return ["failing", "every attempt in 24 h failed"];
  return ["degraded", `${Math.round((100 * stats.failed) / stats.attempts)} % of attempts in 24 h failed`];
}

function statsBlock(stats) {
  if (!stats) return h("p", { class: "muted" }, "No figures: the statistics could not be read.");
  const [word, why] = health(stats);
  return h("div", {},
    h("p", { class: "health" }, "Health: ", statusText(word), ` — ${why}`),
    h("p", {}, `Last 24 h: ${stats.attempts} attempts, ${stats.delivered} delivered, ${stats.failed} failed; ` +
      `median ${stats.median_ms ?? "—"} ms, p95 ${stats.p95_ms ?? "—"} ms${stats.truncated ? " (newest attempts only)" : ""}.`),
    stats.last_error ? h("p", {}, "Last error: ", h("span", { class: "mono" }, stats.last_error), " ", time(stats.last_error_at)) : null,
    chart(stats));
}

/** The new secret, once: it is not shown again when the page is drawn anew. */
function reveal(card, secret) {
  const input = h("input", { readonly: true, value: secret, size: 48, class: "mono", id: `secret-${card.dataset.id}`, "aria-label": "New signing secret" });
  const copy = h("button", { type: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(secret);
      notify("Secret copied. It will not be shown again.");
    } catch {
      input.select();
      notify("Select and copy the secret by hand; it will not be shown again.", true);
    }
  });
  card.querySelector(".secret-area").replaceChildren(
    h("p", {}, "New secret (copy it now; it will not be shown again). The previous secret keeps signing for 24 hours."),
    h("div", { class: "actions" }, input, copy));
}

function card(endpoint, stats, rerender, caller) {
  const id = endpoint.id;
  const path = `/v1/endpoints/${encodeURIComponent(id)}`;
  const act = (label, run) => {
    const button = h("button", { type: "button" }, label);
    button.addEventListener("click", async () => {
      button.disabled = true;
      try { await run(); } catch (e) { notify(e.message, true); } finally { button.disabled = false; }
    });
    return button;
  };
  const toggle = act(endpoint.disabled ? "Enable" : "Disable", async () => {
    await call("PATCH", path, { disabled: !endpoint.disabled });
    notify(endpoint.disabled ? "Enabled: paused deliveries resume." : "Disabled: deliveries wait until it is enabled.");
    await rerender();
  });
  const rotate = act("Rotate secret…", async () => {
    if (!window.confirm("Rotate this endpoint's signing secret? The old one keeps working for 24 hours.")) return;
    const rotated = await call("POST", `${path}/rotate-secret`);
    reveal(element, rotated.secret);
  });
  const types = h("input", { id: `types-${id}`, value: endpoint.event_types.join(", "), size: 40 });
  const typesForm = h("form", { class: "filters", "aria-label": "Event types" },
    field("Event types (comma-separated; empty means every type)", types),
    h("button", { type: "submit" }, "Save event types"));
  typesForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const list = types.value.split(",").map((t) => t.trim()).filter(Boolean);
      await call("PATCH", path, { event_types: list });
      notify("Event types saved.");
      await rerender();
    } catch (e) {
      notify(e.message, true);
    }
  });
  const element = h("section", { class: "card", "data-id": id, "aria-label": `Endpoint ${endpoint.url}` },
    h("h2", { class: "mono" }, endpoint.url),
    h("p", {}, statusText(endpoint.disabled ? "disabled" : "enabled"),
      endpoint.disabled_reason ? ` — ${endpoint.disabled_reason}` : "",
      " · ", h("span", { class: "mono muted" }, id),
      caller.admin ? [" · tenant ", h("span", { class: "mono muted" },
        caller.tenants.find((t) => t.id === endpoint.tenant_id)?.name || endpoint.tenant_id)] : null,
      endpoint.description ? ` · ${endpoint.description}` : ""),
    statsBlock(stats),
    typesForm,
    h("div", { class: "actions" }, toggle, rotate,
      h("a", { href: `#/deliveries?endpoint_id=${encodeURIComponent(id)}` }, "Its deliveries")),
    h("div", { class: "secret-area" }));
  return element;
}

export async function endpointsPage(view, params, caller) {
  const tenantId = caller.admin ? params.get("tenant_id") || undefined : undefined;
  const cursor = params.get("cursor") || undefined;
  const page = await get(`/v1/endpoints${query({ tenant_id: tenantId, limit: PAGE_SIZE, cursor })}`);
  const stats = await Promise.all(page.data.map((e) =>
    get(`/v1/endpoints/${encodeURIComponent(e.id)}/stats`).catch(() => null)));
  const rerender = () => endpointsPage(view, params, caller);
  const filters = caller.admin
    ? filterForm("endpoints", "Filter endpoints", [tenantField(caller, tenantId)])
    : null;
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  show(view,
    h("h1", {}, "Endpoints"),
    filters,
    page.data.length === 0 ? h("p", {}, "No endpoints.") : page.data.map((e, i) => card(e, stats[i], rerender, caller)),
    h("div", { class: "pager" }, page.next_cursor ? h("a", { href: `#/endpoints?${next}` }, "Next page") : null));
}
