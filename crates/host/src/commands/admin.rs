//! `bq-dedupe forget`, `show`, `stats` and `purge`.

use std::process::ExitCode;

use anyhow::{Result, bail};
use bq_dedupe::store::Peeked;
use bq_dedupe::{KeySpace, Store, block_on_ready};
use bq_dedupe_stores::AnyStore;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{ComponentSource, Runtime, guard_options};
use bq_dedupe_host::{say, tell};

/// Forgets `ids` through one `consumer.guard`; with `fingerprint`, their
/// fingerprint markers too (as `run --fingerprint` wrote them). An id a
/// consumer holds a live claim on is left, unless `even_if_claimed`:
/// forgetting it ends the claim, and a redelivery could run beside the
/// running handler (a first user's trial did so, with no word from `forget`).
pub fn forget(
    component: &ComponentSource,
    store: &str,
    prefix: &str,
    (fingerprint, even_if_claimed): (bool, bool),
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
    for ((raw_id, key), peeked) in before {
        let id = shown_id(raw_id);
        if let Some(left) = claim_left(peeked).filter(|_| !even_if_claimed) {
            failed = true;
            say(&format!(
                "bq-dedupe: {id} is claimed by a running consumer (its claim ends in {:.1} s): \
                 not forgotten. Forgetting it ends that claim, and a redelivery could run \
                 beside the running handler; wait for it, or, if that consumer is gone (a \
                 crashed run's claim lasts its --lease), pass --even-if-claimed",
                left.as_secs_f64()
            ));
            continue;
        }
        // Nothing held: nothing deleted. A delete now would also take a claim
        // a consumer took since the check (its handler running beside the
        // redelivery). With `fingerprint`, a marker may outlive its id.
        let free = state_of(peeked) == "free";
        let forgotten = match free && !fingerprint {
            true => Ok(()),
            false => runtime.guard_forget(raw_id)?,
        };
        match forgotten {
            // Only what was there is said forgotten (a script reading stdout
            // took a mistyped id for one forgotten).
            Ok(()) if free => say(&format!(
                "bq-dedupe: {id} was not remembered (key {key:?}): nothing to forget; \
                 check --store and --prefix"
            )),
            Ok(()) => tell(&format!("forgot {id}")),
            Err(e) => {
                failed = true;
                say(&format!("could not forget {id}: {}", e.message));
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// How long a live claim on the id has left, if the store tells one.
fn claim_left(peeked: Peeked) -> Option<std::time::Duration> {
    match peeked {
        Peeked::NotDone {
            claim_ends_in: Some(left),
        } if !left.is_zero() => Some(left),
        _ => None,
    }
}

/// `done`, `claimed`, `free`, or `not-done` (a store that cannot tell a live
/// claim).
fn state_of(peeked: Peeked) -> &'static str {
    match peeked {
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
    }
}

/// Each id's key (`prefix` + id) and what the store holds for it.
fn peek<'i>(
    store: &AnyStore,
    prefix: &str,
    ids: &'i [String],
) -> Result<Vec<((&'i str, String), Peeked)>> {
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
        .zip(peeked)
        .collect())
}

/// Prints, per id, its key and what the store holds for it.
pub fn show(store: &str, prefix: &str, ids: &[String]) -> Result<ExitCode> {
    let native = bq_dedupe_host::open_existing_store(store)?;
    for ((id, key), peeked) in peek(&native, prefix, ids)? {
        tell(&serde_json::json!({ "id": id, "key": key, "state": state_of(peeked) }).to_string());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn stats(store: &str) -> Result<ExitCode> {
    let stats = bq_dedupe_host::open_existing_store(store)?.stats()?;
    // The spec is not echoed: a Redis URL may carry a password.
    tell(
        &serde_json::json!({
            "remembered": stats.remembered,
            "claimed": stats.claimed,
            "expired": stats.expired,
        })
        .to_string(),
    );
    Ok(ExitCode::SUCCESS)
}

pub fn purge(store: &str) -> Result<ExitCode> {
    let purged = bq_dedupe_host::open_existing_store(store)?.purge_expired()?;
    tell(&serde_json::json!({ "purged": purged }).to_string());
    Ok(ExitCode::SUCCESS)
}

/// An id as a message line shows it: as it is, or quoted and escaped when it
/// holds a control or bidirectional character (a terminal would act on them).
fn shown_id(id: &str) -> std::borrow::Cow<'_, str> {
    let hostile = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
            )
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    match id.chars().any(hostile) {
        true => format!("{id:?}").into(),
        false => id.into(),
    }
}
