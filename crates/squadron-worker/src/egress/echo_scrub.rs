//! An upstream that echoes the value it was given (an error body quoting the key, a debug
//! header) must not carry it into the sandbox: the proxy passes every answer through an
//! `EchoScrub`, which puts `[REDACTED:{credential}]` in the value's place, in headers and in a
//! body that arrives in pieces (a value split across two chunks included). Written here
//! rather than with the task redactor: that one rewrites files at rest, this one holds back
//! only the few bytes that could still become the value.

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use zeroize::Zeroizing;

/// Values shorter than this are scrubbed as they are only: their encodings' stable parts
/// would be a few characters, which occur by chance.
const ENCODED_FORMS_VALUE_BYTES_MIN: usize = 8;

/// Replaces one secret value, and the forms an upstream would echo it in, in a stream of
/// chunks.
pub(super) struct EchoScrub {
    /// The value as it is, then its encodings (`forms`), longest first.
    forms: Vec<Zeroizing<Vec<u8>>>,
    label: Vec<u8>,
    /// The tail of what arrived that could be the start of a form: at most the longest form's
    /// length less one byte.
    held: Zeroizing<Vec<u8>>,
}

/// The value and what an echo of it may look like: JSON-escaped, percent-encoded, and base64
/// (standard and URL-safe) at each of the three offsets it can start at in a longer encoded
/// text — for those, the characters that depend only on the value (the first and last ones
/// mix in the neighbouring bytes). Each distinct, none empty.
fn forms(value: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let mut forms = vec![Zeroizing::new(value.to_vec())];
    if value.len() >= ENCODED_FORMS_VALUE_BYTES_MIN {
        if let Ok(text) = std::str::from_utf8(value) {
            let json = Zeroizing::new(serde_json::to_string(text).unwrap_or_default());
            // Without the quotes around it (only those: the value may end in an escaped one).
            let inner = json
                .get(1..json.len().saturating_sub(1))
                .unwrap_or_default();
            forms.push(Zeroizing::new(inner.as_bytes().to_vec()));
        }
        forms.push(Zeroizing::new(percent_encoded(value, false)));
        forms.push(Zeroizing::new(percent_encoded(value, true)));
        for engine in [
            base64::engine::general_purpose::STANDARD_NO_PAD,
            base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            for offset in 0..3 {
                forms.push(base64_core(&engine, value, offset));
            }
        }
    }
    forms.retain(|f| !f.is_empty());
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    forms.dedup();
    forms
}

/// Every byte outside RFC 3986's unreserved set as `%XX`, in upper- or lower-case hex (the
/// value's own letters as they are).
fn percent_encoded(value: &[u8], upper_hex: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else if upper_hex {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        }
    }
    out
}

/// The base64 characters of `value` that are the same wherever it starts `offset` bytes
/// into a 3-byte group: none that a neighbouring byte reaches into.
fn base64_core(
    engine: &base64::engine::GeneralPurpose,
    value: &[u8],
    offset: usize,
) -> Zeroizing<Vec<u8>> {
    let mut bytes = Zeroizing::new(vec![0u8; offset]);
    bytes.extend_from_slice(value);
    let encoded = Zeroizing::new(engine.encode(&bytes[..]));
    // 4 characters per 3 bytes. The bytes before the value reach into the first 2 (offset 1)
    // or 3 (offset 2) of them; after the last whole group, 1 trailing byte fills 1 character
    // alone and 2 fill 2 (the next one mixes in the byte after the value).
    let shared = [0, 2, 3][offset];
    let rest = bytes.len() % 3;
    let own = (bytes.len() - rest) / 3 * 4 + [0, 1, 2][rest];
    Zeroizing::new(
        encoded
            .as_bytes()
            .get(shared..own)
            .unwrap_or_default()
            .to_vec(),
    )
}

impl EchoScrub {
    /// A scrub of `value` and its encodings, shown as `[REDACTED:{credential}]`. An empty
    /// value scrubs nothing.
    pub(super) fn new(value: &str, credential: &str) -> EchoScrub {
        EchoScrub {
            forms: forms(value.as_bytes()),
            label: format!("[REDACTED:{credential}]").into_bytes(),
            held: Zeroizing::new(Vec::new()),
        }
    }

