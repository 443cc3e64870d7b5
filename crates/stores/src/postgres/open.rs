//! Opening a [`PostgresStore`]: the URL's own parameters (table, timeouts,
//! statement cache), the first connection and its session, the tables found
//! or made, and the id columns checked.

use super::*;

/// A table name Go would accept and PostgreSQL folds the same way for both
/// (unquoted): letters, digits and `_`, not starting with a digit, optionally
/// `schema.table`; short enough for the `_claims` table beside it.
fn check_table(table: &str) -> StoreResult<()> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 56
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    let ok = match table.split_once('.') {
        Some((schema, name)) => ident(schema) && ident(name),
        None => ident(table),
    };
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "postgres: table {table:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, optionally schema.table, at most 56 characters)"
        )))
    }
}

/// `lock_timeout`'s default: how long a call waits for a row or table lock
/// another session holds.
const LOCK_TIMEOUT_MS: u64 = 5_000;
/// `statement_timeout`'s default: how long one statement may run (a handler's
/// inside the store's transaction too).
const STATEMENT_TIMEOUT_MS: u64 = 15_000;

/// The session settings of the URL's `lock_timeout` and `statement_timeout`
/// (`500ms`, `5s`, `2min`, `1h`, or milliseconds; `0` turns one off; `server`
/// leaves it to the role or the server), taken out of the URL.
fn timeouts_of(url: &str) -> StoreResult<(String, Timeouts)> {
    let (url, ours) = take_params(url, &["lock_timeout", "statement_timeout"])?;
    let mut timeouts = Timeouts {
        lock: Some(LOCK_TIMEOUT_MS),
        statement: Some(STATEMENT_TIMEOUT_MS),
    };
    for (name, value) in ours {
        let ms = match value.as_str() {
            "server" => None,
            _ => Some(millis(&value).ok_or_else(|| {
                invalid(format!(
                    "postgres: {name}={value:?} is not a duration (500ms, 5s, 2min, 1h, or \
                     milliseconds) nor `server`"
                ))
            })?),
        };
        match name.as_str() {
            "lock_timeout" => timeouts.lock = ms,
            _ => timeouts.statement = ms,
        }
    }
    Ok((url, timeouts))
}

/// The store's own `lock_timeout` and `statement_timeout` in milliseconds;
/// `None`: the role's or the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timeouts {
    lock: Option<u64>,
    statement: Option<u64>,
}

