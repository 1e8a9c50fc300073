//! Redis URLs: parsing into connection settings, and a redacted form that is safe to show.
//! A password never leaves this module in a message: every error names the URL redacted.
//!
//! Passwords with special characters: the percent-encoded form (RFC 3986: `%2F` for `/`, `%40`
//! for `@`, `%25` for `%`, ...) always works. In the user-info of a `redis://`, `rediss://` or
//! Sentinel URL the raw form works too, `/ ? # @ :` included: the user-info runs from `://` to
//! the last `@` (before a Sentinel URL's `?sentinel_...=` query), since nothing after the host
//! may hold an `@`. A `%` followed by two hex digits is always an escape, so a literal `%` is
//! written `%25` there (a `%` followed by anything else is taken as is). In a query (`?pass=`
//! of a socket URL, `sentinel_password=`) a value may hold `/ ? @ :` raw, but `& # + %` must be
//! percent-encoded: values are read as a form's (as redis-py reads them), `+` as a space. The
//! parser and the redactor share one rule for where the user-info ends, so whatever is read as
//! a password is what is redacted.

use std::borrow::Cow;

use redis::{ConnectionInfo, IntoConnectionInfo};

/// The schemes the contract accepts.
const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
/// A Sentinel-managed master (an addition to the contract), plain or over TLS.
const SENTINEL_SCHEMES: [&str; 2] = ["redis+sentinel://", "rediss+sentinel://"];
/// The port of a sentinel when the URL gives none.
pub const SENTINEL_PORT: u16 = 26379;
/// Query keys whose values are secrets.
const SECRET_KEYS: [&str; 4] = ["pass", "password", "sentinel_password", "ssl_password"];
/// Query keys any accepted URL may hold: a secret value runs to the next `&` that starts one of
/// these (or to the end), so a raw `&` inside a password is never shown.
const QUERY_KEYS: [&str; 14] = [
    "db",
    "user",
    "username",
    "pass",
    "password",
    "protocol",
    "sentinel_username",
    "sentinel_password",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
    "ssl_password",
];

/// Where the text after the scheme starts, if the URL has one.
fn after_scheme(url: &str) -> Option<usize> {
    url.find("://").map(|i| i + 3)
}

/// Where the user-info would start: after `://`, or in a URL that lacks it (refused, but echoed
/// in the error) after its leading slashes, so that its password is masked all the same.
fn authority_start(url: &str) -> usize {
    after_scheme(url).unwrap_or_else(|| url.len() - url.trim_start_matches('/').len())
}

/// The first `?key=` or `&key=` of a secret query key in `rest`, if any.
fn first_secret_query(rest: &str) -> Option<usize> {
    SECRET_KEYS
        .iter()
        .flat_map(|key| {
            ['?', '&']
                .into_iter()
                .filter_map(move |sep| rest.find(&format!("{sep}{key}=")))
        })
        .min()
}

/// The user-info of `url` as a byte range `(start, at)`: from after `://` to the `@` that ends
/// it, which is the last `@` before any secret query key. None when there is none (a socket
/// URL whose path follows `://` directly has none either).
fn userinfo_range(url: &str) -> Option<(usize, usize)> {
    let start = authority_start(url);
    let rest = url.get(start..)?;
    if rest.starts_with('/') {
        return None;
    }
    let limit = first_secret_query(rest).unwrap_or(rest.len());
    let at = rest.get(..limit)?.rfind('@')?;
    Some((start, start + at))
}

/// The byte ranges of `url` that hold secrets: the password of the user-info (after its
/// first `:`), and the values of secret query keys (each up to the next `&known=` key, the
/// closing `#insecure`, or the end).
fn secret_ranges(url: &str) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    if let Some((start, at)) = userinfo_range(url) {
        if let Some(colon) = url.get(start..at).and_then(|info| info.find(':')) {
            ranges.push((start + colon + 1, at));
        }
    }
    let start = authority_start(url);
    let end_of_values = if url.ends_with("#insecure") {
        url.len() - "#insecure".len()
    } else {
        url.len()
    };
    for key in SECRET_KEYS {
        for sep in ['?', '&'] {
            let marker = format!("{sep}{key}=");
            let mut from = start;
            while let Some(found) = url.get(from..).and_then(|rest| rest.find(&marker)) {
                let value = from + found + marker.len();
                let rest = url.get(value..end_of_values.max(value)).unwrap_or_default();
                let end = QUERY_KEYS
                    .iter()
                    .filter_map(|k| rest.find(&format!("&{k}=")))
                    .min()
                    .map_or(value + rest.len(), |e| value + e);
                ranges.push((value, end));
                from = value;
            }
        }
    }
    ranges.sort_unstable();
    ranges
}

