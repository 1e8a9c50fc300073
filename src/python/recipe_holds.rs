//! The holds that `acquire_token` took on a single server, kept for `release_token`: a release
//! whose connection broke may have deleted the token with its first send, so its resend's "not
//! ours" is a release, not a loss, when the lease was still ours and the same server incarnation
//! answered, or another one (a restart that kept its data) whose fence counter shows nobody took
//! the lock since (the rules of `Lock.release`, engine `hold.rs`). So is a later release's, after
//! a release that got no answer.

use std::sync::Arc;
use std::time::Instant;

use super::holds_by_token::HoldsByToken;
use crate::engine::hold::release_may_have_landed;
use crate::engine::Shared;

/// What this process noted of a hold it took.
#[derive(Clone)]
pub struct Noted {
    deadline: Instant,
    run_id: Option<Arc<str>>,
    /// The fence it was granted: a release's resend deletes only this hold (`release_chosen`).
    pub fence: i64,
    /// When an earlier release of it was sent that got no answer (its connection failed): that
    /// send may have deleted the token, so a later release's "not ours" may be its work.
    unanswered: Option<Instant>,
}

static HOLDS: HoldsByToken<Noted> = HoldsByToken::new();

/// Notes a hold of `token` on `lock_key` until `deadline` with `fence`, granted by the server
/// `shared` is on.
pub fn taken(shared: &Arc<Shared>, lock_key: &[u8], token: &str, deadline: Instant, fence: i64) {
    let hold = Noted {
        deadline,
        run_id: shared.run_id(),
        fence,
        unanswered: None,
    };
    let now = Instant::now();
    // Never released, their leases over: dropped when the record grows.
    HOLDS.insert(shared, lock_key, token, hold, |h| h.deadline > now);
}

/// The hold noted for `token` on `lock_key`, if this process took one.
pub fn noted(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<Noted> {
    HOLDS.read(shared, lock_key, token, Noted::clone)
}

/// Forgets the hold noted for `token` on `lock_key` (released, or found lost).
pub fn forget(shared: &Arc<Shared>, lock_key: &[u8], token: &str) {
    HOLDS.remove(shared, lock_key, token);
}

/// Notes that a release of the hold sent at `sent_at` got no answer (see `Noted::unanswered`).
pub fn unanswered(shared: &Arc<Shared>, lock_key: &[u8], token: &str, sent_at: Instant) {
    if let Some(mut hold) = HOLDS.remove(shared, lock_key, token) {
        hold.unanswered.get_or_insert(sent_at);
        HOLDS.insert(shared, lock_key, token, hold, |_| true);
    }
}

/// Whether a release of `hold` sent at `sent_at` that answered "not ours" may have been
/// answered so because a send of its own deleted the token: this one, when its connection broke
/// under it (`faulted`), or an earlier one that got no answer.
pub enum OwnDelete {
    /// No: the hold was lost.
    No,
    /// Yes: sent while the lease was ours, and answered by the server incarnation that granted
    /// it (unknown run_ids: the first condition alone decides). The rule of `Lock.release`.
    Likely,
    /// Sent while the lease was ours, but another incarnation answers (a restart, a failover):
    /// it kept the delete only if it kept its data, which a read of the fence counter tells
    /// (`lock::fence_unmoved`, as `Leased::unmoved_since`).
    AfterRestart,
}

impl Noted {
    pub fn own_delete(&self, shared: &Shared, sent_at: Instant, faulted: bool) -> OwnDelete {
        let sends = [faulted.then_some(sent_at), self.unanswered];
        let sends = sends.iter().flatten().copied();
        if sends
            .clone()
            .any(|at| release_may_have_landed(shared, self.deadline, self.run_id.as_ref(), at))
        {
            OwnDelete::Likely
        } else if sends.clone().any(|at| at < self.deadline) && self.run_id.is_some() {
            OwnDelete::AfterRestart
        } else {
            OwnDelete::No
        }
    }
}
