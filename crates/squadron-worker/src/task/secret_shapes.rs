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

/// Where a PEM block starts and ends, what closes each of those lines, and the label of a
/// private key's.
const PEM_BEGIN: &str = "-----BEGIN ";
const PEM_END: &str = "-----END ";
const DASHES: &[u8] = b"-----";
const KEY_LABEL: &[u8] = b"PRIVATE KEY";

/// A whole private key block, and the header of one (the start of a block never ended).
fn pem_patterns() -> &'static (Regex, Regex) {
    static PATTERNS: OnceLock<(Regex, Regex)> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let header = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----";
        let whole = format!(r"(?s){header}.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----");
        (
            Regex::new(&whole).expect("a valid pattern"),
            Regex::new(header).expect("a valid pattern"),
        )
    })
}

/// What a block never ended is redacted through after its header: base64 and the line
/// breaks between its lines, raw or escaped once (`\n` as JSON streams carry them). Spaces
/// are not in it, so prose after a cut-off block is not eaten.
fn pem_body_len(bytes: &[u8]) -> usize {
    let mut at = 0;
    while at < bytes.len() {
        let b = bytes[at];
        if b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\r' | b'\n' | b'\t') {
            at += 1;
        } else if b == b'\\' && matches!(bytes.get(at + 1), Some(b'n' | b'r')) {
            at += 2;
        } else {
            break;
        }
    }
    at
}

/// The secrets' spans in `bytes`, sorted, not merged: every token shape, every whole private
/// key block, and every key header no whole block covers, through its body. `value_ends`
/// (sorted): where a leased value ends, which a start glued to it still counts as free of.
pub(crate) fn secret_spans(bytes: &[u8], value_ends: &[usize]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    for shape in &TOKEN_SHAPES {
        token_spans(bytes, shape, value_ends, &mut spans);
    }
    slack_spans(bytes, &mut spans);
    let (whole, header) = pem_patterns();
    let blocks: Vec<(usize, usize)> = whole
        .find_iter(bytes)
        .map(|m| (m.start(), m.end()))
        .collect();
    for m in header.find_iter(bytes) {
        // Blocks come in order and do not overlap: the last one starting at or before the
        // header is the only one that can cover it.
        let before = blocks.partition_point(|(start, _)| *start <= m.start());
        let covered = before > 0 && m.start() < blocks[before - 1].1;
        if !covered {
            spans.push((m.start(), m.end() + pem_body_len(&bytes[m.end()..])));
        }
    }
    spans.extend(blocks);
    spans.sort_unstable();
    spans
}

/// The earliest offset from which the end of `bytes` could still become (or grow) a secret
/// as more is written: the trailing run of bytes a token's start or body may hold (every
/// start and body is made of them, so a token being written is inside it; the last word is
/// held back with it until the line goes on), a PEM header begun, or a private key block not
/// ended yet. `bytes.len()` when nothing at the end could.
pub(crate) fn unsettled_from(bytes: &[u8]) -> usize {
    let run = bytes.iter().rev().take_while(|b| key_byte(**b)).count();
    (bytes.len() - run).min(open_pem(bytes))
}

fn token_spans(
    bytes: &[u8],
    shape: &TokenShape,
    value_ends: &[usize],
    spans: &mut Vec<(usize, usize)>,
) {
    // An occurrence whose body starts inside the run already scanned ends where that run
    // does: its span is inside the earlier one (`sk-sk-sk-…` is scanned once).
    let mut scanned_to = 0;
    for at in memchr::memmem::find_iter(bytes, shape.start.as_bytes()) {
        let body = at + shape.start.len();
        if body <= scanned_to {
            continue;
        }
        let glued = at > 0 && bytes[at - 1].is_ascii_alphanumeric();
        if shape.boundary && glued && value_ends.binary_search(&at).is_err() {
            continue;
        }
        let len = bytes[body..]
            .iter()
            .take_while(|b| (shape.body)(**b))
            .count();
        scanned_to = body + len;
        if len >= shape.body_min {
            spans.push((at, body + len));
        }
    }
}

fn slack_spans(bytes: &[u8], spans: &mut Vec<(usize, usize)>) {
    let mut scanned_to = 0;
    for at in memchr::memmem::find_iter(bytes, SLACK_PREFIX.as_bytes()) {
        let kind = at + SLACK_PREFIX.len();
        let body = kind + 2;
        if body <= scanned_to {
            continue;
        }
        if bytes.get(kind).is_some_and(|k| SLACK_KINDS.contains(k))
            && bytes.get(kind + 1) == Some(&b'-')
        {
            let len = bytes[body..].iter().take_while(|b| key_byte(**b)).count();
            scanned_to = body + len;
            if len >= SLACK_BODY_MIN {
                spans.push((at, body + len));
            }
        }
    }
}

