//! Which ids a database can hold as text, by its `server_encoding`. The
//! server converts a bound id from UTF-8 and refuses one its encoding has no
//! character for (22P05), which would fail every call holding it, a whole
//! batch on every redelivery; such an id is stored under its digest instead
//! ([`super::stored`]). An id the encoding holds is stored as itself, as the
//! Go SDK stores it.

use std::collections::HashSet;
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

/// A database's encoding, and (for an [`Holds::Asked`] one) the characters
/// beyond ASCII the server has taken in an id.
#[derive(Debug)]
pub(super) struct Charset {
    holds: Holds,
    taken: Mutex<HashSet<char>>,
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
            taken: Mutex::new(HashSet::new()),
        }
    }

    /// Whether the database holds `key` as text; `None` when only the server
    /// can say (then [`Self::learn`] what it answers). Whether it does
    /// depends on the key alone, so every call names an id alike.
    pub(super) fn holds(&self, key: &str) -> Option<bool> {
        match self.holds {
            Holds::Any => Some(true),
            Holds::Latin1 => Some(key.chars().all(|c| u32::from(c) <= 0xff)),
            Holds::Asked if key.is_ascii() => Some(true),
            Holds::Asked => {
                let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
                let known = key.chars().all(|c| c.is_ascii() || taken.contains(&c));
                known.then_some(true)
            }
        }
    }

    /// What the server answered for `key`: taken, its characters are held
    /// (the conversion is character by character).
    pub(super) fn learn(&self, key: &str, taken: bool) {
        if taken {
            let mut known = self.taken.lock().unwrap_or_else(|e| e.into_inner());
            known.extend(key.chars().filter(|c| !c.is_ascii()));
        }
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
            assert_eq!(utf8.holds(key), Some(true));
            assert_eq!(Charset::of("SQL_ASCII").holds(key), Some(true));
        }
        assert_eq!(latin1.holds("caf\u{e9}\u{ff}"), Some(true));
        assert_eq!(latin1.holds("\u{100}"), Some(false));
        assert_eq!(win.holds("plain"), Some(true));
        assert_eq!(win.holds("\u{43a}\u{43b}"), None);
        win.learn("\u{43a}\u{43b}x", true);
        assert_eq!(win.holds("\u{43b}\u{43a}"), Some(true));
        win.learn("\u{43a}\u{65e5}", false);
        assert_eq!(win.holds("\u{43a}\u{65e5}"), None, "asked again");
    }
}
