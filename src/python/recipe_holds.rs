//! The holds that `acquire_token` took on a single server, kept for `release_token`: a release
//! whose connection broke may have deleted the token with its first send, so its resend's "not
//! ours" is a release, not a loss, when the lease was still ours and the same server incarnation
//! answered (the rule of `Lock.release`, engine `hold.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::holds_by_token::HoldsByToken;
use crate::engine::hold::release_may_have_landed;
use crate::engine::Shared;

struct Hold {
    deadline: Instant,
    run_id: Option<Arc<str>>,
    /// The fence it was granted: a release's resend deletes only this hold (`release_chosen`).
    fence: i64,
}

static HOLDS: HoldsByToken<Hold> = HoldsByToken::new();

/// Notes a hold of `token` on `lock_key` until `deadline` with `fence`, granted by the server
/// `shared` is on.
pub fn taken(shared: &Arc<Shared>, lock_key: &[u8], token: &str, deadline: Instant, fence: i64) {
    let hold = Hold {
        deadline,
        run_id: shared.run_id(),
        fence,
    };
    let now = Instant::now();
    // Never released, their leases over: dropped when the record grows.
    HOLDS.insert(shared, lock_key, token, hold, |h| h.deadline > now);
}

/// The fence of the hold noted for `token` on `lock_key`, if this process took one.
pub fn fence(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<i64> {
    HOLDS.read(shared, lock_key, token, |hold| hold.fence)
}

/// Forgets the hold and tells whether a release of it sent at `sent_at` that met a connection
/// fault may have deleted the token itself: sent while the lease was ours, answered by the
/// incarnation that granted it (unknown run_ids: the first alone decides).
pub fn may_have_released(
    shared: &Arc<Shared>,
    lock_key: &[u8],
    token: &str,
    sent_at: Instant,
) -> bool {
    HOLDS.remove(shared, lock_key, token).is_some_and(|hold| {
        release_may_have_landed(shared, hold.deadline, hold.run_id.as_ref(), sent_at)
    })
}
