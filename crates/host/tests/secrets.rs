//! A store spec's password is never printed, whatever form it takes and
//! whichever command fails on it (issue #29: 7 of 15 failing runs printed it).
//! Every spec points at a closed port, so each command fails on it.

mod common;

use common::*;
use serde_json::Value;

/// Every form a password can take in a spec; each password contains `SECRET`.
const SPECS: &[&str] = &[
    // The scheme forgotten: not a URL at all.
    "bob:SECRETpw@127.0.0.1:1/app",
    // libpq's key=value form, any case, quoted with a space.
    "host=127.0.0.1 port=1 user=bob password=SECRETpw dbname=app",
    "host=127.0.0.1 port=1 PASSWORD='SECRET pw' dbname=app",
    // A raw `/`, `?` or `@` in the password.
    "postgres://bob:SECRET/pw@127.0.0.1:1/app",
    "redis://:SECRET/pw@127.0.0.1:1",
    "redis://:SECRET?pw@127.0.0.1:1/0",
    "postgresql://bob:SECRET@pw@127.0.0.1:1/app",
    // The same with the password's end the secret part: the clients read
    // past a raw `@ / ? #` and named that end as the host or a parameter.
    "postgres://bob:pw@SECRET/x@127.0.0.1:1/app",
    "postgresql://bob:pw@SECRET@127.0.0.1:1/app",
    "redis://:pw?SECRET@127.0.0.1:1/0",
    "redis://:pw#SECRET@127.0.0.1:1",
    "postgres://127.0.0.1:1/app?user=bob&password=pw@SECRET/x",
    // A raw `&` in a password parameter: its end was named as an option.
    "postgres://bob@127.0.0.1:1/app?password=pw&SECRET=1",
    // Its end named by our own parsers, and other separators (a review).
    "postgres://127.0.0.1:1/app?password=pw&sslmode=SECRET",
    "postgres://127.0.0.1:1/app?password=pw&SECRET&SECRET",
    "postgres://127.0.0.1:1/app?sslmode=disable?password=SECRET",
    "postgres://127.0.0.1:1/app?user=bob;password=SECRET",
    "host=127.0.0.1 port=1 password = SECRET dbname=app",
    // Percent-encoded.
    "postgres://bob:SECRET%2Fpw@127.0.0.1:1/app",
    // A second `password=`, and one in another case.
    "postgres://127.0.0.1:1/app?password=pw1SECRET&password=SECRETpw2",
    "postgres://127.0.0.1:1/app?user=bob&PassWord=SECRETpw",
    "rediss+cluster://:SECRETpw@127.0.0.1:1,127.0.0.1:2",
    "redis+cluster://bob:SECRET/pw@127.0.0.1:1",
];

#[test]
fn no_command_prints_a_specs_password() {
    let mut leaks = Vec::new();
    for spec in SPECS {
        for args in [
            // `--store` forgotten: clap's error, and run's input file.
            vec!["stats", spec],
            vec!["run", "--store", "memory", spec],
            vec!["run", "--store", spec],
            vec!["stats", "--store", spec],
            vec!["forget", "--store", spec, "some-id"],
            vec!["conformance", "--store", spec],
        ] {
            let out = bq(&args, "");
            assert_ne!(
                out.status.code(),
                Some(0),
                "{args:?} cannot succeed on a closed port"
            );
            let printed = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if printed.contains("SECRET") {
                leaks.push(format!("{args:?}: {printed}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}

/// A password given where the store spec goes (a bare word: no scheme, no
/// user info) is not printed: it was, twice, in "opening store S3cr3t:
/// ... unknown store spec \"S3cr3t\"" (a trial).
#[test]
fn a_password_given_as_the_store_spec_is_not_printed() {
    let secret = "SECRETpw";
    let env = [("BQ_DEDUPE_STORE", secret)];
    for (vars, args) in [
        (&[][..], vec!["run", "--store", secret]),
        (&[][..], vec!["stats", "--store", secret]),
        (&env[..], vec!["run"]),
        (&env[..], vec!["forget", "x"]),
    ] {
        let out = bq_with_env(vars, &args, "");
        let printed = format!("{out:?}");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {printed}");
        assert!(!printed.contains("SECRET"), "{args:?}: {printed}");
        assert!(
            printed.contains("unknown store spec"),
            "{args:?}: {printed}"
        );
    }
}

/// A spec in `$BQ_DEDUPE_STORE` stands for `--store` on every command but
/// `conformance`: a password there is off the command line, which `ps` shows
/// every user of the machine (an operator trial's finding: `--store` was the
/// only way). `--store` still wins; neither `--help` nor an error prints it;
/// an `--exec` handler does not inherit it.
#[test]
fn the_store_spec_may_come_from_the_environment() {
    let dir = scratch("store-env");
    let spec = format!("sqlite:{}", dir.join("seen.db").display());
    let env = [("BQ_DEDUPE_STORE", spec.as_str())];
    let handler_env = dir.join("handler-env");
    let envelope = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"id":"env-1","schema_version":1}}"#;
    let exec = format!("env > {}", handler_env.display());
    let run = bq_with_env(&env, &["run", "--exec", &exec], &format!("{envelope}\n"));
    assert!(run.status.success(), "{run:?}");
    let inherited = std::fs::read_to_string(&handler_env).unwrap();
    assert!(inherited.contains("PATH="), "{inherited}");
    assert!(!inherited.contains("BQ_DEDUPE_STORE"), "{inherited}");
    let state = |vars: &[(&str, &str)], args: &[&str]| {
        let out = bq_with_env(vars, args, "");
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        shown["state"].as_str().map(str::to_owned)
    };
    assert_eq!(state(&env, &["show", "env-1"]).as_deref(), Some("done"));
    let given = ["show", "--store", "memory", "env-1"];
    assert_eq!(state(&env, &given).as_deref(), Some("free"));
    // With a password, on a closed port.
    let secret = [("BQ_DEDUPE_STORE", "postgres://bob:SECRETpw@127.0.0.1:1/app")];
    for args in [
        vec!["stats"],
        vec!["run"],
        vec!["forget", "x"],
        vec!["run", "--help"],
        vec!["stats", "--help"],
    ] {
        let out = bq_with_env(&secret, &args, "");
        let printed = format!("{out:?}");
        assert!(!printed.contains("SECRET"), "{args:?}: {printed}");
        if args.last() != Some(&"--help") {
            assert!(printed.contains("127.0.0.1"), "{args:?} used it: {printed}");
        }
    }
}

/// A store that cannot be reached exits 6, any command, so a supervisor can
/// run it again later; a spec the store refuses (a login, a database that is
/// not there) or a bad argument exits 2, for a person to fix (both exited 2:
/// an operator trial's finding).
#[test]
fn an_unreachable_store_exits_apart_from_a_bad_argument() {
    for spec in ["postgres://bob:pw@127.0.0.1:1/app", "redis://127.0.0.1:1/0"] {
        for args in [vec!["stats", "--store", spec], vec!["run", "--store", spec]] {
            let line = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"id":"u-1","schema_version":1}}"#;
            let out = bq(&args, &format!("{line}\n"));
            assert_eq!(out.status.code(), Some(6), "{args:?}: {out:?}");
        }
    }
    for args in [
        vec!["stats", "--store", "nosuch:x"],
        vec!["stats", "--bogus"],
        vec!["run", "--ttl", "0s"],
    ] {
        let out = bq(&args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}
