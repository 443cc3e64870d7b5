//! The peers' per-message patterns, as their code sends them (bench/README.md
//! names the files read), through the same clients on the same servers as
//! ours. None of them batches: a batch is its messages one at a time.

use std::time::Duration;

use postgres::Statement;

/// What one message's handler does in a run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Ok,
    Fails,
}

/// A peer's dedupe of one message, `true` when its handler ran.
pub trait Peer {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool;
}

const TTL: Duration = Duration::from_secs(24 * 3600);

fn ttl_ms() -> u64 {
    TTL.as_millis() as u64
}

/// The Go SDK's `idempotency.Wrap` on its Redis store (go-redis): `EXISTS`;
/// after a success `SetNX(key, "1", ttl)`, which go-redis sends as
/// `SET key 1 EX <seconds> NX` (a failure records nothing).
pub struct GoRedis(pub redis::Connection, pub String);

impl Peer for GoRedis {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        let key = format!("{}{id}", self.1);
        let seen: bool = redis::cmd("EXISTS").arg(&key).query(&mut self.0).unwrap();
        if seen {
            return false;
        }
        if handler == Handler::Ok {
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("EX")
                .arg(TTL.as_secs())
                .arg("NX")
                .query(&mut self.0)
                .unwrap();
        }
        true
    }
}

/// The PHP SDK's `ClaimingDispatch` on its Redis store (predis): `GET`
/// (seen when `2`), `SET key 1 PX <lease> NX` (the claim; lost: `GET` again),
/// then after a success `SET key 2`, after a failure the release (`EVAL` of a
/// compare-and-delete).
pub struct PhpRedis(pub redis::Connection, pub String);

impl PhpRedis {
    fn seen(&mut self, key: &str) -> bool {
        let got: Option<String> = redis::cmd("GET").arg(key).query(&mut self.0).unwrap();
        got.as_deref() == Some("2")
    }
}

impl Peer for PhpRedis {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        let key = format!("{}{id}", self.1);
        if self.seen(&key) {
            return false;
        }
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("PX")
            .arg(3_600_000)
            .arg("NX")
            .query(&mut self.0)
            .unwrap();
        if claimed.is_none() {
            self.seen(&key);
            return false;
        }
        if handler == Handler::Ok {
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(2)
                .query(&mut self.0)
                .unwrap();
        } else {
            let _: i64 = redis::cmd("EVAL")
                .arg("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end")
                .arg(1)
                .arg(&key)
                .arg(1)
                .query(&mut self.0)
                .unwrap();
        }
        true
    }
}

/// AWS Powertools' pattern (DynamoDB calls, done as Redis commands): a
/// conditional put of the in-progress record (`SET NX`), then the completed
/// one (`SET`); a duplicate is the one refused put; a failure deletes it.
pub struct PowertoolsRedis(pub redis::Connection, pub String);

impl Peer for PowertoolsRedis {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        let key = format!("{}{id}", self.1);
        let put: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("INPROGRESS")
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms())
            .query(&mut self.0)
            .unwrap();
        if put.is_none() {
            return false;
        }
        if handler == Handler::Ok {
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg("COMPLETED")
                .arg("PX")
                .arg(ttl_ms())
                .query(&mut self.0)
                .unwrap();
        } else {
            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut self.0).unwrap();
        }
        true
    }
}

/// The peers' tables on PostgreSQL, as their migrations make them.
pub fn create_tables(client: &mut postgres::Client, prefix: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {prefix}_go, {prefix}_php, {prefix}_pt;
             CREATE TABLE {prefix}_go (message_id TEXT PRIMARY KEY,
               created_at TIMESTAMPTZ NOT NULL DEFAULT now(), expires_at TIMESTAMPTZ NULL);
             CREATE INDEX ON {prefix}_go (expires_at);
             CREATE TABLE {prefix}_php (message_id VARCHAR(255) PRIMARY KEY,
               state VARCHAR(16), expires_at BIGINT NULL);
             CREATE TABLE {prefix}_pt (id TEXT PRIMARY KEY, status TEXT, expires_at TIMESTAMPTZ)"
        ))
        .unwrap();
}

/// The Go SDK's `Wrap` on its PostgreSQL store (pgx, statements prepared once
/// and cached): `Seen`'s `SELECT`; after a success `Claim`'s upsert, which
/// takes over an expired row.
pub struct GoPostgres {
    client: postgres::Client,
    select: Statement,
    upsert: Statement,
}

impl GoPostgres {
    pub fn new(mut client: postgres::Client, table: &str) -> Self {
        let select = client
            .prepare(&format!(
                "SELECT 1 FROM {table} WHERE message_id = $1 AND (expires_at IS NULL OR expires_at > now())"
            ))
            .unwrap();
        let upsert = client
            .prepare(&format!(
                "INSERT INTO {table} (message_id, created_at, expires_at) VALUES ($1, now(), $2)
                 ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at
                 WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()
                 RETURNING message_id"
            ))
            .unwrap();
        GoPostgres {
            client,
            select,
            upsert,
        }
    }
}

