//! The record table in SQLite's dialect, stated once: the SQLite store
//! (`bq_dedupe_stores::SqliteStore`) and the Cloudflare D1 store
//! (`bq_dedupe_workers::d1`) run these statements on the same table format,
//! so a SQLite file's dump run into D1 (or D1's export into a file) keeps its records.
//!
//! One row per key in `bq_dedupe`: `state` 0 is an in-flight claim owned by
//! `token`, 1 is done (`token`: whose commit wrote it, or NULL). `expires_at` is
//! unix ms, NULL for never; a row past it reads as absent. Parameters are
//! numbered (`?1`...), which both rusqlite and D1 bind positionally. Every
//! statement is one atomic step of the record model ([`RULES`]).

use super::ClaimToken;
use super::record::{Record, Rules};

/// How the table's rows follow the record model: a lapsed claim's row stays its
/// owner's until another consumer takes it over; a done row keeps the token of
/// the commit that wrote it.
pub const RULES: Rules = Rules {
    lapsed_claim_kept: true,
    done_keeps_token: true,
    claims_have_owners: true,
    remember_resets_expiry: true,
    lapsed_claim_swept: false,
    claim_given_back: false,
};

/// The table (created if missing).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bq_dedupe (
    key        TEXT PRIMARY KEY,
    state      INTEGER NOT NULL, -- 0 claimed, 1 done
    token      TEXT,             -- the claim's owner (state 0), or whose commit wrote it (state 1)
    expires_at INTEGER           -- unix ms; NULL = never
) WITHOUT ROWID;";

/// The index the sweep of expired rows reads (created with the table).
pub const EXPIRY_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS bq_dedupe_expires_at ON bq_dedupe (expires_at)";

/// A bounded sweep of expired *done* rows (`?1` now, `?2` at most this many):
/// they already read as absent, so removing them changes no answer. Lapsed
/// claims stay (their owner may still renew them, as the rules say).
pub const PURGE_EXPIRED_DONE: &str = "DELETE FROM bq_dedupe WHERE key IN (
    SELECT key FROM bq_dedupe
    WHERE state = 1 AND expires_at IS NOT NULL AND expires_at <= ?1 LIMIT ?2)";

/// A row counts only while `expires_at` is NULL or in the future (`?now` is ms).
pub const SEEN: &str = "SELECT 1 FROM bq_dedupe
    WHERE key = ?1 AND state = 1 AND (expires_at IS NULL OR expires_at > ?2)";

/// Remembering ends any claim: the row becomes `done` whatever it was.
pub const REMEMBER: &str =
    "INSERT INTO bq_dedupe (key, state, token, expires_at) VALUES (?1, 1, NULL, ?2)
    ON CONFLICT(key) DO UPDATE SET state = 1, token = NULL, expires_at = excluded.expires_at";

/// The claim itself, in one statement: insert, or take over a row that has
/// expired (a finished id past its TTL, or a crashed holder's lease). A live row is
/// left alone and the statement changes nothing.
pub const CLAIM: &str = "INSERT INTO bq_dedupe (key, state, token, expires_at) VALUES (?1, 0, ?2, ?3)
    ON CONFLICT(key) DO UPDATE SET state = 0, token = excluded.token, expires_at = excluded.expires_at
    WHERE bq_dedupe.expires_at IS NOT NULL AND bq_dedupe.expires_at <= ?4";

/// The state of a key's row, live or not (after a claim that changed nothing:
/// the row is live, so done or held).
pub const STATE: &str = "SELECT state FROM bq_dedupe WHERE key = ?1";

/// A claim given back by its owner.
pub const RELEASE: &str = "DELETE FROM bq_dedupe WHERE key = ?1 AND state = 0 AND token = ?2";

/// A claim is its token's while the row still carries it (live, or lapsed and not
/// taken over): renewing extends it.
pub const RENEW: &str =
    "UPDATE bq_dedupe SET expires_at = ?3 WHERE key = ?1 AND state = 0 AND token = ?2";

/// The fenced commit, step one: the owner's claim becomes `done`, keeping its
/// token, so the same commit sent again (its reply lost) finds the row done by
/// this token and answers that it was ours.
pub const COMMIT_OWN: &str = "UPDATE bq_dedupe SET state = 1, expires_at = ?3
    WHERE key = ?1 AND token = ?2
      AND (state = 0 OR expires_at IS NULL OR expires_at > ?4)";

