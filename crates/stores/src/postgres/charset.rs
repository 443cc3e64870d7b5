//! Which ids a database can hold as text, by its `server_encoding`. The
//! server converts a bound id from UTF-8 and refuses one its encoding has no
//! character for (22P05), which would fail every call holding it, a whole
//! batch on every redelivery; such an id is stored under its digest instead
//! ([`super::stored`]). An id the encoding holds is stored as itself, as the
//! Go SDK stores it.

use std::collections::HashMap;
use std::sync::Mutex;

/// What the encoding holds, as far as known here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// UTF8, or SQL_ASCII (bytes kept as sent).
    Any,
    /// LATIN1: up to U+00FF, each one byte.
    Latin1,
    /// Another encoding: ASCII, and beyond it what the server is asked.
    Asked,
}

/// A database's encoding, and (for an [`Holds::Asked`] one) what the server
/// answered for each character beyond ASCII it was asked about, alone (not in
/// an id: EUC_JIS_2004 takes `か` + U+309A as one character and refuses
/// U+309A alone, so an id it took says nothing of each of its characters).
///
/// For each: how many bytes it is there, or `None`, not held as itself
/// (refused, or not given back the same: EUC_TW keeps some it cannot send
/// back, EUC_JP turns U+00A6 and U+FFE4 into the same bytes).
#[derive(Debug)]
pub(super) struct Charset {
    holds: Holds,
    answered: Mutex<HashMap<char, Option<usize>>>,
}

impl Charset {
    /// For a database whose `server_encoding` is `encoding`.
    pub(super) fn of(encoding: &str) -> Self {
        let holds = match encoding {
            "UTF8" | "SQL_ASCII" => Holds::Any,
            "LATIN1" => Holds::Latin1,
            _ => Holds::Asked,
        };
        Charset {
            holds,
            answered: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the database holds `key` as itself, and in how many bytes
    /// (its index has a limit): from each of its characters, alone (so it
    /// depends on the key alone, and every call names an id alike). `Err`
    /// with the characters only the server can tell of (then
    /// [`Self::learn`] what it answers for each).
    pub(super) fn holds(&self, key: &str) -> Result<Option<usize>, Vec<char>> {
        match self.holds {
            Holds::Any => Ok(Some(key.len())),
            Holds::Latin1 => Ok(key
                .chars()
                .all(|c| u32::from(c) <= 0xff)
                .then(|| key.chars().count())),
            Holds::Asked if key.is_ascii() => Ok(Some(key.len())),
            Holds::Asked => {
                let answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
                let (mut unknown, mut bytes) = (Vec::new(), 0);
                for c in key.chars() {
                    match (c.is_ascii(), answered.get(&c)) {
                        (true, _) => bytes += 1,
                        (false, Some(None)) => return Ok(None),
                        (false, Some(Some(n))) => bytes += n,
                        (false, None) if unknown.contains(&c) => {}
                        (false, None) => unknown.push(c),
                    }
                }
                match unknown.is_empty() {
                    true => Ok(Some(bytes)),
                    false => Err(unknown),
                }
            }
        }
    }

    /// What the server answered for the character `c`, alone: its bytes in
    /// the database, or `None` (not held as itself).
    pub(super) fn learn(&self, c: char, held: Option<usize>) {
        let mut answered = self.answered.lock().unwrap_or_else(|e| e.into_inner());
        answered.insert(c, held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_encoding_holds_without_asking() {
        let (utf8, latin1, win) = (
            Charset::of("UTF8"),
            Charset::of("LATIN1"),
            Charset::of("WIN1251"),
        );
        for key in ["a", "caf\u{e9}", "\u{65e5}"] {
            assert_eq!(utf8.holds(key), Ok(Some(key.len())));
            assert_eq!(Charset::of("SQL_ASCII").holds(key), Ok(Some(key.len())));
        }
        assert_eq!(latin1.holds("caf\u{e9}\u{ff}"), Ok(Some(5)));
        assert_eq!(latin1.holds("\u{100}"), Ok(None));
        assert_eq!(win.holds("plain"), Ok(Some(5)));
        assert_eq!(
            win.holds("\u{43a}\u{43b}\u{43a}"),
            Err(vec!['\u{43a}', '\u{43b}'])
        );
        win.learn('\u{43a}', Some(1));
        assert_eq!(win.holds("\u{43b}\u{43a}"), Err(vec!['\u{43b}']));
        win.learn('\u{43b}', Some(4));
        assert_eq!(win.holds("\u{43b}\u{43a}x"), Ok(Some(6)));
        win.learn('\u{65e5}', None);
        assert_eq!(
            win.holds("\u{43a}\u{65e5}\u{1f600}"),
            Ok(None),
            "one refused is enough"
        );
    }
}
