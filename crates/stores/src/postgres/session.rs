//! A pooled PostgreSQL connection and the statements prepared on it. Each of
//! the store's statements is parsed and planned once per connection, as the Go
//! SDK's pgx does, instead of on every call: same round trips, but the server
//! no longer plans the settle statement's six parts for every delivery. The
//! lookups of many keys are prepared afresh now and then
//! ([`Session::query_replanned`]).
//!
//! Planned once, on request (`statement_cache=generic`): left to itself the
//! server plans a prepared statement again on every call while it judges a plan
//! for the given values cheaper than one for any values, which it does for ours
//! (arrays of unknown length). With `generic` the store's own calls run with
//! `plan_cache_mode = force_generic_plan`: on loopback a batch of 100 seen-set
//! deliveries 2.7x the throughput, a duplicate one at a time 1.4x. Not the default:
//! a pooler in transaction mode would carry the session setting to other
//! clients, and a plan made while the claims table was small stays until its
//! statistics change (autovacuum's analyze). A handler's transaction gets the
//! connection's own setting back first: its statements are the user's.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::{
    Client, GenericClient, Row, SimpleQueryMessage, SimpleQueryRow, Statement, Transaction,
};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::r2d2::ManageConnection;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::StatementCache;

/// A statement's parameters with their types (`query_typed`'s shape).
pub(super) type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// The pool's connections: a client and its prepared statements.
pub(super) struct Manager {
    pub manager: std::sync::Arc<PostgresConnectionManager<MakeRustlsConnect>>,
    /// The URL's `statement_cache`.
    pub cache: StatementCache,
    /// This pool's part of its `PREPARE`d statements' names ([`Named`]).
    pub salt: String,
}

impl ManageConnection for Manager {
    type Connection = Session;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Session, postgres::Error> {
        Ok(Session {
            client: self.manager.connect()?,
            prepared: Prepared {
                statements: HashMap::new(),
                enabled: self.cache != StatementCache::Off,
                retired: false,
            },
            named: Named::new(self.salt.clone()),
            plans: match self.cache {
                StatementCache::Generic => Plans::Own,
                StatementCache::On | StatementCache::Off => Plans::LeftAlone,
            },
            aborted: false,
        })
    }

    fn is_valid(&self, session: &mut Session) -> Result<(), postgres::Error> {
        self.manager.is_valid(&mut session.client)
    }

    fn has_broken(&self, session: &mut Session) -> bool {
        session.aborted || session.prepared.retired || self.manager.has_broken(&mut session.client)
    }
}

/// One connection of the pool.
pub(super) struct Session {
    client: Client,
    prepared: Prepared,
    /// The statements prepared with SQL's `PREPARE` ([`Session::query_together`]).
    named: Named,
    /// The `plan_cache_mode` the session runs with now.
    plans: Plans,
    /// A failed transaction could not be rolled back: the pool drops the
    /// connection rather than lend it out inside an aborted transaction.
    aborted: bool,
}

/// A session's `plan_cache_mode`, as the store last set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plans {
    /// The connection's own (the URL's `options`, the role's, the server's),
    /// which the store's own calls switch to `force_generic_plan`.
    Own,
    /// `force_generic_plan`, for the store's own calls.
    Generic,
    /// The connection's own, left alone: `statement_cache` is not `generic`,
    /// or the server has no such setting (before PostgreSQL 12).
    LeftAlone,
}

impl Session {
    pub(super) fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Runs `sql`, prepared on this connection the first time.
    pub(super) fn query(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        self.query_prepared(sql, params, None)
    }

    /// The store's own calls with `force_generic_plan` where the URL asked for
    /// it (set once, again after a handler's transaction).
    fn plan_as_asked(&mut self) -> Result<(), postgres::Error> {
        if self.plans == Plans::Own {
            self.plans = match self
                .client
                .batch_execute("SET plan_cache_mode = force_generic_plan")
            {
                Ok(()) => Plans::Generic,
                // 42704: no such setting; the calls run as before.
                Err(e) if e.code().is_some_and(|c| c.code() == "42704") => Plans::LeftAlone,
                Err(e) => return Err(e),
            };
        }
        Ok(())
    }

    /// A lookup of many keys: prepared afresh after [`REPLAN_AFTER`] (10 s or
    /// 500 calls). The plan the server keeps for a prepared statement after five calls is
    /// made with the table as it was then: one made while the table was tiny
    /// scans all of it once it has grown, until autovacuum analyzes it again
    /// (2.5-3.3 ms a statement at 3,000 rows, where the key's index takes µs).
    /// Prepared afresh, it is planned for the table as it is now, for one more
    /// round trip now and then (planning it for every call, sent unnamed, cost
    /// a third of a duplicate batch's throughput on loopback).
    pub(super) fn query_replanned(
        &mut self,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        self.query_prepared(sql, params, Some(REPLAN_AFTER))
    }

