//! The support console at `/console`: a handful of static files compiled into the
//! binary, served by the same router as the API on both runtimes (`entrega serve` and
//! the API Lambda). The pages call only the public `/v1` API with the key the user
//! signs in with, so the console can never do what the API would refuse.
//!
//! Why static files and vanilla JavaScript: no build step, no bundler, nothing fetched
//! from a CDN, and every attacker-controlled string reaches the page through
//! `textContent`, never through HTML parsing (see `assets/dom.js`).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::api::problem::ApiError;

/// Where the console lives.
pub const CONSOLE_PATH: &str = "/console";

/// Only this origin's own scripts, styles and API; no inline script or style, no
/// frames, no plugins, no form posted anywhere. `img-src data:` is not needed: the
/// chart is inline SVG built through the DOM.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The files may change with each release, and the page is small: revalidate every
/// time rather than risk a stale script talking to a newer API.
const ASSET_CACHE: &str = "no-cache";

/// One file of the console.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

/// A file of `assets/`, compiled in.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_str!(concat!("assets/", $name)),
        }
    };
}

/// Every file, by the name it is served under (`/console/<name>`); the page first.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("log.js", JS),
    asset!("delivery.js", JS),
    asset!("failures.js", JS),
    asset!("endpoints.js", JS),
    asset!("icon.svg", "image/svg+xml"),
];

fn serve(asset: &Asset) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CACHE_CONTROL, ASSET_CACHE),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        ],
        asset.body,
    )
        .into_response()
}

async fn index() -> Response {
    serve(&ASSETS[0])
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(a),
        None => ApiError::not_found("console file", &name).into_response(),
    }
}

/// `/console` and its files.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(CONSOLE_PATH, get(index))
        .route("/console/", get(index))
        .route("/console/{name}", get(asset))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script the page loads, directly or by `import`, is served: a missing
    /// file would be a blank console with no error but in the browser's devtools.
    #[test]
    fn every_file_the_page_names_is_served() {
        let mut named = Vec::new();
        for a in ASSETS {
            for piece in a.body.split(['"', '\'']) {
                if let Some(file) = piece.strip_prefix("./").or(piece.strip_prefix("/console/")) {
                    if [".js", ".css", ".svg"]
                        .iter()
                        .any(|ext| file.ends_with(ext))
                    {
                        named.push(file.to_owned());
                    }
                }
            }
        }
        assert!(named.len() >= ASSETS.len() - 1, "{named:?}");
        for file in named {
            assert!(
                ASSETS.iter().any(|a| a.name == file),
                "{file} is loaded by the console but not served"
            );
        }
    }

    /// The pages never parse strings as HTML: every text goes through `textContent`.
    /// (The browser test checks the effect; this keeps the one way in closed.)
    #[test]
    fn no_asset_parses_strings_as_html() {
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
            ] {
                assert!(!a.body.contains(sink), "{} uses {sink}", a.name);
            }
        }
        let html = ASSETS[0].body;
        assert!(!html.contains("<script>"), "inline script in index.html");
        assert!(!html.contains("style="), "inline style in index.html");
    }
}