/// `url` with the characters that would end a raw user-info early (`/ ? # @`) percent-encoded
/// there, so that the standard parsers read the password the user wrote.
fn normalize(url: &str) -> Cow<'_, str> {
    let Some((start, at)) = userinfo_range(url) else {
        return Cow::Borrowed(url);
    };
    let (Some(head), Some(info), Some(tail)) =
        (url.get(..start), url.get(start..at), url.get(at..))
    else {
        return Cow::Borrowed(url);
    };
    if !info.contains(['/', '?', '#', '@']) {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len() + 8);
    out.push_str(head);
    for c in info.chars() {
        match c {
            '/' => out.push_str("%2F"),
            '?' => out.push_str("%3F"),
            '#' => out.push_str("%23"),
            '@' => out.push_str("%40"),
            c => out.push(c),
        }
    }
    out.push_str(tail);
    Cow::Owned(out)
}

/// `url` with its query read as redis-py reads it: a key given twice keeps its first value, and
/// a key with an empty value is left out (as if not given). The `ssl_*` options are not
/// reached here: `split_tls` refuses those given twice or empty.
fn tidy_query(url: &str) -> Cow<'_, str> {
    // A raw password may hold '?' or '&': only what follows the user-info is looked at.
    let from = userinfo_range(url).map_or(0, |(_, at)| at + 1);
    let Some(start) = url.get(from..).and_then(|tail| tail.find('?')) else {
        return Cow::Borrowed(url);
    };
    let start = from + start + 1;
    let end = url
        .get(start..)
        .and_then(|rest| rest.find('#'))
        .map_or(url.len(), |h| start + h);
    let (Some(head), Some(query), Some(tail)) =
        (url.get(..start), url.get(start..end), url.get(end..))
    else {
        return Cow::Borrowed(url);
    };
    let mut keys: Vec<&str> = Vec::new();
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if value.is_empty() || keys.contains(&key) {
            continue;
        }
        keys.push(key);
        kept.push(pair);
    }
    if kept.len() == query.split('&').count() {
        return Cow::Borrowed(url);
    }
    Cow::Owned(format!("{head}{}{tail}", kept.join("&")))
}

/// The TLS settings a `rediss://` URL may carry in its query, named as redis-py names them.
const TLS_KEYS: [&str; 5] = [
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
];

/// The TLS settings of a `rediss://` URL (`?ssl_ca_certs=...&ssl_certfile=...`): file paths as
/// given (the engine reads the files), and how the server's certificate is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of the CAs to trust instead of the built-in web roots.
    pub ca_certs: Option<String>,
    /// PEM file of the client certificate (chain) presented to the server.
    pub certfile: Option<String>,
    /// PEM file of the client certificate's private key (defaults to `certfile`).
    pub keyfile: Option<String>,
    /// `ssl_cert_reqs=none` turns this off: the server's certificate is not checked at all.
    pub verify_peer: bool,
    /// `ssl_check_hostname=false` turns this off: the certificate must chain to a trusted CA,
    /// but may name another host.
    pub check_hostname: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            ca_certs: None,
            certfile: None,
            keyfile: None,
            verify_peer: true,
            check_hostname: true,
        }
    }
}

impl TlsOptions {
    /// Whether the URL gave no TLS setting (the redis crate's defaults apply).
    pub fn is_default(&self) -> bool {
        *self == TlsOptions::default()
    }
}

