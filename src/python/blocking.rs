//! The one blocking helper: runs a future on the runtime with the GIL released, in slices, and
//! between slices lets Python run its signal handlers, so Ctrl-C interrupts any wait.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

use crate::engine::executor::Now;
use crate::engine::runtime;
use crate::engine::waiting;

/// How often a blocked call looks for pending signals.
const SLICE: Duration = Duration::from_millis(50);

pub fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let handle = runtime::handle()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        // The timer must be made inside the runtime's context, hence the async block.
        let step = py
            .detach(|| handle.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await }));
        match step {
            Ok(output) => return Ok(output),
            // Dropping the future on a signal cancels it; the engine cleans up after itself.
            Err(_) => py.check_signals()?,
        }
    }
}

/// Runs a blocking entry point of the engine with the GIL released: the engine either did the
/// work on this thread already (`Now::Done`), or left a future, waited for here through the
/// runtime (so the binding never chooses the transport).
pub fn run<T, F>(py: Python<'_>, start: impl FnOnce() -> Now<T, F> + Send) -> PyResult<T>
where
    T: Send,
    F: Future<Output = T> + Send,
{
    match py.detach(start) {
        Now::Done(output) => Ok(output),
        Now::Later(fut) => wait(py, fut),
    }
}

/// `_waiting_attempts()`: attempts made by waiting acquires so far (first attempts not counted),
/// for tests that count what a woken waiter sent.
#[pyfunction]
pub fn _waiting_attempts() -> u64 {
    waiting::waiting_attempts()
}
