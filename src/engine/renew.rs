//! Background renewal of a hold (auto_renew): extends the lease every third of it, on a task of
//! the Rust runtime, so neither a Python thread hogging the GIL nor a blocked event loop can
//! starve it. It stops at release, never re-creates a hold it lost, and never dies silently:
//! a loss sets `lost` and calls the hold's listener once; transient failures are reported too.
//! It knows nothing of the primitive: it is given the extend operation.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::Result;
use super::hold::HoldStatus;
use super::runtime;

/// Whom renewal tells what it finds.
pub trait Listener: Send + Sync {
    /// The hold was found lost (called once).
    fn lost(&self);
    /// A renewal attempt failed but the lease has not ended yet.
    fn warn(&self, message: &str);
}

pub struct Renewal {
    task: Option<tokio::task::AbortHandle>,
}

impl Renewal {
    pub fn stop(self) {
        if let Some(task) = self.task {
            task.abort();
        }
    }
}

/// Starts renewing: `extend(lease)` makes the lease end `lease` from now and answers
/// Some(sent_at) when it did, None when the hold is not ours any more.
pub fn start<F, Fut>(
    extend: F,
    lease: Duration,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) -> Renewal
where
    F: Fn(Duration) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<Instant>>> + Send + 'static,
{
    let Ok(handle) = runtime::handle() else {
        return Renewal { task: None };
    };
    let task = handle.spawn(renew(extend, lease, status, listener));
    Renewal {
        task: Some(task.abort_handle()),
    }
}

async fn renew<F, Fut>(
    extend: F,
    lease: Duration,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = Result<Option<Instant>>>,
{
    let period = (lease / 3).max(Duration::from_millis(1));
    // After a failure, try again sooner, but without hammering a server that is down.
    let retry = (period / 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next.into()).await;
        if status.is_lost() {
            return;
        }
        // An extend still unanswered when the lease ends cannot save it: stop waiting then, so
        // the loss is reported when it happens, not after the client's timeouts.
        let renewed = match tokio::time::timeout_at(status.deadline().into(), extend(lease)).await {
            Ok(renewed) => renewed,
            Err(_) => return report_lost(&status, &listener),
        };
        match renewed {
            Ok(Some(sent_at)) => {
                status.set_deadline(sent_at.checked_add(lease).unwrap_or(sent_at));
                next = sent_at + period;
            }
            Ok(None) if status.is_releasing() => next = Instant::now() + retry,
            Ok(None) => return report_lost(&status, &listener),
            Err(err) => {
                if Instant::now() >= status.deadline() {
                    return report_lost(&status, &listener);
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

fn report_lost(status: &HoldStatus, listener: &Option<Arc<dyn Listener>>) {
    if status.mark_lost() {
        if let Some(l) = listener {
            l.lost();
        }
    }
}