/// Takes the `ssl_*` settings out of a URL's query: the URL without them, and the settings.
/// They are accepted on `rediss://` URLs of one server and on `rediss+sentinel://` URLs (for
/// the sentinels and the master alike), not on plain-text or unix socket URLs.
pub fn split_tls(url: &str) -> Result<(String, TlsOptions), String> {
    let fail = |why: &str| format!("url: invalid Redis URL '{}': {}", redact(url), why);
    // A raw password may hold '?', '#' or '&': only what follows the user-info is looked at.
    let (head, tail) = url.split_at(userinfo_range(url).map_or(0, |(_, at)| at + 1));
    let (before, fragment) = match tail.find('#') {
        Some(h) => tail.split_at(h),
        None => (tail, ""),
    };
    let Some((base, query)) = before.split_once('?') else {
        return Ok((url.to_string(), TlsOptions::default()));
    };
    let mut options = TlsOptions::default();
    let mut seen: Vec<&str> = Vec::new();
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !key.starts_with("ssl_") {
            kept.push(pair);
            continue;
        }
        if !TLS_KEYS.contains(&key) {
            return Err(fail(&format!(
                "unknown TLS option '{key}' (known: {})",
                TLS_KEYS.join(", ")
            )));
        }
        if seen.contains(&key) {
            return Err(fail(&format!("{key} is given twice")));
        }
        seen.push(key);
        let value = query_decode(value);
        let path = |value: String| {
            if value.is_empty() {
                Err(fail(&format!("{key} needs a file path")))
            } else {
                Ok(Some(value))
            }
        };
        match key {
            "ssl_ca_certs" => options.ca_certs = path(value)?,
            "ssl_certfile" => options.certfile = path(value)?,
            "ssl_keyfile" => options.keyfile = path(value)?,
            "ssl_cert_reqs" => {
                options.verify_peer = match value.to_ascii_lowercase().as_str() {
                    "required" | "optional" | "cert_required" | "cert_optional" => true,
                    "none" | "cert_none" => false,
                    _ => return Err(fail("ssl_cert_reqs must be required, optional or none")),
                }
            }
            _ => {
                options.check_hostname = match value.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "y" | "t" => true,
                    "false" | "0" | "no" | "n" | "f" => false,
                    _ => return Err(fail("ssl_check_hostname must be true or false")),
                }
            }
        }
    }
    if seen.is_empty() {
        return Ok((url.to_string(), options));
    }
    if !url.starts_with("rediss://") && !url.starts_with("rediss+sentinel://") {
        return Err(fail(
            "ssl_* options need a rediss:// or rediss+sentinel:// URL (not redis://, unix:// \
             or redis+sentinel://)",
        ));
    }
    if options.keyfile.is_some() && options.certfile.is_none() {
        return Err(fail("ssl_keyfile needs ssl_certfile"));
    }
    let mut plain = format!("{head}{base}");
    if !kept.is_empty() {
        plain.push('?');
        plain.push_str(&kept.join("&"));
    }
    plain.push_str(fragment);
    Ok((plain, options))
}

/// Whether a URL's query holds any `ssl_*` setting.
fn has_tls_query(url: &str) -> bool {
    let tail = url
        .get(userinfo_range(url).map_or(0, |(_, at)| at + 1)..)
        .unwrap_or_default();
    let before = tail.split('#').next().unwrap_or_default();
    before
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair.starts_with("ssl_")))
}

/// Where a client connects: one server, or whichever master the sentinels name.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Direct(ConnectionInfo),
    Sentinel(SentinelUrl),
}

/// `redis+sentinel://[user:pass@]host[:port][,host[:port]...]/service[/db]`
/// `[?sentinel_username=U&sentinel_password=P][#insecure]`: the user-info and db are the master's;
/// the sentinels take their own credentials from the query.
#[derive(Clone, Debug)]
pub struct SentinelUrl {
    pub sentinels: Vec<ConnectionInfo>,
    pub service: String,
    /// The `ssl_*` settings of a `rediss+sentinel://` URL (`split_tls` takes them off first):
    /// the engine applies them to the sentinels' connections and the master's alike.
    pub tls_options: TlsOptions,
    tls: bool,
    insecure: bool,
    userinfo: String,
    db: i64,
}

impl SentinelUrl {
    /// The settings of the master at `host:port` (as a sentinel named it).
    pub fn master_info(&self, host: &str, port: u16) -> Result<ConnectionInfo, String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let host = bracket(host);
        let fragment = if self.insecure { "#insecure" } else { "" };
        let url = format!(
            "{scheme}://{}{host}:{port}/{}{fragment}",
            self.userinfo, self.db
        );
        url.as_str()
            .into_connection_info()
            .map(auth_as_user)
            .map_err(|e| format!("the master {host}:{port} named by Sentinel: {e}"))
    }
}