impl Timeouts {
    /// The settings in the startup packet's `options` form (`-c name=ms`).
    fn options(self) -> String {
        [
            ("lock_timeout", self.lock),
            ("statement_timeout", self.statement),
        ]
        .into_iter()
        .filter_map(|(name, ms)| Some(format!("-c {name}={}", ms?)))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// Why the first connection failed. A pooler that refuses the startup
/// packet's `options` (PgBouncer does, unless its `ignore_startup_parameters`
/// lists it) is a configuration to change, and the error says how; so is a
/// login the server refused or a database it does not have (`Invalid`: a
/// supervisor must not wait for them to pass); anything else may pass
/// (`Unavailable`).
fn connect_error(host: &str, e: &postgres::Error) -> StoreError {
    let refused_options = e.as_db_error().is_some_and(|db| {
        let message = db.message();
        message.contains("startup parameter") && message.contains("options")
    });
    let cause = causes(e);
    // 28xxx: the role, its password or pg_hba.conf; 3D000: no such database;
    // PgBouncer says the last two in its own words (08P01); a password the
    // server asks for and the URL lacks is the client's "invalid configuration".
    let said = cause.to_ascii_lowercase();
    let refused_login = (e.code())
        .is_some_and(|c| c.code().starts_with("28") || c.code() == "3D000")
        || [
            "no such database",
            "no such user",
            "authentication failed",
            "invalid configuration",
        ]
        .iter()
        .any(|words| said.contains(words));
    if refused_login {
        return invalid(format!("postgres: {host} refused the connection: {cause}"));
    }
    if !refused_options {
        return StoreError::unavailable(format!("postgres: cannot connect to {host}: {cause}"));
    }
    invalid(format!(
        "postgres: {host} refused the startup parameter `options`, which carries the store's \
         session settings (its timeouts, unless the URL says `server`) ({cause}); a pooler such \
         as PgBouncer does unless its ignore_startup_parameters lists it. {POOLER_ADVICE}"
    ))
}

/// A setting of our own in the startup packet's `options`, beside the
/// timeouts: the session has it only if `options` took.
const OPTIONS_MARKER: &str = "bq_dedupe.options";

/// What to do behind a transaction-mode pooler, for the errors that find one.
const POOLER_ADVICE: &str = "Behind a transaction-mode pooler set the timeouts for the role \
     (ALTER ROLE ... SET lock_timeout = '5s'; ALTER ROLE ... SET statement_timeout = '15s') and \
     add statement_cache=off&lock_timeout=server&statement_timeout=server to the URL \
     (docs/stores.md)";

/// What the store reads of its first session, in one round trip.
struct FirstSession {
    /// The database's encoding ([`Charset`]).
    encoding: String,
    /// Said once on start-up: a timeout left to the server that it does not set.
    notes: Vec<String>,
}

/// The first session runs with the `options` the store sent (its timeouts,
/// the URL's own): a pooler told to ignore `options` (PgBouncer's
/// `ignore_startup_parameters`) drops them without a word, and a call would
/// then wait on a lock as long as the role lets it. A timeout the URL leaves
/// to the server (`server`) that the server leaves off is said: a call then
/// waits as long as another session holds the id's row (an operator trial's
/// finding, behind PgBouncer).
fn first_session(
    client: &mut postgres::Client,
    sent: bool,
    limits: Timeouts,
) -> StoreResult<FirstSession> {
    // A simple query: a transaction-mode pooler may send a prepared
    // statement's execution to another server connection.
    let messages = client
        .simple_query(&format!(
            "SELECT current_setting('{OPTIONS_MARKER}', true) IS NOT DISTINCT FROM 'on', \
             current_setting('server_encoding'), current_setting('lock_timeout'), \
             current_setting('statement_timeout'), current_setting('synchronous_commit')"
        ))
        .map_err(error)?;
    let row = first_row(messages);
    let column = |i: usize| row.as_ref().and_then(|row| row.get(i)).unwrap_or_default();
    if sent && column(0) != "t" {
        return Err(invalid(format!(
            "postgres: the session does not have the startup packet's `options` (the store's \
             lock_timeout and statement_timeout, the URL's own): a pooler, such as PgBouncer \
             with `options` in ignore_startup_parameters, dropped them. {POOLER_ADVICE}"
        )));
    }
    let unbounded = [
        (
            limits.lock,
            column(2),
            "lock_timeout",
            "a call waits on another session's lock as long as it is held",
            "5s",
        ),
        (
            limits.statement,
            column(3),
            "statement_timeout",
            "a statement (a handler's too) runs as long as it takes",
            "15s",
        ),
    ];
    let mut notes: Vec<String> = (unbounded.into_iter())
        .filter(|(ours, server, ..)| ours.is_none() && *server == "0")
        .map(|(_, _, name, then, advised)| {
            format!(
                "{name}=server, and the server's {name} is 0 (none): {then} \
                 (ALTER ROLE ... SET {name} = '{advised}')"
            )
        })
        .collect();
    // The store's commits are then answered before they are on the disk: a
    // server crash can drop the last ones, in the exactly-once mode the
    // effect and the id of an acked delivery together (a trial).
    if column(4) == "off" {
        notes.push(
            "synchronous_commit is off for this role or database: a commit the store \
             answered can be lost in a server crash (in the exactly-once mode, an acked \
             delivery's effect and id together); ALTER ROLE ... SET synchronous_commit = on"
                .into(),
        );
    }
    Ok(FirstSession {
        encoding: column(1).to_owned(),
        notes,
    })
}

/// What `statement_cache=` asks of the store's statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StatementCache {
    /// Unnamed, parsed and planned afresh on every call: for a pooler that
    /// cannot keep prepared statements (PgBouncer in transaction mode before
    /// 1.21, or without `max_prepared_statements`), where a named statement may
    /// land on another client's server connection.
    Off,
    /// Prepared once per connection (the default), planned as the server sees fit.
    On,
    /// Prepared once and planned once (`plan_cache_mode = force_generic_plan`
    /// for the store's own calls; `session.rs` says when not to).
    Generic,
}

/// The URL without `statement_cache=off|on|generic`, and which, if given (the
/// default: [`PostgresStore::connect`]).
fn statement_cache_of(url: &str) -> StoreResult<(String, Option<StatementCache>)> {
    let (url, ours) = take_params(url, &["statement_cache"])?;
    match ours.first().map(|(_, v)| v.as_str()) {
        None => Ok((url, None)),
        Some("on") => Ok((url, Some(StatementCache::On))),
        Some("off") => Ok((url, Some(StatementCache::Off))),
        Some("generic") => Ok((url, Some(StatementCache::Generic))),
        Some(other) => Err(invalid(format!(
            "postgres: statement_cache={other:?} is not off, on or generic"
        ))),
    }
}

/// `500ms`, `5s`, `2min`, `1h` or a number of milliseconds, in milliseconds.
fn millis(value: &str) -> Option<u64> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (n, unit) = value.split_at(split);
    let n: u64 = n.parse().ok()?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    // PostgreSQL takes at most i32::MAX milliseconds.
    n.checked_mul(scale).filter(|&ms| ms <= i32::MAX as u64)
}

