//! The one blocking helper: runs a future on the runtime with the GIL released, in slices, and
//! between slices lets Python run its signal handlers, so Ctrl-C interrupts any wait. A call
//! that waits on its own thread (a direct connection's read, `engine::interrupt`) asks Python's
//! signal handlers between its own slices: a handler's exception (KeyboardInterrupt) ends it,
//! and is what the caller gets.

use std::cell::RefCell;
use std::future::Future;
use std::task::{Context, Poll};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Handle;

use super::greenlets;

use crate::engine::executor::{self, Now};
use crate::engine::interrupt;
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
    if greenlets::cooperative(py)? {
        return wait_cooperatively(py, handle, fut);
    }
    let mut fut = std::pin::pin!(fut);
    loop {
        // The timer must be made inside the runtime's context, hence the async block.
        let step = detach_interruptible(py, || {
            handle.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await })
        })?;
        match step {
            Ok(output) => return Ok(output),
            // Dropping the future on a signal cancels it; the engine cleans up after itself.
            Err(_) => py.check_signals()?,
        }
    }
}

/// `wait` on a thread whose greenlets gevent schedules: the future is polled here, in the
/// runtime's context, and between polls the greenlet sleeps through gevent until the future's
/// waker is woken (the runtime's threads drive its timers and sockets), so the thread's other
/// greenlets (the holder this wait is for, say) run meanwhile. On the heap: other greenlets
/// reuse this stack while it sleeps, and the runtime's threads may write into a pending
/// future (intrusive wait lists).
fn wait_cooperatively<F>(py: Python<'_>, handle: &Handle, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let wakeup = greenlets::Wakeup::new(py)?;
    let waker = wakeup.waker();
    let mut fut = Box::pin(fut);
    loop {
        let polled = detach_interruptible(py, || {
            let _entered = handle.enter();
            executor::cooperatively(|| fut.as_mut().poll(&mut Context::from_waker(waker)))
        })?;
        if let Poll::Ready(output) = polled {
            return Ok(output);
        }
        wakeup.sleep(py, SLICE)?;
        py.check_signals()?;
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
    match detach_interruptible(py, start)? {
        Now::Done(output) => Ok(output),
        Now::Later(fut) => wait(py, fut),
    }
}

thread_local! {
    /// The exception a signal handler raised while this thread waited detached (see
    /// `signalled`).
    static SIGNALLED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Runs `f` with the GIL released, its reads on this thread asking Python's signal handlers
/// between slices (`signalled`). When a handler raised, that exception is the outcome: the
/// call it ended failed (as if timed out: an attempt that may still run is given back by the
/// engine), and any other result is dropped (a hold it took stays known to its object).
fn detach_interruptible<R: Send>(py: Python<'_>, f: impl FnOnce() -> R + Send) -> PyResult<R> {
    let output = py.detach(|| interrupt::watching(signalled, f));
    match SIGNALLED.with(|s| s.borrow_mut().take()) {
        Some(err) => Err(err),
        None => Ok(output),
    }
}

/// The check `detach_interruptible` installs: runs Python's signal handlers; true once one of
/// them raised (kept for the caller, and true from then on).
fn signalled() -> bool {
    if SIGNALLED.with(|s| s.borrow().is_some()) {
        return true;
    }
    match Python::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(err) => {
            SIGNALLED.with(|s| *s.borrow_mut() = Some(err));
            true
        }
    }
}

/// `_waiting_attempts()`: attempts made by waiting acquires so far (first attempts not counted),
/// for tests that count what a woken waiter sent.
#[pyfunction]
pub fn _waiting_attempts() -> u64 {
    waiting::waiting_attempts()
}