/// Parses a URL of any accepted scheme, Sentinel included.
pub fn parse_endpoint(url: &str) -> Result<Endpoint, String> {
    if SENTINEL_SCHEMES
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        parse_sentinel(&normalize(url)).map(Endpoint::Sentinel)
    } else {
        parse(url).map(Endpoint::Direct)
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// A user without a password authenticates as that user with an empty password, as redis-py
/// does (`AUTH user ""`, which an ACL `nopass` user accepts): the redis crate sends AUTH only
/// with a password, so the connection would act as the `default` user instead.
fn auth_as_user(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info.redis_settings();
    if settings.username().is_some() && settings.password().is_none() {
        let redis = settings.clone().set_password("");
        info.set_redis_settings(redis)
    } else {
        info
    }
}

fn parse_sentinel(url: &str) -> Result<SentinelUrl, String> {
    let fail = |why: &str| format!("url: invalid Sentinel URL '{}': {}", redact(url), why);
    let (scheme, rest) = url.split_once("://").ok_or_else(|| fail("no scheme"))?;
    let tls = scheme == "rediss+sentinel";
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, f),
        None => (rest, ""),
    };
    let insecure = match fragment {
        "" => false,
        "insecure" => true,
        _ => return Err(fail("the only fragment understood is #insecure")),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, q),
        None => (rest, ""),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let mut parts = path.trim_start_matches('/').split('/');
    let service = parts.next().unwrap_or_default();
    if service.is_empty() {
        return Err(fail(
            "the path must name the master's service: /service[/db]",
        ));
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| fail("the db must be a non-negative integer"))?,
    };
    if parts.next().is_some() {
        return Err(fail("the path is /service[/db]"));
    }
    let (mut s_user, mut s_pass) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // As redis-py reads a query: the first value of a key wins, an empty one is none.
        match pair.split_once('=') {
            Some(("sentinel_username" | "sentinel_password", "")) => {}
            Some(("sentinel_username", v)) => {
                s_user = s_user.or_else(|| Some(query_decode(v)));
            }
            Some(("sentinel_password", v)) => {
                s_pass = s_pass.or_else(|| Some(query_decode(v)));
            }
            _ => {
                return Err(fail(
                    "the query may hold only sentinel_username and sentinel_password",
                ))
            }
        }
    }
    let s_user = s_user.unwrap_or_default();
    let s_userinfo = match (&s_user[..], &s_pass) {
        ("", None) => String::new(),
        (user, None) => format!("{}@", percent_encode(user)),
        (user, Some(pass)) => format!("{}:{}@", percent_encode(user), percent_encode(pass)),
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        let (name, port) =
            split_host_port(host).ok_or_else(|| fail("a sentinel is host[:port]"))?;
        let scheme = if tls { "rediss" } else { "redis" };
        let fragment = if insecure { "#insecure" } else { "" };
        let one = format!("{scheme}://{s_userinfo}{}:{port}{fragment}", bracket(name));
        let info = one
            .as_str()
            .into_connection_info()
            .map_err(|e| fail(&scrub(&e.to_string(), url)))?;
        sentinels.push(auth_as_user(info));
    }
    let parsed = SentinelUrl {
        sentinels,
        service: percent_decode(service),
        tls_options: TlsOptions::default(),
        tls,
        insecure,
        userinfo: userinfo.to_string(),
        db,
    };
    // The master's settings must parse too (checked once here, with a placeholder address).
    parsed
        .master_info("127.0.0.1", 6379)
        .map_err(|_| fail("bad credentials or db for the master"))?;
    Ok(parsed)
}

