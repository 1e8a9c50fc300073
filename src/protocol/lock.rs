//! The lock: what identifies one in Redis and how it is leased, what a granted acquire is, and
//! its steps (acquire attempt, release, extend, owner, leaving the fair queue, fence write-back).

use std::time::{Duration, Instant};

use redis::Value;

use super::keys::Keys;
use super::lease;
use super::replies::{
    parse_attempt, parse_flag, parse_int, parse_released, Attempt, UnexpectedReply,
};
use super::scripts::{self, Queueing};
use super::step::Step;

/// What identifies a lock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct LockSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub lease: Duration,
    pub fair: bool,
    /// Replicas that must acknowledge the lock write (Redis WAIT) before a grant counts.
    pub replicas: u32,
    /// The owner may take it again while it holds (`Lock(reentrant=True)`): the hold count then
    /// lives beside the lock (`Keys::lock_holds`), and extend keeps both alive.
    pub reentrant: bool,
    /// An unfair lock whose blocking waiters, once their first attempt found it taken, wait in
    /// the fair queue and are granted it by a release in arrival order (their first attempt
    /// still takes a free lock past the queue). False: woken waiters race for it (the recipes
    /// and the compat shims, whose tokens or keys other clients share, and Redlock).
    pub queued: bool,
}

/// A successful acquire: the fence, when the lease started at the latest as far as this side
/// knows (when the winning request was sent), and the lease from then.
#[derive(Clone, Copy, Debug)]
pub struct Granted {
    pub fence: i64,
    pub sent_at: Instant,
    pub lease: Duration,
}

/// One acquire attempt for `token` (`fair`: the FIFO script; `inbox`: where a fair release tells
/// this waiter it was granted, '' for none).
pub fn attempt(spec: &LockSpec, token: &str, fair: Option<Queueing>, inbox: &str) -> Step<Attempt> {
    let lease_ms = lease::lease_ms(spec.lease);
    Step::script(
        scripts::acquire(&spec.keys, token, lease_ms, fair, inbox),
        |v| parse_attempt(&v),
    )
}

/// Compare-and-delete, then the hand-off; false when the lock was not `token`'s (any more).
pub fn release(keys: &Keys, token: &str) -> Step<bool> {
    Step::script(scripts::release(keys, token), |v| parse_released(&v))
}

/// `release` of a token the caller chose (the recipes' identifier), which may be a re-entrant
/// lock's: its hold count goes too.
pub fn release_chosen(keys: &Keys, token: &str) -> Step<bool> {
    Step::script(scripts::release_chosen(keys, token, &[]), |v| {
        parse_released(&v)
    })
}

/// `release` that wakes nobody: a lost Redlock round gives its grants back so (see
/// `redlock_lease.rs`).
pub fn give_back_quietly(keys: &Keys, token: &str) -> Step<bool> {
    Step::script(scripts::release_waking(keys, token, scripts::NOBODY), |v| {
        parse_released(&v)
    })
}

/// `release` of a re-entrant lock: its hold count is deleted with it.
pub fn release_reentrant(keys: &Keys, token: &str) -> Step<bool> {
    Step::script(scripts::release_reentrant(keys, token), |v| parse_flag(&v))
}

/// Compare-and-pexpire: the lease ends `lease` from now; false when not `token`'s.
pub fn extend(keys: &Keys, token: &str, lease: Duration) -> Step<bool> {
    Step::script(scripts::extend(keys, token, lease::lease_ms(lease)), |v| {
        parse_flag(&v)
    })
}

/// `extend` of a re-entrant lock: its hold count expires with it.
pub fn extend_reentrant(keys: &Keys, token: &str, lease: Duration) -> Step<bool> {
    let lease_ms = lease::lease_ms(lease);
    Step::script(scripts::extend_reentrant(keys, token, lease_ms), |v| {
        parse_flag(&v)
    })
}

/// A re-entrant lock's owner `token` takes it once more (`lease`: the lease then lasts at least
/// that long from now) or gives back a nested acquire (`lease` None); the hold count becomes
/// `depth`. False when not `token`'s (nothing changed).
pub fn reenter(keys: &Keys, token: &str, depth: u32, lease: Option<Duration>) -> Step<bool> {
    let lease_ms = lease.map_or(0, lease::lease_ms);
    Step::script(scripts::reenter(keys, token, depth, lease_ms), |v| {
        parse_flag(&v)
    })
}

/// The hold count of a re-entrant lock held by `owner`, read from its count key's value
/// (`'<token> <count>'`, or nil): 1 when the value is missing or names another token (a stale
/// count of a lost hold).
pub fn hold_count(value: Option<&[u8]>, owner: &[u8]) -> u64 {
    let Some(value) = value else {
        return 1;
    };
    let Some(space) = value.iter().rposition(|&b| b == b' ') else {
        return 1;
    };
    if &value[..space] != owner {
        return 1;
    }
    std::str::from_utf8(&value[space + 1..])
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(1, |n| n.max(1))
}

