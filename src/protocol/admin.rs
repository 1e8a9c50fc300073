//! What the command line (`python -m redmutex status | list | release`) needs of the protocol,
//! sans-I/O: every key of a name by role, telling a key found by SCAN back to its name and
//! role, the SCAN pattern of a prefix, what a URL connects to, and the force-release step.

use redis::{ConnectionAddr, ConnectionInfo, Script, ScriptInvocation, Value};
use std::sync::LazyLock;

use super::keys::Keys;
use super::replies::UnexpectedReply;
use super::url::{self, Endpoint, TlsOptions};

/// One key of a named primitive: the primitive's kind, the key's role (the name of its `Keys`
/// method) and how it is built.
pub struct Role {
    pub kind: &'static str,
    pub role: &'static str,
    build: fn(&Keys) -> Vec<u8>,
}

impl Role {
    /// This role's key for `keys`.
    pub fn key(&self, keys: &Keys) -> Vec<u8> {
        (self.build)(keys)
    }

    /// What follows `prefix{name}` in this role's key (the same for every name).
    pub fn suffix(&self) -> Vec<u8> {
        let empty = Keys::new(b"", b"");
        let mut key = (self.build)(&empty);
        key.drain(..empty.base().len());
        key
    }
}

/// The kinds of primitive, in the order the command line lists them.
pub const KINDS: [&str; 4] = ["lock", "semaphore", "rwlock", "cache"];

/// Every key of a named primitive (not the wake-up channels, which are no keys).
pub const ROLES: [Role; 13] = [
    Role {
        kind: "lock",
        role: "lock",
        build: Keys::lock,
    },
    Role {
        kind: "lock",
        role: "fence",
        build: Keys::fence,
    },
    Role {
        kind: "lock",
        role: "queue",
        build: Keys::queue,
    },
    Role {
        kind: "semaphore",
        role: "semaphore_holders",
        build: Keys::semaphore_holders,
    },
    Role {
        kind: "semaphore",
        role: "semaphore_limit",
        build: Keys::semaphore_limit,
    },
    Role {
        kind: "semaphore",
        role: "semaphore_queue",
        build: Keys::semaphore_queue,
    },
    Role {
        kind: "semaphore",
        role: "semaphore_queue_deadlines",
        build: Keys::semaphore_queue_deadlines,
    },
    Role {
        kind: "rwlock",
        role: "rw_readers",
        build: Keys::rw_readers,
    },
    Role {
        kind: "rwlock",
        role: "rw_writer",
        build: Keys::rw_writer,
    },
    Role {
        kind: "rwlock",
        role: "rw_writers_waiting",
        build: Keys::rw_writers_waiting,
    },
    Role {
        kind: "cache",
        role: "cache_value",
        build: Keys::cache_value,
    },
    Role {
        kind: "cache",
        role: "cache_fill",
        build: Keys::cache_fill,
    },
    Role {
        kind: "lock",
        role: "lock_holds",
        build: Keys::lock_holds,
    },
];

/// `(role, key)` of every key of `name`, and `("wake_channel", channel)`.
pub fn keys_by_role(keys: &Keys) -> Vec<(&'static str, Vec<u8>)> {
    let mut all: Vec<_> = ROLES.iter().map(|r| (r.role, r.key(keys))).collect();
    all.push(("wake_channel", keys.wake_channel()));
    all
}

/// `(name, role)` of a key of redmutex under `prefix`, or None for a key of something else.
/// A key is `prefix + "{" + name + "}" + suffix`; names may hold braces, suffixes never do, so
/// the name ends at the last `}`.
pub fn split_key<'a>(prefix: &[u8], key: &'a [u8]) -> Option<(&'a [u8], &'static Role)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(b"{")?;
    let close = rest.iter().rposition(|&b| b == b'}')?;
    let (name, suffix) = (&rest[..close], &rest[close + 1..]);
    if name.is_empty() {
        return None;
    }
    let role = ROLES.iter().find(|r| r.suffix() == suffix)?;
    Some((name, role))
}

/// The SCAN pattern of every key under `prefix`: the prefix glob-escaped, then `{*`.
pub fn scan_pattern(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 2);
    for &b in prefix {
        if b"*?[]\\".contains(&b) {
            pattern.push(b'\\');
        }
        pattern.push(b);
    }
    pattern.extend_from_slice(b"{*");
    pattern
}

/// Where a URL connects and with what credentials, for a client of another library (the
/// command line's redis-py) to reach the very server a `Client` of this URL reaches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UrlParts {
    /// The server's `(host, port)`; the sentinels' for a Sentinel URL; none for a socket.
    pub hosts: Vec<(String, u16)>,
    /// The unix socket's path.
    pub socket: Option<String>,
    /// The Sentinel service that names the master.
    pub service: Option<String>,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    /// The sentinels' own credentials.
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    pub tls: bool,
    /// `#insecure`: the server's certificate is not checked.
    pub insecure: bool,
    /// `?ssl_...` settings of a `rediss://` URL.
    pub tls_options: TlsOptions,
}

