//! Store specs as they may be printed: every form a password can take masked.

/// `spec` with any password replaced by `***`, so that no error message or log
/// line carries it: the URL's user info after its first `:` up to the *last*
/// `@` (a raw `/`, `?` or `@` in a password included, and a spec whose
/// scheme was forgotten), and the value of every `password=` parameter, in
/// any case, in a query (`&`-separated) or a libpq `key=value` string (a
/// quoted value whole).
pub fn shown_spec(spec: &str) -> String {
    match crate::backends::Backend::of(spec) {
        Some(backend) => (backend.shown)(spec),
        None => masked(spec),
    }
}

/// [`shown_spec`] of a string given as a store spec (`--store`,
/// `$BQ_DEDUPE_STORE`): one no backend reads, with no scheme, user info or
/// parameters, is a bare word, maybe a password given in the spec's place,
/// and is not shown (it was printed, twice: a trial).
pub fn shown_store_spec(spec: &str) -> String {
    let bare = !spec.contains("://") && !spec.contains(['@', '=', ' ']);
    match crate::backends::Backend::of(spec) {
        None if bare => "*** (not shown: no scheme)".to_string(),
        Some(backend) => (backend.shown)(spec),
        None => masked(spec),
    }
}

/// Why a URL must be refused before any client reads it, if it must: its
/// user info or its query could be split where a client does not split it,
/// and the password's end named in an error ([`query_is_ambiguous`],
/// [`user_info_is_ambiguous`]).
pub(crate) fn ambiguity(url: &str) -> Option<&'static str> {
    if query_is_ambiguous(url) {
        return Some(
            "a password parameter must come last in the query, after its `?` or an `&`, \
             and the query can hold no second `?`: percent-encode `& ; ?` in a value \
             (%26 %3B %3F), or give the password in the user info",
        );
    }
    user_info_is_ambiguous(url).then_some(
        "an `@` after a `/`, `?` or `#`, or more than one `@`: percent-encode `@ / ? # & %` \
         in a user name, password or parameter (%40 %2F %3F %23 %26 %25)",
    )
}

/// Whether a URL's `@` may not be where its client splits the user info off:
/// more than one `@`, or one after a `/`, `?` or `#` (a raw delimiter in a
/// password or a parameter). The clients read such a spec their own ways
/// (PostgreSQL's at the first `@` anywhere) and named the password's end in
/// their errors as a host or a parameter; [`masked`] cannot know which part
/// they took, so such a spec is refused before any client reads it.
fn user_info_is_ambiguous(spec: &str) -> bool {
    let Some(start) = spec.find("://").map(|i| i + 3) else {
        return false;
    };
    let rest = &spec[start..];
    match rest.find('@') {
        Some(at) => rest[at + 1..].contains('@') || rest[..at].contains(['/', '?', '#']),
        None => false,
    }
}

/// A URL's (or a libpq string's) passwords masked, in its user info and its
/// parameters: the redaction of every network backend and of unknown specs.
pub(crate) fn masked(spec: &str) -> String {
    // Parameters first: a `password=p@ss` must not pass for user info.
    mask_user_info(&mask_parameters(spec))
}

fn mask_user_info(spec: &str) -> String {
    let start = spec.find("://").map_or(0, |i| i + 3);
    // Without a scheme, a `key=value` string (libpq's form) has no user info.
    if start == 0 && spec.contains(['=', ' ']) {
        return spec.to_string();
    }
    let Some(at) = spec[start..].rfind('@').map(|i| start + i) else {
        return spec.to_string();
    };
    match spec[start..at].find(':') {
        Some(colon) => format!("{}***{}", &spec[..start + colon + 1], &spec[at..]),
        // No scheme: what comes before the `@` cannot be told from a password.
        None if start == 0 => format!("***{}", &spec[at..]),
        // `scheme://user@host`: a user name only.
        None => spec.to_string(),
    }
}

