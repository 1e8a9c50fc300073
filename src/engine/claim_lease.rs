//! When a cache fill claim's lease ends as far as this process knows, so that a store the
//! claim's owner no longer has can say why: its lease ran out before the store went out (the
//! fill outlived it: renewal could not keep up, or could not reach Redis), or the claim was
//! ended by somebody else while its lease still ran (the entry was invalidated). The first means
//! another caller may have filled the entry too, which the caller must hear about; the second
//! is routine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::protocol::lease;

pub struct ClaimLease {
    /// The lease's end: from the send of the lookup that took the claim, or of the last
    /// renewal that Redis confirmed.
    end: Mutex<Instant>,
    /// Set when a store was refused after the lease's end.
    lapsed: AtomicBool,
}

impl ClaimLease {
    /// A lease of `lease` granted by a request sent at `sent_at`.
    pub fn new(sent_at: Instant, lease: Duration) -> Self {
        ClaimLease {
            end: Mutex::new(lease::deadline(sent_at, lease)),
            lapsed: AtomicBool::new(false),
        }
    }

    /// A renewal sent at `sent_at` was confirmed: the lease now ends `lease` after it.
    pub fn renewed(&self, sent_at: Instant, lease: Duration) {
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = lease::deadline(sent_at, lease);
    }

    /// The lease's end as renewal has kept it so far.
    pub fn end(&self) -> Instant {
        *self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A store sent at `sent_at` was refused (the claim was not ours): note whether the lease
    /// had run out by then.
    pub fn refused(&self, sent_at: Instant) {
        if sent_at >= self.end() {
            self.lapsed.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a store was refused because the lease ran out first.
    pub fn lapsed(&self) -> bool {
        self.lapsed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_refused_after_the_lease_end_is_a_lapse() {
        let start = Instant::now();
        let lease = ClaimLease::new(start, Duration::from_millis(10));
        lease.refused(start + Duration::from_millis(9));
        assert!(
            !lease.lapsed(),
            "refused inside the lease: somebody ended it"
        );
        lease.refused(start + Duration::from_millis(10));
        assert!(lease.lapsed());
    }

    #[test]
    fn a_renewal_moves_the_end() {
        let start = Instant::now();
        let lease = ClaimLease::new(start, Duration::from_millis(10));
        lease.renewed(start + Duration::from_millis(8), Duration::from_millis(10));
        assert_eq!(lease.end(), start + Duration::from_millis(18));
        lease.refused(start + Duration::from_millis(15));
        assert!(!lease.lapsed());
    }
}