    /// A store call in the plan mode the URL asked for, prepared afresh after
    /// `limit` ([`Prepared::query_within`]).
    fn query_prepared(
        &mut self,
        sql: &str,
        params: &Params<'_>,
        limit: Option<(Duration, u32)>,
    ) -> Result<Vec<Row>, postgres::Error> {
        self.plan_as_asked()?;
        self.prepared
            .query_within(&mut self.client, sql, params, limit)
    }

    /// Statements sent as one simple query, one round trip, each in a
    /// transaction of its own (`BEGIN ISOLATION LEVEL READ COMMITTED` ...
    /// `COMMIT`): each commits before the next one's snapshot is taken, as if
    /// sent one after another. (In one implicit transaction instead, a plain
    /// remember could start between the two and miss the uncommitted claim:
    /// the history checker found its renewal answered "still ours" after the
    /// remember, once in a few hundred runs.) After a failure the aborted
    /// transaction is rolled back, and those before it stay committed.
    /// Answers each statement's rows, as text. Each statement is prepared on
    /// the connection with SQL's `PREPARE` (a round trip of its own, the first
    /// time and after [`REPLAN_AFTER`]) and sent as `EXECUTE` with its values;
    /// with `statement_cache=off` the values are written into its text, parsed
    /// and planned on every call.
    pub(super) fn query_together(
        &mut self,
        statements: &[Bound<'_>],
    ) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
        self.plan_as_asked()?;
        let mut sql = String::new();
        for statement in statements {
            sql.push_str("BEGIN ISOLATION LEVEL READ COMMITTED;\n");
            if self.prepared.enabled && !self.named.gone {
                let name = self.named.name_of(&mut self.client, statement)?;
                let _ = write!(sql, "EXECUTE {name}({})", statement.values.join(", "));
            } else {
                sql.push_str(&statement.inline());
            }
            sql.push_str(";\nCOMMIT;\n");
        }
        let messages = match self.client.simple_query(&sql) {
            Ok(messages) => messages,
            Err(e) => {
                if is_stale(&e) {
                    self.named.statements.clear();
                    self.named.gone |= e.code().is_some_and(|c| c.code() == "26000");
                }
                // The rest of the text was skipped; the failed transaction is
                // still open (a connection gone with it is dropped by the pool).
                if !self.client.is_closed() {
                    self.aborted |= self.client.batch_execute("ROLLBACK").is_err();
                }
                return Err(e);
            }
        };
        let (mut answers, mut rows) = (Vec::new(), Vec::new());
        for message in messages {
            match message {
                SimpleQueryMessage::Row(row) => rows.push(row),
                SimpleQueryMessage::CommandComplete(_) => answers.push(std::mem::take(&mut rows)),
                _ => {}
            }
        }
        // BEGIN, the statement, COMMIT: each statement's is the second of three.
        Ok(answers.into_iter().skip(1).step_by(3).collect())
    }

    /// A transaction, and the statements prepared on its connection; the
    /// connection's own `plan_cache_mode` first, for the handler's statements.
    pub(super) fn transaction(
        &mut self,
    ) -> Result<(Transaction<'_>, &mut Prepared), postgres::Error> {
        if self.plans == Plans::Generic {
            self.client.batch_execute("RESET plan_cache_mode")?;
            self.plans = Plans::Own;
        }
        Ok((self.client.transaction()?, &mut self.prepared))
    }
}

/// How long, and for how many calls, a lookup of many keys runs on one
/// preparation ([`Session::query_replanned`]), whichever ends first.
const REPLAN_AFTER: (Duration, u32) = (Duration::from_secs(10), 500);

/// The statements prepared on one connection, by their text, with the calls
/// each has run. A statement prepared inside a transaction outlives it:
/// PostgreSQL's prepared statements belong to the session, whatever the
/// transaction does.
pub(super) struct Prepared {
    statements: HashMap<String, Preparation>,
    enabled: bool,
    /// Set by [`Prepared::retire`]: the pool drops the connection.
    retired: bool,
}

/// A statement prepared on the connection (the client's handle, or its name
/// in SQL): when, and how many calls it ran.
struct Preparation<S = Statement> {
    statement: S,
    at: Instant,
    calls: u32,
}

impl<S: Clone> Preparation<S> {
    /// Prepared just now, for its first call.
    fn new(statement: S) -> Self {
        Preparation {
            statement,
            at: Instant::now(),
            calls: 1,
        }
    }