fn credentials(parts: &mut UrlParts, info: &ConnectionInfo) {
    let settings = info.redis_settings();
    parts.db = settings.db();
    parts.username = settings.username().map(str::to_string);
    parts.password = settings.password().map(str::to_string);
}

fn host_port(addr: &ConnectionAddr) -> Option<(String, u16, bool, bool)> {
    match addr {
        ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port, false, false)),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => Some((host.clone(), *port, true, *insecure)),
        _ => None,
    }
}

/// The parts of any URL a `Client` accepts (Sentinel and `?ssl_*` included), or why not (the
/// URL redacted in the message).
pub fn url_parts(text: &str) -> Result<UrlParts, String> {
    let (plain, tls_options) = url::split_tls(text)?;
    let mut parts = UrlParts {
        tls_options,
        ..UrlParts::default()
    };
    match url::parse_endpoint(&plain)? {
        Endpoint::Direct(info) => {
            credentials(&mut parts, &info);
            match info.addr() {
                ConnectionAddr::Unix(path) => {
                    parts.socket = Some(path.to_string_lossy().into_owned());
                }
                addr => {
                    let (host, port, tls, insecure) = host_port(addr).ok_or_else(|| {
                        format!("url: unsupported address in '{}'", url::redact(text))
                    })?;
                    parts.hosts.push((host, port));
                    parts.tls = tls;
                    parts.insecure = insecure;
                }
            }
        }
        Endpoint::Sentinel(sentinel) => {
            // The master's settings, with a placeholder address (the sentinels name the master).
            let master = sentinel.master_info("127.0.0.1", 6379)?;
            credentials(&mut parts, &master);
            if let Some((_, _, tls, insecure)) = host_port(master.addr()) {
                parts.tls = tls;
                parts.insecure = insecure;
            }
            for info in &sentinel.sentinels {
                if let Some((host, port, _, _)) = host_port(info.addr()) {
                    parts.hosts.push((host, port));
                }
            }
            if let Some(first) = sentinel.sentinels.first() {
                let settings = first.redis_settings();
                parts.sentinel_username = settings.username().map(str::to_string);
                parts.sentinel_password = settings.password().map(str::to_string);
            }
            parts.service = Some(sentinel.service.clone());
        }
    }
    Ok(parts)
}

/// `text` on one line, without the passwords of `urls` (raw, percent-decoded, or as a parser
/// reads them, wherever they appear) and with every URL in it redacted (`url::redact` of each
/// word holding `://`): for messages that quote a URL given on a command line.
pub fn redact_text(text: &str, urls: &[String]) -> String {
    let mut scrubbed = text.to_string();
    for u in urls.iter().filter(|u| !u.is_empty()) {
        scrubbed = url::scrub(&scrubbed, u);
    }
    scrubbed
        .split_whitespace()
        .map(|word| {
            if word.contains("://") {
                url::redact(word)
            } else {
                word.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a forced release took away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Freed {
    /// The lock holder's token.
    pub lock: Option<Vec<u8>>,
    /// Live semaphore holders.
    pub semaphore_holders: i64,
    /// The RWLock writer's token.
    pub writer: Option<Vec<u8>>,
    /// Live RWLock readers.
    pub readers: i64,
    /// The cache fill claim's token.
    pub fill: Option<Vec<u8>>,
    /// Live places of waiting RWLock writers (each holds new readers back).
    pub writers_waiting: i64,
}

/// The outcome of a forced release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceRelease {
    Freed(Freed),
    /// The lock's holder was not the one expected: nothing was touched.
    HolderChanged,
}

pub(crate) const FORCE_RELEASE_SOURCE: &str = include_str!("lua/force_release.lua");
static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE_RELEASE_SOURCE));

/// Frees everything held under one name, whoever holds it, and wakes its waiters; the lock only
/// while `expected` holds it (empty: whoever does). See `lua/force_release.lua`.
pub fn force_release(keys: &Keys, expected: &[u8]) -> ScriptInvocation<'static> {
    let mut inv = FORCE_RELEASE.prepare_invoke();
    inv.key(keys.lock())
        .key(keys.semaphore_holders())
        .key(keys.rw_writer())
        .key(keys.rw_readers())
        .key(keys.cache_fill())
        .key(keys.lock_holds())
        .key(keys.rw_writers_waiting())
        .key(keys.semaphore_limit())
        .key(keys.semaphore_queue_deadlines())
        .arg(keys.wake_channel())
        .arg(expected);
    inv
}

