// The support console in headless Chromium, driven by Playwright (playwright-core, no
// browser download), against a real `entrega serve` that console.rs started. What
// the browser cannot do (fix the receiver, count what it received) it asks console.rs
// for with a `@need {json}` line on stdout, and reads one JSON line back on stdin.
// Any failed check throws: the process exits non-zero and console.rs fails.
"use strict";
const { chromium } = require("playwright-core");
const assert = require("node:assert/strict");
const path = require("node:path");
const readline = require("node:readline");

const env = process.env;
const base = env.CONSOLE_URL;
const artifacts = env.ARTIFACTS;
const answers = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
/** Every wait in the page; generous, since the machine is shared. */
const WAIT = { timeout: 30000 };

async function need(what) {
  console.log(`@need ${JSON.stringify(what)}`);
  const { value } = await answers.next();
  return JSON.parse(value);
}

function step(name) {
  console.log(`@step ${name}`);
}

/** The log's rows as the page shows them. */
async function rows(page) {
  return page.$$eval("#deliveries tbody tr", (trs) => trs.map((tr) => ({
    id: tr.dataset.id,
    eventType: tr.children[1].textContent,
    status: tr.children[3].textContent,
  })));
}

/** Set the log's filters and wait until the table shows them applied. */
async function filter(page, { status, eventType }) {
  await page.getByRole("link", { name: "Delivery log", exact: true }).click();
  await page.getByLabel("Status").selectOption(status);
  await page.getByLabel("Event type").fill(eventType);
  await page.getByRole("button", { name: "Apply filters" }).click();
  await page.waitForFunction(([s, t]) => location.hash.includes(`status=${s}`) && location.hash.includes(`event_type=${encodeURIComponent(t)}`)
    && (document.querySelector("#no-rows") || [...document.querySelectorAll("#deliveries tbody tr")]
      .every((tr) => tr.children[3].textContent === s && tr.children[1].textContent === t)), [status, eventType], WAIT);
  return rows(page);
}

async function signIn(page, key) {
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#deliveries, #no-rows").first().waitFor(WAIT);
  assert.ok(!page.url().includes(key), "the key is never in the address");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("entrega.console.key")), key);
}

