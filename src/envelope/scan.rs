//! The fast path: one hand-written pass over the bytes, on every target (natively
//! it beat sonic-rs's SIMD parser driven through serde, 246 against 280 ns an
//! envelope, and it fits the wasm builds). It only ever *accepts*: whenever it
//! cannot show that the reference decoder (serde_json over `view.rs`)
//! would accept the same text with the same fields, it answers `None` and the
//! reference decides, with its own typed rejection. What it leaves to the reference:
//!
//! - any backslash (a string with an escape; anywhere else it is no JSON), so
//!   every string is borrowed verbatim, and
//!   a string holding a control character (U+0000 to U+001F);
//! - containers deeper than [`FAST_DEPTH`];
//! - numbers that are not JSON's grammar, and any whose magnitude might not fit an
//!   `f64` (over 300 integer digits whatever the exponent, or an exponent that could
//!   take it past 1e300),
//!   which serde_json rejects as out of range; the rest it checks without
//!   converting them, which is where it saves the most;
//! - anything after the envelope but whitespace, and every validation failure.
//!
//! Duplicate keys: the last one wins (a later `meta` replaces an earlier one whole).
//! The syntax is serde_json's: whitespace is space, tab, CR and LF only; no trailing
//! commas, no leading zeros, no `NaN`. `tests/decode_fast.rs` and the `decode` fuzz
//! target check it against the reference on every input.

use super::Message;
use super::accept::{FAST_DEPTH, Field, Meta, View};

/// `Some` when the scanner accepts `text` as a valid envelope; `None` means "ask
/// the reference decoder" (never "invalid").
pub(super) fn parse(text: &str) -> Option<Message<'_>> {
    let mut scanner = Scanner { text, at: 0 };
    let mut view = View::default();
    scanner.envelope(&mut view)?;
    scanner.skip_whitespace();
    if scanner.at != text.len() {
        return None;
    }
    view.into_message(text)
}

