//! The trust boundary's replicated part (DESIGN §5): operators' tokens, one-time bootstrap
//! tokens, the certificates issued to enrolled workers and agents, the subject every command
//! carries, and the audit record. Secrets never enter here — only their SHA-256 (INV-13).
//!
//! What a caller may do is decided at the edge by its authenticated subject; the rules that can
//! be stated on the state alone ("a worker speaks only for itself", "only an admin mints
//! tokens") are checked again here, so a wrong edge cannot break them.

mod audit;
mod bootstrap_token;
mod certificate;
mod operator_token;
mod subject;

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::TaskId;

pub use audit::{AuditLog, AuditRecord};
pub use bootstrap_token::{BootstrapPurpose, BootstrapToken, Consumption};
pub use certificate::{CertSerial, IssuedCertificate, CERT_SERIAL_HEX_MAX};
pub use operator_token::{OperatorToken, ProjectScope, Role, TokenId, TOKEN_ID_HEX_LEN};
pub use subject::{AgentIdentity, Identity, Subject};

/// Tokens, certificates and the audit record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AccessState {
    pub(crate) operator_tokens: BTreeMap<TokenId, OperatorToken>,
    pub(crate) bootstrap_tokens: BTreeMap<TokenId, BootstrapToken>,
    pub(crate) certificates: BTreeMap<CertSerial, IssuedCertificate>,
    /// The same certificates by identity, for revocation and renewal checks.
    pub(crate) certificates_by_identity: BTreeSet<(Identity, CertSerial)>,
    pub(crate) audit: AuditLog,
}

/// Which task submitted which: an agent's child tasks (the seed's parent/child pattern).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskLineage {
    pub(crate) parent_of: BTreeMap<TaskId, TaskId>,
    /// (parent, child), for listing a task's children in order.
    pub(crate) children: BTreeSet<(TaskId, TaskId)>,
}

impl TaskLineage {
    pub fn parent(&self, task: TaskId) -> Option<TaskId> {
        self.parent_of.get(&task).copied()
    }

    pub fn children(&self, parent: TaskId) -> impl Iterator<Item = TaskId> + '_ {
        self.children
            .range((parent, TaskId::FIRST)..)
            .take_while(move |(p, _)| *p == parent)
            .map(|(_, c)| *c)
    }

    pub(crate) fn link(&mut self, parent: TaskId, child: TaskId) {
        self.parent_of.insert(child, parent);
        self.children.insert((parent, child));
    }
}
