// The console's shell: sign in and out, and which page the address's #fragment names.
// Filters live in the fragment too, so a filtered log can be bookmarked or shared
// (without the key, which never leaves sessionStorage).

import { signedIn, remember, forget, whoAmI, ApiError } from "./api.js";
import { h, show, notify } from "./dom.js";
import { deliveryLog } from "./log.js";
import { deliveryPage } from "./delivery.js";
import { failuresPage } from "./failures.js";
import { endpointsPage } from "./endpoints.js";

const $ = (id) => document.getElementById(id);
let caller = null;
/** Each render's number: a slower, older render never paints over a newer one. */
let latest = 0;

function route() {
  const [path, search] = (location.hash.slice(1) || "/deliveries").split("?");
  return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(search || "") };
}

async function render() {
  const mine = ++latest;
  if (!signedIn()) return showSignIn();
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("sign-out").hidden = false;
  // The page is built off-screen and shown only if no newer render started meanwhile
  // (and the user did not sign out); later redraws of the page update it in place.
  const view = h("div");
  const paint = () => { if (mine === latest) $("view").replaceChildren(view); };
  try {
    caller = caller || (await whoAmI());
    $("who").textContent = caller.admin ? "Signed in as admin" : "Signed in with a tenant key";
    const { parts, params } = route();
    for (const link of document.querySelectorAll("#nav a")) {
      const current = link.getAttribute("href").slice(2) === parts[0];
      if (current) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
    }
    notify("");
    if (parts[0] === "deliveries" && parts[1]) await deliveryPage(view, parts[1], caller);
    else if (parts[0] === "failures") await failuresPage(view, params, caller);
    else if (parts[0] === "endpoints") await endpointsPage(view, params, caller);
    else await deliveryLog(view, params, caller);
    paint();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;
    show(view, h("h1", {}, "Something went wrong"), h("p", {}, e.message));
    paint();
  }
}

function showSignIn(message) {
  latest += 1;
  caller = null;
  $("nav").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  show($("view"));
  $("sign-in").hidden = false;
  notify(message || "", Boolean(message));
  $("api-key").focus();
}

function signOut(message) {
  forget();
  // The next key starts on the log, not on the previous user's page and filters.
  history.replaceState(null, "", "#/deliveries");
  $("api-key").value = "";
  showSignIn(message);
}

$("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("api-key");
  remember(input.value.trim());
  input.value = "";
  caller = null;
  try {
    caller = await whoAmI();
  } catch (e) {
    return signOut(e instanceof ApiError && e.status === 401 ? "That key was not accepted." : e.message);
  }
  if (location.hash.startsWith("#/")) await render(); else location.hash = "#/deliveries";
  $("main").focus();
});

$("sign-out").addEventListener("click", () => signOut("Signed out."));
window.addEventListener("entrega:unauthorized", () => signOut("The key is no longer accepted; sign in again."));
window.addEventListener("hashchange", render);
render();
