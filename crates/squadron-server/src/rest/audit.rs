//! Who did what: the replicated audit record, paged oldest first.

use axum::extract::State;
use axum::routing::get;
use axum::Json;
use squadron_core::access::AuditRecord;

use super::{json, page, query, read, AppState, QueryParams, RouteBook};
use crate::error::ApiError;
use squadron_api::{Access, AuditPage, AuditQuery};

use squadron_api::queries::AUDIT_PAGE_RECORDS_DEFAULT;

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
    // In 1..=AUDIT_PAGE_RECORDS_MAX: the query's decoder refused anything else.
    let limit = q.limit.unwrap_or(AUDIT_PAGE_RECORDS_DEFAULT);
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
