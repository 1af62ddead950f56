//! Certificates the cluster CA issued to enrolled identities. A presented worker or agent
//! certificate is believed only while its serial is recorded here and not revoked, so
//! decommissioning a worker or revoking an identity takes effect on every node at once.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::subject::Identity;
use crate::validation_error::ValidationError;

/// Longest serial accepted (20 bytes, RFC 5280).
pub const CERT_SERIAL_HEX_MAX: usize = 40;

/// A certificate serial number, lowercase hex without separators.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct CertSerial(String);

impl CertSerial {
    pub const FIELD: &'static str = "serial";

    pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
        let value = value.into().to_ascii_lowercase();
        let ok = !value.is_empty()
            && value.len() <= CERT_SERIAL_HEX_MAX
            && value.bytes().all(|b| b.is_ascii_hexdigit());
        if !ok {
            return Err(ValidationError::new(
                Self::FIELD,
                format!("must be 1 to {CERT_SERIAL_HEX_MAX} hex digits"),
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Sorts before every serial: the start of an identity's range.
    pub(crate) fn min() -> Self {
        Self(String::new())
    }
}

impl TryFrom<String> for CertSerial {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<CertSerial> for String {
    fn from(value: CertSerial) -> String {
        value.0
    }
}

impl FromStr for CertSerial {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for CertSerial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IssuedCertificate {
    pub serial: CertSerial,
    pub identity: Identity,
    pub issued_at_ms: u64,
    pub not_after_ms: u64,
    pub revoked_at_ms: Option<u64>,
}

impl IssuedCertificate {
    /// Believed at leader time `now`.
    pub fn is_live(&self, now: u64) -> bool {
        self.revoked_at_ms.is_none() && now < self.not_after_ms
    }
}
