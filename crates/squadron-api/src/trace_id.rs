//! A request's trace id (W3C Trace Context): one per request, taken from the caller's
//! `traceparent` header or made by the first node to see the request, carried through the
//! forward to the leader, the proposal and its apply, and named in each of their log lines. A
//! worker sends one with each of its reports and logs it beside the report.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The header (and gRPC metadata key) of W3C Trace Context.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Bytes of a version-00 `traceparent` value: `00-` 32 hex `-` 16 hex `-` 2 hex.
pub const TRACEPARENT_BYTES: usize = 55;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

impl TraceId {
    /// A new trace, never the all-zero id the standard calls invalid.
    pub fn random() -> Self {
        let mut bytes: [u8; 16] = rand::random();
        bytes[15] |= 1;
        Self(bytes)
    }

    /// The trace id of a `traceparent` value, or `None` when it is not one: the standard's
    /// answer to a header it cannot read is a new trace, not a refused request. Versions after
    /// 00 may append fields, which are ignored; `ff` is invalid.
    pub fn from_traceparent(value: &str) -> Option<Self> {
        let mut fields = value.split('-');
        let version = fields.next()?;
        let trace = fields.next()?;
        let parent = fields.next()?;
        let flags = fields.next()?;
        let more = fields.next().is_some();
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let known_shape = hex(version, 2)
            && version != "ff"
            && hex(parent, 16)
            && hex(flags, 2)
            && (version != "00" || !more);
        if !known_shape || !hex(trace, 32) {
            return None;
        }
        let id = Self::from_hex(trace)?;
        let zero_parent = parent.bytes().all(|b| b == b'0');
        (id.0 != [0; 16] && !zero_parent).then_some(id)
    }

    /// A `traceparent` value for this trace and a new span of the sender's.
    pub fn traceparent(&self) -> String {
        let span = rand::random::<u64>() | 1;
        format!("00-{self}-{span:016x}-01")
    }

    fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::from_hex(&text)
            .filter(|_| text.len() == 32)
            .ok_or_else(|| serde::de::Error::custom("a trace id is 32 hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_gives_its_trace_id_and_a_new_one_keeps_it() {
        let id = TraceId::from_traceparent(SAMPLE).expect("valid");
        assert_eq!(id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let sent = id.traceparent();
        assert_eq!(sent.len(), TRACEPARENT_BYTES);
        assert_eq!(TraceId::from_traceparent(&sent), Some(id));
        assert_ne!(sent, SAMPLE, "the span is the sender's own");
    }

    #[test]
    fn what_is_not_a_traceparent_is_none() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e47€6-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceId::from_traceparent(bad), None, "{bad:?}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(
            TraceId::from_traceparent(later).is_some(),
            "a later version"
        );
    }

    #[test]
    fn it_travels_as_32_hex_digits() {
        let id = TraceId::random();
        let json = serde_json::to_string(&id).expect("json");
        assert_eq!(json.len(), 34);
        assert_eq!(serde_json::from_str::<TraceId>(&json).expect("back"), id);
        assert!(serde_json::from_str::<TraceId>("\"abc\"").is_err());
    }
}
