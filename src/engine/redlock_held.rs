//! A Redlock hold of a token the caller chose (the recipes' identifier, which another call may
//! use too): per master, the fence its own vote was granted there, until that grant is released
//! or given back.
//!
//! - The votes (a resend after a broken connection too) are first sends
//!   (`scripts::acquire_first_send`), so a grant proves that this call set the key: a release, a
//!   give-back or a cancelled acquire deletes only where its own votes set it, never a lock that
//!   another call with the same identifier holds.
//! - A delete whose connection broke under it may have run: another call may have taken the
//!   master since under the same identifier. Its resend deletes only while the master's fence
//!   counter still reads what this hold left there (`release_fenced`): its vote's fence, or the
//!   agreed fence written back over it. A later grant there issues a fence larger than the
//!   counter read then, so it is neither (the one exception: the write-back never landed there
//!   and the master's clock, in µs, gave exactly the agreed fence, which another master issued).
//! - A resend that finds the key gone while the counter still reads one of those fences
//!   (`GONE_AT_OWN_FENCE`): nobody took the name there since this hold's grant, so the hold
//!   ended by the first send or by its lease running out. Sent while the lease was surely ours
//!   (`released_by_first_send`), it was the first send: that master counts as released.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use redis::{ScriptInvocation, Value};

use crate::protocol::keys::Keys;
use crate::protocol::replies::gone_at_own_fence;
use crate::protocol::scripts;

pub(super) struct HeldVotes {
    keys: Keys,
    /// Per master: the fence its vote granted, while that grant is this hold's.
    grants: Mutex<Vec<Option<i64>>>,
    /// The fence the won round agreed (unset while the round is not won): the masters whose
    /// counter was behind it were raised to it.
    agreed: OnceLock<i64>,
    /// Until when the won round's lease is surely ours (counted from before its votes were
    /// sent, less the drift allowance); unset while the round is not won.
    deadline: OnceLock<Instant>,
    /// When the latest grant was heard: each key its votes set was set before then, so it is
    /// gone a lease after it (see `Redlock::keep_hold`).
    last_grant: Mutex<Option<Instant>>,
}

impl HeldVotes {
    pub(super) fn new(keys: &Keys, masters: usize) -> Self {
        HeldVotes {
            keys: keys.clone(),
            grants: Mutex::new(vec![None; masters]),
            agreed: OnceLock::new(),
            deadline: OnceLock::new(),
            last_grant: Mutex::new(None),
        }
    }

    /// Master `index` granted this hold's vote with `fence`.
    pub(super) fn granted(&self, index: usize, fence: i64) {
        if let Some(slot) = self.lock().get_mut(index) {
            *slot = Some(fence);
        }
        let now = Instant::now();
        let mut last = self.last_grant.lock().unwrap_or_else(|p| p.into_inner());
        *last = Some(last.map_or(now, |t| t.max(now)));
    }

    /// When the latest grant of this hold was heard (None: none was).
    pub(super) fn last_grant(&self) -> Option<Instant> {
        *self.last_grant.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The round was won with `fence`, its lease surely ours until `deadline`.
    pub(super) fn agreed(&self, fence: i64, deadline: Instant) {
        let _ = self.agreed.set(fence);
        let _ = self.deadline.set(deadline);
    }

    /// Whether a release sent at `sent_at` whose (resent) delete replied `reply` was deleted by
    /// its first send: the resend found the key gone with the counter still at this hold's
    /// fence, and the first send went out while the lease was surely ours, before the key
    /// could lapse by itself.
    pub(super) fn released_by_first_send(&self, reply: &Value, sent_at: Instant) -> bool {
        gone_at_own_fence(reply) && self.deadline.get().is_some_and(|&end| sent_at < end)
    }

    /// Takes master `index`'s grant for its release or give-back (`quiet`: one that wakes
    /// nobody), and returns that delete's resend after a broken connection; None when there is
    /// nothing of this hold's to delete there (no grant, or deleted already).
    pub(super) fn take(
        &self,
        index: usize,
        token: &str,
        quiet: bool,
    ) -> Option<ScriptInvocation<'static>> {
        let granted = self.lock().get_mut(index)?.take()?;
        let mut fences = vec![granted];
        fences.extend(self.agreed.get().filter(|&&agreed| agreed != granted));
        let channel = if quiet {
            scripts::NOBODY.to_vec()
        } else {
            self.keys.wake_channel()
        };
        Some(scripts::release_fenced(
            &self.keys, token, &channel, &fences,
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<i64>>> {
        self.grants.lock().unwrap_or_else(|p| p.into_inner())
    }
}
