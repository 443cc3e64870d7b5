//! `bq-dedupe conformance`: the core's manifest runner, with the component (and a
//! real store) as the subject.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use bq_dedupe::conformance::{self, Effect, Subject};
use serde_json::Value;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{ComponentSource, Runtime, options};
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

/// The vendored BabelQueue conformance manifest (`tests/conformance/`, linked into
/// this crate as `conformance/`), built in so an installed binary has it.
const BUILT_IN_MANIFEST: &str = include_str!("../../conformance/manifest.json");

/// The manifest's fixtures, by their manifest-relative path.
fn built_in_fixture(file: &str) -> Option<&'static [u8]> {
    macro_rules! fixtures {
        ($($name:literal),* $(,)?) => {
            match file {
                $(concat!("fixtures/", $name) => Some(include_bytes!(concat!("../../conformance/fixtures/", $name)).as_slice()),)*
                _ => None,
            }
        };
    }
    fixtures!(
        "dead-lettered.json",
        "invalid-missing-urn.json",
        "invalid-unknown-schema-version.json",
        "order-created.json",
        "unicode-and-numbers.json",
        "urn-alias.json",
    )
}

pub fn run(
    component: &ComponentSource,
    store: &str,
    manifest: Option<PathBuf>,
) -> Result<ExitCode> {
    // The vendored manifest is built in; a file given on the command line wins.
    let (text, dir) = match &manifest {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            Some(path.parent().map(Path::to_path_buf).unwrap_or_default()),
        ),
        None => (BUILT_IN_MANIFEST.to_string(), None),
    };
    let store = bq_dedupe_host::open_store(store)?;
    let runtime = Runtime::load(component, store, Handler::Mark)?;
    let mut subject = ComponentSubject {
        runtime,
        prefix: String::new(),
        resets: 0,
    };
    let load = |file: &str| match &dir {
        Some(dir) => std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}")),
        None => built_in_fixture(file)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("{file}: not a built-in fixture")),
    };
    let report = conformance::run(&text, load, &mut subject, |r| {
        bq_dedupe_host::tell(&r.to_string())
    })
    .map_err(anyhow::Error::msg)?;
    bq_dedupe_host::tell(&report.summary());
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
