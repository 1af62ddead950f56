//! Standard base64 (RFC 4648, with padding), which etcd's JSON gateway uses for keys and
//! values. Small enough to keep here rather than add a dependency.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes bytes as padded standard base64.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let sextet = (n >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(ALPHABET[sextet as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Why a text is not base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    #[error("base64 text length {0} is not a multiple of 4")]
    Length(usize),
    #[error("invalid base64 character {0:?} at offset {1}")]
    Character(char, usize),
}

fn sextet(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes padded standard base64.
pub fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    let bytes = text.as_bytes();
    if bytes.len() % 4 != 0 {
        return Err(Base64Error::Length(bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let quads = bytes.len() / 4;
    for (q, quad) in bytes.chunks(4).enumerate() {
        // Padding only ends the last quad, and is at most two characters.
        let padding = if q + 1 == quads {
            quad.iter().rev().take_while(|&&c| c == b'=').count()
        } else {
            0
        };
        if padding > 2 {
            return Err(Base64Error::Character('=', q * 4 + 4 - padding));
        }
        let mut n = 0u32;
        for (i, &c) in quad.iter().take(4 - padding).enumerate() {
            let v = sextet(c).ok_or(Base64Error::Character(char::from(c), q * 4 + i))?;
            n = (n << 6) | v;
        }
        n <<= 6 * padding as u32;
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..3 - padding]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(encode(plain.as_bytes()), encoded);
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).collect();
        for len in 0..all.len() {
            let text = encode(&all[..len]);
            assert_eq!(decode(&text).unwrap(), &all[..len], "length {len}");
        }
        assert_eq!(encode(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn bad_text_is_refused_with_its_position() {
        assert_eq!(decode("abc"), Err(Base64Error::Length(3)));
        assert_eq!(decode("ab!d"), Err(Base64Error::Character('!', 2)));
        assert_eq!(decode("a==d"), Err(Base64Error::Character('=', 1)));
        assert_eq!(decode("ab=d"), Err(Base64Error::Character('=', 2)));
        assert_eq!(decode("Zg==Zm9v"), Err(Base64Error::Character('=', 2)));
    }
}
