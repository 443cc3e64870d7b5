//! The repository's own hygiene (issue #29 item 9): every `cargo install` of a
//! pinned tool is `--locked` (its dependencies as its release locked them, not
//! resolved afresh at install time), `make test` starts by refusing a lock file
//! that would need an update, `.dev.vars` (where the docs put the admin token)
//! is ignored by git, and no script puts a secret on a command line.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The scripts, make files, manifests and docs a user or CI runs or copies.
fn files() -> Vec<PathBuf> {
    let mut out = vec![root().join("Makefile"), root().join("README.md")];
    for dir in [
        "scripts",
        "mk",
        "docs",
        "examples/user-worker",
        ".ci",
        "crates/host",
    ] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
            continue;
        };
        out.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
    }
    out
}

/// The crate a `cargo install` line installs (its first argument not an option).
fn installed_crate(code: &str) -> Option<&str> {
    let rest = code.split("cargo install").nth(1)?;
    let mut words = rest.split_whitespace();
    while let Some(word) = words.next() {
        match word {
            "--version" | "--root" | "--path" => {
                words.next();
            }
            w if w.starts_with('-') => {}
            w => return Some(w.split('@').next().unwrap_or(w)),
        }
    }
    None
}

/// Every `cargo install` is `--locked`. The one exception is a line marked
/// `# unlocked fallback` that retries, in the same file, a locked install of
/// the same crate (the index lacks a version wasm-bindgen-cli's lock names).
#[test]
fn every_cargo_install_is_locked() {
    let mut unlocked = Vec::new();
    for path in files() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let locked: Vec<&str> = text
            .lines()
            .map(|line| line.split(" #").next().unwrap_or(line))
            .filter(|code| code.contains("cargo install") && code.contains("--locked"))
            .filter_map(installed_crate)
            .collect();
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line);
            if !code.contains("cargo install") || code.contains("--locked") {
                continue;
            }
            let fallback = line.contains("# unlocked fallback")
                && installed_crate(code).is_some_and(|krate| locked.contains(&krate));
            if !fallback {
                unlocked.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        unlocked.is_empty(),
        "cargo install without --locked:\n{}",
        unlocked.join("\n")
    );
}

#[test]
fn the_unlocked_fallback_rule_reads_the_crate() {
    let code = r#"cargo install wasm-bindgen-cli --version "$V" >&2"#;
    assert_eq!(installed_crate(code), Some("wasm-bindgen-cli"));
    assert_eq!(
        installed_crate("cargo install -q --locked worker-build@^0.8 && worker-build"),
        Some("worker-build")
    );
    assert_eq!(
        installed_crate("cargo install --locked --path crates/host"),
        None
    );
}

#[test]
fn make_test_refuses_a_lock_file_that_needs_an_update() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let setup = makefile.split("\nsetup:").nth(1).expect("a setup target");
    let recipe: String = setup
        .lines()
        .take_while(|l| l.starts_with('\t') || l.is_empty())
        .collect();
    assert!(recipe.contains("cargo metadata --locked"), "{recipe}");
    assert!(makefile.lines().any(|l| l.starts_with("test: setup")));
}

#[test]
fn dev_vars_are_ignored_and_no_script_puts_a_token_on_a_command_line() {
    let ignored = std::fs::read_to_string(root().join(".gitignore")).unwrap();
    assert!(
        ignored.lines().any(|l| l.trim() == ".dev.vars"),
        ".dev.vars not in .gitignore"
    );
    for path in files() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let on_the_line = line.contains("--var") && line.contains("TOKEN")
                || line.contains("-H \"Authorization: Bearer $")
                || line.contains("AUTH=\"Authorization: Bearer");
            assert!(
                !on_the_line,
                "{}:{}: a secret on a command line: {line}",
                path.display(),
                n + 1
            );
        }
    }
}