/// An error and what caused it, outermost first ("error performing TLS
/// handshake: invalid peer certificate: UnknownIssuer").
pub(super) fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let more = cause.to_string();
        if !text.ends_with(&more) {
            text = format!("{text}: {more}");
        }
        next = cause.source();
    }
    text
}

/// How long a connection may take: [`TIMEOUT`] per host the URL names (each
/// one's TCP connect has that long) and [`TIMEOUT`] more for the startup, the
/// login and the first checks. (A host name with several addresses tries each
/// for [`TIMEOUT`]: not counted.)
fn connect_bound(config: &Config) -> std::time::Duration {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    TIMEOUT * (hosts.max(1) as u32 + 1)
}

/// `connect` on a thread of its own, awaited for `bound`
/// ([`connect_bound`]): past it the store is unavailable, "no answer", and the
/// thread is left to end with its connection (against a server that never
/// answers, when the process does).
fn within_connect_bound<T: Send + 'static>(
    host: &str,
    bound: std::time::Duration,
    connect: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || answer.send(connect()));
    answered.recv_timeout(bound).unwrap_or_else(|_| {
        Err(StoreError::unavailable(format!(
            "postgres: cannot connect to {host}: no answer within {} s",
            bound.as_secs()
        )))
    })
}

/// Where a config connects, for an error message: `host:port`, never the
/// credentials.
fn where_to(config: &Config) -> String {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}", path.display()),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Takes `table=` out of a PostgreSQL URL's query.
pub(crate) fn split_table(spec: &str) -> Result<(String, String), StoreError> {
    let (url, ours) = take_params(spec, &["table"])?;
    let table = ours
        .into_iter()
        .next_back()
        .map_or_else(|| DEFAULT_POSTGRES_TABLE.to_owned(), |(_, v)| v);
    Ok((url, table))
}