/// `host[:port]` or `[v6]:port`; the port defaults to Sentinel's.
fn split_host_port(text: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        match rest.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if rest.is_empty() => (host, None),
            None => return None,
        }
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
    };
    Some((host, port))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let value = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(value as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query value decoded as a form is (and as redis-py's `parse_qs` reads it): `+` is a space,
/// then `%XX` escapes (so `%2B` is a `+`).
fn query_decode(text: &str) -> String {
    percent_decode(&text.replace('+', " "))
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses a Redis URL, or says why not (with the URL redacted).
pub fn parse(url: &str) -> Result<ConnectionInfo, String> {
    let fail = |why: &str| format!("url: invalid Redis URL '{}': {}", redact(url), why);
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(fail(
            "the scheme must be redis://, rediss://, redis+unix:// or unix://",
        ));
    }
    if has_tls_query(url) {
        // `split_tls` takes them off first where they are supported.
        return Err(fail(
            "the ssl_* options are taken by Client(url) and Redlock master URLs, not here \
             (e.g. not by cluster seeds)",
        ));
    }
    let normalized = normalize(url);
    let normalized = tidy_query(&normalized);
    let info = match normalized.as_ref().into_connection_info() {
        Ok(info) => with_query_settings(&normalized, info).map_err(&fail)?,
        // The parser's own words are static descriptions; they still pass through the
        // redactor in case a future version quotes the input.
        Err(err) => return Err(fail(&scrub(&err.to_string(), url))),
    };
    if info.redis_settings().db() < 0 {
        return Err(fail("the db must be a non-negative integer"));
    }
    Ok(auth_as_user(info))
}

/// A URL's `db`, `username` and `password` query settings, read as redis-py reads them (the
/// query's db over the path's; the user-info's credentials over the query's), which the standard
/// parser passes over: `redis://host?db=5` must be the same database for every client, and
/// `unix:///path?password=...` (redis-py's form; `user=`/`pass=` are the standard parser's) the
/// same credentials. Other query keys (redis-py's socket and pool options) are left to the
/// client's own settings.
fn with_query_settings(url: &str, info: ConnectionInfo) -> Result<ConnectionInfo, &'static str> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(info);
    };
    let query = query.split('#').next().unwrap_or_default();
    let mut redis = info.redis_settings().clone();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = query_decode(value);
        redis = match key {
            "db" => match value.parse::<i64>() {
                Ok(db) if db >= 0 => redis.set_db(db),
                _ => return Err("the db must be a non-negative integer"),
            },
            "username" if redis.username().is_none() => redis.set_username(value),
            "password" if redis.password().is_none() => redis.set_password(value),
            _ => redis,
        };
    }
    Ok(info.set_redis_settings(redis))
}

/// The URL with any password (in the user-info part, or `pass=`/`password=`/
/// `sentinel_password=` in the query) replaced by `***`.
pub fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for (start, end) in secret_ranges(url) {
        if start < at {
            // Overlapping ranges: extend the one already masked.
            at = at.max(end);
            continue;
        }
        out.push_str(url.get(at..start).unwrap_or_default());
        out.push_str("***");
        at = end;
    }
    out.push_str(url.get(at..).unwrap_or_default());
    out
}