/// The first header begun (whole or in part) whose private key block has not ended yet.
/// One pass: each block's end is searched from its header, and the next header after it.
fn open_pem(bytes: &[u8]) -> usize {
    let begin = PEM_BEGIN.as_bytes();
    let mut from = 0;
    while let Some(i) = memchr::memmem::find(&bytes[from..], begin) {
        let at = from + i;
        let header_from = at + begin.len();
        let Some(header_len) = memchr::memmem::find(&bytes[header_from..], DASHES) else {
            return at; // the header is still being written
        };
        let label_end = header_from + header_len;
        if !bytes[header_from..label_end].ends_with(KEY_LABEL) {
            // Not a key: the next header may start at these very dashes.
            from = label_end;
            continue;
        }
        match key_block_end(&bytes[label_end + DASHES.len()..]) {
            Some(end) => from = label_end + DASHES.len() + end,
            None => return at,
        }
    }
    partial_at_end(bytes, begin)
}

/// Where a private key block's `-----END … PRIVATE KEY-----` line ends in `body`, if it does.
fn key_block_end(body: &[u8]) -> Option<usize> {
    let end = PEM_END.as_bytes();
    let mut from = 0;
    while let Some(i) = memchr::memmem::find(&body[from..], end) {
        let label_from = from + i + end.len();
        let label_len = memchr::memmem::find(&body[label_from..], DASHES)?;
        let label_end = label_from + label_len;
        if body[label_from..label_end].ends_with(KEY_LABEL) {
            return Some(label_end + DASHES.len());
        }
        // The next END may start at these very dashes.
        from = label_end;
    }
    None
}

/// The start of the longest proper prefix of `literal` that `bytes` ends with.
fn partial_at_end(bytes: &[u8], literal: &[u8]) -> usize {
    (1..literal.len())
        .rev()
        .find(|k| bytes.ends_with(&literal[..*k]))
        .map_or(bytes.len(), |k| bytes.len() - k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::credential_session::Redactor;

    const ANTHROPIC: &str = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    const PEM: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----";

    fn redacted(text: &str) -> String {
        let out = Redactor::shapes_only().redact(text.as_bytes());
        String::from_utf8(out.unwrap_or_else(|| text.into())).expect("utf-8")
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
    fn a_key_block_cut_off_is_redacted_through_its_body_and_an_ended_one_no_further() {
        let cut = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIrYSSNQ\\nFOo9\" tail";
        assert_eq!(redacted(cut), "[REDACTED:provider-secret]\" tail");
        let ended = format!("{PEM}\nThe build finished ok and all tests passed\nnext: step");
        assert_eq!(
            redacted(&ended),
            "[REDACTED:provider-secret]\nThe build finished ok and all tests passed\nnext: step"
        );
    }

    #[test]
    fn repeated_starts_are_scanned_once() {
        let text = "sk-".repeat(200_000) + "AKIA".repeat(200_000).as_str();
        let started = std::time::Instant::now();
        let out = redacted(&text);
        assert_eq!(out, "[REDACTED:provider-secret]");
        // Not a timing assertion on the product: a quadratic scan of 1.4 MB would not end.
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn what_is_still_being_written_is_unsettled() {
        let text = format!("a {ANTHROPIC} b\n{PEM}\nend xoxb-1234567890-abcdefghij .");
        for len in 0..=text.len() {
            let raw = &text.as_bytes()[..len];
            let view = Redactor::shapes_only().view(raw);
            let shown = String::from_utf8_lossy(&view);
            for secret in [&ANTHROPIC[7..15], "b3BlbnNz", "12345678"] {
                assert!(!shown.contains(secret), "prefix {len}: {shown}");
            }
        }
        // A header that is not a key's closes at dashes the next header opens with.
        let stray = "grep -- -----BEGIN x\n-----BEGIN RSA PRIVATE KEY-----\nQWERTYsecret";
        assert_eq!(
            open_pem(stray.as_bytes()),
            stray.find("-----BEGIN RSA").unwrap()
        );
        // An END line never closed does not hide a later one that is.
        let later =
            "-----BEGIN RSA PRIVATE KEY-----\nAB\n-----END x\n-----END RSA PRIVATE KEY-----\n";
        assert_eq!(open_pem(later.as_bytes()), later.len());
    }
}
