//! `bq-dedupe forget`, `show`, `stats` and `purge`.

use std::process::ExitCode;

use anyhow::{Result, bail};
use bq_dedupe::store::Peeked;
use bq_dedupe::{KeySpace, Store, block_on_ready};
use bq_dedupe_stores::AnyStore;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{ComponentSource, Runtime, guard_options};

/// Forgets `ids` through one `consumer.guard`; with `fingerprint`, their
/// fingerprint markers too (as `run --fingerprint` wrote them).
pub fn forget(
    component: &ComponentSource,
    store: &str,
    prefix: &str,
    fingerprint: bool,
    ids: &[String],
) -> Result<ExitCode> {
    let native = bq_dedupe_host::open_existing_store(store)?;
    // What each id was, to say when there was nothing to forget (a mistyped
    // id, store or prefix looks like a success otherwise).
    let before = peek(&native, prefix, ids)?;
    let mut runtime = Runtime::load(component, native, Handler::Mark)?;
    let mut opts = guard_options(prefix);
    opts.fingerprint = fingerprint;
    if let Err(refused) = runtime.open_guard(&opts)? {
        bail!(
            "the dedupe component refused the options: {}",
            refused.message
        );
    }
    let mut failed = false;
    for ((id, key), state) in before {
        match runtime.guard_forget(id)? {
            Ok(()) => {
                println!("forgot {id}");
                if state == "free" {
                    eprintln!(
                        "bq-dedupe: {id} was not remembered (key {key:?}): nothing to forget; \
                         check --store and --prefix"
                    );
                }
            }
            Err(e) => {
                failed = true;
                eprintln!("could not forget {id}: {}", e.message);
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Each id's key (`prefix` + id) and what the store holds for it: `done`,
/// `claimed`, `free`, or `not-done` (a store that cannot tell a live claim).
fn peek<'i>(
    store: &AnyStore,
    prefix: &str,
    ids: &'i [String],
) -> Result<Vec<((&'i str, String), &'static str)>> {
    let keyspace = KeySpace::new().with_prefix(prefix);
    let keys: Vec<String> = ids.iter().map(|id| keyspace.key(id).into_owned()).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let peeked = block_on_ready(store.peek_many(&refs))
        .map_err(|_| anyhow::anyhow!("the store answered asynchronously"))?
        .map_err(|e| anyhow::anyhow!("reading the store: {e}"))?;
    Ok(ids
        .iter()
        .map(String::as_str)
        .zip(keys)
        .zip(peeked.into_iter().map(|p| match p {
            Peeked::Done => "done",
            Peeked::NotDone {
                claim_ends_in: Some(left),
            } if left.is_zero() => "free",
            Peeked::NotDone {
                claim_ends_in: Some(_),
            } => "claimed",
            Peeked::NotDone {
                claim_ends_in: None,
            } => "not-done",
        }))
        .collect())
}

/// Prints, per id, its key and what the store holds for it.
pub fn show(store: &str, prefix: &str, ids: &[String]) -> Result<ExitCode> {
    let native = bq_dedupe_host::open_existing_store(store)?;
    for ((id, key), state) in peek(&native, prefix, ids)? {
        println!(
            "{}",
            serde_json::json!({ "id": id, "key": key, "state": state })
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn stats(store: &str) -> Result<ExitCode> {
    let stats = bq_dedupe_host::open_existing_store(store)?.stats()?;
    // The spec is not echoed: a Redis URL may carry a password.
    println!(
        "{}",
        serde_json::json!({
            "remembered": stats.remembered,
            "claimed": stats.claimed,
            "expired": stats.expired,
        })
    );
    Ok(ExitCode::SUCCESS)
}

pub fn purge(store: &str) -> Result<ExitCode> {
    let purged = bq_dedupe_host::open_existing_store(store)?.purge_expired()?;
    println!("{}", serde_json::json!({ "purged": purged }));
    Ok(ExitCode::SUCCESS)
}
