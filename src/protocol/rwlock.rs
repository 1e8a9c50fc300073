//! The read-write lock: what identifies one in Redis, and the steps of its read and write sides.

use std::time::Duration;

use super::keys::Keys;
use super::lease;
use super::lock::parse_owner;
use super::replies::{parse_admission, parse_flag, parse_rw_state, Admission, RwState};
use super::scripts::{self, Queueing};
use super::step::Step;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

/// What identifies a read-write lock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct RwSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub lease: Duration,
}

/// One attempt of `mode` for `token`: a reader that `reentrant`ly joins its own context's read
/// hold passes a waiting writer; a writer `queueing` marks itself waiting.
pub fn attempt(
    spec: &RwSpec,
    mode: Mode,
    token: &str,
    reentrant: bool,
    queueing: Queueing,
) -> Step<Admission> {
    let lease_ms = lease::lease_ms(spec.lease);
    let inv = match mode {
        Mode::Read => scripts::rw_read_acquire(&spec.keys, token, lease_ms, reentrant),
        Mode::Write => scripts::rw_write_acquire(&spec.keys, token, lease_ms, queueing),
    };
    Step::script(inv, |v| parse_admission(&v))
}

/// Gives `token`'s read or write lock back; false when it held none (any more).
pub fn release(keys: &Keys, mode: Mode, token: &str) -> Step<bool> {
    release_waking(keys, mode, token, &keys.wake_channel())
}

/// `release` that wakes nobody: a lost Redlock round gives its grants back so (see
/// `redlock_lease.rs`).
pub fn give_back_quietly(keys: &Keys, mode: Mode, token: &str) -> Step<bool> {
    release_waking(keys, mode, token, scripts::NOBODY)
}

fn release_waking(keys: &Keys, mode: Mode, token: &str, channel: &[u8]) -> Step<bool> {
    let inv = match mode {
        Mode::Read => scripts::rw_read_release(keys, token, channel),
        Mode::Write => scripts::rw_write_release(keys, token, channel),
    };
    Step::script(inv, |v| parse_flag(&v))
}

/// A waiting writer gives up its mark.
pub fn writer_leave(keys: &Keys, token: &str) -> Step<()> {
    Step::script(scripts::rw_writer_leave(keys, token), |_| Ok(()))
}

/// Compare-and-extend; false when not `token`'s.
pub fn extend(keys: &Keys, mode: Mode, token: &str, lease: Duration) -> Step<bool> {
    let lease_ms = lease::lease_ms(lease);
    let inv = match mode {
        Mode::Read => scripts::rw_read_extend(keys, token, lease_ms),
        Mode::Write => scripts::rw_write_extend(keys, token, lease_ms),
    };
    Step::script(inv, |v| parse_flag(&v))
}

/// Whether `token` holds the read or write lock.
pub fn owned(keys: &Keys, mode: Mode, token: &str) -> Step<bool> {
    match mode {
        Mode::Read => Step::script(scripts::rw_read_owned(keys, token), |v| parse_flag(&v)),
        Mode::Write => {
            let token = token.as_bytes().to_vec();
            let mut get = redis::cmd("GET");
            get.arg(keys.rw_writer());
            Step::command(get, parse_owner)
                .map(move |owner| owner.as_deref() == Some(token.as_slice()))
        }
    }
}

/// Who holds the lock.
pub fn state(keys: &Keys) -> Step<RwState> {
    Step::script(scripts::rw_state(keys), |v| parse_rw_state(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn keys() -> Keys {
        Keys::new(b"p:", b"rw")
    }

    #[test]
    fn the_write_side_owns_by_its_token_the_read_side_by_flag() {
        let write = owned(&keys(), Mode::Write, "w");
        assert!(write.invocation().is_none());
        assert_eq!(write.parse(Value::BulkString(b"w".to_vec())), Ok(true));
        assert_eq!(write.parse(Value::Nil), Ok(false));
        let read = owned(&keys(), Mode::Read, "r");
        assert!(read.invocation().is_some());
        assert_eq!(read.parse(Value::Int(1)), Ok(true));
    }

    #[test]
    fn attempts_read_admissions() {
        let spec = RwSpec {
            name: b"rw".to_vec(),
            keys: keys(),
            lease: Duration::from_secs(1),
        };
        for mode in [Mode::Read, Mode::Write] {
            let step = attempt(&spec, mode, "t", false, Queueing::TryOnly);
            let busy = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
            assert_eq!(step.parse(busy), Ok(Admission::Busy { retry_ms: -1 }));
            assert_eq!(
                release(&spec.keys, mode, "t").parse(Value::Int(1)),
                Ok(true)
            );
        }
    }
}
