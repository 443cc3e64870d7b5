//! `bq-dedupe forget` and `bq-dedupe stats`.

use std::process::ExitCode;

use anyhow::{Result, bail};

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
    let mut runtime = Runtime::load(
        component,
        bq_dedupe_host::open_existing_store(store)?,
        Handler::Mark,
    )?;
    let mut opts = guard_options(prefix);
    opts.fingerprint = fingerprint;
    if let Err(refused) = runtime.open_guard(&opts)? {
        bail!(
            "the dedupe component refused the options: {}",
            refused.message
        );
    }
    let mut failed = false;
    for id in ids {
        match runtime.guard_forget(id)? {
            Ok(()) => println!("forgot {id}"),
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
