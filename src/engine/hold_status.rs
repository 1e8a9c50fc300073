//! The state a hold shares with its renewal task: its deadline, and whether it was lost or is
//! being released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Shared between a hold and its renewal task.
#[derive(Debug)]
pub struct HoldStatus {
    deadline: Mutex<Instant>,
    lost: AtomicBool,
    /// Set once a release was attempted, and never cleared: renewal stops for good (a release
    /// that failed must not leave the lease renewed for as long as the object lives; it ends by
    /// itself within the ttl), and no "not ours" it hears from then on is a loss.
    releasing: AtomicBool,
    /// The run_id of the server incarnation known when the hold was granted (None: unknown).
    pub(super) run_id: Option<Arc<str>>,
    /// Told when the caller moved the deadline (`extend`): the renewal task plans again.
    moved: tokio::sync::Notify,
}

impl HoldStatus {
    pub fn new(deadline: Instant) -> Self {
        HoldStatus {
            deadline: Mutex::new(deadline),
            lost: AtomicBool::new(false),
            releasing: AtomicBool::new(false),
            run_id: None,
            moved: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn granted_on(deadline: Instant, run_id: Option<Arc<str>>) -> Self {
        HoldStatus {
            run_id,
            ..HoldStatus::new(deadline)
        }
    }

    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_deadline(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    /// The caller's `extend` moved the deadline: `set_deadline`, and the renewal task (if any)
    /// plans its next extend again.
    pub fn move_deadline(&self, deadline: Instant) {
        self.set_deadline(deadline);
        self.moved.notify_one();
    }

    /// Resolves once the caller moved the deadline (see `move_deadline`).
    pub async fn deadline_moved(&self) {
        self.moved.notified().await;
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the hold lost; true only for the first caller (who reports it).
    pub fn mark_lost(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    pub fn is_releasing(&self) -> bool {
        self.releasing.load(Ordering::Acquire)
    }

    pub fn set_releasing(&self) {
        self.releasing.store(true, Ordering::Release);
    }
}