    /// What of `chunk` (after what was held) can go on now.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.forms.is_empty() {
            return Bytes::copy_from_slice(chunk);
        }
        let mut all = Zeroizing::new(std::mem::take(&mut *self.held));
        all.extend_from_slice(chunk);
        let (mut out, rest) = self.replace_in(&all, true);
        // Hold back the longest tail that is a start of some form; release the rest.
        let keep = (1..=rest.len().min(self.forms[0].len() - 1))
            .rev()
            .find(|n| {
                let tail = &rest[rest.len() - n..];
                self.forms
                    .iter()
                    .any(|f| f.len() > *n && f.starts_with(tail))
            })
            .unwrap_or(0);
        out.extend_from_slice(&rest[..rest.len() - keep]);
        self.held.extend_from_slice(&rest[rest.len() - keep..]);
        out.freeze()
    }

    /// What was held back, at the end of the stream (a form that could have grown into a
    /// longer one, replaced now).
    pub(super) fn finish(&mut self) -> Bytes {
        let held = Zeroizing::new(std::mem::take(&mut *self.held));
        Bytes::from(self.scrub(&held))
    }

    /// `text` with every whole occurrence of a form replaced (a header's, say).
    pub(super) fn scrub(&self, text: &[u8]) -> Vec<u8> {
        let (mut out, rest) = self.replace_in(text, false);
        out.extend_from_slice(rest);
        out.to_vec()
    }

    /// Every whole occurrence of a form replaced, earliest first (the longest form where two
    /// start at one place), up to the tail after the last one. With `more_to_come`, a match
    /// that reaches the end of `text` and is also the start of a longer form (a value ending
    /// in `%` is the start of its percent-encoding) is not replaced yet: the tail from it is
    /// left for the caller to hold, so the longer form's last bytes never go out unscrubbed.
    fn replace_in<'a>(&self, text: &'a [u8], more_to_come: bool) -> (BytesMut, &'a [u8]) {
        let mut out = BytesMut::with_capacity(text.len());
        let mut rest = text;
        loop {
            // `forms` is longest first, so `min_by_key` keeps the longest of equal starts.
            let found = self
                .forms
                .iter()
                .filter_map(|f| memchr::memmem::find(rest, f).map(|at| (at, f.len())))
                .min_by_key(|(at, _)| *at);
            let Some((at, len)) = found else {
                return (out, rest);
            };
            if more_to_come && self.may_grow(&rest[at..], len) {
                out.extend_from_slice(&rest[..at]);
                return (out, &rest[at..]);
            }
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(&self.label);
            rest = &rest[at + len..];
        }
    }

    /// `tail` begins with a form `len` bytes long and is, whole, the start of a longer form.
    fn may_grow(&self, tail: &[u8], len: usize) -> bool {
        self.forms
            .iter()
            .any(|f| f.len() > len && f.len() > tail.len() && f.starts_with(tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(scrub: &mut EchoScrub, chunks: &[&str]) -> String {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&scrub.push(c.as_bytes()));
        }
        out.extend_from_slice(&scrub.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_value_is_replaced_wherever_the_chunks_split_it() {
        let text = "error: key sk-ant-12345 is invalid; sk-ant-12345 again";
        let want = "error: key [REDACTED:cred] is invalid; [REDACTED:cred] again";
        for a in 0..text.len() {
            for b in a..text.len() {
                let mut scrub = EchoScrub::new("sk-ant-12345", "cred");
                let got = through(&mut scrub, &[&text[..a], &text[a..b], &text[b..]]);
                assert_eq!(got, want, "split at {a}, {b}");
            }
        }
    }

    #[test]
    fn what_only_starts_like_the_value_is_held_then_released_unchanged() {
        let mut scrub = EchoScrub::new("secret", "c");
        assert_eq!(&scrub.push(b"data: sec")[..], b"data: ");
        assert_eq!(&scrub.push(b"ond")[..], b"second");
        assert_eq!(&scrub.push(b"x secre")[..], b"x ");
        assert_eq!(&scrub.finish()[..], b"secre");
        let mut empty = EchoScrub::new("", "c");
        assert_eq!(&empty.push(b"anything")[..], b"anything");
    }

    /// The cores of `ABCDEFGH` at each offset: every character the value alone decides (found
    /// in the encodings of the value between random bytes).
    #[test]
    fn a_base64_core_keeps_every_character_the_value_alone_decides() {
        let engine = base64::engine::general_purpose::STANDARD_NO_PAD;
        let cores: Vec<String> = (0..3)
            .map(|o| String::from_utf8(base64_core(&engine, b"ABCDEFGH", o).to_vec()).unwrap())
            .collect();
        assert_eq!(cores, ["QUJDREVGR0", "FCQ0RFRkdI", "BQkNERUZHS"]);
        // A value that ends in a quote keeps its escaped quote in its JSON form.
        let quoted = forms(b"abcdefgh\"");
        assert!(quoted.iter().any(|f| f.as_slice() == b"abcdefgh\\\""));
    }

    /// An upstream that echoes the value encoded — inside a base64 blob at any offset, either
    /// alphabet, percent-encoded in a URL, JSON-escaped — has it replaced too, split across
    /// chunks or not; the text around it is left as it was.
    #[test]
    fn an_encoded_echo_is_replaced_too() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        // `??>>` makes `+` and `/` in base64, so the URL-safe forms differ.
        let value = "sk-ant-api03-??>>AbC/def+GHI=jkl\\\"x";
        let cases: Vec<String> = (0..3)
            .flat_map(|pad| {
                let raw = format!("{}{value} trailing words", "p".repeat(pad));
                [STANDARD.encode(&raw), URL_SAFE.encode(&raw)]
            })
            .chain([
                format!(
                    "https://h/cb?key={}&x=1",
                    percent_encoded(value.as_bytes(), true).escape_ascii()
                ),
                // Lower-case hex, the value's own capitals kept (.NET's `UrlEncode`).
                format!(
                    "https://h/cb?key={}&x=1",
                    percent_encoded(value.as_bytes(), false).escape_ascii()
                ),
                serde_json::json!({ "error": format!("bad key {value}") }).to_string(),
            ])
            .collect();
        for text in cases {
            let scrubbed = EchoScrub::new(value, "c").scrub(text.as_bytes());
            let scrubbed = String::from_utf8(scrubbed).unwrap();
            assert!(scrubbed.contains("[REDACTED:c]"), "{text} -> {scrubbed}");
            for (at, cut) in [(3, 17), (text.len() / 2, text.len() / 2 + 1)] {
                let mut scrub = EchoScrub::new(value, "c");
                let got = through(&mut scrub, &[&text[..at], &text[at..cut], &text[cut..]]);
                assert_eq!(got, scrubbed, "split at {at}, {cut}");
            }
        }
        // Short values are scrubbed only as they are.
        let short = EchoScrub::new("k3y", "c");
        assert_eq!(short.forms.len(), 1);
        let plain = "nothing secret here, just text";
        assert_eq!(
            EchoScrub::new(value, "c").scrub(plain.as_bytes()),
            plain.as_bytes()
        );
    }

    /// A value ending in `%` is, as it is, the start of its percent-encoding (`…%25`): a chunk
    /// that ends right after it must not release the encoding's last bytes unscrubbed.
    #[test]
    fn a_form_that_starts_a_longer_one_waits_for_it() {
        let value = "abcdefg%";
        let percent = "abcdefg%25";
        assert!(forms(value.as_bytes())
            .iter()
            .any(|f| f.as_slice() == percent.as_bytes()));
        for (chunks, want) in [
            (vec!["x ", value, "25 y"], "x [REDACTED:c] y"),
            (vec!["x ", value, "2", "5 y"], "x [REDACTED:c] y"),
            (vec!["x ", value, " y"], "x [REDACTED:c] y"),
            (vec!["x ", value], "x [REDACTED:c]"),
            (vec!["x ", value, "2"], "x [REDACTED:c]2"),
        ] {
            let mut scrub = EchoScrub::new(value, "c");
            assert_eq!(through(&mut scrub, &chunks), want, "{chunks:?}");
        }
    }

    #[test]
    fn a_header_is_scrubbed_whole() {
        let scrub = EchoScrub::new("k3y", "c");
        assert_eq!(scrub.scrub(b"Bearer k3y"), b"Bearer [REDACTED:c]");
        assert_eq!(scrub.scrub(b"Bearer"), b"Bearer");
    }
}