    /// The statement for one more call, if the preparation is younger than
    /// `limit`'s age and has run fewer than its calls (no limit: always);
    /// `None` when it is due to be prepared afresh.
    fn call_within(&mut self, limit: Option<(Duration, u32)>) -> Option<S> {
        let fresh = limit.is_none_or(|(age, calls)| self.calls < calls && self.at.elapsed() < age);
        fresh.then(|| {
            self.calls = self.calls.saturating_add(1);
            self.statement.clone()
        })
    }
}

impl Prepared {
    /// The session is no longer as the store left it (a handler ended the
    /// store's transaction itself, committing whatever it `SET`): the pool
    /// drops the connection instead of lending it out again.
    pub(super) fn retire(&mut self) {
        self.retired = true;
    }

    /// Runs `sql` on `client`, preparing it first if this connection has not.
    /// A statement the server no longer has (someone ran `DEALLOCATE ALL` or
    /// `DISCARD ALL` on the connection), or whose cached plan a schema change
    /// broke, empties the cache: the call fails and the next one prepares
    /// afresh ([`is_stale`]).
    pub(super) fn query(
        &mut self,
        client: &mut impl GenericClient,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        self.query_within(client, sql, params, None)
    }

    /// [`Prepared::query`], preparing `sql` afresh once its preparation is
    /// `limit`'s age or has run its number of calls (the old one is closed
    /// when dropped).
    pub(super) fn query_within(
        &mut self,
        client: &mut impl GenericClient,
        sql: &str,
        params: &Params<'_>,
        limit: Option<(Duration, u32)>,
    ) -> Result<Vec<Row>, postgres::Error> {
        if !self.enabled {
            return client.query_typed(sql, params);
        }
        let statement = match self
            .statements
            .get_mut(sql)
            .and_then(|p| p.call_within(limit))
        {
            Some(statement) => statement,
            None => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = client.prepare_typed(sql, &types)?;
                let prepared = Preparation::new(statement.clone());
                self.statements.insert(sql.to_owned(), prepared);
                statement
            }
        };
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        client.query(&statement, &values).inspect_err(|e| {
            if is_stale(e) {
                self.statements.clear();
            }
        })
    }
}

/// A statement of [`Session::query_together`]: its text with parameters
/// `$1`..`$9`, their types (`"text[], bigint"`), and its values as SQL
/// ([`literal`], [`array_literal`], a number).
pub(super) struct Bound<'a> {
    pub sql: &'a str,
    pub types: &'a str,
    pub values: &'a [&'a str],
}

impl Bound<'_> {
    /// The statement with its values written in place of its parameters.
    fn inline(&self) -> String {
        // One pass: a value written in is never read again for `$n`.
        let mut sql = String::with_capacity(self.sql.len());
        let mut rest = self.sql;
        while let Some(at) = rest.find('$') {
            sql.push_str(&rest[..at]);
            let digits = rest[at + 1..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            let param = &rest[at..at + 1 + digits];
            let value = param[1..]
                .parse::<usize>()
                .ok()
                .and_then(|n| n.checked_sub(1))
                .and_then(|i| self.values.get(i));
            sql.push_str(value.copied().unwrap_or(param));
            rest = &rest[at + 1 + digits..];
        }
        sql.push_str(rest);
        sql
    }
}

/// The statements a session prepared with SQL's `PREPARE`, by their text.
struct Named {
    statements: HashMap<String, Preparation<String>>,
    /// The pool's own part of every name (random per store): a statement of
    /// that name on any server connection is one this pool prepared, with its
    /// tables, whatever a pooler does with the calls.
    salt: String,
    /// A statement this session prepared was found gone (26000): a pooler
    /// moves its calls between server connections, or a handler deallocated
    /// it. From then on the session writes the values into the text.
    gone: bool,
}

impl Named {
    pub(super) fn new(salt: String) -> Self {
        Named {
            statements: HashMap::new(),
            salt,
            gone: false,
        }
    }

    /// The name `statement` runs under, prepared now if it is not, or afresh
    /// after [`REPLAN_AFTER`] (the old one deallocated first).
    fn name_of(
        &mut self,
        client: &mut Client,
        statement: &Bound<'_>,
    ) -> Result<String, postgres::Error> {
        let replan = match self.statements.get_mut(statement.sql) {
            Some(p) => match p.call_within(Some(REPLAN_AFTER)) {
                Some(name) => return Ok(name),
                None => true,
            },
            None => false,
        };
        self.statements.remove(statement.sql);
        let name = self.name(statement.sql);
        let prepare = format!("PREPARE {name} ({}) AS {}", statement.types, statement.sql);
        let again = format!("DEALLOCATE {name}; {prepare}");
        let sent = match replan {
            true => client.batch_execute(&again),
            false => client.batch_execute(&prepare).or_else(|e| match e.code() {
                // 42P05: the session has it still (the map was emptied when
                // another statement went stale); its plan may be stale too.
                Some(c) if c.code() == "42P05" => client.batch_execute(&again),
                _ => Err(e),
            }),
        };
        if let Err(e) = sent {
            if is_stale(&e) {
                self.statements.clear();
            }
            return Err(e);
        }
        let prepared = Preparation::new(name.clone());
        self.statements.insert(statement.sql.to_owned(), prepared);
        Ok(name)
    }

