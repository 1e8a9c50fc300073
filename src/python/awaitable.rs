//! The asyncio bridge: runs an engine future on the tokio runtime and resolves an asyncio
//! future on the caller's event loop when it ends. The loop never blocks; cancelling the asyncio
//! future aborts the tokio task (whose drop guards clean up in Redis), and first tells an acquire
//! that it is abandoned, so that a grant it obtains all the same is given back.
//!
//! Runtime threads never call into Python. A finished operation goes into its loop's queue, and
//! one byte on a socket pair wakes the loop, which resolves the futures on its own thread (a
//! reader callback). Calling Python from a runtime thread instead (call_soon_threadsafe) can
//! catch that thread re-taking the GIL while the interpreter shuts down, where CPython ends the
//! thread with pthread_exit, which cannot unwind through Rust frames: the process aborts.

use std::future::Future;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::engine::{runtime, Error};

/// What to do when an acquire's future is cancelled, by the future's address, while the entry's
/// `HookKey` lives (its first attempt is out on the loop's connection, or its task runs).
/// `redmutex.aio` tells (`_loop_cancelled`) as the cancellation reaches the awaiting task, so the
/// object is idle again before that task goes on (it may acquire again at once): a done-callback
/// runs only later in the loop's turn, and would cost every acquire one more callback.
type OnCancelled = (usize, Box<dyn FnOnce() + Send>);
static CANCELLED: Mutex<Vec<OnCancelled>> = Mutex::new(Vec::new());

fn cancelled_hooks() -> std::sync::MutexGuard<'static, Vec<OnCancelled>> {
    CANCELLED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes out the hook of the future at `key`.
fn take_hook(key: usize) -> Option<Box<dyn FnOnce() + Send>> {
    let mut hooks = cancelled_hooks();
    let at = hooks.iter().position(|(k, _)| *k == key)?;
    Some(hooks.swap_remove(at).1)
}

/// Takes its future's hook out when dropped (so no hook outlives what it is for, and a new
/// future at the same address never finds it).
pub struct HookKey(usize);

impl Drop for HookKey {
    fn drop(&mut self) {
        drop(take_hook(self.0));
    }
}

/// Registers `hook` for the cancellation of `future`, while the returned key lives.
pub fn on_cancelled(future: &Bound<'_, PyAny>, hook: Box<dyn FnOnce() + Send>) -> HookKey {
    let key = future.as_ptr() as usize;
    cancelled_hooks().push((key, hook));
    HookKey(key)
}

/// Runs the hook registered for the cancelled `future`, if any.
pub fn run_cancelled_hook(future: &Bound<'_, PyAny>) {
    if let Some(hook) = take_hook(future.as_ptr() as usize) {
        hook();
    }
}

/// Told when an acquire's asyncio future is cancelled, before its task is aborted.
pub type Abandon = Arc<dyn Fn() + Send + Sync>;

/// Aborts the tokio task when the asyncio future it feeds is cancelled (a done-callback). An
/// abort only stops the task at its next await: a poll under way still finishes, so an acquire
/// is also told (`abandon`), to give back what it obtains.
#[pyclass(frozen)]
struct AbortOnCancel {
    task: tokio::task::AbortHandle,
    abandon: Option<Abandon>,
}

#[pymethods]
impl AbortOnCancel {
    #[pyo3(signature = (*args))]
    fn __call__(&self, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let cancelled = match args.get_item(0) {
            Ok(fut) => fut.call_method0("cancelled")?.is_truthy()?,
            Err(_) => false,
        };
        if cancelled {
            if let Some(abandon) = &self.abandon {
                abandon();
            }
            self.task.abort();
        }
        Ok(())
    }
}

/// Whether cancelling the awaitable stops the operation. Acquiring stops (and cleans up);
/// releasing runs to its end regardless, so a hold is given back exactly once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    Abort,
    Finish,
}

/// Turns a finished operation into the future's result, on the loop's thread.
type Settle = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send>;

struct Finished {
    future: Py<PyAny>,
    settle: Settle,
    /// An acquire's cancel hook, kept until its future is resolved: a cancel that reaches the
    /// awaiting task after the acquire ended but before the loop resolved its future still
    /// finds it, and gives the hold back at once (the object is idle as the task goes on).
    _hook: Option<HookKey>,
    /// An acquire's abandon: run if the loop is closed before it resolved the future.
    abandon: Option<Abandon>,
}

