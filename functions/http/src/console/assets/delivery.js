// One delivery: its state, every attempt, the event's payload, who resent it, and
// "Try now".

import { get, call, newIdempotencyKey, ApiError } from "./api.js";
import { h, show, statusText, time, notify } from "./dom.js";

/** How often, and how long, the page looks again after "Try now". */
const POLL_MS = 500;
const POLL_FOR_MS = 30000;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function summary(d, endpoint) {
  const row = (term, value) => [h("dt", {}, term), h("dd", {}, value)];
  return h("dl", { class: "summary" },
    row("Status", statusText(d.status)),
    row("Delivery", h("span", { class: "mono" }, d.id)),
    row("Event", h("span", { class: "mono" }, `${d.event_id} (${d.event_type})`)),
    row("Endpoint", h("span", { class: "mono", title: d.endpoint_id }, endpoint ? endpoint.url : d.endpoint_id)),
    row("Attempts (this generation)", String(d.attempt_count)),
    row("Last response", d.last_status_code ?? "—"),
    row("Last error", d.last_error ?? "—"),
    row("Next attempt", time(d.next_attempt_at)),
    row("Created", time(d.created_at)),
    row("Delivered", time(d.delivered_at)),
    row("Resent by", d.requested_by ? `${d.requested_by} (generation ${d.generation})` : "nobody"));
}

function attemptsTable(attempts) {
  if (attempts.length === 0) return h("p", {}, "No attempt yet.");
  return h("table", { id: "attempts" },
    h("thead", {}, h("tr", {}, ["#", "Started", "Duration", "Response", "Error kind", "Error",
      "Response excerpt", "Trigger"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, attempts.map((a) => h("tr", {},
      h("td", {}, `${a.generation}.${a.number}`),
      h("td", {}, time(a.started_at)),
      h("td", { class: "num" }, `${a.duration_ms} ms`),
      h("td", { class: "num" }, a.status_code ?? "—"),
      h("td", {}, a.failure_kind ?? "—"),
      h("td", {}, a.error ?? "—"),
      h("td", {}, a.response_excerpt ? h("pre", { class: "excerpt" }, a.response_excerpt) : "—"),
      h("td", {}, a.trigger === "manual" ? `manual, by ${a.requested_by || "?"}` : a.trigger)))));
}

/** "Try now": resend by id under a fresh key, then watch until a new attempt lands. */
async function tryNow(id, button, render) {
  button.disabled = true;
  const path = `/v1/deliveries/${encodeURIComponent(id)}`;
  try {
    const before = await get(path);
    const answer = await call("POST", "/v1/deliveries/resend", { ids: [id] }, newIdempotencyKey());
    if (answer.endpoint_deleted?.length) throw new Error("its endpoint was deleted, so nothing can send it");
    if (answer.attempt_under_way?.length) throw new Error("an attempt is under way and its endpoint takes each event at most once; try again when it ends");
    if (answer.queued !== 1) throw new Error("the delivery was not found");
    notify("Queued; waiting for the attempt…");
    let attempted = false;
    for (const deadline = Date.now() + POLL_FOR_MS; !attempted && Date.now() < deadline;) {
      await sleep(POLL_MS);
      const now = await get(path);
      attempted = now.attempts.length > before.attempts.length && now.status !== "pending";
    }
    await render();
    notify(attempted
      ? "Tried again: see the newest attempt below."
      : `Queued, but no attempt in ${POLL_FOR_MS / 1000} s; it is still pending. Look again later.`, !attempted);
  } catch (e) {
    notify(`Try now failed: ${e.message}`, true);
    button.disabled = false;
  }
}

export async function deliveryPage(view, id, caller) {
  const render = async () => {
    let d;
    try {
      d = await get(`/v1/deliveries/${encodeURIComponent(id)}`);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        return show(view, h("h1", {}, "Delivery not found"), h("p", {}, "It does not exist, or this key cannot see it."));
      }
      throw e;
    }
    const [event, endpoint] = await Promise.all([
      get(`/v1/events/${encodeURIComponent(d.event_id)}${caller.admin ? `?tenant_id=${d.tenant_id}` : ""}`).catch(() => null),
      get(`/v1/endpoints/${encodeURIComponent(d.endpoint_id)}`).catch(() => null),
    ]);
    const button = h("button", { type: "button", class: "primary", id: "try-now" }, "Try now");
    button.addEventListener("click", () => tryNow(id, button, render));
    show(view,
      h("p", {}, h("a", { href: "#/deliveries" }, "← Delivery log")),
      h("h1", {}, "Delivery"),
      h("div", { class: "actions" }, button,
        h("span", { class: "muted" }, "Sends it again now, with the same webhook-id, as a new generation.")),
      summary(d, endpoint),
      h("h2", {}, "Attempts"),
      attemptsTable(d.attempts),
      h("h2", {}, "Event payload"),
      event ? h("pre", { id: "payload" }, JSON.stringify(event.data, null, 2)) : h("p", {}, "The event is past retention."));
  };
  await render();
}
