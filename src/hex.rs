//! Lowercase hexadecimal: the one spelling of digests, ownership tokens and random names in a
//! state dir. Only lowercase is accepted when reading, so one value has one spelling (a blob's
//! file name, a token in a record) and two spellings never name the same thing.

use std::fmt;

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex digits, two per byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// Writes `bytes` as lowercase hex digits (for `Display` without an allocation): a chunk at a
/// time through a buffer on the stack, one `write_str` per chunk (a formatted write per byte
/// was a tenth of the checkpoint model's time, which spells a blob name per file per step).
pub fn write(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(buf.len() / 2) {
        for (pair, b) in buf.chunks_exact_mut(2).zip(chunk) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        let text = std::str::from_utf8(&buf[..2 * chunk.len()]).map_err(|_| fmt::Error)?;
        f.write_str(text)?;
    }
    Ok(())
}

/// Exactly `2 * N` lowercase hex digits as `N` bytes; `None` for any other text (uppercase
/// included).
pub fn decode<const N: usize>(s: &str) -> Option<[u8; N]> {
    let digits = s.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (value(pair[0])? << 4) | value(pair[1])?;
    }
    Some(out)
}

fn value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_spellings() {
        let bytes = [0x00, 0x01, 0x7f, 0x80, 0xab, 0xff];
        let s = encode(&bytes);
        assert_eq!(s, "00017f80abff");
        // `write` (Display) spells the same, also across its 32-byte chunks.
        struct Hex<'a>(&'a [u8]);
        impl fmt::Display for Hex<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write(f, self.0)
            }
        }
        let long: Vec<u8> = (0..=255).collect();
        for n in [0, 1, 6, 31, 32, 33, 64, 256] {
            assert_eq!(Hex(&long[..n]).to_string(), encode(&long[..n]));
        }
        assert_eq!(Hex(&bytes).to_string(), s);
        assert_eq!(decode::<6>(&s), Some(bytes));
        assert_eq!(
            decode::<6>("00017F80ABFF"),
            None,
            "uppercase is another spelling"
        );
        assert_eq!(decode::<6>("00017f80abf"), None, "odd length");
        assert_eq!(decode::<5>(&s), None, "wrong length");
        assert_eq!(decode::<1>("g0"), None);
        assert_eq!(decode::<1>("é"), None, "non-ASCII");
        struct Shown<'a>(&'a [u8]);
        impl fmt::Display for Shown<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write(f, self.0)
            }
        }
        assert_eq!(Shown(&bytes).to_string(), s);
    }
}
