//! Validated identifiers. Every id that crosses the wire is one of these newtypes; each
//! constructor (and each deserializer, so the Raft log and snapshots are checked too) refuses
//! malformed input with an error naming the field.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::{IDEMPOTENCY_KEY_BYTES_MAX, NAME_BYTES_MAX};
use crate::validation_error::ValidationError;

/// Checks the common name grammar: 1..=63 bytes, a lowercase letter or digit first, then
/// lowercase letters, digits, `-`, `_` or `.`. Names end up in paths, cgroup leaves, container
/// labels and URLs, so the grammar is deliberately narrow.
pub fn check_name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > NAME_BYTES_MAX {
        return Err(ValidationError::new(
            field,
            format!(
                "must be at most {NAME_BYTES_MAX} bytes, got {}",
                value.len()
            ),
        ));
    }
    let mut chars = value.chars();
    let first = chars.next().unwrap_or('-');
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err(ValidationError::new(
            field,
            format!("must start with a lowercase letter or digit, got {value:?}"),
        ));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')))
    {
        return Err(ValidationError::new(
            field,
            format!("may contain only a-z, 0-9, '-', '_' and '.', found {bad:?} in {value:?}"),
        ));
    }
    if value.contains("..") {
        return Err(ValidationError::new(field, "must not contain '..'"));
    }
    Ok(())
}

/// [`check_name`]'s grammar as a JSON Schema pattern, for the API document (it cannot say
/// "no `..`", which the check adds).
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]*$";

macro_rules! name_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
        #[serde(try_from = "String", into = "String")]
        #[schemars(extend("pattern" = NAME_PATTERN, "maxLength" = NAME_BYTES_MAX))]
        pub struct $name(String);

        impl $name {
            /// The field name used in errors about this id.
            pub const FIELD: &'static str = $field;

            pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
                let value = value.into();
                check_name($field, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_id!(
    /// A tenant: the outermost namespace of projects.
    TenantId, "tenant"
);
name_id!(
    /// A project within a tenant.
    ProjectId, "project"
);
name_id!(
    /// The stable key of an agent profile within its project (`reviewer`, `agent-3`).
    ProfileKey, "profile_key"
);
name_id!(
    /// A worker node, chosen by the worker (usually its host name).
    WorkerId, "worker"
);
name_id!(
    /// A credential reference (`cred_anthropic_platform_ci`). Never the secret itself (INV-13).
    CredentialId, "credential_id"
);
name_id!(
    /// An MCP server known to the capability plane.
    McpServerId, "mcp_server"
);
name_id!(
    /// A skill a capability manifest may require.
    SkillId, "skill"
);

macro_rules! number_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
        )]
        #[serde(try_from = "u64", into = "u64")]
        #[schemars(extend("minimum" = 1))]
        pub struct $name(u64);

        impl $name {
            /// The field name used in errors about this id.
            pub const FIELD: &'static str = $field;

            /// Ids are assigned by the state machine from 1 upwards; 0 is never an id.
            pub fn new(value: u64) -> Result<Self, ValidationError> {
                if value == 0 {
                    return Err(ValidationError::new($field, "must be a positive integer, got 0"));
                }
                Ok(Self(value))
            }

            pub fn get(self) -> u64 {
                self.0
            }

            /// The id after this one; used only by the state machine's allocators.
            pub(crate) fn next(self) -> Self {
                Self(self.0.checked_add(1).unwrap_or_else(|| {
                    panic!("{} space exhausted", $field)
                }))
            }

            pub(crate) const FIRST: Self = Self(1);
        }

        impl TryFrom<u64> for $name {
            type Error = ValidationError;
            fn try_from(value: u64) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for u64 {
            fn from(value: $name) -> u64 {
                value.0
            }
        }

        impl FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let n: u64 = s.parse().map_err(|_| {
                    ValidationError::new($field, format!("must be a positive integer, got {s:?}"))
                })?;
                Self::new(n)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

number_id!(
    /// An agent profile, assigned on creation. Unique across the cluster.
    ProfileId, "profile_id"
);
number_id!(
    /// A runtime lease, assigned on grant. Unique across the cluster.
    LeaseId, "lease_id"
);
number_id!(
    /// A task, assigned on submission; rising ids are also submission order.
    TaskId, "task_id"
);
number_id!(
    /// A session-scoped credential lease, assigned on grant (INV-13).
    CredentialLeaseId, "credential_lease"
);

/// A profile's runtime generation. Zero means no lease was ever granted; each successful
/// acquisition raises it by exactly one (INV-3).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(transparent)]
pub struct Generation(u64);

impl Generation {
    pub const FIELD: &'static str = "generation";
    pub const ZERO: Self = Self(0);

    pub fn new(value: u64) -> Self {
        Self(value)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// The generation a successful acquisition grants.
    pub fn successor(self) -> Self {
        Self(
            self.0
                .checked_add(1)
                .unwrap_or_else(|| panic!("generation space exhausted")),
        )
    }
}

impl FromStr for Generation {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self).map_err(|_| {
            ValidationError::new(
                "generation",
                format!("must be a non-negative integer, got {s:?}"),
            )
        })
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A SHA-256 digest: of a capsule's canonical encoding, or of the whole state (INV-7, INV-12).
/// Written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "String", into = "String")]
#[schemars(extend("pattern" = "^[0-9a-f]{64}$"))]
pub struct Digest([u8; 32]);

impl Digest {
    pub const FIELD: &'static str = "digest";

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
        if s.len() != 64 {
            return Err(ValidationError::new(
                field,
                format!("must be 64 hex digits, got {} characters", s.len()),
            ));
        }
        if s.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(ValidationError::new(field, "must be lowercase hex"));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|e| ValidationError::new(field, format!("is not hex: {e}")))?;
        Ok(Self(out))
    }
}

impl TryFrom<String> for Digest {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(Self::FIELD, &value)
    }
}

impl From<Digest> for String {
    fn from(value: Digest) -> String {
        value.to_hex()
    }
}

impl FromStr for Digest {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(Self::FIELD, s)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

/// A client-chosen key that makes a command apply at most once (INV-11): 1..=128 printable
/// ASCII characters, no spaces.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(extend("minLength" = 1, "maxLength" = IDEMPOTENCY_KEY_BYTES_MAX))]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const FIELD: &'static str = "idempotency_key";

    pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
        let value = value.into();
        if value.is_empty() {
            return Err(ValidationError::new(Self::FIELD, "must not be empty"));
        }
        if value.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(ValidationError::new(
                Self::FIELD,
                format!(
                    "must be at most {IDEMPOTENCY_KEY_BYTES_MAX} bytes, got {}",
                    value.len()
                ),
            ));
        }
        if let Some(bad) = value.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(ValidationError::new(
                Self::FIELD,
                format!("may contain only printable ASCII without spaces, found {bad:?}"),
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<IdempotencyKey> for String {
    fn from(value: IdempotencyKey) -> String {
        value.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
