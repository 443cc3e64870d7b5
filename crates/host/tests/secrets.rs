//! A store spec's password is never printed, whatever form it takes and
//! whichever command fails on it (issue #29: 7 of 15 failing runs printed it).
//! Every spec points at a closed port, so each command fails on it.

mod common;

use common::*;

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
