//! `bq-dedupe conformance`: the core's manifest runner, with the component (and a
//! real store) as the subject.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use bq_dedupe::conformance::{self, Effect, Subject};
use bq_dedupe_stores::AnyStore;
use serde_json::Value;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{Runtime, options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::Outcome;

struct ComponentSubject {
    runtime: Runtime,
    /// Each sequence gets a fresh prefix, so a persistent store starts empty.
    prefix: String,
    resets: u64,
}

fn text(raw: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(raw).map_err(|e| format!("not UTF-8: {e}"))
}

impl Subject for ComponentSubject {
    fn decode(&mut self, raw: &[u8]) -> Result<Value, String> {
        match self
            .runtime
            .decode(text(raw)?)
            .map_err(|e| format!("{e:#}"))?
        {
            Ok(json) => serde_json::from_str(&json).map_err(|e| e.to_string()),
            Err(rejection) => Err(rejection.message),
        }
    }

    fn dedup_key(&mut self, raw: &[u8]) -> Result<Option<String>, String> {
        // No prefix: the key must be `meta.id` itself.
        match self
            .runtime
            .dedupe_key(text(raw)?, &options(""))
            .map_err(|e| format!("{e:#}"))?
        {
            Ok(key) => Ok(key),
            Err(rejection) => Err(rejection.message),
        }
    }

    fn reset(&mut self) -> Result<(), String> {
        self.resets += 1;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.prefix = format!(
            "bq-conformance:{}-{nanos}-{}:",
            std::process::id(),
            self.resets
        );
        Ok(())
    }

    fn forget(&mut self, id: &str) -> Result<(), String> {
        let opts = options(&self.prefix);
        match self
            .runtime
            .forget(id, &opts)
            .map_err(|e| format!("{e:#}"))?
        {
            Ok(()) => Ok(()),
            Err(e) => Err(e.message),
        }
    }

    fn deliver(&mut self, raw: &[u8], succeed: bool) -> Result<Effect, String> {
        self.runtime.state().handler = Handler::Scripted { succeed, calls: 0 };
        let opts = options(&self.prefix);
        let outcome = self
            .runtime
            .process(text(raw)?, &opts)
            .map_err(|e| format!("{e:#}"))?;
        // The effect is whether the handler was really called, not what the
        // component says about it.
        let called = matches!(
            self.runtime.state().handler,
            Handler::Scripted { calls: 1.., .. }
        );
        Ok(match outcome {
            _ if called => Effect::Run,
            Outcome::Skip => Effect::Skip,
            other => Effect::Other(format!("{other:?}")),
        })
    }
}

pub fn run(component: &Path, store: &str, manifest: Option<PathBuf>) -> Result<ExitCode> {
    let manifest = manifest.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/manifest.json")
    });
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let dir = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    let store = AnyStore::from_spec(store).map_err(|e| anyhow::anyhow!("store {store}: {e}"))?;
    let runtime = Runtime::load(component, store, Handler::Mark)?;
    let mut subject = ComponentSubject {
        runtime,
        prefix: String::new(),
        resets: 0,
    };
    let load = |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
    let report = conformance::run(&text, load, &mut subject, |r| println!("{r}"))
        .map_err(anyhow::Error::msg)?;
    println!("{}", report.summary());
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