    /// `bq_dedupe_` and 16 bytes of the SHA-256 of the salt and `sql`, in hex.
    fn name(&self, sql: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(self.salt.as_bytes())
            .chain_update(sql.as_bytes())
            .finalize();
        let mut name = String::from("bq_dedupe_");
        for byte in &digest[..16] {
            let _ = write!(name, "{byte:02x}");
        }
        name
    }
}

/// A prepared statement the server lost (26000) or whose plan no longer fits
/// its tables (0A000, "cached plan must not change result type"): preparing it
/// again is the fix, and nothing ran. The second is told by the server
/// function that raises it, which no `lc_messages` translates.
pub(super) fn is_stale(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        c.code() == "26000"
            || (c.code() == "0A000"
                && e.as_db_error()
                    .is_some_and(|db| db.routine() == Some("RevalidateCachedQuery")))
    })
}

/// A text value written into a statement's text, in ASCII alone, so nothing
/// in it can end the literal whatever the connection's client encoding (in
/// SJIS a multibyte character written as itself can swallow the backslash
/// after it: a review's finding). An ASCII value is an escape string constant
/// (`E'...'`, read the same whatever `standard_conforming_strings` says): a
/// quote doubled, a backslash doubled, a control character as its code point
/// (`\U00000009`). Any other value is its UTF-8 bytes in hex, decoded by the
/// server in the database's collation: a `\U` escape above U+007F is refused
/// by a `SQL_ASCII` database.
/// Constants, so the planner sees the values (a lookup by key is planned for
/// the number of keys it has). The store never sends U+0000
/// ([`super::stored`] names such an id by its hash).
pub(super) fn literal(value: &str) -> String {
    if !value.is_ascii() {
        let mut text = String::with_capacity(2 * value.len() + 40);
        text.push_str("(pg_catalog.convert_from(pg_catalog.decode('");
        for byte in value.bytes() {
            let _ = write!(text, "{byte:02x}");
        }
        // convert_from's result has the collation "C": the key's index, in the
        // database's, would not serve it.
        text.push_str("', 'hex'), 'UTF8') COLLATE pg_catalog.\"default\")");
        return text;
    }
    let mut text = String::with_capacity(value.len() + 3);
    text.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => text.push_str("''"),
            '\\' => text.push_str("\\\\"),
            ' '..='~' => text.push(c),
            c => {
                let _ = write!(text, "\\U{:08X}", u32::from(c));
            }
        }
    }
    text.push('\'');
    text
}

/// Text values as a `text[]` of [`literal`]s.
pub(super) fn array_literal<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = values.into_iter().map(literal).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

/// [`literal`], or SQL's `NULL`.
pub(super) fn optional_literal(value: Option<&str>) -> String {
    value.map_or_else(|| "NULL".to_string(), literal)
}

/// [`array_literal`] of values some of which are SQL `NULL`.
pub(super) fn optional_array_literal(values: &[Option<&str>]) -> String {
    let items: Vec<String> = values.iter().map(|v| optional_literal(*v)).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

/// The first row `messages` hold.
pub(super) fn first_row(messages: Vec<SimpleQueryMessage>) -> Option<SimpleQueryRow> {
    messages.into_iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_ascii() {
        assert_eq!(literal("a-\t'"), "E'a-\\U00000009'''");
        assert_eq!(
            literal("ключ-🔑"),
            "(pg_catalog.convert_from(pg_catalog.decode('d0bad0bbd18ed1872df09f9491', 'hex'), \
             'UTF8') COLLATE pg_catalog.\"default\")"
        );
    }

    #[test]
    fn values_are_written_in_once_each() {
        let key = literal("$2 it's \\ $1");
        let bound = Bound {
            sql: "SELECT $1::text, $2::bigint, $10, $",
            types: "text, bigint",
            values: &[&key, "7"],
        };
        assert_eq!(
            bound.inline(),
            "SELECT E'$2 it''s \\\\ $1'::text, 7::bigint, $10, $"
        );
    }
}
