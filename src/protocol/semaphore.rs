//! The semaphore: what identifies one in Redis and how its permits are leased, and its steps.

use std::time::Duration;

use super::keys::Keys;
use super::lease;
use super::replies::{
    as_int, parse_admission, parse_count, parse_flag, parse_limit_refusal, Admission,
    UnexpectedReply,
};
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
    /// On Redlock: a permit is a slot won on a majority of the masters (`slot_attempt`).
    pub slots: bool,
}

/// What an admission attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Answered(Admission),
    /// Refused: the semaphore's holders or waiters use this other limit (kept in Redis).
    OtherLimit(i64),
}

/// One admission attempt for `token`: a fair waiter that joins takes its turn in the queue, an
/// unfair one a place that only tells that it waits (see sem_acquire.lua).
pub fn attempt(spec: &SemaphoreSpec, token: &str, queueing: Queueing) -> Step<Admit> {
    let inv = scripts::semaphore_acquire(
        &spec.keys,
        token,
        lease::lease_ms(spec.lease),
        spec.limit,
        spec.fair,
        queueing,
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

/// A waiter gives up its place (fair: its turn in the queue).
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

/// What one Redlock master said to a slot attempt (`sem_slot_acquire.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotReply {
    /// The token holds the slot asked for here.
    Granted { slot: i64 },
    /// The token holds another slot here: no vote for the slot asked for, or votes for two
    /// slots would add up to one majority and admit a holder past the limit. (The script moves
    /// such a stale slot instead of answering with it; this keeps the rule in the tally too.)
    HoldsAnother { slot: i64 },
    /// The slot is taken here until `retry_ms` from now; `free`: other slots free here.
    Busy { retry_ms: i64, free: Vec<u64> },
    /// Live holders here use this other limit.
    OtherLimit(i64),
}

/// How many free slots a refused slot attempt names.
pub const FREE_SLOTS_NAMED: u64 = 8;

/// Redlock: one attempt on one master to take `slot` for `token`.
pub fn slot_attempt(spec: &SemaphoreSpec, token: &str, slot: u64) -> Step<SlotReply> {
    let inv = scripts::semaphore_slot_acquire(
        &spec.keys,
        token,
        lease::lease_ms(spec.lease),
        spec.limit,
        slot,
        FREE_SLOTS_NAMED,
    );
    let asked = i64::try_from(slot).unwrap_or(i64::MAX);
    Step::script(inv, move |v| parse_slot_reply(&v, asked))
}

fn parse_slot_reply(value: &redis::Value, asked: i64) -> Result<SlotReply, UnexpectedReply> {
    let bad = || UnexpectedReply(format!("{value:?}"));
    let redis::Value::Array(items) = value else {
        return Err(bad());
    };
    let ints: Option<Vec<i64>> = items.iter().map(as_int).collect();
    match ints.ok_or_else(bad)?.as_slice() {
        [1, slot] if *slot == asked => Ok(SlotReply::Granted { slot: *slot }),
        [1, slot] => Ok(SlotReply::HoldsAnother { slot: *slot }),
        [2, live] => Ok(SlotReply::OtherLimit(*live)),
        [0, retry_ms, free @ ..] => Ok(SlotReply::Busy {
            retry_ms: *retry_ms,
            free: free.iter().filter_map(|&f| u64::try_from(f).ok()).collect(),
        }),
        _ => Err(bad()),
    }
}

/// The release step of a permit: the slot's own on Redlock.
pub fn release_any(spec: &SemaphoreSpec, token: &str) -> Step<bool> {
    if spec.slots {
        let inv =
            scripts::semaphore_slot_release(&spec.keys, token, None, &spec.keys.wake_channel());
        Step::script(inv, |v| parse_flag(&v))
    } else {
        release(spec, token)
    }
}

/// Redlock: gives back whatever slot `token` holds on one master, waking nobody: a lost round
/// gives its grants back so (see `redlock_lease.rs`).
pub fn slot_give_back_quietly(spec: &SemaphoreSpec, token: &str) -> Step<bool> {
    let inv = scripts::semaphore_slot_release(&spec.keys, token, None, scripts::NOBODY);
    Step::script(inv, |v| parse_flag(&v))
}

/// Redlock: the release, on one master, of the permit `token` won as `slot`: any slot of the
/// token there goes; true only when it was that one, with a live lease.
pub fn slot_release(spec: &SemaphoreSpec, token: &str, slot: u64) -> Step<bool> {
    Step::script(
        scripts::semaphore_slot_release(&spec.keys, token, Some(slot), &spec.keys.wake_channel()),
        |v| parse_flag(&v),
    )
}

/// Redlock: compare-and-extend, on one master, of the permit `token` won as `slot`; false when
/// that master does not hold `token` in that slot (see sem_slot_held.lua).
pub fn slot_extend(spec: &SemaphoreSpec, token: &str, slot: u64, lease: Duration) -> Step<bool> {
    let ms = lease::lease_ms(lease);
    Step::script(
        scripts::semaphore_slot_held(&spec.keys, token, slot, Some(ms)),
        |v| parse_flag(&v),
    )
}

/// Redlock: whether one master holds `token` in `slot` with a live lease.
pub fn slot_owned(spec: &SemaphoreSpec, token: &str, slot: u64) -> Step<bool> {
    Step::script(
        scripts::semaphore_slot_held(&spec.keys, token, slot, None),
        |v| parse_flag(&v),
    )
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
            slots: false,
        }
    }

    #[test]
    fn a_slot_attempt_reads_grant_busy_with_free_slots_or_another_limit() {
        let step = slot_attempt(&spec(), "t", 1);
        let granted = Value::Array(vec![Value::Int(1), Value::Int(1)]);
        assert_eq!(step.parse(granted), Ok(SlotReply::Granted { slot: 1 }));
        let elsewhere = Value::Array(vec![Value::Int(1), Value::Int(0)]);
        assert_eq!(
            step.parse(elsewhere),
            Ok(SlotReply::HoldsAnother { slot: 0 })
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(40), Value::Int(0)]);
        let free = vec![0];
        assert_eq!(step.parse(busy), Ok(SlotReply::Busy { retry_ms: 40, free }));
        let other = Value::Array(vec![Value::Int(2), Value::Int(3)]);
        assert_eq!(step.parse(other), Ok(SlotReply::OtherLimit(3)));
        assert!(step.parse(Value::Nil).is_err());
        assert!(step.parse(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn an_attempt_reads_admission_busy_or_another_limit() {
        let step = attempt(&spec(), "t", Queueing::TryOnly);
        assert_eq!(
            step.parse(Value::Int(2)),
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