/// The largest decimal magnitude (digits before the point plus the exponent)
/// accepted without converting the number: far inside `f64`'s 1.8e308.
const MAX_MAGNITUDE: usize = 300;

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The next byte after any whitespace, consumed.
    #[inline]
    fn next_token(&mut self) -> Option<u8> {
        self.skip_whitespace();
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    #[inline]
    fn expect(&mut self, wanted: u8) -> Option<()> {
        (self.next_token()? == wanted).then_some(())
    }

    /// The envelope: the top-level object, its fields read into `view`.
    fn envelope(&mut self, view: &mut View<'a>) -> Option<()> {
        self.expect(b'{')?;
        let mut first = true;
        while let Some(key) = self.next_key(&mut first)? {
            match key {
                "job" => view.job = self.value(2)?,
                "urn" => view.urn = self.value(2)?,
                "trace_id" => view.trace_id = self.value(2)?,
                "attempts" => view.attempts = self.value(2)?,
                "data" => {
                    self.skip_whitespace();
                    view.data_is_object = self.peek() == Some(b'{');
                    self.value(2)?;
                }
                "meta" => view.meta = self.meta()?,
                _ => {
                    self.value(2)?;
                }
            }
        }
        Some(())
    }

    /// `meta`: its id and schema version when it is an object; a `meta` that is
    /// not an object is walked and left `is_object: false`.
    fn meta(&mut self) -> Option<Meta<'a>> {
        let mut meta = Meta::default();
        self.skip_whitespace();
        if self.peek() != Some(b'{') {
            self.value(2)?;
            return Some(meta);
        }
        self.at += 1;
        meta.is_object = true;
        let mut first = true;
        while let Some(key) = self.next_key(&mut first)? {
            match key {
                "id" => meta.id = self.value(3)?,
                "schema_version" => meta.schema_version = self.value(3)?,
                _ => {
                    self.value(3)?;
                }
            }
        }
        Some(meta)
    }

    /// Inside an object (after its `{`, or after a member's value): the next key,
    /// its colon consumed, or `None` once the closing `}` is consumed.
    fn next_key(&mut self, first: &mut bool) -> Option<Option<&'a str>> {
        let mut token = self.next_token()?;
        if std::mem::take(first) {
            if token == b'}' {
                return Some(None); // an empty object
            }
        } else {
            match token {
                b',' => token = self.next_token()?,
                b'}' => return Some(None),
                _ => return None,
            }
        }
        if token != b'"' {
            return None;
        }
        let key = self.string()?;
        self.expect(b':')?;
        Some(Some(key))
    }

    /// An array's elements after its `[`, up to and including its `]`.
    fn elements(&mut self, level: usize) -> Option<()> {
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            self.value(level)?;
            match self.next_token()? {
                b',' => {}
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// Any value; a container here would sit at nesting `level` (the envelope is
    /// level 1) and is walked, not kept.
    fn value(&mut self, level: usize) -> Option<Field<'a>> {
        match self.next_token()? {
            b'"' => self.string().map(Field::Str),
            b'{' if level <= FAST_DEPTH => {
                let mut first = true;
                while self.next_key(&mut first)?.is_some() {
                    self.value(level + 1)?;
                }
                Some(Field::Other)
            }
            b'[' if level <= FAST_DEPTH => {
                self.elements(level + 1)?;
                Some(Field::Other)
            }
            b't' => self.literal(b"rue", Field::Other),
            b'f' => self.literal(b"alse", Field::Other),
            b'n' => self.literal(b"ull", Field::Null),
            b'-' | b'0'..=b'9' => {
                self.at -= 1;
                self.number()
            }
            _ => None,
        }
    }

    fn literal(&mut self, rest: &[u8], field: Field<'a>) -> Option<Field<'a>> {
        let end = self.at + rest.len();
        (self.text.as_bytes().get(self.at..end)? == rest).then(|| {
            self.at = end;
            field
        })
    }

    /// A string's text after its opening quote, the closing quote consumed; one
    /// with an escape (a backslash) is the reference's, so the text is the value.
    #[inline(never)]
    fn string(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut at = start + special_in_words(&bytes[start..]);
        loop {
            match *bytes.get(at)? {
                b'"' => break,
                0..=0x1f | b'\\' => return None,
                _ => at += 1,
            }
        }
        self.at = at + 1;
        // Both ends sit beside an ASCII quote, so on character boundaries.
        self.text.get(start..at)
    }

    /// A number, checked against JSON's grammar; a non-negative integer of at most
    /// 19 digits is read (`attempts`, `schema_version`), anything else is `Other`
    /// (and a longer integer where a count is due goes to the reference).
    #[inline(never)]
    fn number(&mut self) -> Option<Field<'a>> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let integer = self.at;
        let value = match self.peek()? {
            b'0' => {
                self.at += 1;
                Some(0)
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        let mut magnitude = self.at - integer;
        let mut plain = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
            plain = false;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            let raises = match self.peek() {
                Some(b'-') => {
                    self.at += 1;
                    false
                }
                Some(b'+') => {
                    self.at += 1;
                    true
                }
                _ => true,
            };
            let start = self.at;
            let exponent = self.some_digits()?;
            // A long exponent is the reference's (it may be out of range).
            if self.at - start > 3 {
                return None;
            }
            let exponent = exponent? as usize;
            // Scaled down it is no larger than its integer part; a long negative
            // exponent stays the reference's too, as cautious as a positive one.
            magnitude = match raises {
                true => magnitude + exponent,
                false => magnitude.max(exponent),
            };
            plain = false;
        }
        if magnitude > MAX_MAGNITUDE {
            return None;
        }
        Some(match (plain && !negative, value) {
            (true, Some(n)) => Field::Unsigned(n),
            _ => Field::Other,
        })
    }

    /// Digits, read as a `u64` when there are at most 19 (so they fit; a longer
    /// count is left to the reference, which accepts it where it fits).
    #[inline]
    fn digits(&mut self) -> Option<u64> {
        let start = self.at;
        let mut value = 0u64;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            self.at += 1;
        }
        (self.at - start <= 19).then_some(value)
    }

    /// At least one digit (`None` when there is none); the inner `Option` is
    /// [`Self::digits`]'s value.
    fn some_digits(&mut self) -> Option<Option<u64>> {
        let start = self.at;
        let value = self.digits();
        (self.at > start).then_some(value)
    }
}

