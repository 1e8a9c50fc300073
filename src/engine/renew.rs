//! Background renewal of a hold (auto_renew): extends the lease every third of it, on a task of
//! the Rust runtime, so neither a Python thread hogging the GIL nor a blocked event loop can
//! starve it. It stops at release, never re-creates a hold it lost, and never dies silently:
//! a loss sets `lost` and calls the hold's listener once; transient failures are reported too.
//! It knows nothing of the primitive: it is given the extend operation.
//!
//! The same task, run once, tops up a lease granted shorter than the ttl (a fair lock handed on
//! by a release, see `lock_grant.lua`): one extend to the full ttl when half of what was left of
//! the grant has passed.
//!
//! A task that would first sleep a while is spawned late, by the starter (`starter.rs`), half
//! way to its first extend: a hold released before then never had a task to spawn and abort.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::Result;
use super::hold_status::HoldStatus;
use super::runtime;
use super::starter::{self, Planned};
use crate::protocol::lease;

/// How renewal found a hold lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Redis answered that the token no longer holds it: its lease ended there, or another
    /// owner took it (the extend cannot tell which).
    NotOurs,
    /// The lease ran out before an extend got an answer.
    Unanswered,
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Loss::NotOurs => {
                "renewal found it no longer held under its token (the lease had ended in Redis, \
                 or another owner had taken it)"
            }
            Loss::Unanswered => "its lease ended before renewal got an answer from Redis",
        })
    }
}

/// Whom renewal tells what it finds.
pub trait Listener: Send + Sync {
    /// The hold was found lost (called once), and how.
    fn lost(&self, how: Loss);
    /// A renewal attempt failed but the lease has not ended yet.
    fn warn(&self, message: &str);
}

pub enum Renewal {
    /// The task runs (None: there was no runtime to run it on).
    Running(Option<tokio::task::AbortHandle>),
    /// The task is spawned when its start falls due.
    Planned(Planned),
}

impl Renewal {
    pub fn stop(self) {
        match self {
            Renewal::Running(Some(task)) => task.abort(),
            Renewal::Running(None) => {}
            Renewal::Planned(planned) => planned.stop(),
        }
    }

    /// Lets the task run on (or start when due: a planned start stays filed) with nobody left
    /// to stop it: for a one-off top-up, which ends by itself.
    pub fn detach(self) {
        drop(self);
    }

    /// The caller moved the hold's deadline: a task not spawned yet is spawned now, to plan
    /// its next extend from the new deadline (a running one is told by the hold's status).
    pub fn plan_again(&self) {
        if let Renewal::Planned(planned) = self {
            planned.start_now();
        }
    }
}

/// A first extend at least this far off is spawned late (see the module's note); a sooner one
/// gains little from it, and its timing is left to its own task.
const SPAWN_LATE_FROM: Duration = Duration::from_millis(100);

/// How often renewal, about to put back a lease it may have cut, looks whether the caller's
/// extend was answered (it is also woken when it is).
const CALLER_LOOK: Duration = Duration::from_millis(5);

/// When renewal extends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The first extend, from now (later ones follow every third of the lease).
    pub first: Duration,
    /// false: stop after the first extend that succeeds (a top-up).
    pub repeat: bool,
}

impl Schedule {
    /// auto_renew of a hold with `left` to go on its lease (at most `lease`): every third of
    /// the lease, and the first time before half of what is left is gone.
    pub fn renewing(lease: Duration, left: Duration) -> Self {
        Schedule {
            first: period(lease).min(left / 2),
            repeat: true,
        }
    }

    /// One top-up of a hold with `left` to go on its (short) lease, at half of that.
    pub fn top_up(left: Duration) -> Self {
        Schedule {
            first: left / 2,
            repeat: false,
        }
    }
}

