//! The canonical UUID text form and its 16 bytes, both ways.

/// Parses exactly the canonical lowercase form `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
/// Anything else (upper case, braces, no hyphens) is kept verbatim as text, so two
/// ids that differ only in spelling stay two ids.
pub(super) fn parse_uuid(s: &[u8]) -> Option<[u8; 16]> {
    /// Lowercase hex digit -> value; anything else -> 0xff.
    const HEX: [u8; 256] = {
        let mut t = [0xff; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    /// Where each byte's two hex digits start in the 36-character form.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let s: &[u8; 36] = s.try_into().ok()?;
    if s[8] != b'-' || s[13] != b'-' || s[18] != b'-' || s[23] != b'-' {
        return None;
    }
    let mut out = [0u8; 16];
    let mut bad = 0u8;
    for (byte, &at) in out.iter_mut().zip(&AT) {
        let (hi, lo) = (HEX[s[at] as usize], HEX[s[at + 1] as usize]);
        bad |= hi | lo;
        *byte = (hi << 4) | (lo & 0x0f);
    }
    // 0xff marks a non-hex digit; valid digits never set the high bit.
    (bad & 0x80 == 0).then_some(out)
}

pub(super) fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[(byte >> 4) as usize] as char);
        s.push(HEX[(byte & 15) as usize] as char);
    }
    s
}
