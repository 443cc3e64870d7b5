//! `bq-dedupe`: runs the dedupe WebAssembly component under wasmtime with a real
//! store (SQLite by default, Redis for a fleet, memory for tests).

mod commands;

use bq_dedupe_host::{DEFAULT_STORE, STORE_ENV, runtime};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bq-dedupe",
    version,
    about = "Dedupe BabelQueue envelopes by meta.id through the dedupe component"
)]
struct Cli {
    /// The dedupe component (default: $BQ_DEDUPE_COMPONENT, else the one built in).
    #[arg(long, global = true)]
    component: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a BabelQueue conformance manifest through the component.
    Conformance {
        /// The store (as `run --store`). A persistent store keeps the run's
        /// records, under `bq-conformance:` prefixes.
        #[arg(long, default_value = "memory")]
        store: String,
        /// The manifest (default: the vendored tests/conformance/manifest.json).
        manifest: Option<PathBuf>,
    },
    /// Dedupe envelopes (JSON lines) and print one decision per line.
    Run(commands::run::RunArgs),
    /// Validate envelopes (JSON lines), one verdict per line.
    Check {
        /// Input file, or - for stdin.
        #[arg(default_value = "-")]
        input: String,
    },
    /// Forget ids so their next delivery runs again.
    Forget {
        /// The store (as `run --store`); a SQLite file must exist.
        #[arg(long, env = STORE_ENV, hide_env_values = true, default_value = DEFAULT_STORE)]
        store: String,
        /// Key prefix the ids were remembered under.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Also forget the ids' payload fingerprints (as `run --fingerprint`
        /// wrote them), so their next success records one afresh.
        #[arg(long)]
        fingerprint: bool,
        /// Forget an id even while a consumer holds a live claim on it: that
        /// claim ends, and a redelivery may run beside the running handler.
        #[arg(long)]
        even_if_claimed: bool,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print, per id, its key and what the store holds for it (done, claimed, free).
    Show {
        /// The store (as `run --store`); a SQLite file must exist.
        #[arg(long, env = STORE_ENV, hide_env_values = true, default_value = DEFAULT_STORE)]
        store: String,
        /// Key prefix the ids were remembered under.
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print how many ids and claims the store holds.
    Stats {
        /// The store (as `run --store`); a SQLite file must exist.
        #[arg(long, env = STORE_ENV, hide_env_values = true, default_value = DEFAULT_STORE)]
        store: String,
    },
    /// Delete expired ids (and claims lapsed long ago) from the store; live
    /// claims stay. `run` does the same every `--purge-every`.
    Purge {
        /// The store (as `run --store`); a SQLite file must exist.
        #[arg(long, env = STORE_ENV, hide_env_values = true, default_value = DEFAULT_STORE)]
        store: String,
    },
}

/// clap's error or help, with any argument that carries a password masked
/// as a store spec is: a spec given without `--store` (`stats redis://:pw@h`)
/// was echoed whole as an unexpected argument.
fn exit_masked(e: &clap::Error) -> ! {
    let mut text = e.render().to_string();
    // args_os: `args` panics on an argument that is not UTF-8.
    for arg in std::env::args_os()
        .skip(1)
        .filter_map(|a| a.into_string().ok())
    {
        let shown = bq_dedupe_host::shown_spec(&arg);
        if shown != arg {
            text = text.replace(&arg, &shown);
        }
    }
    match e.use_stderr() {
        true => bq_dedupe_host::say(text.trim_end()),
        false => bq_dedupe_host::tell(text.trim_end()),
    }
    std::process::exit(e.exit_code())
}

fn main() -> ExitCode {
    // SIGCHLD ignored by whoever started us (kept across exec) has the kernel
    // reap each handler at once, its exit status lost: every success was read
    // as a failure and run again on its redelivery (a trial).
    #[cfg(unix)]
    // SAFETY: at start-up, before any thread or child exists.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    }
    let cli = Cli::try_parse().unwrap_or_else(|e| exit_masked(&e));
    let component = runtime::ComponentSource::choose(cli.component);
    let result = match cli.command {
        Command::Conformance { store, manifest } => {
            commands::conformance::run(&component, &store, manifest)
        }
        Command::Run(args) => commands::run::run(&component, args),
        Command::Check { input } => commands::check::run(&component, &input),
        Command::Forget {
            store,
            prefix,
            fingerprint,
            even_if_claimed,
            ids,
        } => commands::admin::forget(
            &component,
            &store,
            &prefix,
            (fingerprint, even_if_claimed),
            &ids,
        ),
        Command::Show { store, prefix, ids } => commands::admin::show(&store, &prefix, &ids),
        Command::Stats { store } => commands::admin::stats(&store),
        Command::Purge { store } => commands::admin::purge(&store),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            bq_dedupe_host::say(&format!("bq-dedupe: {e:#}"));
            ExitCode::from(error_status(&e))
        }
    }
}

/// The exit status of a command that failed: a store that could not be
/// reached (or answered that it is unavailable) exits
/// [`EXIT_STORE_UNAVAILABLE`], worth running again later; anything else
/// (bad arguments, a spec, login or certificate the store's server or its TLS
/// refused) exits 2, for a person to fix. Both were 2, and a supervisor could
/// not tell them apart (an operator trial's finding).
fn error_status(e: &anyhow::Error) -> u8 {
    use bq_dedupe::store::{StoreError, StoreErrorKind};
    let unavailable = e.chain().any(|cause| {
        cause
            .downcast_ref::<StoreError>()
            .is_some_and(|s| s.kind == StoreErrorKind::Unavailable)
    });
    // A certificate TLS refused does not pass with time (rustls's words, in
    // every client's error): a supervisor retried one for ever (a trial).
    let refused_certificate = e
        .chain()
        .any(|cause| cause.to_string().contains("invalid peer certificate"));
    match unavailable && !refused_certificate {
        true => EXIT_STORE_UNAVAILABLE,
        false => 2,
    }
}

/// Any command's exit status when its store could not be reached.
const EXIT_STORE_UNAVAILABLE: u8 = 6;
