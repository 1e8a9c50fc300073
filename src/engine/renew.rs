//! Background renewal of a hold (auto_renew): extends the lease every third of it, on a task of
//! the Rust runtime, so neither a Python thread hogging the GIL nor a blocked event loop can
//! starve it. It stops at release, never re-creates a lock it lost, and never dies silently:
//! a loss sets `lost` and calls the hold's listener once; transient failures are reported too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::Backend;
use super::lock::{extend_on, HoldStatus, LockSpec};
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

pub fn start(
    backend: Backend,
    spec: LockSpec,
    token: String,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) -> Renewal {
    let Ok(handle) = runtime::handle() else {
        return Renewal { task: None };
    };
    let task = handle.spawn(renew(backend, spec, token, status, listener));
    Renewal {
        task: Some(task.abort_handle()),
    }
}

async fn renew(
    backend: Backend,
    spec: LockSpec,
    token: String,
    status: Arc<HoldStatus>,
    listener: Option<Arc<dyn Listener>>,
) {
    let period = (spec.lease / 3).max(Duration::from_millis(1));
    // After a failure, try again sooner, but without hammering a server that is down.
    let retry = (period / 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next.into()).await;
        if status.is_lost() {
            return;
        }
        let sent_at = Instant::now();
        match extend_on(&backend, &spec.keys, &token, spec.lease).await {
            Ok(Some(deadline)) => {
                status.set_deadline(deadline);
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
                        "lock renewal failed, retrying until the lease ends: {err}"
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
