//! Redis URLs: parsing into connection settings, and a redacted form that is safe to show.
//! A password never leaves this module in a message: every error names the URL redacted.

use redis::{ConnectionInfo, IntoConnectionInfo};

/// The schemes the contract accepts.
const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];

/// Parses a Redis URL, or says why not (with the URL redacted).
pub fn parse(url: &str) -> Result<ConnectionInfo, String> {
    let fail = |why: &str| format!("url: invalid Redis URL '{}': {}", redact(url), why);
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(fail(
            "the scheme must be redis://, rediss://, redis+unix:// or unix://",
        ));
    }
    match url.into_connection_info() {
        Ok(info) => Ok(info),
        // The parser's own words are static descriptions; they still pass through the
        // redactor in case a future version quotes the input.
        Err(err) => Err(fail(&scrub(&err.to_string(), url))),
    }
}

/// The URL with any password (in the user-info part, or `pass=`/`password=` in the query)
/// replaced by `***`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => return url.to_string(),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    // User-info ends at the last '@' before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    out.push_str(&redact_query(tail));
    out
}

fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_string();
    };
    let (path, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{path}{}{fragment}", pairs.join("&"))
}

/// Removes the password of `url` from `text`, wherever it appears.
pub fn scrub(text: &str, url: &str) -> String {
    match url.into_connection_info() {
        Ok(info) => match info.redis_settings().password() {
            Some(pw) if !pw.is_empty() => text.replace(pw, "***"),
            _ => text.to_string(),
        },
        Err(_) => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_userinfo_and_query_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h"), "redis://:***@h");
        assert_eq!(redact("redis://user@h"), "redis://user@h");
        assert_eq!(redact("rediss://a:b:c@h/2"), "rediss://a:***@h/2");
        assert_eq!(
            redact("unix:///tmp/r.sock?db=2&pass=secret&user=u"),
            "unix:///tmp/r.sock?db=2&pass=***&user=u"
        );
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
    }

    #[test]
    fn parses_every_accepted_form() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis://user:pw@localhost:1234/3",
            "rediss://example.com",
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock?db=2&user=u&pass=p",
        ] {
            assert!(parse(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn rejects_malformed_urls_without_leaking_the_password() {
        for url in [
            "",
            "http://h",
            "redis://",
            "redis://:hunter2@h/notadb",
            "redis://h:99999",
        ] {
            let err = parse(url).expect_err(url);
            assert!(err.starts_with("url: "), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