/// The acquires under way on one loop's runtime tasks, by a number of their own: closing the
/// loop abandons and aborts them (their callers, tasks of that loop, are gone).
#[derive(Default)]
struct InFlight {
    closed: bool,
    next: u64,
    acquires: std::collections::HashMap<u64, (Abandon, Option<tokio::task::AbortHandle>)>,
}

/// An acquire's entry in its loop's `InFlight`, taken out when its task ends, also when the
/// task is aborted (a cancelled acquire) and dropped unfinished.
struct Noted {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Noted {
    fn drop(&mut self) {
        self.shared.in_flight().acquires.remove(&self.id);
    }
}

struct Shared {
    done: Mutex<Vec<Finished>>,
    /// A wake-up byte is on its way and the loop has not drained yet.
    signalled: AtomicBool,
    writer: UnixStream,
    in_flight: Mutex<InFlight>,
}

impl Shared {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn done(&self) -> std::sync::MutexGuard<'_, Vec<Finished>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, finished: Finished) {
        self.done().push(finished);
        self.signal();
    }

    /// `finish` for a noted acquire: its entry goes, and unless the loop was closed meanwhile
    /// it is queued, in one step with `close` (which takes the queue under the same lock), so
    /// that none is queued after `close` emptied the queue. Gives the outcome back if closed.
    fn finish_noted(&self, noted: &Noted, finished: Finished) -> Option<Finished> {
        let mut in_flight = self.in_flight();
        in_flight.acquires.remove(&noted.id);
        if in_flight.closed {
            return Some(finished);
        }
        self.done().push(finished);
        drop(in_flight);
        self.signal();
        None
    }

    fn signal(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            // Non-blocking: if the socket buffer is full, a byte is pending anyway.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// One event loop's end of the bridge: `fileno()` is registered with `loop.add_reader(fileno,
/// waker.drain)` by `redmutex._aio_bridge`, which keeps one waker per loop.
#[pyclass(frozen, module = "redmutex._core", name = "LoopWaker")]
pub struct LoopWaker {
    shared: Arc<Shared>,
    reader: UnixStream,
}

#[pymethods]
impl LoopWaker {
    #[new]
    fn new() -> PyResult<Self> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            signalled: AtomicBool::new(false),
            writer,
            in_flight: Mutex::new(InFlight::default()),
        });
        Ok(LoopWaker { shared, reader })
    }

    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// Resolves every finished operation's future (the loop's reader callback).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let mut sink = [0u8; 64];
        while matches!((&self.reader).read(&mut sink), Ok(n) if n > 0) {}
        self.shared.signalled.store(false, Ordering::Release);
        let finished = std::mem::take(&mut *self.shared.done());
        for Finished { future, settle, .. } in finished {
            let future = future.bind(py);
            // Cancelled meanwhile: the runtime side cleans up (an acquire was told to give back
            // what it obtained).
            if future.call_method0("done")?.is_truthy()? {
                continue;
            }
            match settle(py) {
                Ok(value) => future.call_method1("set_result", (value,))?,
                Err(err) => future.call_method1("set_exception", (err.into_value(py),))?,
            };
        }
        Ok(())
    }

    /// How many acquires are noted as under way on this loop (for tests: an ended or cancelled
    /// one must not stay noted).
    fn _acquires_under_way(&self) -> usize {
        self.shared.in_flight().acquires.len()
    }

    /// The loop is closing (`redmutex._aio_bridge`): its acquires still under way, or ended but
    /// not resolved, are abandoned (a grant is given back, a wait ends), and so is every one
    /// that ends later. Their awaiting tasks never run again: a hold they took would belong to
    /// nobody, and with auto_renew it would be renewed for the life of the process.
    fn close(&self) {
        let (acquires, finished) = {
            let mut in_flight = self.shared.in_flight();
            in_flight.closed = true;
            let finished = std::mem::take(&mut *self.shared.done());
            (std::mem::take(&mut in_flight.acquires), finished)
        };
        for (abandon, task) in acquires.into_values() {
            abandon();
            if let Some(task) = task {
                task.abort();
            }
        }
        for done in finished {
            if let Some(abandon) = &done.abandon {
                abandon();
            }
        }
    }
}