/// Step two, when the claim was lost: remember the key only if it is free (no
/// row, or an expired one), never over another consumer's live claim.
pub const COMMIT_IF_FREE: &str =
    "INSERT INTO bq_dedupe (key, state, token, expires_at) VALUES (?1, 1, NULL, ?2)
    ON CONFLICT(key) DO UPDATE SET state = 1, token = NULL, expires_at = excluded.expires_at
    WHERE bq_dedupe.expires_at IS NOT NULL AND bq_dedupe.expires_at <= ?3";

/// The key's row deleted, whatever it holds.
pub const FORGET: &str = "DELETE FROM bq_dedupe WHERE key = ?1";

/// The transactional mode where the store runs a batch of statements in one
/// transaction (D1): first the key's expired row, if any, is cleared...
pub const TX_CLEAR_EXPIRED: &str =
    "DELETE FROM bq_dedupe WHERE key = ?1 AND expires_at IS NOT NULL AND expires_at <= ?2";

/// ...then the key is inserted as done by `?2` (the run's token) with a plain
/// INSERT: a live row (done, or claimed) fails it on the primary key, which
/// aborts the batch and rolls back the handler's statements with it...
pub const TX_INSERT_DONE: &str =
    "INSERT INTO bq_dedupe (key, state, token, expires_at) VALUES (?1, 1, ?2, ?3)";

/// ...or, where the run took a claim (`?4`, its token), the key is marked done
/// by `?2` over that claim in place, or inserted where free (D1 counted 5 rows
/// written per new id with this update, 6 with a delete and an insert)...
pub const TX_DONE_OVER_OWN_CLAIM: &str =
    "INSERT INTO bq_dedupe (key, state, token, expires_at) VALUES (?1, 1, ?2, ?3)
    ON CONFLICT(key) DO UPDATE SET state = 1, token = excluded.token, expires_at = excluded.expires_at
    WHERE bq_dedupe.state = 0 AND bq_dedupe.token = ?4";

/// ...and a live row that upsert left alone (done, or another's claim) fails
/// the batch on the primary key, as [`TX_INSERT_DONE`] would have: a copy of
/// that row's own key is inserted (so nothing is ever written by it). `IS`,
/// not `=`: a row remembered plainly has no token, and `NULL = ?2` let it
/// by (a review)...
pub const TX_REFUSE_OTHERS_ROW: &str = "INSERT INTO bq_dedupe (key, state)
    SELECT key, 1 FROM bq_dedupe WHERE key = ?1 AND NOT (state = 1 AND token IS ?2)";

/// ...and after the handler's statements, the key must still be done by `?2`
/// and live at `?3` (now): a statement that deleted, changed or expired its row
/// would commit the effects with the id unrecorded (run again on every
/// delivery). Otherwise a row with no key fails the batch ([`TX_UNRECORDED`];
/// the table is WITHOUT ROWID, so its key is NOT NULL).
pub const TX_CHECK_RECORDED: &str = "INSERT INTO bq_dedupe (key, state) SELECT NULL, 1
    WHERE NOT EXISTS (SELECT 1 FROM bq_dedupe WHERE key = ?1 AND state = 1 AND token = ?2
                      AND (expires_at IS NULL OR expires_at > ?3))";

/// How SQLite refuses [`TX_CHECK_RECORDED`]'s row.
pub const TX_UNRECORDED: &str = "NOT NULL constraint failed: bq_dedupe.key";

/// A key's live row (`?2` is now): its state (0 claimed, 1 done), token and
/// expiry.
pub const LIVE_ROW: &str = "SELECT state, token, expires_at FROM bq_dedupe
    WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)";

/// A key's [`LIVE_ROW`] (its state, token and expiry in unix ms) as the record
/// model's record; no row: free.
pub fn live_record(row: Option<(i64, Option<String>, Option<u64>)>) -> Record {
    match row {
        None => Record::Free,
        Some((1, token, until)) => Record::Done {
            until,
            by: token.map(ClaimToken),
        },
        Some((_, token, until)) => Record::Claimed {
            token: ClaimToken(token.unwrap_or_default()),
            until,
        },
    }
}
