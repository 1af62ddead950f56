//! MCP authorization checks this node answered with 403 / PERMISSION_DENIED, per project: the
//! release evidence's "unauthorized MCP requests". Node-local, like every request counter:
//! `squadron evidence` asks each node and adds the counts up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use squadron_core::ids::{ProjectId, TenantId};

/// Projects counted separately; denials of further projects count in the total only.
pub const MCP_DENIAL_PROJECTS_MAX: usize = 100_000;

#[derive(Debug, Default)]
pub struct McpDenials {
    total: AtomicU64,
    by_project: Mutex<BTreeMap<(TenantId, ProjectId), u64>>,
}

impl McpDenials {
    pub fn record(&self, tenant: &TenantId, project: &ProjectId) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self
            .by_project
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.clone(), project.clone());
        if let Some(n) = map.get_mut(&key) {
            *n += 1;
        } else if map.len() < MCP_DENIAL_PROJECTS_MAX {
            map.insert(key, 1);
        }
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub fn of(&self, tenant: &TenantId, project: &ProjectId) -> u64 {
        let map = self
            .by_project
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(&(tenant.clone(), project.clone()))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_are_counted_per_project_and_in_total() {
        let d = McpDenials::default();
        let (t, p, q) = (
            TenantId::new("t").unwrap(),
            ProjectId::new("p").unwrap(),
            ProjectId::new("q").unwrap(),
        );
        d.record(&t, &p);
        d.record(&t, &p);
        d.record(&t, &q);
        assert_eq!(d.of(&t, &p), 2);
        assert_eq!(d.of(&t, &q), 1);
        assert_eq!(d.total(), 3);
    }
}
