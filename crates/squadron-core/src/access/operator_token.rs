//! Operators' bearer tokens as the state keeps them: the SHA-256 of the secret, never the
//! secret (INV-13), with the role and scope that decide what the bearer may do.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::subject::Subject;
use crate::ids::{Digest, ProjectId, TenantId};
use crate::validation_error::ValidationError;

/// Hex digits in a token id.
pub const TOKEN_ID_HEX_LEN: usize = 16;

/// The public part of a token (`sqd_op_{id}_…`), naming its record. 16 lowercase hex digits.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct TokenId(String);

impl TokenId {
    pub const FIELD: &'static str = "token_id";

    pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
        let value = value.into();
        let ok = value.len() == TOKEN_ID_HEX_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return Err(ValidationError::new(
                Self::FIELD,
                format!("must be {TOKEN_ID_HEX_LEN} lowercase hex digits"),
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TokenId {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<TokenId> for String {
    fn from(value: TokenId) -> String {
        value.0
    }
}

impl FromStr for TokenId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a bearer may do (DESIGN §5 "Operators").
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Membership, tokens, credentials, worker decommission, MCP grants — and everything an
    /// operator may do, everywhere.
    Admin,
    /// Tasks, profiles, agents and leases, within the token's scope.
    Operator,
    /// Reads, within the token's scope (everywhere when it has none).
    Viewer,
}

impl Role {
    /// Whether a bearer of this role may do what `needed` may: admin ⊇ operator ⊇ viewer.
    pub fn grants(self, needed: Role) -> bool {
        let rank = |r: Role| match r {
            Role::Viewer => 0,
            Role::Operator => 1,
            Role::Admin => 2,
        };
        rank(self) >= rank(needed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
        match s {
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            "viewer" => Ok(Role::Viewer),
            _ => Err(ValidationError::new(
                field,
                format!("unknown role {s:?}; expected one of admin, operator, viewer"),
            )),
        }
    }
}

/// One tenant, or one project of a tenant, a token covers.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct ProjectScope {
    pub tenant: TenantId,
    /// `None`: every project of the tenant.
    #[serde(default)]
    pub project: Option<ProjectId>,
}

impl ProjectScope {
    pub fn covers(&self, tenant: &TenantId, project: Option<&ProjectId>) -> bool {
        if &self.tenant != tenant {
            return false;
        }
        match (&self.project, project) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            // A project-scoped token does not cover a tenant-wide request.
            (Some(_), None) => false,
        }
    }
}

/// A token record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OperatorToken {
    pub id: TokenId,
    /// SHA-256 of the secret part.
    pub digest: Digest,
    pub role: Role,
    /// Empty: everywhere (admin and viewer only; an operator token always has a scope).
    pub scope: Vec<ProjectScope>,
    /// What the token is for, as its creator named it.
    pub name: String,
    pub created_at_ms: u64,
    pub created_by: Subject,
    pub expires_at_ms: Option<u64>,
    pub revoked_at_ms: Option<u64>,
}

impl OperatorToken {
    /// Usable at leader time `now`: not revoked, not expired.
    pub fn is_live(&self, now: u64) -> bool {
        self.revoked_at_ms.is_none() && self.expires_at_ms.is_none_or(|e| now < e)
    }

    /// Whether the token's scope reaches this tenant (and project, when given).
    pub fn covers(&self, tenant: &TenantId, project: Option<&ProjectId>) -> bool {
        self.scope.is_empty() || self.scope.iter().any(|s| s.covers(tenant, project))
    }
}

#[cfg(test)]
mod tests {
    use super::Role;

    #[test]
    fn roles_grant_what_lesser_roles_may() {
        use Role::*;
        for (role, needed, granted) in [
            (Admin, Admin, true),
            (Admin, Operator, true),
            (Admin, Viewer, true),
            (Operator, Admin, false),
            (Operator, Operator, true),
            (Operator, Viewer, true),
            (Viewer, Admin, false),
            (Viewer, Operator, false),
            (Viewer, Viewer, true),
        ] {
            assert_eq!(role.grants(needed), granted, "{role:?} for {needed:?}");
        }
    }
}