fn period(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Starts renewing: `extend(lease)` makes the lease end `lease` from now and answers
/// Some(sent_at) when it did, None when the hold is not ours any more.
pub fn start<F, Fut>(
    extend: F,
    lease: Duration,
    schedule: Schedule,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) -> Renewal
where
    F: Fn(Duration) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<Instant>>> + Send + 'static,
{
    let planned_at = Instant::now();
    let first_at = planned_at + schedule.first;
    let spawn: starter::Start = Box::new(move || {
        let handle = runtime::handle().ok()?;
        let task = handle.spawn(renew(
            extend,
            lease,
            first_at,
            schedule.repeat,
            status,
            listener,
        ));
        Some(task.abort_handle())
    });
    let spawn = if schedule.first >= SPAWN_LATE_FROM {
        match starter::plan(planned_at + schedule.first / 2, spawn) {
            Ok(planned) => return Renewal::Planned(planned),
            Err(spawn) => spawn,
        }
    } else {
        spawn
    };
    Renewal::Running(spawn())
}

/// Renews from `first_at` on (once unless `repeat`).
async fn renew<F, Fut>(
    extend: F,
    lease: Duration,
    first_at: Instant,
    repeat: bool,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = Result<Option<Instant>>>,
{
    let period = period(lease);
    // After a failure, try again sooner, but without hammering a server that is down.
    let retry = (period / 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let mut next = first_at;
    // The next extend puts back a lease that the last one may have cut.
    let mut again = false;
    loop {
        // The caller's extend may have moved the deadline: a shorter lease is renewed by half
        // of what is left of it if that comes first (it wakes this task to plan again).
        let now = Instant::now();
        let due = next.min(now + status.deadline().saturating_duration_since(now) / 2);
        tokio::select! {
            _ = tokio::time::sleep_until(due.into()) => {}
            _ = status.deadline_moved() => continue,
        }
        if status.is_lost() || status.is_releasing() {
            return;
        }
        // Never shorter than the caller's extend left it or asked for: a lease extended past
        // the ttl keeps its end until it runs down to the ttl.
        let (pending, wanted) = status.begin_renewal(lease, again);
        // An extend still unanswered when the lease ends cannot save it: stop waiting then, so
        // the loss is reported when it happens, not after the client's timeouts.
        let renewed = match tokio::time::timeout_at(status.deadline().into(), extend(wanted)).await
        {
            Ok(renewed) => renewed,
            Err(_) => return report_lost(&status, &listener, Loss::Unanswered),
        };
        match renewed {
            Ok(Some(sent_at)) => {
                // The caller's extend, begun after this one, may have run first: its lease is
                // put back at once.
                again = pending.renewal_answered(lease::deadline(sent_at, wanted));
                if again {
                    // Once the caller's extend is answered (or within half of what is left):
                    // begun after that answer, the next extend ran last in Redis, and the
                    // hold counts on its end at once.
                    let now = Instant::now();
                    let until = now + status.deadline().saturating_duration_since(now) / 2;
                    while status.caller_extend_pending() && Instant::now() < until {
                        tokio::select! {
                            _ = status.deadline_moved() => {}
                            _ = tokio::time::sleep(CALLER_LOOK) => {}
                        }
                    }
                    next = Instant::now();
                    continue;
                }
                if !repeat {
                    return;
                }
                next = sent_at + period;
            }
            Ok(None) => return report_lost(&status, &listener, Loss::NotOurs),
            Err(_) if status.is_releasing() => return,
            Err(err) => {
                if Instant::now() >= status.deadline() {
                    return report_lost(&status, &listener, Loss::Unanswered);
                }
                if let Some(l) = &listener {
                    l.warn(&format!(
                        "lease renewal failed, retrying until the lease ends: {err}"
                    ));
                }
                next = Instant::now() + retry;
            }
        }
    }
}

/// Marks the hold lost and tells the listener, unless a release was attempted meanwhile: then
/// the hold's end is the release's to report (a "not ours" may be the release's own doing).
fn report_lost(status: &HoldStatus, listener: &Option<Arc<dyn Listener>>, how: Loss) {
    if status.is_releasing() {
        return;
    }
    if status.mark_lost() {
        if let Some(l) = listener {
            l.lost(how);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        let s = Duration::from_secs;
        // A full lease: renewal every third, as always.
        assert_eq!(Schedule::renewing(s(9), s(9)).first, s(3));
        // A short grant: renewal, or the one top-up, before half of it is gone.
        assert_eq!(Schedule::renewing(s(9), s(4)).first, s(2));
        assert_eq!(
            Schedule::top_up(s(7)),
            Schedule {
                first: Duration::from_millis(3500),
                repeat: false
            }
        );
    }
}