/// An awaitable for `fut`, whose output is turned into a Python object by `convert`.
pub fn spawn<'py, F, T, C>(
    py: Python<'py>,
    on_cancel: OnCancel,
    fut: F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    spawn_with(py, on_cancel, None, fut, convert)
}

/// `spawn` for an acquire: cancelling the awaitable calls `abandon` (then aborts the task).
pub fn spawn_abandonable<'py, F, T, C>(
    py: Python<'py>,
    abandon: Abandon,
    fut: F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    spawn_with(py, OnCancel::Abort, Some(abandon), fut, convert)
}

fn spawn_with<'py, F, T, C>(
    py: Python<'py>,
    on_cancel: OnCancel,
    abandon: Option<Abandon>,
    fut: F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let py_future = event_loop.call_method0("create_future")?;
    spawn_into(
        py,
        &event_loop,
        &py_future,
        on_cancel,
        abandon,
        fut,
        convert,
    )?;
    Ok(py_future)
}

/// How many operations went through the runtime (`spawn` and its kin), for tests that check
/// which path served a call (see `loop_conn::_aio_calls`).
pub static RUNTIME_CALLS: AtomicU64 = AtomicU64::new(0);

/// Runs `fut` on the runtime and resolves `py_future` (of `event_loop`, the running loop) with
/// its outcome, like `spawn` with a future made by the caller.
pub fn spawn_into<F, T, C>(
    py: Python<'_>,
    event_loop: &Bound<'_, PyAny>,
    py_future: &Bound<'_, PyAny>,
    on_cancel: OnCancel,
    abandon: Option<Abandon>,
    fut: F,
    convert: C,
) -> PyResult<()>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    RUNTIME_CALLS.fetch_add(1, Ordering::Relaxed);
    let waker = py
        .import("redmutex._aio_bridge")?
        .call_method1("waker_for", (event_loop,))?;
    let shared = waker
        .cast::<LoopWaker>()
        .map_err(PyErr::from)?
        .get()
        .shared
        .clone();
    let target = py_future.clone().unbind();
    let handle = runtime::handle()?;
    // An acquire is abandoned as soon as its task learns of the cancel (see `on_cancelled`),
    // while the task runs; the done-callback below tells it again (it may come first).
    let hook = abandon.clone().map(|abandon| {
        let hook: Box<dyn FnOnce() + Send> = Box::new(move || abandon());
        on_cancelled(py_future, hook)
    });
    // An acquire is noted as under way on its loop, which abandons it if closed first.
    let noted = match &abandon {
        Some(abandon) => {
            let mut in_flight = shared.in_flight();
            if in_flight.closed {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "the event loop is closing",
                ));
            }
            in_flight.next += 1;
            let id = in_flight.next;
            in_flight.acquires.insert(id, (abandon.clone(), None));
            Some(Noted {
                shared: shared.clone(),
                id,
            })
        }
        None => None,
    };
    let noted_id = noted.as_ref().map(|n| n.id);
    let ended_abandon = abandon.clone();
    let task_shared = shared.clone();
    let task = handle.spawn(async move {
        let shared = task_shared;
        let outcome = fut.await;
        let settle: Settle = Box::new(move |py| match outcome {
            Ok(value) => convert(py, value),
            Err(err) => Err(PyErr::from(err)),
        });
        let finished = Finished {
            future: target,
            settle,
            _hook: hook,
            abandon: ended_abandon,
        };
        match &noted {
            Some(noted) => {
                if let Some(closed) = shared.finish_noted(noted, finished) {
                    if let Some(abandon) = &closed.abandon {
                        abandon();
                    }
                }
            }
            None => shared.finish(finished),
        }
    });
    if let Some(id) = noted_id {
        if let Some(entry) = shared.in_flight().acquires.get_mut(&id) {
            entry.1 = Some(task.abort_handle());
        }
    }
    if on_cancel == OnCancel::Abort {
        let canceller = AbortOnCancel {
            task: task.abort_handle(),
            abandon,
        };
        py_future.call_method1("add_done_callback", (canceller,))?;
    }
    Ok(())
}