/// How many leading bytes of `bytes` hold no quote, backslash or control
/// character, eight at a time (a lower bound: the byte loop after it finishes the job). A
/// string body is mostly such bytes; this is where a long id or payload string
/// goes by without a branch per byte.
#[inline]
fn special_in_words(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const SPACES: u64 = u64::from_ne_bytes([0x20; 8]);
    let mut done = 0;
    for word in bytes.chunks_exact(8) {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let (quote, backslash) = (word ^ QUOTES, word ^ BACKSLASHES);
        // A byte is flagged when it is zero after an xor (a quote, a backslash) or
        // below 0x20 (a control character); the lowest flagged byte is always a
        // real one.
        let flagged = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | word.wrapping_sub(SPACES) & !word)
            & HIGHS;
        if flagged != 0 {
            return done + (flagged.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::{parse, special_in_words};
    use crate::envelope::accept::FAST_DEPTH;
    use crate::envelope::{Limits, Message};

    const BASE: &str = r#"{"job":"urn:babel:orders:shipped","trace_id":"f10f5e1a-01ba-4956-9582-8a4511ed9ff8","data":{"order_id":1000000,"amount":143.18,"currency":"CHF","customer":"cus_915221"},"meta":{"id":"60a7c782-d326-426c-876e-7fc44dd0bb78","queue":"fulfilment","lang":"node","schema_version":1,"created_at":1749132727031},"attempts":0}"#;

    /// The scanner's answer, checked against the reference's where it accepts.
    fn scanned(raw: &str) -> bool {
        let Some(msg) = parse(raw) else { return false };
        let reference = Message::parse_reference(raw.as_bytes(), &Limits::default())
            .unwrap_or_else(|e| {
                panic!("the scanner accepted what the reference rejects ({e}): {raw}")
            });
        assert_eq!(
            (msg.id(), msg.job(), msg.trace_id(), msg.attempts()),
            (
                reference.id(),
                reference.job(),
                reference.trace_id(),
                reference.attempts()
            )
        );
        true
    }

    #[test]
    fn typical_envelopes_are_scanned() {
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(BASE).unwrap())
                .unwrap();
        let accepted = [
            BASE.to_owned(),
            pretty,
            format!(" \t\r\n{BASE}\n"),
            BASE.replace(r#""job":"#, r#""urn":"#),
            BASE.replace(r#","attempts":0"#, ""),
            BASE.replace(r#""attempts":0"#, r#""attempts":9999999999999999999"#),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "null"),
            BASE.replace(r#""id":"60a7c782-d326-426c-876e-7fc44dd0bb78","#, ""),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, r#""""#),
            BASE.replace("143.18", "-0.5e-300"),
            BASE.replace("143.18", "1E+299"),
            BASE.replace("143.18", r#"[true,false,null,{},[],{"a":[]},"",-0]"#),
            BASE.replace("CHF", "Fr. \u{e9}\u{1f600}\u{7f}"),
            BASE.replace(r#""lang":"node""#, r#""id":"first","lang":"node""#),
        ];
        for raw in &accepted {
            assert!(scanned(raw), "not scanned: {raw}");
        }
        // Duplicate keys: the last one wins, a later meta replacing all of one.
        let twice = BASE.replace(r#""attempts":0"#, r#""attempts":0,"attempts":3"#);
        assert_eq!(parse(&twice).map(|m| m.attempts()), Some(3));
        let metas = BASE.replace(r#""attempts":0"#, r#""meta":{"schema_version":1}"#);
        assert_eq!(parse(&metas).map(|m| m.id().is_none()), Some(true));
    }

    #[test]
    fn everything_in_doubt_goes_to_the_reference() {
        let declined = [
            BASE.replace("60a7c782", r"\u0036a7c782"),
            BASE.replace("CHF", "C\nHF"),
            BASE.replace("CHF", "C\u{1f}HF"),
            BASE.replace("143.18", "1e400"),
            BASE.replace("143.18", "1e301"),
            BASE.replace("143.18", "0e1000"),
            BASE.replace("143.18", &"9".repeat(301)),
            BASE.replace("143.18", &format!("1{}e-1", "0".repeat(400))),
            BASE.replace("143.18", "01"),
            BASE.replace("143.18", "1."),
            BASE.replace("143.18", ".5"),
            BASE.replace("143.18", "-"),
            BASE.replace("143.18", "+1"),
            BASE.replace("143.18", "1e"),
            BASE.replace("143.18", "NaN"),
            BASE.replace("143.18", "tru"),
            BASE.replace("143.18", "nulll"),
            BASE.replace("143.18", "[1,]"),
            BASE.replace(r#""CHF","#, r#""CHF",}"#)
                .replace("\"customer\":\"cus_915221\"}", "}"),
            BASE.replace(r#""attempts":0"#, r#""attempts":-1"#),
            BASE.replace(r#""attempts":0"#, r#""attempts":1.0"#),
            BASE.replace(r#""attempts":0"#, r#""attempts":18446744073709551615"#),
            BASE.replace(r#""attempts":0"#, r#""attempts":18446744073709551616"#),
            BASE.replace(r#""schema_version":1"#, r#""schema_version":2"#),
            BASE.replace(r#""60a7c782-d326-426c-876e-7fc44dd0bb78""#, "7"),
            BASE.replace(r#""job":"urn:babel:orders:shipped""#, r#""job":" ""#),
            BASE.replace(r#""data":{"#, r#""data":[{"#)
                .replace(r#""cus_915221"}"#, r#""cus_915221"}]"#),
            BASE.replace(r#""meta":{"#, r#""meta":[{"#)
                .replace("1749132727031}", "1749132727031}]"),
            format!("{BASE}x"),
            format!("{BASE},"),
            format!("\u{feff}{BASE}"),
            format!("\u{c}{BASE}"),
            format!("[{BASE}]"),
            BASE[..BASE.len() - 1].to_owned(),
            String::new(),
        ];
        for raw in &declined {
            assert!(!scanned(raw), "decided by the scanner: {raw}");
        }
    }

    #[test]
    fn the_scanner_follows_containers_to_the_fast_depth_only() {
        let at = |levels: usize| {
            let inner = format!("{}1{}", "[".repeat(levels - 2), "]".repeat(levels - 2));
            BASE.replace("143.18", &inner)
        };
        assert!(scanned(&at(FAST_DEPTH)));
        assert!(!scanned(&at(FAST_DEPTH + 1)));
        let objects = |levels: usize| {
            let inner = format!(
                "{}1{}",
                r#"{"a":"#.repeat(levels - 2),
                "}".repeat(levels - 2)
            );
            BASE.replace("143.18", &inner)
        };
        assert!(scanned(&objects(FAST_DEPTH)));
        assert!(!scanned(&objects(FAST_DEPTH + 1)));
    }

    #[test]
    fn any_backslash_goes_to_the_reference() {
        let declined = [
            BASE.replace("cus_915221", r"cus_\u0041"),
            BASE.replace("cus_915221", r"cus_\\"),
            BASE.replace("cus_915221", r"cus_915221_long_enough_for_a_word\\"),
            BASE.replace(r#""currency""#, r#""curr\u0065ncy""#),
            BASE.replace(r#","attempts""#, r#",\"attempts""#),
            BASE.replace("143.18", r"143.18\"),
        ];
        for raw in &declined {
            assert!(!scanned(raw), "decided by the scanner: {raw}");
        }
    }

    #[test]
    fn words_stop_at_the_first_quote_backslash_or_control_character() {
        for len in 0..24 {
            for special in [b'"', b'\\', 0u8, 0x1f] {
                for at in 0..len {
                    let mut text = vec![b'a'; len];
                    text[at] = special;
                    // Bytes past the special one may not hide it.
                    for (i, byte) in text.iter_mut().enumerate().skip(at + 1) {
                        *byte = [0x20, 0xff, b'"', 0x80][i % 4];
                    }
                    let found = special_in_words(&text);
                    assert!(
                        found <= at && found / 8 * 8 == found || found == at,
                        "{text:?}"
                    );
                    assert!(
                        !text[..found]
                            .iter()
                            .any(|&b| b == b'"' || b == b'\\' || b < 0x20)
                    );
                }
            }
            let plain = vec![b'z'; len];
            assert_eq!(special_in_words(&plain), len / 8 * 8);
        }
        // The bytes around the limits are not flagged.
        assert_eq!(
            special_in_words(&[0x20, 0x21, 0x23, 0x7f, 0x80, 0xff, b'a', b'~']),
            8
        );
    }
}
