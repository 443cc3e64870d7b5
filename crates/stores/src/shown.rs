//! Store specs as they may be printed: every form a password can take masked.

/// `spec` with any password replaced by `***`, so that no error message or log
/// line carries it: the URL's user info after its first `:` up to the *last*
/// `@` (a raw `/`, `?` or `@` in a password included, and a spec whose
/// scheme was forgotten), and the value of every `password=` parameter, in
/// any case, in a query (`&`-separated) or a libpq `key=value` string (a
/// quoted value whole).
pub fn shown_spec(spec: &str) -> String {
    mask_parameters(&mask_user_info(spec))
}

fn mask_user_info(spec: &str) -> String {
    if spec.starts_with("sqlite:") {
        return spec.to_string();
    }
    let start = spec.find("://").map_or(0, |i| i + 3);
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

fn mask_parameters(spec: &str) -> String {
    const KEY: &str = "password=";
    let lower = spec.to_ascii_lowercase();
    let mut shown = String::with_capacity(spec.len());
    let mut from = 0;
    while let Some(found) = lower[from..].find(KEY) {
        let value = from + found + KEY.len();
        let rest = &spec[value..];
        let len = match rest.strip_prefix('\'') {
            // libpq: a quoted value, `\'` inside it escaped.
            Some(quoted) => {
                let mut escaped = false;
                quoted
                    .char_indices()
                    .find(|&(_, c)| {
                        let end = c == '\'' && !escaped;
                        escaped = c == '\\' && !escaped;
                        end
                    })
                    .map_or(rest.len(), |(i, _)| i + 2)
            }
            None => rest
                .find(|c: char| c == '&' || c.is_whitespace())
                .unwrap_or(rest.len()),
        };
        shown.push_str(&spec[from..value]);
        shown.push_str("***");
        from = value + len;
    }
    shown.push_str(&spec[from..]);
    shown
}

#[cfg(test)]
mod tests {
    use super::shown_spec;

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
                "postgres://db/app?user=bq&password=***&x=1",
            ),
            (
                "redis+cluster://h1:7000,h2:7001",
                "redis+cluster://h1:7000,h2:7001",
            ),
            ("sqlite:.bq-dedupe/seen.db", "sqlite:.bq-dedupe/seen.db"),
            ("sqlite:/data/a@b.db", "sqlite:/data/a@b.db"),
            ("memory", "memory"),
            ("postgres://bob@db/app", "postgres://bob@db/app"),
            ("bob:PW@db:5432/app", "bob:***@db:5432/app"),
            ("PW@db:5432/app", "***@db:5432/app"),
            ("postgres://bob:P/W@db/app", "postgres://bob:***@db/app"),
            ("redis://:P?W@h:1/0", "redis://:***@h:1/0"),
            ("postgres://bob:P@W@db/app", "postgres://bob:***@db/app"),
            (
                "postgres://db/app?password=a&PassWord=b",
                "postgres://db/app?password=***&PassWord=***",
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
        ] {
            assert_eq!(shown_spec(spec), shown, "{spec}");
        }
    }
}
