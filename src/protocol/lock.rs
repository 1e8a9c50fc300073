//! The lock: what identifies one in Redis and how it is leased, and what a granted acquire is.

use std::time::{Duration, Instant};

use super::keys::Keys;

/// What identifies a lock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct LockSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub lease: Duration,
    pub fair: bool,
    /// Replicas that must acknowledge the lock write (Redis WAIT) before a grant counts.
    pub replicas: u32,
}

/// A successful acquire: the fence, when the lease started at the latest as far as this side
/// knows (when the winning request was sent), and the lease from then.
#[derive(Clone, Copy, Debug)]
pub struct Granted {
    pub fence: i64,
    pub sent_at: Instant,
    pub lease: Duration,
}
