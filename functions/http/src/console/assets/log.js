// The delivery log: filters, a page of deliveries, cursor paging, and batch resend of
// everything the filters match.

import { get, call, query, listed, newIdempotencyKey } from "./api.js";
import { h, show, statusText, time, field, select, confirmDialog, notify, tenantField, filterForm } from "./dom.js";

/** The API's page size limit. */
const PAGE_SIZE = 50;
/** Rows read per call while counting or resending: the API's maximum page. */
const COUNT_PAGE = 200;
/** Counting stops here; the confirmation then says "more than". */
const MAX_COUNT = 20000;
/** The longest window the API resends at once. */
const MAX_WINDOW_DAYS = 14;
const STATUSES = [["", "Any status"], ["pending", "pending"], ["delivered", "delivered"],
  ["failed", "failed"], ["exhausted", "exhausted"]];
const FILTERS = ["tenant_id", "endpoint_id", "status", "event_type", "since", "until"];

/** `datetime-local` input value → RFC 3339 (UTC), or undefined. */
function instant(local) {
  if (!local) return undefined;
  const date = new Date(local);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

/** The API filters the form's values name. */
function apiFilters(params) {
  const f = {};
  for (const name of FILTERS) {
    const value = params.get(name);
    if (value) f[name] = name === "since" || name === "until" ? instant(value) : value;
  }
  return f;
}

/** Endpoints the caller sees (the first 1 000), to label rows and fill the filter. */
export async function endpointsOf(tenantId) {
  const rows = await listed("/v1/endpoints", { tenant_id: tenantId });
  return new Map(rows.map((e) => [e.id, e]));
}

function deliveryFilters(params, caller, endpoints) {
  const controls = [tenantField(caller, params.get("tenant_id"))];
  controls.push(field("Endpoint", select("endpoint_id",
    [["", "Every endpoint"], ...[...endpoints.values()].map((e) => [e.id, e.url])], params.get("endpoint_id"))));
  controls.push(field("Status", select("status", STATUSES, params.get("status"))));
  controls.push(field("Event type", h("input", { name: "event_type", id: "f-event_type", value: params.get("event_type") || "" })));
  controls.push(field("Created from", h("input", { type: "datetime-local", name: "since", id: "f-since", value: params.get("since") || "" })));
  controls.push(field("Created before", h("input", { type: "datetime-local", name: "until", id: "f-until", value: params.get("until") || "" })));
  return filterForm("deliveries", "Filter deliveries", controls, {
    after: h("button", { type: "button", onclick: () => { location.hash = "#/deliveries"; } }, "Clear"),
  });
}

function table(rows, endpoints) {
  if (rows.length === 0) return h("p", { id: "no-rows" }, "No deliveries match these filters.");
  return h("table", { id: "deliveries" },
    h("caption", { class: "muted" }, "Deliveries, newest first"),
    h("thead", {}, h("tr", {}, ["Created", "Event type", "Endpoint", "Status", "Attempts",
      "Last response", "Next attempt"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((d) => h("tr", { "data-id": d.id },
      h("td", {}, h("a", { href: `#/deliveries/${encodeURIComponent(d.id)}`, "aria-label": `Open delivery ${d.id}` }, time(d.created_at))),
      h("td", { class: "mono" }, d.event_type),
      h("td", { class: "mono", title: d.endpoint_id }, endpoints.get(d.endpoint_id)?.url || d.endpoint_id),
      h("td", {}, statusText(d.status)),
      h("td", { class: "num" }, d.attempt_count),
      h("td", { class: "num" }, d.last_status_code ?? "—"),
      h("td", {}, time(d.next_attempt_at))))));
}

/** The window a batch resend covers: the filters', else up to the last 14 days. */
function resendWindow(filters) {
  const until = filters.until || new Date().toISOString();
  const since = filters.since || new Date(new Date(until).getTime() - MAX_WINDOW_DAYS * 86400000).toISOString();
  const days = (new Date(until) - new Date(since)) / 86400000;
  if (!(days > 0)) throw new Error("“Created from” must be before “Created before”.");
  if (days > MAX_WINDOW_DAYS) {
    throw new Error(`A batch resend covers at most ${MAX_WINDOW_DAYS} days; narrow “Created from” and “Created before”.`);
  }
  return { ...filters, since, until, defaulted: !filters.since };
}

async function countMatching(filters, progress) {
  let count = 0;
  let cursor;
  do {
    const page = await get(`/v1/deliveries${query({ ...filters, limit: COUNT_PAGE, cursor })}`);
    count += page.data.length;
    cursor = page.next_cursor;
    progress.textContent = `Counting matching deliveries: ${count}…`;
  } while (cursor && count < MAX_COUNT);
  return { count, more: Boolean(cursor) };
}

async function batchResend(filters, button, progressArea, caller) {
  button.disabled = true;
  const label = h("span", { role: "status" });
  const bar = h("progress", { max: 1, value: 0, "aria-label": "Resend progress" });
  show(progressArea, label, bar);
  try {
    const scope = resendWindow(filters);
    const { defaulted, ...query } = scope;
    const { count, more } = await countMatching(query, label);
    if (count === 0) {
      label.textContent = "No delivery matches these filters in the window; nothing to resend.";
      return;
    }
    const what = more ? `more than ${count}` : `${count}`;
    const whose = caller.admin && !scope.tenant_id ? " of every tenant" : "";
    const older = defaulted ? " (the last 14 days; older matching deliveries are not included)" : "";
    const ok = await confirmDialog(
      `Resend ${what} deliveries${whose} created between ${new Date(scope.since).toLocaleString()} and ${new Date(scope.until).toLocaleString()}${older}? Each is sent again now, with the same webhook-id.`,
      `Resend ${what}`);
    if (!ok) {
      label.textContent = "Nothing was resent.";
      return;
    }
    bar.max = count;
    // One key for this click; each page of the walk adds its number, so repeating a
    // page after a lost answer resends nothing twice.
    const key = newIdempotencyKey();
    const body = { since: scope.since, until: scope.until };
    for (const name of ["tenant_id", "endpoint_id", "status", "event_type"]) if (scope[name]) body[name] = scope[name];
    let queued = 0;
    let skipped = 0;
    let underWay = 0;
    let cursor;
    let page = 0;
    do {
      const answer = await call("POST", "/v1/deliveries/resend", cursor ? { ...body, cursor } : body, `${key}-${page}`);
      queued += answer.queued;
      skipped += answer.endpoint_deleted?.length || 0;
      underWay += answer.attempt_under_way?.length || 0;
      cursor = answer.next_cursor;
      page += 1;
      bar.value = Math.min(queued, count);
      label.textContent = `Resending: ${queued} of ${what} queued…`;
    } while (cursor);
    const deleted = skipped ? ` ${skipped} left as they are: their endpoint was deleted.` : "";
    const running = underWay
      ? ` ${underWay} left as they are: an attempt is under way and their endpoint takes each event at most once.`
      : "";
    const left = deleted + running;
    label.textContent = `Done: ${queued} deliveries queued again.${left}`;
    notify(`${queued} deliveries queued again.${left}`);
  } catch (e) {
    label.textContent = `Stopped: ${e.message}`;
    notify(e.message, true);
  } finally {
    button.disabled = false;
    button.focus();
  }
}

export async function deliveryLog(view, params, caller) {
  const filters = apiFilters(params);
  const cursor = params.get("cursor") || undefined;
  const [endpoints, page] = await Promise.all([
    endpointsOf(caller.admin ? filters.tenant_id : undefined),
    get(`/v1/deliveries${query({ ...filters, limit: PAGE_SIZE, cursor })}`),
  ]);
  const progressArea = h("div", { id: "resend-progress" });
  const resendButton = h("button", { type: "button", id: "resend-matching" }, "Resend all matching…");
  resendButton.addEventListener("click", () => batchResend(filters, resendButton, progressArea, caller));
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  const first = new URLSearchParams(params);
  first.delete("cursor");
  show(view,
    h("h1", {}, "Delivery log"),
    deliveryFilters(params, caller, endpoints),
    h("div", { class: "actions" }, resendButton, progressArea),
    table(page.data, endpoints),
    h("div", { class: "pager" },
      cursor ? h("a", { href: `#/deliveries?${first}` }, "First page") : null,
      page.next_cursor ? h("a", { href: `#/deliveries?${next}`, id: "next-page" }, "Next page") : h("span", { class: "muted" }, "Last page")));
}