impl Peer for GoPostgres {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        if !self.client.query(&self.select, &[&id]).unwrap().is_empty() {
            return false;
        }
        if handler == Handler::Ok {
            let until = std::time::SystemTime::now() + TTL;
            self.client.query(&self.upsert, &[&id, &until]).unwrap();
        }
        true
    }
}

/// The PHP SDK's `PdoStore` under `ClaimingDispatch`: `SELECT state`, an
/// `INSERT` of the claim, then `UPDATE` to seen (or `DELETE`, released). PDO
/// prepares every statement on every call (pdo_pgsql: the prepare, the
/// execution and the `DEALLOCATE` when the statement is freed, each a round
/// trip), done here with SQL's `PREPARE` / `EXECUTE` / `DEALLOCATE` (the ids
/// are the bench's own, `[A-Za-z0-9-]`, safe as literals).
pub struct PhpPostgres {
    client: postgres::Client,
    table: String,
    statements: u64,
}

impl PhpPostgres {
    pub fn new(client: postgres::Client, table: &str) -> Self {
        PhpPostgres {
            client,
            table: table.to_owned(),
            statements: 0,
        }
    }

    /// Prepares `sql` (with `$1`.. typed `types`), executes it with the
    /// literal `args`, deallocates it: the rows it touched or returned.
    fn run(&mut self, sql: &str, types: &str, args: &[String]) -> u64 {
        self.statements += 1;
        let name = format!("pdo_stmt_{:08x}", self.statements);
        self.client
            .batch_execute(&format!("PREPARE {name} ({types}) AS {sql}"))
            .unwrap();
        let affected = self
            .client
            .simple_query(&format!("EXECUTE {name} ({})", args.join(", ")))
            .unwrap()
            .iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            })
            .unwrap_or(0);
        self.client
            .batch_execute(&format!("DEALLOCATE {name}"))
            .unwrap();
        affected
    }
}

fn literal(id: &str) -> String {
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    format!("'{id}'")
}

impl Peer for PhpPostgres {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        let t = self.table.clone();
        let key = literal(id);
        let seen = format!("SELECT state FROM {t} WHERE message_id = $1 AND state = 'seen'");
        if self.run(&seen, "text", std::slice::from_ref(&key)) > 0 {
            return false;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claim = format!(
            "INSERT INTO {t} (message_id, state, expires_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
        );
        let args = [key.clone(), "'claimed'".into(), (now + 3600).to_string()];
        if self.run(&claim, "text, text, bigint", &args) == 0 {
            self.run(&seen, "text", std::slice::from_ref(&key));
            return false;
        }
        if handler == Handler::Ok {
            let done =
                format!("UPDATE {t} SET state = $1, expires_at = NULL WHERE message_id = $2");
            self.run(&done, "text, text", &["'seen'".into(), key]);
        } else {
            let release = format!("DELETE FROM {t} WHERE message_id = $1 AND state = $2");
            self.run(&release, "text, text", &[key, "'claimed'".into()]);
        }
        true
    }
}

/// AWS Powertools' pattern (DynamoDB calls, done as SQL): a conditional
/// insert of the in-progress record, then its update to completed (or its
/// delete after a failure); a duplicate is the one refused insert.
pub struct PowertoolsPostgres {
    client: postgres::Client,
    put: Statement,
    complete: Statement,
    delete: Statement,
}

impl PowertoolsPostgres {
    pub fn new(mut client: postgres::Client, table: &str) -> Self {
        let put = client
            .prepare(&format!(
                "INSERT INTO {table} (id, status, expires_at) VALUES ($1, 'INPROGRESS', now() + $2::bigint * interval '1 millisecond')
                 ON CONFLICT (id) DO NOTHING"
            ))
            .unwrap();
        let complete = client
            .prepare(&format!(
                "UPDATE {table} SET status = 'COMPLETED' WHERE id = $1"
            ))
            .unwrap();
        let delete = client
            .prepare(&format!("DELETE FROM {table} WHERE id = $1"))
            .unwrap();
        PowertoolsPostgres {
            client,
            put,
            complete,
            delete,
        }
    }
}

impl Peer for PowertoolsPostgres {
    fn deliver(&mut self, id: &str, handler: Handler) -> bool {
        let ttl = ttl_ms() as i64;
        if self.client.execute(&self.put, &[&id, &ttl]).unwrap() == 0 {
            return false;
        }
        let next = match handler {
            Handler::Ok => &self.complete,
            Handler::Fails => &self.delete,
        };
        self.client.execute(next, &[&id]).unwrap();
        true
    }
}
