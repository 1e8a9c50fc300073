//! The semaphore: what identifies one in Redis and how its permits are leased, and its steps.

use std::time::Duration;

use super::keys::Keys;
use super::lease;
use super::replies::{parse_admission, parse_count, parse_flag, parse_limit_refusal, Admission};
use super::scripts::{self, Queueing};
use super::step::Step;

/// What identifies a semaphore in Redis and how its permits are leased.
#[derive(Clone, Debug)]
pub struct SemaphoreSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    /// The most live holders at any time (>= 1).
    pub limit: u64,
    pub lease: Duration,
    /// Waiters get permits in the order in which they started waiting (FIFO queue in Redis).
    pub fair: bool,
}

/// What an admission attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Answered(Admission),
    /// Refused: the semaphore's holders or waiters use this other limit (kept in Redis).
    OtherLimit(i64),
}

/// One admission attempt for `token` (`queueing` matters to a fair semaphore only).
pub fn attempt(spec: &SemaphoreSpec, token: &str, queueing: Queueing) -> Step<Admit> {
    let inv = scripts::semaphore_acquire(
        &spec.keys,
        token,
        lease::lease_ms(spec.lease),
        spec.limit,
        spec.fair.then_some(queueing),
    );
    Step::script(inv, |v| match parse_limit_refusal(&v) {
        Some(live) => Ok(Admit::OtherLimit(live)),
        None => parse_admission(&v).map(Admit::Answered),
    })
}

/// Gives `token`'s permit back; false when it held none (any more).
pub fn release(spec: &SemaphoreSpec, token: &str) -> Step<bool> {
    Step::script(
        scripts::semaphore_release(&spec.keys, token, spec.limit),
        |v| parse_flag(&v),
    )
}

/// A fair waiter leaves the queue.
pub fn leave(spec: &SemaphoreSpec, token: &str) -> Step<()> {
    Step::script(
        scripts::semaphore_leave(&spec.keys, token, spec.limit),
        |_| Ok(()),
    )
}

/// Compare-and-extend of `token`'s permit; false when not ours.
pub fn extend(keys: &Keys, token: &str, lease: Duration) -> Step<bool> {
    Step::script(
        scripts::semaphore_extend(keys, token, lease::lease_ms(lease)),
        |v| parse_flag(&v),
    )
}

/// Whether `token` holds a live permit.
pub fn owned(keys: &Keys, token: &str) -> Step<bool> {
    Step::script(scripts::semaphore_owned(keys, token), |v| parse_flag(&v))
}

/// The number of live holders.
pub fn holders(keys: &Keys) -> Step<i64> {
    Step::script(scripts::semaphore_holders(keys), |v| parse_count(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn spec() -> SemaphoreSpec {
        SemaphoreSpec {
            name: b"s".to_vec(),
            keys: Keys::new(b"p:", b"s"),
            limit: 2,
            lease: Duration::from_secs(1),
            fair: false,
        }
    }

    #[test]
    fn an_attempt_reads_admission_busy_or_another_limit() {
        let step = attempt(&spec(), "t", Queueing::TryOnly);
        let admitted = Value::Array(vec![Value::Int(1), Value::Int(2)]);
        assert_eq!(
            step.parse(admitted),
            Ok(Admit::Answered(Admission::Admitted { count: 2 }))
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(40)]);
        assert_eq!(
            step.parse(busy),
            Ok(Admit::Answered(Admission::Busy { retry_ms: 40 }))
        );
        assert!(step.parse(Value::Nil).is_err());
    }

    #[test]
    fn release_extend_owned_read_the_flag() {
        let spec = spec();
        assert_eq!(release(&spec, "t").parse(Value::Int(0)), Ok(false));
        let extended = extend(&spec.keys, "t", Duration::from_secs(2)).parse(Value::Int(1));
        assert_eq!(extended, Ok(true));
        assert_eq!(owned(&spec.keys, "t").parse(Value::Int(1)), Ok(true));
        assert_eq!(holders(&spec.keys).parse(Value::Int(3)), Ok(3));
    }
}
