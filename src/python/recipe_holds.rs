//! The holds that `acquire_token` took on a single server, kept for `release_token`: a release
//! whose connection broke may have deleted the token with its first send, so its resend's "not
//! ours" is a release, not a loss, when the lease was still ours and the same server incarnation
//! answered (the rule of `Lock.release`, engine `hold.rs`). Touched only with the GIL held, so
//! a fork never finds the map locked by another thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::engine::hold::release_may_have_landed;
use crate::engine::Shared;

/// (the server's `Shared`, the lock key, the token)
type HoldKey = (usize, Vec<u8>, String);

struct Hold {
    deadline: Instant,
    run_id: Option<Arc<str>>,
    /// The fence it was granted: a release's resend deletes only this hold (`release_chosen`).
    fence: i64,
}

/// Past this many holds, those whose lease ended (never released) are dropped.
const SWEEP_AT: usize = 1024;

static HOLDS: Mutex<Option<HashMap<HoldKey, Hold>>> = Mutex::new(None);

fn key(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> HoldKey {
    (
        Arc::as_ptr(shared) as usize,
        lock_key.to_vec(),
        token.to_string(),
    )
}

/// Notes a hold of `token` on `lock_key` until `deadline` with `fence`, granted by the server
/// `shared` is on.
pub fn taken(shared: &Arc<Shared>, lock_key: &[u8], token: &str, deadline: Instant, fence: i64) {
    let mut holds = HOLDS.lock().unwrap_or_else(|p| p.into_inner());
    let holds = holds.get_or_insert_with(HashMap::new);
    if holds.len() >= SWEEP_AT {
        let now = Instant::now();
        holds.retain(|_, h| h.deadline > now);
    }
    let hold = Hold {
        deadline,
        run_id: shared.run_id(),
        fence,
    };
    holds.insert(key(shared, lock_key, token), hold);
}

/// The fence of the hold noted for `token` on `lock_key`, if this process took one.
pub fn fence(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<i64> {
    HOLDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|holds| holds.get(&key(shared, lock_key, token)))
        .map(|hold| hold.fence)
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
    let hold = HOLDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|holds| holds.remove(&key(shared, lock_key, token)));
    hold.is_some_and(|hold| {
        release_may_have_landed(shared, hold.deadline, hold.run_id.as_ref(), sent_at)
    })
}
