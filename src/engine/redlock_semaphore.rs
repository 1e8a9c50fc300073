//! The semaphore on Redlock: a permit is one of `limit` slots, each a mutex won on a majority of
//! the masters (`sem_slot_acquire.lua` on each). Two holders of one slot would need two
//! majorities, which intersect in a master that admits one holder per slot, so at most `limit`
//! holders exist at any time. Counting admissions per master instead would not do: holders of
//! a majority each could then number up to `n * limit / quorum` (`quorum::counting_bound`).
//!
//! An acquire asks for one slot per round (a random one first); a master that finds it taken
//! names the slots free there, and the next round asks for the slot that the most masters named
//! (at once when a majority did, else when woken by a release).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::error::{Error, Result};
use super::redlock::Redlock;
use super::redlock_lease::{self, Ballot, QuorumContender};
use super::waiting::Wait;
use crate::protocol::quorum;
use crate::protocol::semaphore::{self as steps, SemaphoreSpec, SlotReply};
use crate::protocol::step::Step;

struct SlotContender<'a> {
    spec: &'a SemaphoreSpec,
    token: &'a str,
    /// The slot the next round asks for.
    slot: Mutex<u64>,
}

/// The free slots each master that found the slot asked for taken named.
fn named_free(replies: &[SlotReply]) -> Vec<Vec<u64>> {
    replies
        .iter()
        .filter_map(|r| match r {
            SlotReply::Busy { free, .. } => Some(free.clone()),
            _ => None,
        })
        .collect()
}

/// A random number (0 when the system has none to give).
fn random() -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => 0,
    }
}

impl SlotContender<'_> {
    fn slot(&self) -> std::sync::MutexGuard<'_, u64> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl QuorumContender for SlotContender<'_> {
    type Reply = SlotReply;

    fn attempt(&self, _join: bool) -> Step<SlotReply> {
        steps::slot_attempt(self.spec, self.token, *self.slot())
    }

    fn ballot(&self, reply: &SlotReply) -> Ballot {
        match reply {
            SlotReply::Granted { .. } => Ballot::Granted { fence: 0 },
            // Not this round's slot: a lost round's give-back clears it there.
            SlotReply::HoldsAnother { .. } => Ballot::Stale { retry_ms: 1 },
            SlotReply::Busy { retry_ms, .. } => Ballot::Busy {
                retry_ms: *retry_ms,
            },
            // (The binding names the semaphore before the message.)
            SlotReply::OtherLimit(live) => Ballot::Refused(Error::Limit(format!(
                "limit {} differs from the limit {live} its holders use (kept in Redis); a new \
                 limit takes effect once none of them remains",
                self.spec.limit
            ))),
        }
    }

    fn give_back(&self) -> Step<bool> {
        steps::release_any(self.spec, self.token)
    }

    fn give_back_quietly(&self) -> Step<bool> {
        steps::slot_give_back_quietly(self.spec, self.token)
    }

    fn retry_now(&self, n: usize, replies: &[SlotReply]) -> bool {
        match quorum::next_slot(n, &named_free(replies), random()) {
            Some((slot, majority)) => {
                *self.slot() = slot;
                majority
            }
            None => {
                // Nothing free anywhere: wait for a release, then ask for another slot.
                *self.slot() = random() % self.spec.limit.max(1);
                false
            }
        }
    }

    /// A lost round hears the masters still out while they could make one slot named free on
    /// a majority: whether a permit is free must not depend on which masters answered first
    /// (a call that does not wait would return without it).
    fn more(&self, n: usize, replies: &[SlotReply], out: usize) -> bool {
        let named = quorum::most_named(&named_free(replies));
        named < quorum::quorum(n) && named + out >= quorum::quorum(n)
    }

    fn lease(&self) -> Duration {
        self.spec.lease
    }

    fn channel(&self) -> Vec<u8> {
        self.spec.keys.wake_channel()
    }

    fn gate(&self) -> Option<Vec<u8>> {
        Some(self.spec.keys.semaphore_gate(self.spec.limit))
    }
}

/// Takes a permit (a slot on a majority) for `token`; Some((when the lease counts from, the slot
/// won)) when taken. The hold's extend and `owned` count the masters holding that slot only.
pub async fn acquire(
    redlock: &Arc<Redlock>,
    spec: &SemaphoreSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<(Instant, u64)>> {
    let contender = SlotContender {
        spec,
        token,
        slot: Mutex::new(random() % spec.limit.max(1)),
    };
    let won = redlock_lease::acquire(redlock, &contender, token, wait).await?;
    // The slot the winning round asked for (only a lost round moves it).
    Ok(won.map(|start| (start, *contender.slot())))
}
