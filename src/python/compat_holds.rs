//! The holds that the drop-in shims (`redmutex.compat`) took in this process, kept for their
//! release: the fence each was granted. A shim's token may be the caller's (redis-py's `token=`,
//! python-redis-lock's `id=`), and a release whose connection broke may have deleted it with its
//! first send, after which another call may take the lock under the same token: the resend
//! deletes only the hold granted this fence (`CompatLock::release`). Kept process-wide, since the
//! originals release by token from any object. Touched only with the GIL held, so a fork never
//! finds the map locked by another thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::engine::compat::CompatHold;
use crate::engine::hold_status::HoldStatus;
use crate::engine::Shared;

/// (the server's `Shared`, the lock key, the token)
type HoldKey = (usize, Vec<u8>, String);

struct Hold {
    fence: i64,
    /// Its deadline (moved by renewal) and whether it was found lost, for the sweep.
    status: Arc<HoldStatus>,
}

/// Past this many holds, those whose lease ended or that were found lost are dropped.
const SWEEP_AT: usize = 1024;

static HOLDS: Mutex<Option<HashMap<HoldKey, Hold>>> = Mutex::new(None);

fn key(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> HoldKey {
    (
        Arc::as_ptr(shared) as usize,
        lock_key.to_vec(),
        token.to_string(),
    )
}

/// Notes `hold` of `token` on `lock_key`, granted by the server `shared` is on.
pub fn taken(shared: &Arc<Shared>, lock_key: &[u8], token: &str, hold: &CompatHold) {
    let mut holds = HOLDS.lock().unwrap_or_else(|p| p.into_inner());
    let holds = holds.get_or_insert_with(HashMap::new);
    if holds.len() >= SWEEP_AT {
        let now = Instant::now();
        holds.retain(|_, h| !h.status.is_lost() && h.status.deadline() > now);
    }
    let hold = Hold {
        fence: hold.fence,
        status: hold.status(),
    };
    holds.insert(key(shared, lock_key, token), hold);
}

/// Forgets the hold noted for `token` on `lock_key` (it is being released) and returns its
/// fence; None when this process took none.
pub fn released(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<i64> {
    HOLDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|holds| holds.remove(&key(shared, lock_key, token)))
        .map(|hold| hold.fence)
}
