//! The `provider-secrets-v1` redaction profile: the shapes of well-known secrets, replaced
//! wherever they occur in a task's outputs, whether or not the task was lent them — a key a
//! provider found in the repository or its environment and printed is hidden as a leased
//! value is.
//!
//! Each token shape is a literal start and a run of its alphabet; a private key is a PEM
//! block, ended or not (a block cut off is redacted up to its body's last byte). Escaped
//! newlines (`\n` as JSON streams carry them) count as the block's whitespace.

use std::sync::OnceLock;

use regex::bytes::Regex;

/// What stands in for a secret found by its shape.
pub(crate) const SHAPE_STAND_IN: &[u8] = b"[REDACTED:provider-secret]";

/// A token shape: its literal start, the alphabet of its body and the body's least length.
/// `boundary`: the start must not follow a letter or digit (`sk-` inside `task-…`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenShape {
    pub(crate) start: &'static str,
    pub(crate) body: fn(u8) -> bool,
    pub(crate) body_min: usize,
    pub(crate) boundary: bool,
}

fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

fn upper_alnum(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

/// Anthropic, OpenAI, GitHub (classic and fine-grained), Slack and AWS access keys.
pub(crate) const TOKEN_SHAPES: [TokenShape; 10] = [
    TokenShape {
        start: "sk-ant-",
        body: key_byte,
        body_min: 20,
        boundary: false,
    },
    TokenShape {
        start: "sk-",
        body: key_byte,
        body_min: 20,
        boundary: true,
    },
    TokenShape {
        start: "ghp_",
        body: alnum,
        body_min: 30,
        boundary: false,
    },
    TokenShape {
        start: "gho_",
        body: alnum,
        body_min: 30,
        boundary: false,
    },
    TokenShape {
        start: "ghu_",
        body: alnum,
        body_min: 30,
        boundary: false,
    },
    TokenShape {
        start: "ghs_",
        body: alnum,
        body_min: 30,
        boundary: false,
    },
    TokenShape {
        start: "ghr_",
        body: alnum,
        body_min: 30,
        boundary: false,
    },
    TokenShape {
        start: "github_pat_",
        body: key_byte,
        body_min: 22,
        boundary: false,
    },
    TokenShape {
        start: "AKIA",
        body: upper_alnum,
        body_min: 16,
        boundary: false,
    },
    TokenShape {
        start: "ASIA",
        body: upper_alnum,
        body_min: 16,
        boundary: false,
    },
];

/// Slack's `xox?-` tokens: one letter after `xox`, then the body.
const SLACK_PREFIX: &str = "xox";
const SLACK_KINDS: &[u8] = b"abposr";
const SLACK_BODY_MIN: usize = 10;

/// Where a PEM block starts.
const PEM_BEGIN: &str = "-----BEGIN ";

/// A whole private key block, and a block that was never ended (redacted through its body).
fn pem_patterns() -> &'static [Regex; 2] {
    static PATTERNS: OnceLock<[Regex; 2]> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let header = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----";
        let whole = format!(r"(?s){header}.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----");
        let cut = format!(r"{header}(?:[A-Za-z0-9+/=:,\- \t\r\n]|\\[rn])*");
        [whole, cut].map(|p| Regex::new(&p).expect("a valid pattern"))
    })
}

/// The secrets' spans in `bytes`, sorted and merged: every token shape and PEM block.
pub(crate) fn secret_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    for shape in &TOKEN_SHAPES {
        token_spans(bytes, shape, &mut spans);
    }
    slack_spans(bytes, &mut spans);
    for pattern in pem_patterns() {
        spans.extend(pattern.find_iter(bytes).map(|m| (m.start(), m.end())));
    }
    merge(spans)
}