/// The current owner token, if anybody holds the lock.
pub fn owner(keys: &Keys) -> Step<Option<Vec<u8>>> {
    let mut get = redis::cmd("GET");
    get.arg(keys.lock());
    Step::command(get, parse_owner)
}

/// Whether `token` holds the lock.
pub fn owned(keys: &Keys, token: &str) -> Step<bool> {
    let token = token.as_bytes().to_vec();
    owner(keys).map(move |owner| owner.as_deref() == Some(token.as_slice()))
}

/// Whether the fencing counter still reads `fence`: no acquisition of the name since the hold
/// that was granted it (every grant moves the counter). A release resent after a restart that
/// finds its token gone reads this: the first send's delete is then what it found.
pub fn fence_unmoved(keys: &Keys, fence: i64) -> Step<bool> {
    let mut get = redis::cmd("GET");
    get.arg(keys.fence());
    let fence = fence.to_string().into_bytes();
    Step::command(get, parse_owner).map(move |counter| counter.as_deref() == Some(fence.as_slice()))
}

/// A fair waiter leaves the queue (giving back a grant that came meanwhile).
pub fn leave_queue(keys: &Keys, token: &str) -> Step<()> {
    Step::script(scripts::leave_queue(keys, token), |_| Ok(()))
}

/// Raises the fencing counter to at least `fence`; the counter after.
pub fn raise_fence(keys: &Keys, fence: i64) -> Step<i64> {
    Step::script(scripts::raise_fence(keys, fence), |v| parse_int(&v))
}

/// The reply of a GET of a token: the token, or nil.
pub fn parse_owner(value: Value) -> Result<Option<Vec<u8>>, UnexpectedReply> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(bytes)),
        Value::SimpleString(text) => Ok(Some(text.into_bytes())),
        other => Err(UnexpectedReply(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(b"p:", b"name")
    }

    #[test]
    fn release_and_extend_read_the_flag() {
        let release = release(&keys(), "t");
        assert!(release.invocation().is_some());
        assert_eq!(release.parse(Value::Int(1)), Ok(true));
        assert_eq!(release.parse(Value::Int(0)), Ok(false));
        assert!(release.parse(Value::Nil).is_err());
        let extend = extend(&keys(), "t", Duration::from_secs(1));
        assert_eq!(extend.parse(Value::Int(1)), Ok(true));
    }

    #[test]
    fn reentry_sends_the_new_count_and_reads_the_flag() {
        let step = reenter(&keys(), "t", 3, Some(Duration::from_secs(2)));
        assert!(step.invocation().is_some());
        assert_eq!(step.parse(Value::Int(1)), Ok(true));
        assert_eq!(step.parse(Value::Int(0)), Ok(false));
        assert!(step.parse(Value::Nil).is_err());
        let leave = reenter(&keys(), "t", 1, None);
        assert_eq!(leave.parse(Value::Int(1)), Ok(true));
        let extend = extend_reentrant(&keys(), "t", Duration::from_secs(1));
        assert_eq!(extend.parse(Value::Int(0)), Ok(false));
    }

    #[test]
    fn the_hold_count_counts_only_for_its_owner() {
        assert_eq!(hold_count(Some(b"abc 3"), b"abc"), 3);
        assert_eq!(hold_count(Some(b"abc 3"), b"abd"), 1);
        assert_eq!(hold_count(None, b"abc"), 1);
        assert_eq!(hold_count(Some(b"abc x"), b"abc"), 1);
        assert_eq!(hold_count(Some(b"abc"), b"abc"), 1);
        assert_eq!(hold_count(Some(b"a b 0"), b"a b"), 1);
        assert_eq!(hold_count(Some(b"a b 12"), b"a b"), 12);
    }

    #[test]
    fn owned_compares_the_token() {
        let owned = owned(&keys(), "mine");
        assert!(owned.invocation().is_none());
        assert_eq!(owned.parse(Value::BulkString(b"mine".to_vec())), Ok(true));
        assert_eq!(owned.parse(Value::BulkString(b"other".to_vec())), Ok(false));
        assert_eq!(owned.parse(Value::Nil), Ok(false));
        assert!(owned.parse(Value::Int(3)).is_err());
    }

    #[test]
    fn an_attempt_reads_grant_or_busy() {
        let spec = LockSpec {
            name: b"name".to_vec(),
            keys: keys(),
            lease: Duration::from_secs(1),
            fair: false,
            replicas: 0,
            reentrant: false,
            queued: false,
        };
        let step = attempt(&spec, "t", None, "");
        assert_eq!(step.parse(Value::Int(7)), Ok(Attempt::Granted { fence: 7 }));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(250)]);
        assert_eq!(
            step.parse(busy),
            Ok(Attempt::Busy {
                retry_ms: 250,
                fence: None
            })
        );
        assert!(step.parse(Value::Nil).is_err());
    }
}