/// Every `password=` parameter masked (a `sqlite:` path has no user info).
pub(crate) fn mask_parameters(spec: &str) -> String {
    match spec.split_once("://").and_then(|_| spec.split_once('?')) {
        Some((base, query)) => format!("{base}?{}", mask_query(query)),
        None if spec.contains("://") => spec.to_string(),
        None => mask_key_values(spec),
    }
}

/// Whether a URL's query holds a password (`password=`, any case): the
/// names after it may be that password's end, split off at a raw `&`.
pub(crate) fn has_password_parameter(url: &str) -> bool {
    url.split_once('?')
        .is_some_and(|(_, query)| first_password_parameter(query).is_some())
}

/// Whether a URL's query could be split where its client does not split it,
/// so that a password's end would read as another parameter or a value (and
/// be named in an error): a second `?`, or a password parameter that is not
/// the last one or does not follow the query's `?` or an `&` (a raw `&`, `;`
/// or `?` in the password, or in the value before it).
fn query_is_ambiguous(url: &str) -> bool {
    let Some((_, query)) = url.split_once('?') else {
        return false;
    };
    if query.contains('?') {
        return true;
    }
    first_password_parameter(query).is_some_and(|start| {
        (start > 0 && !query[..start].ends_with('&')) || query[start..].contains(['&', ';'])
    })
}

/// Where the query's first password parameter begins, its pairs split at
/// `&`, `;` and `?` (what one client or another may take for a separator).
fn first_password_parameter(query: &str) -> Option<usize> {
    let ends = query.match_indices(['&', ';', '?']).map(|(i, _)| i);
    let mut start = 0;
    for end in ends.chain(std::iter::once(query.len())) {
        let pair = &query[start..end];
        if pair
            .split_once('=')
            .is_some_and(|(name, _)| is_password(name))
        {
            return Some(start);
        }
        start = end + 1;
    }
    None
}

/// Whether a parameter's name is a password's (any case, percent-decoded:
/// the client decodes it too), e.g. `password`, `PassWord`, `sslpassword`.
fn is_password(name: &str) -> bool {
    let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    decoded.to_ascii_lowercase().ends_with("password")
}

/// A URL's query: from the first password parameter on, masked (its value
/// whole, a space or a raw separator in it included, and what follows it).
fn mask_query(query: &str) -> String {
    match first_password_parameter(query) {
        Some(start) => {
            let name = query[start..].split_once('=').map_or("", |(name, _)| name);
            format!("{}{name}=***", &query[..start])
        }
        None => query.to_owned(),
    }
}

/// libpq's `key=value` string: every password value masked, a quoted one
/// (`\'` inside it escaped) whole.
fn mask_key_values(spec: &str) -> String {
    let mut shown = String::with_capacity(spec.len());
    let mut rest = spec;
    while let Some(eq) = rest.find('=') {
        // libpq allows spaces around `=` (`password = x`).
        let head = rest[..eq].trim_end();
        let name = &head[head.rfind(char::is_whitespace).map_or(0, |i| i + 1)..];
        let after = &rest[eq + 1..];
        let value = after.trim_start();
        let spaces = &after[..after.len() - value.len()];
        let len = match value.strip_prefix('\'') {
            Some(quoted) => {
                let mut escaped = false;
                quoted
                    .char_indices()
                    .find(|&(_, c)| {
                        let end = c == '\'' && !escaped;
                        escaped = c == '\\' && !escaped;
                        end
                    })
                    .map_or(value.len(), |(i, _)| i + 2)
            }
            None => value.find(char::is_whitespace).unwrap_or(value.len()),
        };
        shown.push_str(&rest[..=eq]);
        shown.push_str(spaces);
        if is_password(name) {
            shown.push_str("***");
        } else {
            shown.push_str(&value[..len]);
        }
        rest = &value[len..];
    }
    shown.push_str(rest);
    shown
}

#[cfg(test)]
mod tests {
    use super::shown_spec;

