//! Bearer and bootstrap tokens. A token is `sqd_{kind}_{id}_{secret}`: the id names the record
//! (so a lookup never scans), the secret is 256 random bits. Only the SHA-256 of the secret is
//! stored, in the replicated state; a plain hash suffices because the secret is random and
//! long — there is nothing for a slow password hash to protect against.

use std::fmt;

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::PkiError;

/// Random bytes in a token's secret part.
pub const TOKEN_SECRET_BYTES: usize = 32;
/// Random bytes in a token's id part.
pub const TOKEN_ID_BYTES: usize = 8;
/// Longest token text accepted from a caller.
pub const TOKEN_BYTES_MAX: usize = 160;

/// What a token is for; part of its text so a token pasted into the wrong place is refused
/// by its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An operator's bearer token (`sqd_op_…`).
    Operator,
    /// A one-time bootstrap token for enrollment (`sqd_boot_…`).
    Bootstrap,
    /// One agent generation's key to its worker's MCP gateway (`sqd_mcp_…`).
    Mcp,
    /// One task attempt's placeholder for the credentials its worker injects at egress
    /// (`sqd_egress_…`): the proxy swaps it for the value.
    Egress,
}

impl TokenKind {
    fn tag(self) -> &'static str {
        match self {
            TokenKind::Operator => "op",
            TokenKind::Bootstrap => "boot",
            TokenKind::Mcp => "mcp",
            TokenKind::Egress => "egress",
        }
    }
}

/// A token as its holder has it. `Debug` and `Display` never show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretToken {
    kind: TokenKind,
    id: String,
    secret: String,
}

/// The SHA-256 of a token's secret, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenHash(pub [u8; 32]);

impl SecretToken {
    /// A new random token.
    pub fn generate(kind: TokenKind) -> Self {
        let mut id = [0u8; TOKEN_ID_BYTES];
        let mut secret = [0u8; TOKEN_SECRET_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut id);
        rand::rngs::OsRng.fill_bytes(&mut secret);
        SecretToken {
            kind,
            id: hex::encode(id),
            secret: hex::encode(secret),
        }
    }

    /// Parses a token a caller sent; the error never repeats the text.
    pub fn parse(kind: TokenKind, text: &str) -> Result<Self, PkiError> {
        let text = text.trim();
        let bad = || {
            PkiError::Token(format!(
                "not a {} token (expected sqd_{}_<id>_<secret>)",
                kind.tag(),
                kind.tag()
            ))
        };
        if text.len() > TOKEN_BYTES_MAX {
            return Err(bad());
        }
        let rest = text
            .strip_prefix("sqd_")
            .and_then(|r| r.strip_prefix(kind.tag()))
            .and_then(|r| r.strip_prefix('_'))
            .ok_or_else(bad)?;
        let (id, secret) = rest.split_once('_').ok_or_else(bad)?;
        let hex_of =
            |s: &str, n: usize| s.len() == 2 * n && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex_of(id, TOKEN_ID_BYTES) || !hex_of(secret, TOKEN_SECRET_BYTES) {
            return Err(bad());
        }
        Ok(SecretToken {
            kind,
            id: id.to_ascii_lowercase(),
            secret: secret.to_ascii_lowercase(),
        })
    }

    /// The public part: names the stored record.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn hash(&self) -> TokenHash {
        TokenHash(Sha256::digest(self.secret.as_bytes()).into())
    }

    /// The whole token, for the one place it is shown or written (a 0600 file, stdout once).
    pub fn expose(&self) -> String {
        format!("sqd_{}_{}_{}", self.kind.tag(), self.id, self.secret)
    }
}

impl TokenHash {
    /// Constant-time comparison, so response timing says nothing about how much matched.
    pub fn matches(&self, token: &SecretToken) -> bool {
        self.0.ct_eq(&token.hash().0).into()
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Result<Self, PkiError> {
        let bytes =
            hex::decode(s).map_err(|_| PkiError::Token("hash must be 64 hex digits".into()))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| PkiError::Token("hash must be 64 hex digits".into()))?;
        Ok(TokenHash(arr))
    }
}

impl fmt::Debug for SecretToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretToken(sqd_{}_{}_…)", self.kind.tag(), self.id)
    }
}

impl fmt::Display for SecretToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sqd_{}_{}_…", self.kind.tag(), self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_parses_back_and_its_hash_matches() {
        let t = SecretToken::generate(TokenKind::Operator);
        let text = t.expose();
        let back = SecretToken::parse(TokenKind::Operator, &text).unwrap();
        assert_eq!(back, t);
        assert!(t.hash().matches(&back));
        let other = SecretToken::generate(TokenKind::Operator);
        assert!(!t.hash().matches(&other));
        assert_eq!(TokenHash::from_hex(&t.hash().to_hex()).unwrap(), t.hash());
    }

    #[test]
    fn the_secret_never_shows_in_debug_or_display() {
        let t = SecretToken::generate(TokenKind::Bootstrap);
        let secret = t.expose().rsplit('_').next().unwrap().to_owned();
        assert!(!format!("{t:?}").contains(&secret));
        assert!(!t.to_string().contains(&secret));
    }

    #[test]
    fn malformed_tokens_are_refused_without_echo() {
        let good = SecretToken::generate(TokenKind::Operator).expose();
        let boot = SecretToken::generate(TokenKind::Bootstrap).expose();
        let secret_part = good.rsplit('_').next().unwrap().to_owned();
        for bad in [
            "".to_owned(),
            "sqd_op_".to_owned(),
            good.replace("sqd_op_", "sqd_boot_"),
            boot,
            format!("{good}0"),
            good[..good.len() - 1].to_owned(),
            format!("{}_{}", &good[..good.len() - 65], "g".repeat(64)),
            "x".repeat(500),
        ] {
            let e = SecretToken::parse(TokenKind::Operator, &bad)
                .unwrap_err()
                .to_string();
            assert!(!e.contains(&secret_part[..16]), "{e}");
            assert!(!e.contains("xxxxxxxx"), "{e}");
        }
    }
}
