//! The one blocking helper: runs a future on the runtime with the GIL released, in slices, and
//! between slices lets Python run its signal handlers, so Ctrl-C interrupts any wait.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

use crate::engine::runtime;

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

/// One call made on the caller's thread when `direct` (one round trip on the thread's own
/// connection, the GIL released), else waited for on the runtime as `wait` does.
pub fn direct_or_wait<T, D, F>(
    py: Python<'_>,
    direct: bool,
    on_thread: D,
    runtime: F,
) -> PyResult<T>
where
    T: Send,
    D: FnOnce() -> T + Send,
    F: Future<Output = T> + Send,
{
    if direct {
        return Ok(py.detach(on_thread));
    }
    wait(py, runtime)
}
