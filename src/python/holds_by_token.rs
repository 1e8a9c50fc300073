//! A process-wide record of holds by (server, lock key, token), for the releases that must know
//! what this process was granted: the recipes' (`recipe_holds`) and the drop-in shims'
//! (`compat_holds`). Their tokens may be the caller's and their releases come by token from any
//! object, so the record cannot live on an object. Touched only with the GIL held, so a fork
//! never finds a map locked by another thread.

use std::sync::{Arc, Mutex};

use crate::engine::kept_holds::KeptHolds;
use crate::engine::Shared;

pub struct HoldsByToken<H> {
    /// By (the server's `Shared` and the lock key, the token); swept of the holds that are over
    /// as it doubles (a sweep on every insert past a fixed size made each `acquire_lock` scan
    /// every live hold).
    holds: Mutex<Option<KeptHolds<H>>>,
}

impl<H> HoldsByToken<H> {
    pub const fn new() -> Self {
        HoldsByToken {
            holds: Mutex::new(None),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut KeptHolds<H>) -> R) -> R {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        f(holds.get_or_insert_with(KeptHolds::new))
    }

    /// Notes `hold` of `token` on `lock_key`, granted by the server `shared` is on; as the
    /// record grows, first drops the holds that `live` says are over.
    pub fn insert(
        &self,
        shared: &Arc<Shared>,
        lock_key: &[u8],
        token: &str,
        hold: H,
        live: impl Fn(&H) -> bool,
    ) {
        self.with(|holds| holds.insert(key(shared, lock_key), token, hold, |_, h| !live(h)))
    }

    /// What `read` makes of the hold noted for `token` on `lock_key`, if any.
    pub fn read<R>(
        &self,
        shared: &Arc<Shared>,
        lock_key: &[u8],
        token: &str,
        read: impl FnOnce(&H) -> R,
    ) -> Option<R> {
        self.with(|holds| holds.get(key(shared, lock_key), token).map(read))
    }

    /// Forgets the hold noted for `token` on `lock_key` and returns it.
    pub fn remove(&self, shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<H> {
        self.with(|holds| holds.remove(key(shared, lock_key), token))
    }
}

/// The server's `Shared` (its address) and the lock key, as one key of the record.
fn key(shared: &Arc<Shared>, lock_key: &[u8]) -> Vec<u8> {
    let mut key = (Arc::as_ptr(shared) as usize).to_ne_bytes().to_vec();
    key.extend_from_slice(lock_key);
    key
}
