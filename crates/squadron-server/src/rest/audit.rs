//! Who did what: the replicated audit record, paged oldest first.

use axum::extract::State;
use axum::routing::get;
use axum::Json;
use squadron_core::access::AuditRecord;

use super::{json, page, query, read, AppState, QueryParams, RouteBook};
use crate::error::ApiError;
use squadron_api::{Access, AuditPage, AuditQuery};

/// Records per page unless `limit` says otherwise, and the most one page holds.
pub const AUDIT_PAGE_RECORDS_DEFAULT: usize = 100;
pub const AUDIT_PAGE_RECORDS_MAX: usize = 1_000;

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/api/v1/audit",
        "The audit record, oldest first: ?after=SEQ&limit=N (the newest records are kept)",
        query::<AuditQuery>(),
        json::<AuditPage>(),
        Access::admin(),
        get(list),
    )
}

async fn list(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(AUDIT_PAGE_RECORDS_DEFAULT);
    if limit == 0 || limit > AUDIT_PAGE_RECORDS_MAX {
        return Err(ApiError::invalid(
            "limit",
            format!("must be between 1 and {AUDIT_PAGE_RECORDS_MAX}, got {limit}"),
        ));
    }
    read(&node, q.consistency, |s| {
        let records: Vec<AuditRecord> = s.audit().after(q.after, limit + 1).cloned().collect();
        let (records, next_after) = page(records, limit, |r| r.seq);
        Ok(Json(AuditPage {
            records,
            next_after,
        }))
    })
    .await
}
