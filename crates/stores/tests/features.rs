//! A user's crate outside the workspace that takes only the SQLite store
//! (`default-features = false, features = ["sqlite"]`): its dependency tree
//! holds no Redis, PostgreSQL, tokio or rustls, it dedupes a redelivery on a
//! SQLite file, and a spec of a backend it left out is refused by name.

use std::path::{Path, PathBuf};
use std::process::Command;

const MAIN: &str = r##"
use bq_dedupe::{Guard, Message, block_on_ready};
use bq_dedupe_stores::AnyStore;

fn main() {
    let dir = std::env::args().nth(1).expect("a folder");
    let store = AnyStore::from_spec(&format!("sqlite:{dir}/seen.db")).expect("sqlite opens");
    let guard = Guard::new(store);
    let body = br#"{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{},"meta":{"id":"only-sqlite-1","schema_version":1}}"#;
    for _ in 0..2 {
        let outcome = block_on_ready(guard.process(body, async |_: &Message<'_>| Ok::<(), String>(())))
            .expect("a ready future");
        println!("{}", outcome.kind().code());
    }
    for spec in ["postgres://u:secret@h/db", "redis://h:1"] {
        match AnyStore::from_spec(spec) {
            Ok(_) => println!("opened {spec}"),
            Err(e) => println!("{:?}: {}", e.kind, e.message),
        }
    }
}
"##;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cargo(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(dir)
        // Its own target folder (the running `cargo test` holds the workspace's),
        // kept between runs so that only the first one compiles SQLite.
        .env("CARGO_TARGET_DIR", workspace().join("target/user-crates"))
        .output()
        .expect("cargo runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "cargo {args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

#[test]
fn a_sqlite_only_build_has_no_network_store_in_it() {
    let dir = std::env::temp_dir().join(format!("bq-sqlite-only-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let root = workspace().canonicalize().unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            r#"[package]
name = "sqlite-only-user"
version = "0.1.0"
edition = "2024"

[dependencies]
babelqueue-dedupe = {{ path = "{root}" }}
babelqueue-dedupe-stores = {{ path = "{root}/crates/stores", default-features = false, features = ["sqlite"] }}

[workspace]
"#,
            root = root.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), MAIN).unwrap();
    // The versions the workspace was tested with, and no registry needed.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

    let tree = cargo(
        &dir,
        &[
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ],
    );
    let names: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(names.contains(&"rusqlite"), "{tree}");
    for left_out in [
        "redis",
        "postgres",
        "tokio",
        "tokio-postgres",
        "rustls",
        "r2d2",
    ] {
        assert!(!names.contains(&left_out), "{left_out} is built:\n{tree}");
    }

    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let out = cargo(
        &dir,
        &["run", "--offline", "--quiet", "--", data.to_str().unwrap()],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["run-ok", "skip"], "{out}");
    assert!(data.join("seen.db").exists());
    for (line, feature) in lines[2..].iter().zip(["postgres", "redis"]) {
        assert!(line.starts_with("Invalid: "), "{line}");
        assert!(
            line.contains(&format!("feature `{feature}` is off")),
            "{line}"
        );
        assert!(!line.contains("secret"), "no password shown: {line}");
    }
    assert_eq!(lines.len(), 4, "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