impl PostgresStore {
    /// Connects to `url` (`postgres://[USER[:PASSWORD]@]HOST[:PORT]/DB[?...]`, any
    /// parameter libpq-style URLs take) and creates the tables if missing.
    ///
    /// TLS as libpq reads the URL's `sslmode` and `sslrootcert`:
    /// `verify-full` checks the server's certificate and name against
    /// `sslrootcert=PATH` (a PEM file) or the platform's roots (also
    /// `sslrootcert=system`); `verify-ca` the certificate only, against
    /// `sslrootcert` (required); `require` (and the default, `prefer`, when the
    /// server offers TLS) encrypts without authenticating the server, unless
    /// `sslrootcert` is given. `disable` is plain TCP. Differences from libpq:
    /// `allow` is `prefer`; a failed handshake under `prefer` is an error, not a
    /// plain retry; `~/.postgresql/root.crt`, `PGSSLMODE` and client
    /// certificates are not read. A certificate that fails its check is
    /// `Unavailable`, naming the host.
    pub fn connect(url: &str, table: &str) -> StoreResult<Self> {
        off_runtime(|| Self::connect_here(url, table, true))
    }

    /// [`Self::connect`] to a table that must already exist (`Invalid`
    /// otherwise): for commands that only read or delete (`bq-dedupe show`,
    /// `stats`, `forget`, `purge`), where a mistyped `?table=` created two
    /// empty tables and read as a store with nothing in it.
    pub fn connect_existing(url: &str, table: &str) -> StoreResult<Self> {
        off_runtime(|| Self::connect_here(url, table, false))
    }

    fn connect_here(url: &str, table: &str, create: bool) -> StoreResult<Self> {
        check_table(table)?;
        let (url, tls) = postgres_tls(url)?;
        let (url, limits) = timeouts_of(&url)?;
        let (url, cache) = statement_cache_of(&url)?;
        let mut config: Config = url
            .parse()
            // The cause names the parameter (`unknown option `tabel``), never a
            // value; but after a `password=` a name may be the password's end,
            // split off at a raw `&` (a review's finding): not shown then.
            .map_err(|e| match std::error::Error::source(&e) {
                Some(_) if crate::shown::has_password_parameter(&url) => invalid(format!(
                    "postgres: bad url: {e} (its detail not shown: the URL has a password \
                     parameter; percent-encode `&` in it as %26)"
                )),
                Some(cause) => invalid(format!("postgres: bad url: {e}: {cause}")),
                None => invalid(format!("postgres: bad url: {e}")),
            })?;
        config.connect_timeout(TIMEOUT);
        config.notice_callback(on_notice);
        // Every session of the store: a call blocked on a lock, or a
        // statement running long, ends as `Unavailable` within its limit.
        // The URL's own `options` last: a user's `-c statement_timeout=0` wins.
        // (None at all when both are `server`: a pooler may refuse `options`.)
        // With them, a marker: a pooler that drops `options` is found out.
        let given = config.get_options().unwrap_or_default().to_owned();
        let options = format!("{} {given}", limits.options());
        let sends_options = !options.trim().is_empty();
        if sends_options {
            config.options(&format!("-c {OPTIONS_MARKER}=on {}", options.trim()));
        }
        // Statements prepared once per connection, unless nothing goes in
        // `options`: that is the setup for a transaction-mode pooler, where
        // the client's statement names (`s0`, `s1`, ..., the same in every
        // process) could run another process's statement.
        let cache = cache.unwrap_or(match sends_options {
            true => StatementCache::On,
            false => StatementCache::Off,
        });
        if let Some(mode) = tls.mode {
            config.ssl_mode(mode);
        }
        let host = where_to(&config);
        let bound = connect_bound(&config);
        let connector = MakeRustlsConnect::new(client_config(tls.verify, tls.ca.as_deref())?);
        let manager = std::sync::Arc::new(PostgresConnectionManager::new(config, connector));
        // One connection first, to report why it fails (a certificate, a
        // password) at once and whole; the pool would retry until its timeout
        // and keep only the outermost message. Within the connect bound:
        // `connect_timeout` covers the TCP connect alone, and a server that
        // took the connection and never answered held the startup for ever.
        let (first_manager, first_host) = (manager.clone(), host.clone());
        let FirstSession { encoding, notes } = within_connect_bound(&host, bound, move || {
            let connect = || {
                first_manager
                    .connect()
                    .map_err(|e| connect_error(&first_host, &e))
            };
            let mut first = connect()?;
            match first_session(&mut first, sends_options, limits) {
                // The session ended under the check (behind a pooler, the server
                // connection it was lent went away): once more, on a new one.
                Err(_) if first.is_closed() => {
                    first_session(&mut connect()?, sends_options, limits)
                }
                checked => checked,
            }
        })?;
        let pool = Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            // No health-check query before each use (one more round trip per
            // call): a broken connection is found by the call, which is retried
            // once on a fresh one ([`PostgresStore::run`]).
            .test_on_check_out(false)
            // The pool's first connection tries the hosts as the first did.
            .connection_timeout(bound)
            .build(Manager {
                manager: manager.clone(),
                cache,
                salt: new_token().0,
            })
            .map_err(|e| {
                StoreError::unavailable(format!("postgres: cannot connect to {host}: {e}"))
            })?;
        let claims = format!("{table}_claims");
        let mut store = PostgresStore {
            pool: Some(pool),
            direct: manager,
            table: table.to_owned(),
            claims,
            notes: tls.note.into_iter().chain(notes).collect(),
            charset: Charset::of(&encoding),
            pending_undos: std::sync::Mutex::default(),
        };
        // The ids' table wherever the `search_path` finds it, its claims beside
        // it: `CREATE TABLE IF NOT EXISTS` looks in the first schema alone (a
        // role's own, `"$user"`), and made a second table there beside a Go
        // fleet's in `public`, each fleet then running the other's ids again.
        // Both there: no table is created (CREATE ... IF NOT EXISTS needs the
        // CREATE privilege even then, which a role beside a fleet's table in
        // `public` lacks since PostgreSQL 15).
        let found = store.found_tables()?;
        let qualified = found.is_some();
        let missing = match found {
            Some((t, c, claims_exist)) => {
                (store.table, store.claims) = (t, c);
                (!claims_exist).then(|| store.claims.clone())
            }
            None if !create => {
                return Err(invalid(format!(
                    "postgres: no table {table} in this database (a mistyped ?table=? \
                     `bq-dedupe run` creates it)"
                )));
            }
            None => Some(format!("{} and {}", store.table, store.claims)),
        };
        store.create_tables(table, missing.as_deref())?;
        // Found, the names came with their schema; made here, they are read now.
        if !qualified {
            (store.table, store.claims) = store.qualified_tables()?;
        }
        store.check_id_columns()?;
        Ok(store)
    }