    /// A bare word given as a store spec is not shown; one with a scheme,
    /// user info or parameters is, as [`shown_spec`] shows it.
    #[test]
    fn a_bare_word_given_as_a_store_spec_is_not_shown() {
        use super::shown_store_spec;
        for spec in ["S3cr3t", "P:W", "seen.db"] {
            assert_eq!(
                shown_store_spec(spec),
                "*** (not shown: no scheme)",
                "{spec}"
            );
        }
        for spec in [
            "memory",
            "sqlite:a.db",
            "mysql://u:pw@h/db",
            "host=h password=pw",
        ] {
            assert_eq!(shown_store_spec(spec), shown_spec(spec), "{spec}");
        }
    }

    #[test]
    fn every_form_of_a_password_is_masked() {
        for (spec, shown) in [
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            (
                "postgres://bq:s3cret@db:5432/app?table=t",
                "postgres://bq:***@db:5432/app?table=t",
            ),
            (
                "postgres://db/app?user=bq&password=s3cret&x=1",
                "postgres://db/app?user=bq&password=***",
            ),
            (
                "redis+cluster://h1:7000,h2:7001",
                "redis+cluster://h1:7000,h2:7001",
            ),
            ("sqlite:.bq-dedupe/seen.db", "sqlite:.bq-dedupe/seen.db"),
            ("sqlite:/data/a@b.db", "sqlite:/data/a@b.db"),
            ("sqlite://u:s3cret@x", "sqlite://u:***@x"),
            ("sqlite:///data/a@b.db", "sqlite:///data/a@b.db"),
            ("memory", "memory"),
            ("postgres://bob@db/app", "postgres://bob@db/app"),
            ("bob:PW@db:5432/app", "bob:***@db:5432/app"),
            ("PW@db:5432/app", "***@db:5432/app"),
            ("postgres://bob:P/W@db/app", "postgres://bob:***@db/app"),
            ("redis://:P?W@h:1/0", "redis://:***@h:1/0"),
            ("postgres://bob:P@W@db/app", "postgres://bob:***@db/app"),
            (
                "postgres://db/app?password=a&PassWord=b",
                "postgres://db/app?password=***",
            ),
            // Everything after a password is masked: a raw `&` in it.
            (
                "postgres://db/app?user=u&password=pw&SECRET=1&table=t",
                "postgres://db/app?user=u&password=***",
            ),
            (
                "host=h password=PW dbname=d",
                "host=h password=*** dbname=d",
            ),
            (
                "host=h PASSWORD='P W\\' X' dbname=d",
                "host=h PASSWORD=*** dbname=d",
            ),
            ("host=h password='unterminated", "host=h password=***"),
            ("host=h sslpassword=PW", "host=h sslpassword=***"),
            // Found by review: a password with `@` in the key=value form; a
            // space in a query value; a percent-encoded name.
            (
                "host=h password=p@ss dbname=d",
                "host=h password=*** dbname=d",
            ),
            (
                "host=h password='p@ss' dbname=d",
                "host=h password=*** dbname=d",
            ),
            (
                "postgres://db/app?password=a b&x=1",
                "postgres://db/app?password=***",
            ),
            (
                "postgres://db/app?passw%6Frd=x",
                "postgres://db/app?passw%6Frd=***",
            ),
            // A second `?` or a `;` before a password: masked from it on.
            (
                "postgres://h/db?sslmode=disable?password=SECRET",
                "postgres://h/db?sslmode=disable?password=***",
            ),
            (
                "postgres://h/db?user=bob;password=SECRET",
                "postgres://h/db?user=bob;password=***",
            ),
            // Spaces around libpq's `=`.
            (
                "host=h password = SECRET dbname=d",
                "host=h password = *** dbname=d",
            ),
            // An `@` after the host: masked up to it (more than needed, never less).
            ("postgres://u:p@db/app?x=a@b", "postgres://u:***@b"),
        ] {
            assert_eq!(shown_spec(spec), shown, "{spec}");
        }
    }
}
