//! The lock: what identifies one in Redis and how it is leased, what a granted acquire is, and
//! its steps (acquire attempt, release, extend, owner, leaving the fair queue, fence write-back).

use std::time::{Duration, Instant};

use redis::Value;

use super::keys::Keys;
use super::lease;
use super::replies::{parse_attempt, parse_flag, parse_int, Attempt, UnexpectedReply};
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
    Step::script(scripts::release(keys, token), |v| parse_flag(&v))
}

/// Compare-and-pexpire: the lease ends `lease` from now; false when not `token`'s.
pub fn extend(keys: &Keys, token: &str, lease: Duration) -> Step<bool> {
    Step::script(scripts::extend(keys, token, lease::lease_ms(lease)), |v| {
        parse_flag(&v)
    })
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
        };
        let step = attempt(&spec, "t", None, "");
        let granted = Value::Array(vec![Value::Int(1), Value::Int(7)]);
        assert_eq!(step.parse(granted), Ok(Attempt::Granted { fence: 7 }));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(250)]);
        assert_eq!(
            step.parse(busy),
            Ok(Attempt::Busy {
                retry_ms: 250,
                fence: None
            })
        );
        assert!(step.parse(Value::Int(1)).is_err());
    }
}
