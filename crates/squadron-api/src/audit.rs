//! The audit log's page.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::access::AuditRecord;

/// `GET /api/v1/audit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// Pass as `after` to get the next page; absent on the last page.
    pub next_after: Option<u64>,
}