async function main() {
  const browser = await chromium.launch({
    executablePath: env.ENTREGA_CHROMIUM,
    headless: true,
    // As root, without a sandbox; and without the background traffic that this
    // machine's closed network refuses.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    env: { ...process.env, LD_LIBRARY_PATH: env.ENTREGA_CHROMIUM_LIBS || "" },
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // Errors in the page's console: a CSP violation ("Refused to …") or a script error.
  // A refused API call (the tenant's 403 on /v1/tenants, the 404 of another tenant's
  // delivery) is logged by the browser too, and is expected here.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console: ${m.text()}`);
  });
  page.on("dialog", (d) => d.accept());

  step("sign in as tenant A");
  await page.goto(`${base}/console`);
  await signIn(page, env.TENANT_A_KEY);

  step("find the exhausted delivery through the filters");
  let found = await filter(page, { status: "exhausted", eventType: "invoice.paid" });
  assert.equal(found.length, 1, JSON.stringify(found));
  await page.screenshot({ path: path.join(artifacts, "log.png"), fullPage: true });

  step("its page shows the attacker's text as text");
  await page.locator(`#deliveries tbody tr[data-id="${found[0].id}"] a`).click();
  await page.locator("#try-now").waitFor(WAIT);
  const payload = await page.locator("#payload").textContent();
  assert.ok(payload.includes("<script>window.__pwned=1</script>"), payload);
  assert.ok(payload.includes("\"><img src=x onerror=window.__pwned=2>"), payload);
  const excerpt = await page.locator("#attempts pre.excerpt").first().textContent();
  assert.ok(excerpt.includes("<script>window.__pwned=3</script>"), excerpt);
  assert.equal(await page.evaluate(() => document.querySelectorAll("img, #main script").length), 0);
  const attemptsBefore = await page.locator("#attempts tbody tr").count();

  step("the receiver is fixed; Try now, double-clicked");
  await need({ what: "healthy" });
  await page.locator("#try-now").dblclick();
  await page.waitForFunction(() => document.querySelector("dl.summary .status")?.textContent === "delivered", null, WAIT);
  const attempts = await page.locator("#attempts tbody tr").allTextContents();
  assert.equal(attempts.length, attemptsBefore + 1, `one new attempt: ${attempts}`);
  assert.ok(attempts[attempts.length - 1].includes("204"), attempts.join(" | "));
  assert.ok(attempts[attempts.length - 1].includes("manual"), attempts.join(" | "));
  const sent = await need({ what: "received", event_type: "invoice.paid" });
  assert.equal(sent.count, attemptsBefore + 1, "a double-click sends once");
  await page.screenshot({ path: path.join(artifacts, "delivery.png"), fullPage: true });

  step("batch-resend a filtered set of 5");
  found = await filter(page, { status: "exhausted", eventType: "order.shipped" });
  assert.equal(found.length, 5, JSON.stringify(found));
  const before = await need({ what: "received", event_type: "order.shipped" });
  await page.locator("#resend-matching").click();
  const dialog = page.locator("dialog[open]");
  await dialog.waitFor(WAIT);
  assert.match(await dialog.textContent(), /Resend 5 deliveries/);
  await dialog.getByRole("button", { name: "Resend 5" }).click();
  await page.getByText("Done: 5 deliveries queued again.").waitFor(WAIT);
  const after = await need({ what: "arrived", event_type: "order.shipped", at_least: before.count + 5 });
  assert.equal(after.count, before.count + 5, "5 arrive, no more");

  step("a window longer than the API resends is refused before anything is counted or sent");
  await page.getByLabel("Created from").fill("2026-01-01T00:00");
  // The view is drawn anew once its data has loaded: until then the old view's button,
  // with the old filters, is still there to be clicked.
  const oldButton = await page.locator("#resend-matching").elementHandle();
  await page.getByRole("button", { name: "Apply filters" }).click();
  await page.waitForFunction(() => location.hash.includes("since="), null, WAIT);
  await oldButton.waitForElementState("hidden", WAIT);
  await page.locator("#resend-matching").click();
  await page.locator("#resend-progress").getByText("A batch resend covers at most 14 days").waitFor(WAIT);
  assert.equal(await page.locator("dialog[open]").count(), 0, "no confirmation offered");

  step("failures: the oldest's age, and an acknowledgement with a note");
  await page.getByRole("link", { name: "Failures" }).click();
  await page.locator("#oldest").waitFor(WAIT);
  assert.match(await page.locator("#oldest").textContent(), /Oldest unacknowledged failure: \d+ (s|min) old/);
  const unacked = await page.locator("#failures tbody tr").count();
  await page.getByRole("button", { name: "Acknowledge…" }).first().click();
  await page.getByLabel(/^Note/).fill("receiver fixed <b>by hand</b>");
  await page.locator("dialog[open]").getByRole("button", { name: "Acknowledge" }).click();
  await page.waitForFunction((n) => document.querySelectorAll("#failures tbody tr").length === n - 1, unacked, WAIT);

  step("endpoints: figures, chart, rotate the secret once");
  await page.getByRole("link", { name: "Endpoints" }).click();
  await page.locator(".card svg.chart").first().waitFor(WAIT);
  assert.match(await page.locator(".card").first().textContent(), /Last 24 h: \d+ attempts/);
  // 6 delivered (Try now, 5 resent), 7 failed: degraded, in words.
  assert.match(await page.locator(".card .health").first().textContent(), /Health: degraded — 54 % of attempts in 24 h failed/);
  await page.locator(".card").first().getByRole("button", { name: "Rotate secret…" }).click();
  const secret = page.locator(".card input[aria-label='New signing secret']");
  await secret.waitFor(WAIT);
  assert.match(await secret.inputValue(), /^whsec_/);
  await page.screenshot({ path: path.join(artifacts, "endpoints.png"), fullPage: true });
  await page.getByRole("button", { name: "Disable" }).first().click();
  await page.locator(".card .status-disabled").first().waitFor(WAIT);
  assert.equal(await secret.count(), 0, "the secret is shown once");
  await page.getByRole("button", { name: "Enable" }).first().click();
  await page.locator(".card .status-enabled").first().waitFor(WAIT);

  step("tenant B sees none of tenant A's rows");
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key").waitFor(WAIT);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("entrega.console.key")), null);
  await signIn(page, env.TENANT_B_KEY);
  const seen = await rows(page);
  assert.deepEqual(seen.map((r) => r.eventType), ["b.only"], JSON.stringify(seen));
  await page.evaluate((id) => { location.hash = `#/deliveries/${id}`; }, found[0].id);
  await page.getByText("Delivery not found").waitFor(WAIT);

  step("the admin key sees every tenant, and filters by one");
  await page.getByRole("button", { name: "Sign out" }).click();
  await signIn(page, env.ADMIN_KEY);
  assert.equal(await page.locator("#who").textContent(), "Signed in as admin");
  const tenants = await page.getByLabel("Tenant").locator("option").allTextContents();
  assert.deepEqual(tenants.sort(), ["Acme", "Every tenant", "Globex"], tenants.join());
  assert.equal((await rows(page)).length, 8, "both tenants' deliveries");
  await page.getByLabel("Tenant").selectOption({ label: "Globex" });
  await page.getByRole("button", { name: "Apply filters" }).click();
  await page.waitForFunction(() => location.hash.includes("tenant_id=")
    && document.querySelectorAll("#deliveries tbody tr").length === 1, null, WAIT);
  assert.deepEqual((await rows(page)).map((r) => r.eventType), ["b.only"]);

  step("the admin's failures: every tenant's, then one tenant's");
  await page.getByRole("link", { name: "Failures" }).click();
  await page.locator("#failures").waitFor(WAIT);
  await page.getByLabel("Show").selectOption({ label: "All" });
  await page.getByRole("button", { name: "Apply filters" }).click();
  await page.waitForFunction(() => new URLSearchParams(location.hash.split("?")[1]).get("acknowledged") === ""
    && document.querySelectorAll("#failures tbody tr").length > 1, null, WAIT);
  const everyTenant = await page.locator("#failures tbody tr td:nth-child(2)").allTextContents();
  assert.ok(everyTenant.includes("b.only") && everyTenant.includes("audit.logged"), everyTenant.join());
  await page.getByLabel("Tenant").selectOption({ label: "Globex" });
  await page.getByRole("button", { name: "Apply filters" }).click();
  await page.waitForFunction(() => location.hash.startsWith("#/failures?tenant_id=")
    && [...document.querySelectorAll("#failures tbody tr td:nth-child(2)")].every((td) => td.textContent === "b.only"), null, WAIT);
  assert.deepEqual(await page.locator("#failures tbody tr td:nth-child(2)").allTextContents(), ["b.only"]);

  step("nothing the attacker wrote ever ran");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  assert.deepEqual(problems, []);
  await browser.close();
  console.log("@done");
  // The open stdin would keep node running.
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
