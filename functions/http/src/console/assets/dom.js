// Building the page. Every string reaches the DOM as a text node or an attribute value
// set through the DOM, never parsed as HTML: payloads, response excerpts, URLs and
// event types come from other people and are shown exactly as they are.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) {
      element.addEventListener(name.slice(2), value);
    } else if (value === true) {
      element.setAttribute(name, "");
    } else {
      element.setAttribute(name, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: `h("td", {class: "num"}, "3")`. */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, for the charts. */
export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replace what `parent` shows. */
export function show(parent, ...children) {
  parent.replaceChildren();
  build(parent, {}, children);
}

/** A status written out in text, the colour only repeating it. */
export function statusText(status) {
  return h("span", { class: `status status-${status}` }, status);
}

/** A timestamp as the browser's local time, with the exact UTC value on hover. */
export function time(value) {
  if (!value) return h("span", { class: "muted" }, "—");
  const date = new Date(value);
  return h("time", { datetime: value, title: value }, date.toLocaleString());
}

/** How long ago, in words a person reads at a glance. */
export function age(value, now = Date.now()) {
  const seconds = Math.max(0, Math.round((now - new Date(value).getTime()) / 1000));
  if (seconds < 90) return `${seconds} s`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min`;
  if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} days`;
}

/** A labelled control for a filter form. */
export function field(label, control) {
  const id = control.id || `f-${Math.random().toString(36).slice(2)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control);
}

/** `<select>` of `[value, text]` pairs, `selected` chosen. */
export function select(name, options, selected) {
  // A filter from the address that the list does not hold (past its first page) is
  // still shown as what it is, never as "every".
  const known = options.some(([value]) => value === (selected || ""));
  const all = known ? options : [...options, [selected, selected]];
  return h("select", { name, id: `f-${name}` },
    all.map(([value, text]) => h("option", { value, selected: value === (selected || "") }, text)));
}

/** The admin's tenant filter (every tenant, or one); nothing for a tenant's key. */
export function tenantField(caller, selected) {
  if (!caller.admin) return null;
  return field("Tenant", select("tenant_id",
    [["", "Every tenant"], ...caller.tenants.map((t) => [t.id, t.name])], selected));
}

/**
 * A filter form for the page at `#/<page>`: applying it puts its values in the
 * address. Empty values are left out unless `keepEmpty` (where empty means something,
 * as "All" does); `after` comes after the Apply button.
 */
export function filterForm(page, label, controls, { keepEmpty = false, after = [] } = {}) {
  const form = h("form", { class: "filters", role: "search", "aria-label": label },
    controls, h("button", { type: "submit", class: "primary" }, "Apply filters"), after);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v || keepEmpty) next.set(k, v);
    location.hash = `#/${page}?${next}`;
  });
  return form;
}

/** A `<dialog>` asking `question`; resolves true when confirmed. */
export function confirmDialog(question, confirmText) {
  return new Promise((resolve) => {
    const yes = h("button", { type: "button", class: "primary" }, confirmText);
    const no = h("button", { type: "button" }, "Cancel");
    const dialog = h("dialog", { "aria-labelledby": "confirm-question" },
      h("p", { id: "confirm-question" }, question), h("div", { class: "actions" }, yes, no));
    const finish = (answer) => { dialog.close(); dialog.remove(); resolve(answer); };
    yes.addEventListener("click", () => finish(true));
    no.addEventListener("click", () => finish(false));
    dialog.addEventListener("cancel", () => finish(false));
    document.body.append(dialog);
    dialog.showModal();
    no.focus();
  });
}

/** Show a message in the live region (read out by screen readers). */
export function notify(message, isError = false) {
  const notice = document.getElementById("notice");
  notice.className = isError ? "error" : "";
  notice.textContent = message;
}
