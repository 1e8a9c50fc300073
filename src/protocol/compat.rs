//! The steps that differ for the drop-in shims (`redmutex.compat`): python-redis-lock's release
//! (which also pushes its signal list), redis-py's extend (adding to the lease), and a reset.
//! Everything else of a shim is the lock's own steps on `Keys::with_lock_key`.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation, Value};

use super::keys::Keys;
use super::replies::{parse_int, UnexpectedReply};
use super::step::Step;

pub(crate) const COMPAT_SIGNAL_RELEASE_SOURCE: &str = include_str!("lua/compat_signal_release.lua");
pub static COMPAT_SIGNAL_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(COMPAT_SIGNAL_RELEASE_SOURCE));
pub(crate) const COMPAT_EXTEND_SOURCE: &str = include_str!("lua/compat_extend.lua");
pub static COMPAT_EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(COMPAT_EXTEND_SOURCE));
pub(crate) const COMPAT_RESET_SOURCE: &str = include_str!("lua/compat_reset.lua");
pub static COMPAT_RESET: LazyLock<Script> = LazyLock::new(|| Script::new(COMPAT_RESET_SOURCE));

/// The release of keys with a signal list (`Keys::with_signal`): compare-and-delete, then the
/// signal push and the wake-up; only while the fence counter reads one of `fences`, if any
/// (`scripts::release_fenced`). Reply 1 released, 0 not ours.
pub fn signal_release<'a>(
    keys: &Keys,
    token: &str,
    signal: &[u8],
    expire_ms: u64,
    fences: &[i64],
) -> ScriptInvocation<'a> {
    let mut inv = COMPAT_SIGNAL_RELEASE.prepare_invoke();
    inv.key(keys.lock())
        .key(signal)
        .arg(token)
        .arg(keys.wake_channel())
        .arg(expire_ms);
    if !fences.is_empty() {
        inv.key(keys.fence());
        for fence in fences {
            inv.arg(fence.to_string());
        }
    }
    inv
}

/// What redis-py's extend found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extended {
    /// The lease now ends this many ms from now.
    To(i64),
    /// The lock is not `token`'s (any more).
    NotOwned,
    /// The lock is `token`'s but has no expiry (nothing changed).
    NoExpiry,
}

/// redis-py's extend: `ms` added to what is left of the lease, or (`replace`) the lease ends
/// `ms` from now.
pub fn extend(keys: &Keys, token: &str, ms: i64, replace: bool) -> Step<Extended> {
    let mut inv = COMPAT_EXTEND.prepare_invoke();
    inv.key(keys.lock())
        .arg(token)
        .arg(ms)
        .arg(if replace { "1" } else { "0" });
    Step::script(inv, |v| parse_extended(&v))
}

fn parse_extended(value: &Value) -> Result<Extended, UnexpectedReply> {
    let bad = || UnexpectedReply(format!("{value:?}"));
    let Value::Array(items) = value else {
        return Err(bad());
    };
    match items.as_slice() {
        [Value::Int(1), Value::Int(ms)] => Ok(Extended::To(*ms)),
        [Value::Int(0), _] => Ok(Extended::NotOwned),
        [Value::Int(-1), _] => Ok(Extended::NoExpiry),
        _ => Err(bad()),
    }
}

/// Deletes the lock whoever holds it, waking every waiter; the number of keys deleted.
pub fn reset(keys: &Keys) -> Step<i64> {
    let mut inv = COMPAT_RESET.prepare_invoke();
    inv.key(keys.lock());
    let expire_ms = match keys.signal() {
        Some((signal, ms)) => {
            inv.key(signal);
            ms
        }
        None => 1,
    };
    inv.arg(keys.wake_channel()).arg(expire_ms);
    Step::script(inv, |v| parse_int(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_reads_the_three_outcomes() {
        let keys = Keys::new(b"p:", b"n").with_lock_key(b"n");
        let step = extend(&keys, "t", 100, false);
        let reply = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
        assert_eq!(step.parse(reply(1, 250)), Ok(Extended::To(250)));
        assert_eq!(step.parse(reply(0, 0)), Ok(Extended::NotOwned));
        assert_eq!(step.parse(reply(-1, 0)), Ok(Extended::NoExpiry));
        assert!(step.parse(Value::Int(1)).is_err());
    }

    #[test]
    fn reset_reads_the_count() {
        let keys = Keys::new(b"p:", b"n").with_lock_key(b"lock:n");
        assert_eq!(reset(&keys).parse(Value::Int(1)), Ok(1));
    }
}