/// Parses the reply of `force_release`.
pub fn parse_force_release(value: &Value) -> Result<ForceRelease, UnexpectedReply> {
    let unexpected = || UnexpectedReply(format!("force release: {value:?}"));
    let token = |v: &Value| match v {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(bytes.clone())),
        Value::SimpleString(s) => Ok(Some(s.as_bytes().to_vec())),
        _ => Err(unexpected()),
    };
    let count = |v: &Value| match v {
        Value::Int(n) => Ok(*n),
        _ => Err(unexpected()),
    };
    match value {
        Value::Int(-1) => Ok(ForceRelease::HolderChanged),
        Value::Array(items) if items.len() == 6 => Ok(ForceRelease::Freed(Freed {
            lock: token(&items[0])?,
            semaphore_holders: count(&items[1])?,
            writer: token(&items[2])?,
            readers: count(&items[3])?,
            fill: token(&items[4])?,
            writers_waiting: count(&items[5])?,
        })),
        _ => Err(unexpected()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_cover_every_key_and_split_back() {
        let keys = Keys::new(b"p:", b"a{b}c");
        for role in &ROLES {
            let key = role.key(&keys);
            let (name, found) = split_key(b"p:", &key).unwrap();
            assert_eq!(name, b"a{b}c");
            assert_eq!(found.role, role.role);
            assert!(KINDS.contains(&role.kind));
        }
        assert_eq!(ROLES[0].suffix(), b":lock");
        assert_eq!(ROLES[2].suffix(), b":lock:queue");
        assert_eq!(ROLES[6].suffix(), b":sem:queue:deadlines");
        assert!(split_key(b"p:", b"p:{n}:wake").is_none());
        assert!(split_key(b"p:", b"q:{n}:lock").is_none());
        assert!(split_key(b"p:", b"p:{}:lock").is_none());
        assert!(split_key(b"p:", b"p:n:lock").is_none());
        let all = keys_by_role(&keys);
        assert_eq!(all.len(), ROLES.len() + 1);
        assert_eq!(all[all.len() - 1].1, keys.wake_channel());
    }

    #[test]
    fn scan_patterns_escape_the_prefix() {
        assert_eq!(scan_pattern(b"redmutex:"), b"redmutex:{*");
        assert_eq!(scan_pattern(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\{*");
    }

    #[test]
    fn url_parts_of_every_form() {
        let p = url_parts("redis://u:p/w@h:7/3").unwrap();
        assert_eq!(p.hosts, vec![("h".to_string(), 7)]);
        assert_eq!(
            (p.db, p.username.as_deref(), p.password.as_deref()),
            (3, Some("u"), Some("p/w"))
        );
        assert!(!p.tls);
        let p = url_parts("rediss://h/0?ssl_ca_certs=/ca.pem#insecure").unwrap();
        assert!(p.tls && p.insecure);
        assert_eq!(p.tls_options.ca_certs.as_deref(), Some("/ca.pem"));
        let p = url_parts("unix:///tmp/s.sock?db=2&user=u&pass=x").unwrap();
        assert_eq!(p.socket.as_deref(), Some("/tmp/s.sock"));
        assert_eq!(
            (p.db, p.username.as_deref(), p.password.as_deref()),
            (2, Some("u"), Some("x"))
        );
        let p = url_parts("redis+sentinel://u:pw@h1,h2:5/svc/4?sentinel_password=sp").unwrap();
        assert_eq!(
            p.hosts,
            vec![("h1".to_string(), 26379), ("h2".to_string(), 5)]
        );
        assert_eq!(p.service.as_deref(), Some("svc"));
        assert_eq!((p.db, p.password.as_deref()), (4, Some("pw")));
        assert_eq!(p.sentinel_password.as_deref(), Some("sp"));
        let err = url_parts("redis://:hunter2@h/x").unwrap_err();
        assert!(
            err.starts_with("url: ") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn text_is_redacted_on_one_line() {
        let url = "redis://u:se cret@h:1/0".to_string();
        assert_eq!(
            redact_text("bad\n 'redis://a:pw@h/x' and se cret", &[url]),
            "bad 'redis://a:***@h/x' and ***"
        );
        assert_eq!(
            redact_text("at unix:///s?pass=pw&db=1", &[]),
            "at unix:///s?pass=***&db=1"
        );
    }

    #[test]
    fn force_release_replies() {
        let freed = Value::Array(vec![
            Value::BulkString(b"tok".to_vec()),
            Value::Int(2),
            Value::Nil,
            Value::Int(0),
            Value::Nil,
            Value::Int(1),
        ]);
        assert_eq!(
            parse_force_release(&freed),
            Ok(ForceRelease::Freed(Freed {
                lock: Some(b"tok".to_vec()),
                semaphore_holders: 2,
                writers_waiting: 1,
                ..Freed::default()
            }))
        );
        assert_eq!(
            parse_force_release(&Value::Int(-1)),
            Ok(ForceRelease::HolderChanged)
        );
        assert!(parse_force_release(&Value::Int(0)).is_err());
        let inv = force_release(&Keys::new(b"p:", b"n"), b"");
        let _ = inv;
    }
}
