//! A small self-contained dashboard: cluster status, tasks with their live output, projects,
//! refreshed every two seconds. The page is public; its data comes from the API under the
//! operator token the visitor pastes into its sign-in form (kept in the tab's
//! `sessionStorage`, sent as `Authorization: Bearer`, and on the output WebSocket as the
//! `bearer.<token>` subprotocol). Nothing is fetched from outside the node, and its
//! Content-Security-Policy lets the page connect to nothing else.

pub const PAGE: &str = include_str!("dashboard.html");