/// `bytes` with every secret's span replaced by the stand-in; `None` when none occurs.
pub(crate) fn redact_shapes(bytes: &[u8]) -> Option<Vec<u8>> {
    let spans = secret_spans(bytes);
    if spans.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut from = 0;
    for (start, end) in spans {
        out.extend_from_slice(&bytes[from..start]);
        out.extend_from_slice(SHAPE_STAND_IN);
        from = end;
    }
    out.extend_from_slice(&bytes[from..]);
    Some(out)
}

/// The earliest offset from which the end of `bytes` could still become (or grow) a secret
/// as more is written: a token shape's start, whole or in part, followed only by its body's
/// bytes; a PEM header begun, or a private key block not yet ended. `bytes.len()` when
/// nothing at the end could.
pub(crate) fn unsettled_from(bytes: &[u8]) -> usize {
    let mut from = bytes.len();
    for shape in &TOKEN_SHAPES {
        from = from.min(open_token(
            bytes,
            shape.start.as_bytes(),
            shape.body,
            shape.boundary,
        ));
    }
    from = from.min(open_slack(bytes));
    from.min(open_pem(bytes))
}

fn token_spans(bytes: &[u8], shape: &TokenShape, spans: &mut Vec<(usize, usize)>) {
    for at in memchr::memmem::find_iter(bytes, shape.start.as_bytes()) {
        if shape.boundary && at > 0 && bytes[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let body = at + shape.start.len();
        let len = bytes[body..]
            .iter()
            .take_while(|b| (shape.body)(**b))
            .count();
        if len >= shape.body_min {
            spans.push((at, body + len));
        }
    }
}

fn slack_spans(bytes: &[u8], spans: &mut Vec<(usize, usize)>) {
    for at in memchr::memmem::find_iter(bytes, SLACK_PREFIX.as_bytes()) {
        let kind = at + SLACK_PREFIX.len();
        if bytes.get(kind).is_some_and(|k| SLACK_KINDS.contains(k))
            && bytes.get(kind + 1) == Some(&b'-')
        {
            let body = kind + 2;
            let len = bytes[body..].iter().take_while(|b| key_byte(**b)).count();
            if len >= SLACK_BODY_MIN {
                spans.push((at, body + len));
            }
        }
    }
}

/// Where a token that could still grow starts: the literal start (or a part of it) at the
/// end, or the whole start followed only by body bytes up to the end.
fn open_token(bytes: &[u8], start: &[u8], body: fn(u8) -> bool, boundary: bool) -> usize {
    let run_from = bytes.len() - bytes.iter().rev().take_while(|b| body(**b)).count();
    // The start ends at or after the run's first byte (it may itself be body bytes).
    let window = run_from.saturating_sub(start.len());
    let whole = memchr::memmem::find_iter(&bytes[window..], start)
        .map(|i| window + i)
        .filter(|at| at + start.len() >= run_from)
        .find(|at| !(boundary && *at > 0 && bytes[at - 1].is_ascii_alphanumeric()));
    whole
        .unwrap_or(bytes.len())
        .min(partial_at_end(bytes, start, boundary))
}

fn open_slack(bytes: &[u8]) -> usize {
    let body_run = bytes.iter().rev().take_while(|b| key_byte(**b)).count();
    let run_from = bytes.len() - body_run;
    let mut earliest = bytes.len();
    // `xox?-` then body bytes to the end; the run may swallow the `xox?` itself.
    for end in run_from.saturating_sub(5)..=bytes.len() {
        if end >= 5 {
            let head = &bytes[end - 5..end];
            if head.starts_with(SLACK_PREFIX.as_bytes())
                && SLACK_KINDS.contains(&head[3])
                && head[4] == b'-'
            {
                earliest = earliest.min(end - 5);
            }
        }
    }
    // A part of `xox?-` at the very end.
    for k in (1..5).rev() {
        if bytes.len() >= k {
            let tail = &bytes[bytes.len() - k..];
            let fits = tail.iter().enumerate().all(|(i, b)| match i {
                0..=2 => *b == SLACK_PREFIX.as_bytes()[i],
                3 => SLACK_KINDS.contains(b),
                _ => *b == b'-',
            });
            if fits {
                earliest = earliest.min(bytes.len() - k);
            }
        }
    }
    earliest
}

/// The first header begun (whole or in part) whose private key block has not ended yet.
fn open_pem(bytes: &[u8]) -> usize {
    let begin = PEM_BEGIN.as_bytes();
    for at in memchr::memmem::find_iter(bytes, begin) {
        let after = &bytes[at + begin.len()..];
        let Some(header_len) = memchr::memmem::find(after, b"-----") else {
            return at; // the header is still being written
        };
        let is_key = after[..header_len].ends_with(b"PRIVATE KEY");
        let rest = &after[header_len..];
        let ended = memchr::memmem::find_iter(rest, b"-----END ").any(|end| {
            let line = &rest[end..];
            let close = memchr::memmem::find(&line[9..], b"-----").map(|i| 9 + i);
            close.is_some_and(|c| line[..c].ends_with(b"PRIVATE KEY"))
        });
        if is_key && !ended {
            return at;
        }
    }
    partial_at_end(bytes, begin, false)
}

/// The start of the longest proper prefix of `literal` that `bytes` ends with.
fn partial_at_end(bytes: &[u8], literal: &[u8], boundary: bool) -> usize {
    for k in (1..literal.len()).rev() {
        if bytes.ends_with(&literal[..k]) {
            let at = bytes.len() - k;
            if !(boundary && at > 0 && bytes[at - 1].is_ascii_alphanumeric()) {
                return at;
            }
        }
    }
    bytes.len()
}

fn merge(mut spans: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC: &str = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    const PEM: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----";

    fn redacted(text: &str) -> String {
        String::from_utf8(redact_shapes(text.as_bytes()).unwrap_or_else(|| text.into()))
            .expect("utf-8")
    }

    #[test]
    fn every_shape_is_found_wherever_it_occurs() {
        for secret in [
            ANTHROPIC,
            "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx",
            "sk-AbCdEfGhIjKlMnOpQrStUvWx",
            "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "xoxb-1234567890-abcdefghij",
            "AKIAIOSFODNN7EXAMPLE",
            "ASIAIOSFODNN7EXAMPLE",
            PEM,
            "-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKCAQEA\\n-----END RSA PRIVATE KEY-----",
        ] {
            for text in [
                secret.to_owned(),
                format!("key={secret} and more"),
                format!("{{\"text\":\"{secret}\"}}"),
            ] {
                let out = redacted(&text);
                assert!(!out.contains(&secret[secret.len() - 8..]), "{text} → {out}");
                assert!(out.contains("[REDACTED:provider-secret]"), "{text} → {out}");
            }
        }
    }

    #[test]
    fn look_alikes_are_left_alone() {
        for text in [
            "task-AbCdEfGhIjKlMnOpQrStUvWxYz",
            "sk-short",
            "ghp_short",
            "AKIA-not-a-key",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
            "plain text",
        ] {
            assert_eq!(redacted(text), text);
        }
    }

    #[test]
    fn a_key_block_cut_off_is_redacted_through_its_body() {
        let text = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIrYSSNQ\nFOo9\" tail";
        let out = redacted(text);
        assert_eq!(out, "[REDACTED:provider-secret]\" tail");
    }

    #[test]
    fn the_unsettled_tail_covers_every_secret_being_written() {
        let text = format!("a {ANTHROPIC} b\n{PEM}\nend xoxb-1234567890-abcdefghij .");
        for len in 0..=text.len() {
            let raw = &text.as_bytes()[..len];
            let settled = &raw[..unsettled_from(raw)];
            let shown = redact_shapes(settled).unwrap_or_else(|| settled.to_vec());
            let shown = String::from_utf8_lossy(&shown);
            for secret in [&ANTHROPIC[7..15], "b3BlbnNz", "12345678"] {
                assert!(!shown.contains(secret), "prefix {len}: {shown}");
            }
        }
    }
}
