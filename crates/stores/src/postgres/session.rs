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
use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};
use postgres::{Client, GenericClient, Row, Statement, Transaction};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::r2d2::ManageConnection;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::StatementCache;

/// A statement's parameters with their types (`query_typed`'s shape).
pub(super) type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// The pool's connections: a client and its prepared statements.
pub(super) struct Manager {
    pub manager: PostgresConnectionManager<MakeRustlsConnect>,
    /// The URL's `statement_cache`.
    pub cache: StatementCache,
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
            },
            plans: match self.cache {
                StatementCache::Generic => Plans::Own,
                StatementCache::On | StatementCache::Off => Plans::LeftAlone,
            },
        })
    }

    fn is_valid(&self, session: &mut Session) -> Result<(), postgres::Error> {
        self.manager.is_valid(&mut session.client)
    }

    fn has_broken(&self, session: &mut Session) -> bool {
        self.manager.has_broken(&mut session.client)
    }
}

/// One connection of the pool.
pub(super) struct Session {
    client: Client,
    prepared: Prepared,
    /// The `plan_cache_mode` the session runs with now.
    plans: Plans,
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
}

/// A statement prepared on the connection: when, and how many calls it ran.
struct Preparation {
    statement: Statement,
    at: Instant,
    calls: u32,
}

impl Prepared {
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
        let fresh = |p: &Preparation| {
            limit.is_none_or(|(age, calls)| p.calls < calls && p.at.elapsed() < age)
        };
        let statement = match self.statements.get_mut(sql) {
            Some(prepared) if fresh(prepared) => {
                prepared.calls = prepared.calls.saturating_add(1);
                prepared.statement.clone()
            }
            _ => {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                let statement = client.prepare_typed(sql, &types)?;
                let prepared = Preparation {
                    statement: statement.clone(),
                    at: Instant::now(),
                    calls: 1,
                };
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
