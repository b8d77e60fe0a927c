// The console's only way to the server: the public `/v1` API with the signed-in key.
// The key lives in this tab's sessionStorage, is sent only in the Authorization
// header, and never appears in a URL.

const KEY = "entrega.console.key";
/** Waits for a 429 before giving up: the API's per-key limit refills within a second. */
const MAX_RATE_LIMIT_RETRIES = 5;

export function signedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

export function remember(key) {
  sessionStorage.setItem(KEY, key);
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

/** A refused call, carrying the API's problem document (its `detail` and `field`). */
export class ApiError extends Error {
  constructor(status, problem) {
    const field = problem.field ? ` (${problem.field})` : "";
    super(`${problem.title || "Request failed"}: ${problem.detail || status}${field}`);
    this.status = status;
    this.problem = problem;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Call the API; the JSON answer, or an ApiError. `idempotencyKey` makes a retry safe. */
export async function call(method, path, body, idempotencyKey) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
    if (response.status === 429 && attempt < MAX_RATE_LIMIT_RETRIES) {
      const wait = Number(response.headers.get("Retry-After")) || 1;
      await sleep(wait * 1000);
      continue;
    }
    const text = await response.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch { json = null; }
    if (!response.ok) {
      if (response.status === 401) window.dispatchEvent(new Event("entrega:unauthorized"));
      throw new ApiError(response.status, json || { detail: text.slice(0, 200) });
    }
    return json;
  }
}

export const get = (path) => call("GET", path);

/** A query string of the filters that are set. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** A fresh key for one click: a double-click sends the same key, so acts once. */
export function newIdempotencyKey() {
  return `console-${crypto.randomUUID()}`;
}

/** Rows of a list for a dropdown or labels: its pages followed up to [`MAX_LISTED`]. */
const MAX_LISTED = 1000;

/** Every row of the list at `path` with `params`, up to [`MAX_LISTED`]. */
export async function listed(path, params = {}) {
  const rows = [];
  let cursor;
  do {
    const page = await get(`${path}${query({ ...params, limit: 200, cursor })}`);
    rows.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor && rows.length < MAX_LISTED);
  return rows;
}

/** Who the key belongs to: the admin can list tenants, a tenant cannot. */
export async function whoAmI() {
  try {
    return { admin: true, tenants: await listed("/v1/tenants") };
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return { admin: false, tenants: [] };
    throw e;
  }
}