/// Removes the password of `url` from `text`, wherever it appears (raw, percent-decoded, or as
/// the parser read it).
pub fn scrub(text: &str, url: &str) -> String {
    let mut secrets: Vec<String> = Vec::new();
    if let Ok(info) = normalize(url).as_ref().into_connection_info() {
        if let Some(pw) = info.redis_settings().password() {
            secrets.push(pw.to_string());
        }
    }
    for (start, end) in secret_ranges(url) {
        if let Some(raw) = url.get(start..end) {
            secrets.push(raw.to_string());
            secrets.push(percent_decode(raw));
            secrets.push(percent_decode(&raw.replace('+', " ")));
            // As a query parser reads it: up to the first '&'.
            let first = raw.split('&').next().unwrap_or_default();
            secrets.push(percent_decode(first));
            secrets.push(percent_decode(&first.replace('+', " ")));
        }
    }
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), "***");
    }
    out
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
    fn a_url_missing_its_scheme_is_refused_without_its_password() {
        for (url, shown) in [
            ("redis:/alice:S3CRET@h:1/0", "redis:***@h:1/0"),
            ("alice:S3CRET@h:1", "alice:***@h:1"),
            ("//alice:S3CRET@h", "//alice:***@h"),
            ("redis//alice:S3CRET@h", "redis//alice:***@h"),
            ("h:1?pass=S3CRET", "h:1?pass=***"),
            ("h:1/0", "h:1/0"),
        ] {
            assert_eq!(redact(url), shown);
            let err = parse(url).unwrap_err();
            assert!(!err.contains("S3CRET") && err.contains(shown), "{err}");
        }
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
    fn reads_the_db_and_credentials_of_a_tcp_urls_query_as_redis_py_does() {
        let settings = |url: &str| parse(url).unwrap().redis_settings().clone();
        assert_eq!(settings("redis://h:1?db=5").db(), 5);
        assert_eq!(settings("redis://h:1/2?db=5").db(), 5); // the query's over the path's
        assert_eq!(settings("rediss://h:1/?db=7&socket_timeout=5").db(), 7);
        let s = settings("redis://h:1?username=u&password=p%40w");
        assert_eq!((s.username(), s.password()), (Some("u"), Some("p@w")));
        let s = settings("redis://a:b@h:1?username=u&password=p");
        assert_eq!((s.username(), s.password()), (Some("a"), Some("b")));
        for bad in ["redis://h:1/-1", "redis://h:1?db=-1", "redis://h:1?db=x"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("non-negative"), "{bad}: {err}");
        }
        assert!(parse("redis://h:1?db=5&password=secret")
            .map(|i| i.redis_settings().db())
            .is_ok());
    }

    #[test]
    fn reads_redis_pys_credentials_in_a_unix_urls_query_too() {
        let settings = |url: &str| parse(url).unwrap().redis_settings().clone();
        let s = settings("unix:///tmp/r.sock?db=1&username=u&password=p%40w");
        assert_eq!(
            (s.db(), s.username(), s.password()),
            (1, Some("u"), Some("p@w"))
        );
        let s = settings("unix:///tmp/r.sock?db=2&user=a&pass=b&username=u&password=p");
        assert_eq!(
            (s.db(), s.username(), s.password()),
            (2, Some("a"), Some("b"))
        );
        let s = settings("redis+unix:///tmp/r.sock?password=p");
        assert_eq!((s.db(), s.password()), (0, Some("p")));
    }

    #[test]
    fn a_user_without_a_password_authenticates_with_an_empty_one() {
        for url in [
            "redis://svc@h:1/0",
            "redis://svc:@h:1/0",
            "rediss://svc@h:1/0",
            "unix:///tmp/r.sock?user=svc",
            "unix:///tmp/r.sock?db=1&username=svc",
            "redis://h:1/0?username=svc",
        ] {
            let info = parse(url).expect(url);
            let s = info.redis_settings();
            assert_eq!(
                (s.username(), s.password()),
                (Some("svc"), Some("")),
                "{url}"
            );
        }
        // No user: no AUTH, as before.
        for url in ["redis://h:1/0", "redis://:@h:1/0", "unix:///tmp/r.sock"] {
            assert_eq!(
                parse(url).unwrap().redis_settings().password(),
                None,
                "{url}"
            );
        }
        let Ok(Endpoint::Sentinel(s)) =
            parse_endpoint("redis+sentinel://svc@h:5000/m?sentinel_username=watch")
        else {
            panic!("not a sentinel URL");
        };
        let sentinel = s.sentinels[0].redis_settings();
        assert_eq!(
            (sentinel.username(), sentinel.password()),
            (Some("watch"), Some(""))
        );
        let master = s.master_info("10.0.0.1", 7000).unwrap();
        let master = master.redis_settings();
        assert_eq!(
            (master.username(), master.password()),
            (Some("svc"), Some(""))
        );
    }

    #[test]
    fn a_plus_in_a_query_value_is_a_space_as_in_redis_py() {
        let (_, o) = split_tls("rediss://h/0?ssl_ca_certs=/ca+dir/a%2Bb.pem").unwrap();
        assert_eq!(o.ca_certs.as_deref(), Some("/ca dir/a+b.pem"));
        let s = parse("redis://h:1/0?username=u+1&password=p+w%2B")
            .unwrap()
            .redis_settings()
            .clone();
        assert_eq!((s.username(), s.password()), (Some("u 1"), Some("p w+")));
        // The standard parser reads a socket URL's user/pass the same way.
        let s = parse("unix:///tmp/r.sock?user=u+1&pass=p+w%2B")
            .unwrap()
            .redis_settings()
            .clone();
        assert_eq!((s.username(), s.password()), (Some("u 1"), Some("p w+")));
        let Ok(Endpoint::Sentinel(s)) = parse_endpoint(
            "redis+sentinel://h:5000/m?sentinel_username=w+1&sentinel_password=s+p%2B",
        ) else {
            panic!("not a sentinel URL");
        };
        let sentinel = s.sentinels[0].redis_settings();
        assert_eq!(
            (sentinel.username(), sentinel.password()),
            (Some("w 1"), Some("s p+"))
        );
    }

    #[test]
    fn a_keys_first_value_wins_and_an_empty_one_is_none_as_in_redis_py() {
        let settings = |url: &str| parse(url).expect(url).redis_settings().clone();
        assert_eq!(settings("redis://h:1/0?db=3&db=4").db(), 3);
        assert_eq!(settings("redis://h:1/3?db=").db(), 3);
        assert_eq!(settings("redis://h:1/3?db=&db=5").db(), 5);
        assert_eq!(settings("unix:///tmp/r.sock?db=2&db=4").db(), 2);
        assert_eq!(settings("unix:///tmp/r.sock?db=&user=u").db(), 0);
        let s = settings("redis://h:1/0?password=&password=b&password=c");
        assert_eq!(s.password(), Some("b"));
        let s = settings("unix:///tmp/r.sock?pass=&user=u&pass=p&user=v");
        assert_eq!((s.username(), s.password()), (Some("u"), Some("p")));
        // A raw '?' or '&' in the user-info's password is not the query.
        let s = settings("rediss://u:p?db=9&db=@h:1/1?db=2&db=3#insecure");
        assert_eq!((s.db(), s.password()), (2, Some("p?db=9&db=")));
        let Ok(Endpoint::Sentinel(s)) = parse_endpoint(
            "redis+sentinel://h:5000/m?sentinel_password=&sentinel_password=a&sentinel_password=b",
        ) else {
            panic!("not a sentinel URL");
        };
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("a"));
    }

    #[test]
    fn parses_sentinel_urls() {
        let Ok(Endpoint::Sentinel(s)) = parse_endpoint(
            "redis+sentinel://u:pw@127.0.0.1:5000,[::1],h2:26380/mymaster/2?sentinel_password=sp%40x",
        ) else {
            panic!("not a sentinel URL");
        };
        assert_eq!(s.service, "mymaster");
        assert_eq!(s.sentinels.len(), 3);
        assert_eq!(s.sentinels[0].addr().to_string(), "127.0.0.1:5000");
        assert_eq!(s.sentinels[1].addr().to_string(), "::1:26379");
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("sp@x"));
        let master = s.master_info("10.0.0.1", 7000).unwrap();
        assert_eq!(master.addr().to_string(), "10.0.0.1:7000");
        assert_eq!(master.redis_settings().db(), 2);
        assert_eq!(master.redis_settings().username(), Some("u"));
        assert_eq!(master.redis_settings().password(), Some("pw"));
        assert!(matches!(
            parse_endpoint("redis://h:1/0"),
            Ok(Endpoint::Direct(_))
        ));
        assert!(matches!(
            parse_endpoint("redis+sentinel://h/svc"),
            Ok(Endpoint::Sentinel(_))
        ));
        for bad in [
            "redis+sentinel://h",
            "redis+sentinel://h/",
            "redis+sentinel://h/svc/x",
            "redis+sentinel://h:0/svc",
            "redis+sentinel://h/svc/1/2",
            "redis+sentinel://:hunter2@h/svc?what=1",
            "redis+sentinel://h/svc#other",
        ] {
            let err = parse_endpoint(bad).map(|_| ()).expect_err(bad);
            assert!(err.starts_with("url: "), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn redacts_sentinel_secrets() {
        assert_eq!(
            redact("redis+sentinel://u:pw@h1,h2:1/m?sentinel_password=s3&x=1#insecure"),
            "redis+sentinel://u:***@h1,h2:1/m?sentinel_password=***#insecure"
        );
        let text = "boom s3 and pw and s@x";
        assert_eq!(
            scrub(
                text,
                "redis+sentinel://u:pw@h/m?sentinel_password=s%40x&y=s3"
            ),
            "boom s3 and *** and ***"
        );
    }

    #[test]
    fn splits_tls_options_off_the_query() {
        let (plain, o) = split_tls(
            "rediss://u:pw@h:1/2?ssl_ca_certs=%2Fetc%2Fca%20x.pem&protocol=resp3\
             &ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_cert_reqs=Required&ssl_check_hostname=false",
        )
        .unwrap();
        assert_eq!(plain, "rediss://u:pw@h:1/2?protocol=resp3");
        assert_eq!(o.ca_certs.as_deref(), Some("/etc/ca x.pem"));
        assert_eq!(o.certfile.as_deref(), Some("/c.pem"));
        assert_eq!(o.keyfile.as_deref(), Some("/k.pem"));
        assert!(o.verify_peer && !o.check_hostname);
        // A raw password with '?', '#' and '&' is left alone.
        let (plain, o) = split_tls("rediss://u:p?a#b&c@h:1/0?ssl_cert_reqs=none").unwrap();
        assert_eq!(plain, "rediss://u:p?a#b&c@h:1/0");
        assert!(!o.verify_peer);
        assert!(!has_tls_query("rediss://u:p?ssl_x@h:1/0"));
        let (plain, o) = split_tls("rediss://h/0?ssl_cert_reqs=none#insecure").unwrap();
        assert_eq!(plain, "rediss://h/0#insecure");
        assert!(!o.verify_peer);
        for url in [
            "rediss://h/0",
            "redis://h/0?protocol=resp3",
            "unix:///s?db=1",
        ] {
            let (plain, o) = split_tls(url).unwrap();
            assert_eq!(plain, url);
            assert!(o.is_default());
        }
        let (plain, o) =
            split_tls("rediss+sentinel://:pw@h1,h2/svc?ssl_ca_certs=/ca&sentinel_password=s")
                .unwrap();
        assert_eq!(plain, "rediss+sentinel://:pw@h1,h2/svc?sentinel_password=s");
        assert_eq!(o.ca_certs.as_deref(), Some("/ca"));
        for bad in [
            "redis://:hunter2@h/0?ssl_cert_reqs=none",
            "redis+sentinel://:hunter2@h/svc?ssl_cert_reqs=none",
            "rediss://:hunter2@h/0?ssl_cert_reqs=sometimes",
            "rediss://:hunter2@h/0?ssl_check_hostname=2",
            "rediss://:hunter2@h/0?ssl_keyfile=/k",
            "rediss://:hunter2@h/0?ssl_ca_certs=",
            "rediss://:hunter2@h/0?ssl_ca_certs=/a&ssl_ca_certs=/b",
            "rediss://h/0?ssl_password=hunter2",
        ] {
            let err = split_tls(bad).map(|_| ()).expect_err(bad);
            assert!(err.starts_with("url: "), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        // Where the options are not taken off first, they are refused, never ignored.
        assert!(parse("rediss://h/0?ssl_cert_reqs=none").is_err());
    }

    #[test]
    fn raw_special_characters_in_the_password_are_read_and_redacted() {
        // Raw in the user-info: everything up to the last '@' is the user-info.
        for (url, password) in [
            ("redis://user:se/cret@localhost:6379/0", "se/cret"),
            ("redis://user:a/b@c:d?e#f@127.0.0.1:1/2", "a/b@c:d?e#f"),
            ("rediss://:p@ss@h/0#insecure", "p@ss"),
            ("redis://u:pa%ss@h", "pa%ss"),
            ("redis://u:pässwörd@h", "pässwörd"),
            ("redis://u:se%2Fc%40r%3Ae%3Ft%23%25@h/0", "se/c@r:e?t#%"),
        ] {
            let info = parse(url).expect(url);
            assert_eq!(info.redis_settings().password(), Some(password), "{url}");
            assert_eq!(
                info.redis_settings().username(),
                Some("user")
                    .filter(|_| url.contains("user:"))
                    .or(info.redis_settings().username())
            );
            let shown = redact(url);
            assert!(!shown.contains(password), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert_eq!(
            parse("redis://user:se/cret@localhost:6379/3")
                .unwrap()
                .redis_settings()
                .db(),
            3
        );
        assert_eq!(
            redact("redis://user:se/cret@localhost:6379/0"),
            "redis://user:***@localhost:6379/0"
        );
        assert_eq!(
            redact("redis://u:a#b@h:1/0?protocol=resp3"),
            "redis://u:***@h:1/0?protocol=resp3"
        );
        // In a query, a secret value runs to the next known key.
        assert_eq!(
            redact("unix:///tmp/r.sock?pass=a&b#c&db=1"),
            "unix:///tmp/r.sock?pass=***&db=1"
        );
        let Ok(Endpoint::Sentinel(s)) =
            parse_endpoint("redis+sentinel://u:p/w@h:5000/m/1?sentinel_password=x@y")
        else {
            panic!("not a sentinel URL");
        };
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("x@y"));
        let master = s.master_info("10.0.0.1", 7000).unwrap();
        assert_eq!(master.redis_settings().password(), Some("p/w"));
        assert_eq!(
            redact("redis+sentinel://u:p/w@h:5000/m/1?sentinel_password=x@y"),
            "redis+sentinel://u:***@h:5000/m/1?sentinel_password=***"
        );
        for bad in [
            "redis://user:se/cret@localhost:6379/x",
            "redis://user:se/cret@localhost:99999/0",
            "redis+sentinel://user:se/cret@h/m/x",
        ] {
            let err = parse_endpoint(bad).map(|_| ()).expect_err(bad);
            assert!(!err.contains("cret"), "{err}");
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