    /// The tables' `message_id` columns keep every id as given: `text`, or
    /// `varchar` without a length, in a deterministic collation. A table made
    /// by hand otherwise is refused, naming the column: `char(n)` pads (an id
    /// `"a "` would read as `"a"`'s record and be skipped), `varchar(n)` fails
    /// every batch holding a longer id, a case-insensitive collation merges
    /// `A` and `a`.
    fn check_id_columns(&self) -> StoreResult<()> {
        let sql = "SELECT pg_catalog.format('%s.message_id is %s%s', c.oid::regclass,
                       pg_catalog.format_type(a.atttypid, a.atttypmod),
                       ' COLLATE ' || pg_catalog.quote_ident(co.collname))
                   FROM pg_catalog.pg_attribute a
                   JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
                   -- A domain is read as the type it is over.
                   JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
                   CROSS JOIN LATERAL (SELECT
                       CASE ty.typtype WHEN 'd' THEN ty.typbasetype ELSE a.atttypid END AS base,
                       CASE ty.typtype WHEN 'd' THEN ty.typtypmod ELSE a.atttypmod END AS typmod) b
                   LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
                   WHERE a.attrelid IN (pg_catalog.to_regclass($1), pg_catalog.to_regclass($2))
                     AND a.attname = 'message_id' AND NOT a.attisdropped
                     AND NOT ((b.base = 'text'::regtype
                               OR (b.base = 'varchar'::regtype AND b.typmod = -1))
                              -- Before PostgreSQL 12 every collation is deterministic.
                              AND coalesce(pg_catalog.to_jsonb(co) ->> 'collisdeterministic',
                                           'true') = 'true')
                   -- A unique index in another collation decides ON CONFLICT.
                   UNION ALL
                   SELECT pg_catalog.format('%s has a unique index %s on message_id COLLATE %s',
                       i.indrelid::regclass, i.indexrelid::regclass,
                       pg_catalog.quote_ident(co.collname))
                   FROM pg_catalog.pg_index i
                   JOIN pg_catalog.pg_attribute a
                     ON a.attrelid = i.indrelid AND a.attname = 'message_id'
                   CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(i.indkey::int2[]),
                       pg_catalog.unnest(i.indcollation::oid[])) AS k(attnum, coll)
                   JOIN pg_catalog.pg_collation co ON co.oid = k.coll
                   WHERE i.indrelid IN (pg_catalog.to_regclass($1), pg_catalog.to_regclass($2))
                     AND i.indisunique AND k.attnum = a.attnum
                     AND pg_catalog.to_jsonb(co) ->> 'collisdeterministic' = 'false'";
        let (t, c) = (self.table.as_str(), self.claims.as_str());
        let rows = self.run(|conn| {
            conn.client()
                .query_typed(sql, &[(&t, Type::TEXT), (&c, Type::TEXT)])
        })?;
        match rows.first() {
            None => Ok(()),
            Some(row) => Err(invalid(format!(
                "postgres: {}: ids would not be kept as given (padded, cut short or \
                 compared loosely, some skipped as another's duplicate); make the column \
                 TEXT in the default collation, as the Go SDK and this store create it",
                row.get::<_, String>(0)
            ))),
        }
    }

    /// The two tables' names with their schemas, as they resolve now: a
    /// handler that moves its session's `search_path` (`SET`, which outlives
    /// its transaction on the pooled connection) cannot move the store's
    /// statements to another schema's tables of the same names.
    fn qualified_tables(&self) -> StoreResult<(String, String)> {
        let name = "(SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
                     FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = pg_catalog.to_regclass";
        let sql = format!("SELECT {name}($1)), {name}($2))");
        let (t, c) = (self.table.as_str(), self.claims.as_str());
        let row = self.run(|conn| {
            conn.client()
                .query_typed_one(&sql, &[(&t, Type::TEXT), (&c, Type::TEXT)])
        })?;
        match (row.get(0), row.get(1)) {
            (Some(t), Some(c)) => Ok((t, c)),
            _ => Err(StoreError::new(
                StoreErrorKind::Internal,
                format!("postgres: {t} or {c} is not found after creating them"),
            )),
        }
    }

    /// The ids' table, if the `search_path` finds one, and its claims table's
    /// name in the same schema, both with that schema, and whether that one
    /// exists.
    fn found_tables(&self) -> StoreResult<Option<(String, String, bool)>> {
        let table = self.table.as_str();
        let rows = self.run(|conn| {
            conn.query(
                "SELECT t, c, pg_catalog.to_regclass(c) IS NOT NULL FROM (
                   SELECT pg_catalog.format('%I.%I', n.nspname, r.relname) AS t,
                          pg_catalog.format('%I.%I', n.nspname, pg_catalog.concat(r.relname, '_claims')) AS c
                   FROM pg_catalog.pg_class r
                   JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
                   WHERE r.oid = pg_catalog.to_regclass($1)) found",
                &[(&table, Type::TEXT)],
            )
        })?;
        Ok(rows.first().map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    /// Creates the tables when one is `missing` (its name, or both, for the
    /// error a role without CREATE gets), then the `expires_at` index if `T`
    /// has none and this role owns it; `given` is the table's name as the spec
    /// gave it (the index is named after it).
    fn create_tables(&self, given: &str, missing: Option<&str>) -> StoreResult<()> {
        let (t, c) = (&self.table, &self.claims);
        let index = given.replace('.', "_");
        let tables = match missing {
            Some(_) => format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    message_id TEXT NOT NULL PRIMARY KEY,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    expires_at TIMESTAMPTZ NULL);
                 CREATE TABLE IF NOT EXISTS {c} (
                    message_id TEXT NOT NULL PRIMARY KEY,
                    token      TEXT NOT NULL,
                    expires_at TIMESTAMPTZ NOT NULL);"
            ),
            None => String::new(),
        };
        let ddl = format!(
            "{tables}
             DO $$ BEGIN
               -- Go's index on expires_at, whatever it is named; ours only if none.
               -- Left to the table's owner: another role may use a fleet's table.
               IF NOT EXISTS (SELECT 1 FROM pg_index i
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                              WHERE i.indrelid = '{t}'::regclass AND a.attname = 'expires_at')
                  AND pg_has_role((SELECT relowner FROM pg_class WHERE oid = '{t}'::regclass), 'USAGE') THEN
                 CREATE INDEX IF NOT EXISTS {index}_expires_at_idx ON {t} (expires_at);
               END IF;
             END $$;"
        );
        let mut conn = self.conn()?;
        // Processes creating the tables at once: one wins, and another's
        // CREATE ... IF NOT EXISTS can still fail on the catalog (a unique index,
        // the table's row type: 23505, 42P07, 42710) with the rest of the batch
        // not run. Sent again, it finds what the winner made.
        let mut attempts = 0;
        loop {
            match conn.client().batch_execute(&ddl) {
                Ok(()) => return Ok(()),
                Err(e)
                    if attempts < 5
                        && e.code()
                            .is_some_and(|c| matches!(c.code(), "23505" | "42P07" | "42710")) =>
                {
                    attempts += 1;
                }
                // Not ours to make there: say which, and who can.
                Err(e) if e.code() == Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
                    let mut refused = error(e);
                    refused.message = format!(
                        "{}: making {} needs CREATE on the schema it goes in: have a role \
                         that may make it once (`bq-dedupe run` as that role), or grant CREATE",
                        refused.message,
                        missing.unwrap_or(t)
                    );
                    return Err(refused);
                }
                Err(e) => return Err(error(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_taken_out_of_the_postgres_url() {
        use crate::AnyStore;
        assert_eq!(
            split_table("postgres://u@h:5/db?table=seen&connect_timeout=3").unwrap(),
            (
                "postgres://u@h:5/db?connect_timeout=3".into(),
                "seen".into()
            )
        );
        assert_eq!(
            split_table("postgres://u@h/db").unwrap().1,
            DEFAULT_POSTGRES_TABLE
        );
        let e = AnyStore::from_spec("postgres://u:pw@h/db?table=a;drop").unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Invalid);
        assert!(!e.message.contains("pw"), "no secrets in errors: {e}");
    }

    #[test]
    fn statement_cache_is_what_the_url_says() {
        let url = "postgres://u@h/db";
        let cache = |query: &str| statement_cache_of(&format!("{url}{query}")).unwrap().1;
        assert_eq!(statement_cache_of(url).unwrap(), (url.to_owned(), None));
        let (rest, off) = statement_cache_of("postgres://u@h/db?statement_cache=off&x=1").unwrap();
        assert_eq!(
            (rest.as_str(), off),
            ("postgres://u@h/db?x=1", Some(StatementCache::Off))
        );
        assert_eq!(cache("?statement_cache=on"), Some(StatementCache::On));
        assert_eq!(
            cache("?statement_cache=generic"),
            Some(StatementCache::Generic)
        );
        let e = statement_cache_of(&format!("{url}?statement_cache=no")).unwrap_err();
        assert!(e.to_string().contains("not off, on or generic"), "{e}");
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["babelqueue_idempotency", "_t1", "app.seen", "T"] {
            assert!(check_table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1t",
            "a-b",
            "a;drop",
            "a.b.c",
            "\"q\"",
            ".t",
            "s.",
            &"x".repeat(57),
        ] {
            assert_eq!(check_table(bad).unwrap_err().kind, StoreErrorKind::Invalid);
        }
    }
}
