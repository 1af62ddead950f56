//! A small self-contained dashboard: cluster status, tasks with their live terminals, projects,
//! refreshed every two seconds. The page is public; its data comes from the API under the
//! operator token the visitor pastes into its sign-in form (kept in the tab's
//! `sessionStorage`, sent as `Authorization: Bearer`, and on the output WebSocket as the
//! `bearer.<token>` subprotocol). Nothing is fetched from outside the node, and its
//! Content-Security-Policy lets the page connect to nothing else: the terminal (xterm.js) is
//! installed from npm at build time, pinned by `dashboard/package-lock.json` (see build.rs),
//! and served from the binary under `/assets/`.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

pub const PAGE: &str = include_str!("dashboard.html");

/// The page's front-end files by the name it asks for, with their content type. The page's
/// own script is a file too, so its Content-Security-Policy runs no inline script: output a
/// sandbox wrote can never become code on the page.
const ASSETS: [(&str, &str, &str); 5] = [
    (
        "dashboard.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard.js"),
    ),
    (
        "xterm.js",
        "text/javascript; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/xterm.js")),
    ),
    (
        "xterm.css",
        "text/css; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/xterm.css")),
    ),
    (
        "addon-fit.js",
        "text/javascript; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/addon-fit.js")),
    ),
    (
        "LICENSES.txt",
        "text/plain; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/LICENSES.txt")),
    ),
];

/// The pinned packages' files change only with their lock file; an hour's caching spares a
/// reload the half megabyte without outliving an upgrade by long.
const ASSET_CACHE_CONTROL: &str = "public, max-age=3600";
/// The page's own script goes with the page, which is never cached either.
const PAGE_SCRIPT_CACHE_CONTROL: &str = "no-cache";

/// `GET /assets/{name}`: one of the page's embedded files.
pub async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return Err(ApiError::not_found(format!(
            "no dashboard asset named {name:?}"
        )));
    };
    let mut response = (StatusCode::OK, *body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let cache = if name == "dashboard.js" {
        PAGE_SCRIPT_CACHE_CONTROL
    } else {
        ASSET_CACHE_CONTROL
    };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_terminal_is_xterm_and_names_no_source_map() {
        let (_, _, js) = ASSETS.iter().find(|(n, ..)| *n == "xterm.js").unwrap();
        assert!(js.len() > 100_000, "xterm.js is {} bytes", js.len());
        assert!(js.contains("Terminal"));
        assert!(!js.contains("sourceMappingURL"));
        let (_, _, notices) = ASSETS.iter().find(|(n, ..)| *n == "LICENSES.txt").unwrap();
        assert!(notices.contains("@xterm/xterm") && notices.contains("MIT"));
    }

    /// The page runs no inline script: its policy allows scripts from the node alone, and
    /// every script it loads is one the node serves.
    #[test]
    fn the_page_runs_only_the_nodes_own_scripts() {
        let policy = PAGE
            .split("Content-Security-Policy\" content=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("the page's policy");
        let scripts = policy
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"));
        assert_eq!(scripts, Some("script-src 'self'"), "{policy}");
        let scripts: Vec<&str> = PAGE.split("<script").skip(1).collect();
        assert_eq!(scripts.len(), 3, "{scripts:?}");
        for tag in scripts {
            let src = tag
                .split("src=\"/assets/")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_else(|| panic!("an inline script: <script{tag}"));
            assert!(
                ASSETS.iter().any(|(n, ..)| *n == src),
                "{src} is not served"
            );
            assert!(
                tag.starts_with(&format!(" src=\"/assets/{src}\"></script>")),
                "{tag}"
            );
        }
    }
}
