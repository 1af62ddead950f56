//! An upstream that echoes the value it was given (an error body quoting the key, a debug
//! header) must not carry it into the sandbox: the proxy passes every answer through an
//! `EchoScrub`, which puts `[REDACTED:{credential}]` in the value's place, in headers and in a
//! body that arrives in pieces (a value split across two chunks included). Written here
//! rather than with the task redactor: that one rewrites files at rest, this one holds back
//! only the few bytes that could still become the value.

use bytes::{Bytes, BytesMut};
use zeroize::Zeroizing;

/// Replaces one secret value in a stream of chunks.
pub(super) struct EchoScrub {
    value: Zeroizing<Vec<u8>>,
    label: Vec<u8>,
    /// The tail of what arrived that could be the start of the value: at most its length
    /// less one byte.
    held: Zeroizing<Vec<u8>>,
}

impl EchoScrub {
    /// A scrub of `value`, shown as `[REDACTED:{credential}]`. An empty value scrubs nothing.
    pub(super) fn new(value: &str, credential: &str) -> EchoScrub {
        EchoScrub {
            value: Zeroizing::new(value.as_bytes().to_vec()),
            label: format!("[REDACTED:{credential}]").into_bytes(),
            held: Zeroizing::new(Vec::new()),
        }
    }

    /// What of `chunk` (after what was held) can go on now.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Bytes {
        if self.value.is_empty() {
            return Bytes::copy_from_slice(chunk);
        }
        let mut all = Zeroizing::new(std::mem::take(&mut *self.held));
        all.extend_from_slice(chunk);
        let (mut out, rest) = self.replace_in(&all);
        // Hold back the longest tail that is a start of the value; release the rest.
        let keep = (1..self.value.len())
            .rev()
            .find(|n| rest.len() >= *n && self.value.starts_with(&rest[rest.len() - n..]))
            .unwrap_or(0);
        out.extend_from_slice(&rest[..rest.len() - keep]);
        self.held.extend_from_slice(&rest[rest.len() - keep..]);
        out.freeze()
    }

    /// What was held back, at the end of the stream.
    pub(super) fn finish(&mut self) -> Bytes {
        Bytes::copy_from_slice(&std::mem::take(&mut *self.held))
    }

    /// `text` with every whole occurrence of the value replaced (a header's, say).
    pub(super) fn scrub(&self, text: &[u8]) -> Vec<u8> {
        if self.value.is_empty() {
            return text.to_vec();
        }
        let (mut out, rest) = self.replace_in(text);
        out.extend_from_slice(rest);
        out.to_vec()
    }

    /// Every whole occurrence replaced, up to the tail after the last one.
    fn replace_in<'a>(&self, text: &'a [u8]) -> (BytesMut, &'a [u8]) {
        let mut out = BytesMut::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = memchr::memmem::find(rest, &self.value) {
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(&self.label);
            rest = &rest[at + self.value.len()..];
        }
        (out, rest)
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

    #[test]
    fn a_header_is_scrubbed_whole() {
        let scrub = EchoScrub::new("k3y", "c");
        assert_eq!(scrub.scrub(b"Bearer k3y"), b"Bearer [REDACTED:c]");
        assert_eq!(scrub.scrub(b"Bearer"), b"Bearer");
    }
}
