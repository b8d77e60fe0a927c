// Failures: the dead-letter records, their acknowledgement with a note, resend, and
// the age of the oldest nobody has acknowledged (what the 24-hour rule pages about).

import { get, call, query } from "./api.js";
import { h, show, time, age, field, select, notify, tenantField, filterForm } from "./dom.js";
import { endpointsOf } from "./log.js";

const PAGE_SIZE = 50;
/** Pages read to find the oldest unacknowledged failure (200 each); past it, "older than". */
const MAX_OLDEST_PAGES = 25;
/** The API's limit on an acknowledgement note. */
const MAX_NOTE_BYTES = 2000;

async function oldestUnacknowledged(tenantId) {
  let cursor;
  let oldest = null;
  for (let i = 0; i < MAX_OLDEST_PAGES; i++) {
    const page = await get(`/v1/failures${query({ acknowledged: false, tenant_id: tenantId, limit: 200, cursor })}`);
    if (page.data.length) oldest = page.data[page.data.length - 1];
    cursor = page.next_cursor;
    if (!cursor) return { oldest, complete: true };
  }
  return { oldest, complete: false };
}

function ackDialog(failure, done) {
  const note = h("textarea", { id: "ack-note", rows: 4, cols: 50, maxlength: 2000 });
  const save = h("button", { type: "submit", class: "primary" }, "Acknowledge");
  const cancel = h("button", { type: "button" }, "Cancel");
  const form = h("form", { method: "dialog" },
    h("h2", {}, "Acknowledge this failure"),
    h("p", {}, `${failure.event_type} to ${failure.endpoint_id}`),
    h("label", { for: "ack-note" }, "Note (what was done, for whoever looks next)"), h("br"), note,
    h("div", { class: "actions" }, save, cancel));
  const dialog = h("dialog", {}, form);
  // Escape closes a dialog without a click: remove it however it closes.
  dialog.addEventListener("close", () => dialog.remove());
  cancel.addEventListener("click", () => dialog.close());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (new TextEncoder().encode(note.value).length > MAX_NOTE_BYTES) {
      return notify(`The note is too long: at most ${MAX_NOTE_BYTES} bytes (fewer characters when accented or non-Latin).`, true);
    }
    save.disabled = true;
    try {
      await call("POST", `/v1/failures/${encodeURIComponent(failure.id)}/ack`, { note: note.value });
      dialog.close();
      notify("Acknowledged.");
      done();
    } catch (e) {
      notify(e.message, true);
      save.disabled = false;
    }
  });
  document.body.append(dialog);
  dialog.showModal();
  note.focus();
}

function row(f, endpoints, rerender) {
  const resend = h("button", { type: "button", "aria-label": `Resend ${f.event_type} to ${endpoints.get(f.endpoint_id)?.url || f.endpoint_id}` }, "Resend");
  resend.addEventListener("click", async () => {
    resend.disabled = true;
    try {
      await call("POST", `/v1/failures/${encodeURIComponent(f.id)}/resend`);
      notify("Queued again.");
    } catch (e) {
      notify(e.message, true);
      resend.disabled = false;
    }
  });
  const ack = f.acknowledged_at
    ? h("span", {}, `by ${f.acknowledged_by || "?"}`, h("br"), time(f.acknowledged_at), f.ack_note ? h("br") : null, f.ack_note || null)
    : h("button", { type: "button", onclick: () => ackDialog(f, rerender) }, "Acknowledge…");
  return h("tr", {},
    h("td", {}, h("a", { href: `#/deliveries/${encodeURIComponent(f.delivery_id)}` }, time(f.created_at))),
    h("td", { class: "mono" }, f.event_type),
    h("td", { class: "mono", title: f.endpoint_id }, endpoints.get(f.endpoint_id)?.url || f.endpoint_id),
    h("td", {}, f.reason),
    h("td", { class: "num" }, f.last_status_code ?? "—"),
    h("td", {}, f.last_error ?? "—"),
    h("td", {}, ack),
    h("td", {}, resend));
}

export async function failuresPage(view, params, caller) {
  const tenantId = caller.admin ? params.get("tenant_id") || undefined : undefined;
  const acknowledged = params.get("acknowledged") ?? "false";
  const cursor = params.get("cursor") || undefined;
  const [page, oldest, endpoints] = await Promise.all([
    get(`/v1/failures${query({ tenant_id: tenantId, acknowledged, limit: PAGE_SIZE, cursor })}`),
    oldestUnacknowledged(tenantId),
    endpointsOf(tenantId),
  ]);
  const form = filterForm("failures", "Filter failures", [
    tenantField(caller, tenantId),
    field("Show", select("acknowledged",
      [["false", "Unacknowledged"], ["true", "Acknowledged"], ["", "All"]], acknowledged)),
  ], { keepEmpty: true });
  const rerender = () => failuresPage(view, params, caller);
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  show(view,
    h("h1", {}, "Failures"),
    h("p", { id: "oldest" }, oldest.oldest
      ? `Oldest unacknowledged failure: ${oldest.complete ? "" : "more than "}${age(oldest.oldest.created_at)} old.`
      : "Every failure is acknowledged."),
    form,
    page.data.length === 0 ? h("p", {}, "No failures match.") : h("table", { id: "failures" },
      h("thead", {}, h("tr", {}, ["Failed", "Event type", "Endpoint", "Reason", "Last response", "Last error",
        "Acknowledged", "Action"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, page.data.map((f) => row(f, endpoints, rerender)))),
    h("div", { class: "pager" }, page.next_cursor ? h("a", { href: `#/failures?${next}` }, "Next page") : null));
}
