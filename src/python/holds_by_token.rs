//! A process-wide record of holds by (server, lock key, token), for the releases that must know
//! what this process was granted: the recipes' (`recipe_holds`) and the drop-in shims'
//! (`compat_holds`). Their tokens may be the caller's and their releases come by token from any
//! object, so the record cannot live on an object. Touched only with the GIL held, so a fork
//! never finds a map locked by another thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::engine::Shared;

/// (the server's `Shared`, the lock key, the token)
type HoldKey = (usize, Vec<u8>, String);

/// Past this many holds, the ones `live` says are over are dropped on the next insert.
const SWEEP_AT: usize = 1024;

pub struct HoldsByToken<H> {
    holds: Mutex<Option<HashMap<HoldKey, H>>>,
}

impl<H> HoldsByToken<H> {
    pub const fn new() -> Self {
        HoldsByToken {
            holds: Mutex::new(None),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<HoldKey, H>) -> R) -> R {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        f(holds.get_or_insert_with(HashMap::new))
    }

    /// Notes `hold` of `token` on `lock_key`, granted by the server `shared` is on; past
    /// SWEEP_AT holds, first drops those that `live` says are over.
    pub fn insert(
        &self,
        shared: &Arc<Shared>,
        lock_key: &[u8],
        token: &str,
        hold: H,
        live: impl Fn(&H) -> bool,
    ) {
        self.with(|holds| {
            if holds.len() >= SWEEP_AT {
                holds.retain(|_, h| live(h));
            }
            holds.insert(key(shared, lock_key, token), hold);
        })
    }

    /// What `read` makes of the hold noted for `token` on `lock_key`, if any.
    pub fn read<R>(
        &self,
        shared: &Arc<Shared>,
        lock_key: &[u8],
        token: &str,
        read: impl FnOnce(&H) -> R,
    ) -> Option<R> {
        self.with(|holds| holds.get(&key(shared, lock_key, token)).map(read))
    }

    /// Forgets the hold noted for `token` on `lock_key` and returns it.
    pub fn remove(&self, shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> Option<H> {
        self.with(|holds| holds.remove(&key(shared, lock_key, token)))
    }
}

fn key(shared: &Arc<Shared>, lock_key: &[u8], token: &str) -> HoldKey {
    (
        Arc::as_ptr(shared) as usize,
        lock_key.to_vec(),
        token.to_string(),
    )
}
