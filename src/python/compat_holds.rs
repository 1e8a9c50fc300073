//! The holds that the drop-in shims (`redmutex.compat`) took in this process, kept for their
//! release: the fence each was granted. A shim's token may be the caller's (redis-py's `token=`,
//! python-redis-lock's `id=`), and a release whose connection broke may have deleted it with its
//! first send, after which another call may take the lock under the same token: the resend
//! deletes only the hold granted this fence (`CompatLock::release`). Kept process-wide, since the
//! originals release by token from any object.

use std::sync::Arc;
use std::time::Instant;

use super::holds_by_token::HoldsByToken;
use crate::engine::compat::CompatHold;
use crate::engine::hold_status::HoldStatus;
use crate::engine::Shared;

struct Hold {
    fence: i64,
    /// Its deadline (moved by renewal) and whether it was found lost, for the sweep.
    status: Arc<HoldStatus>,
}

static HOLDS: HoldsByToken<Hold> = HoldsByToken::new();

/// Notes `hold` of `token` on `lock_key`, granted by the server `shared` is on.
pub fn taken(shared: &Arc<Shared>, lock_key: &[u8], token: &str, hold: &CompatHold) {
    let noted = Hold {
        fence: hold.fence,
        status: hold.status(),
    };
    let now = Instant::now();
    HOLDS.insert(shared, lock_key, token, noted, |h| {
        !h.status.is_lost() && h.status.deadline() > now
    });
}

/// Forgets the hold noted for `token` on `lock_key` (it is being released) and returns its
/// fence; None when this process took none.
pub fn released(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<i64> {
    HOLDS.remove(shared, lock_key, token).map(|hold| hold.fence)
}
