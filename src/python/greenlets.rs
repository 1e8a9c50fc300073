//! gevent. Under its monkey-patching the greenlets of a thread are what `threading` calls
//! threads, and they take turns on one OS thread. So a caller is told apart by its greenlet
//! (`context`): another greenlet is another owner of a re-entrant lock and of an RWLock's holds,
//! as for `threading.RLock`. And a blocking call that waits lets the other greenlets run
//! (`wait`): blocking the OS thread would stall all of them, the holder it waits for included.
//! The Python side is `redmutex._greenlets`; without gevent's patching nothing here calls it.

use std::cell::Cell;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};

/// Set once gevent was seen to have monkey-patched `threading` (`patched`): patching cannot be
/// undone, so it is never cleared.
static PATCHED: AtomicBool = AtomicBool::new(false);

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This OS thread as a caller: never reused within the process (Python's idents can be).
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    /// Whether this thread runs a gevent hub, once asked (`cooperative`).
    static HUB: Cell<Option<bool>> = const { Cell::new(None) };
}

static HELPERS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn helpers(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    HELPERS
        .get_or_try_init(py, || Ok(py.import("redmutex._greenlets")?.unbind()))
        .map(|m| m.bind(py))
}

/// `sys.modules`, and the name gevent's patching module has there.
static MODULES: PyOnceLock<(Py<PyDict>, Py<PyString>)> = PyOnceLock::new();

/// Whether gevent has monkey-patched `threading` in this process. Asked on each use until it
/// has (a dictionary lookup while gevent's `monkey` module is not loaded): a program may patch
/// after it made its Clients (gunicorn's gevent worker patches in the forked worker, after
/// `--preload` imported the application). An error of the Python side is the caller's: a
/// signal handler's exception (Ctrl-C's KeyboardInterrupt) may land in it, and must not be
/// taken for "not patched".
fn patched(py: Python<'_>) -> PyResult<bool> {
    if PATCHED.load(Ordering::Relaxed) {
        return Ok(true);
    }
    let (modules, monkey) = MODULES.get_or_try_init(py, || -> PyResult<_> {
        let modules = py
            .import("sys")?
            .getattr("modules")?
            .cast_into::<PyDict>()?;
        Ok((
            modules.unbind(),
            PyString::intern(py, "gevent.monkey").unbind(),
        ))
    })?;
    if modules.bind(py).get_item(monkey.bind(py))?.is_none() {
        return Ok(false);
    }
    let now = helpers(py)?.call_method0("patched")?.is_truthy()?;
    if now {
        PATCHED.store(true, Ordering::Relaxed);
    }
    Ok(now)
}

/// The caller as an owner: the OS thread, or under gevent's patching the greenlet. A number
/// never reused within the process. Fails only with what the Python side raised (a signal
/// handler's exception: see `patched`).
pub fn context() -> PyResult<u64> {
    let thread = THREAD.with(|t| *t);
    Python::attach(|py| {
        if !patched(py)? {
            return Ok(thread);
        }
        helpers(py)?.call_method0("current")?.extract::<u64>()
    })
}

/// Whether a wait on this thread should let its other greenlets run: gevent patched
/// `threading` and this thread runs a hub (a thread of gevent's threadpool, or a runtime
/// callback's, has none and blocks as without gevent). An error is the caller's (see
/// `patched`): taken for "no hub", it would block the thread, its other greenlets with it.
pub fn cooperative(py: Python<'_>) -> PyResult<bool> {
    if !patched(py)? {
        return Ok(false);
    }
    if HUB.with(Cell::get) == Some(true) {
        return Ok(true);
    }
    // Asked again until a hub exists: a thread makes its hub on its first gevent call.
    let has_hub = helpers(py)?.call_method0("has_hub")?.is_truthy()?;
    HUB.with(|h| h.set(Some(has_hub)));
    Ok(has_hub)
}

/// What a cooperative wait sleeps on: a socket pair whose writing end is the future's waker
/// (`waker`) and whose reading end the greenlet waits on through gevent (`sleep`), so that the
/// thread's other greenlets run meanwhile.
pub struct Wakeup {
    ends: Arc<SocketPair>,
    waker: Waker,
    wait_readable: Py<PyAny>,
}

/// Both ends live as long as any clone of the waker (a registration may outlive the wait), so
/// a late wake-up never writes to a closed peer.
struct SocketPair {
    reader: UnixStream,
    writer: UnixStream,
}

impl Wake for SocketPair {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // A full socket already has a wake-up pending; after any other error the greenlet
        // still polls again once its slice passed.
        let _ = (&self.writer).write(&[1]);
    }
}

impl Wakeup {
    pub fn new(py: Python<'_>) -> PyResult<Self> {
        let (reader, writer) = UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        writer.set_nonblocking(true)?;
        let ends = Arc::new(SocketPair { reader, writer });
        Ok(Wakeup {
            waker: Waker::from(ends.clone()),
            ends,
            wait_readable: helpers(py)?.getattr("wait_readable")?.unbind(),
        })
    }

    pub fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Lets the thread's other greenlets run until the waker was woken or `slice` passed.
    pub fn sleep(&self, py: Python<'_>, slice: Duration) -> PyResult<()> {
        let reader = &self.ends.reader;
        self.wait_readable
            .call1(py, (reader.as_raw_fd(), slice.as_secs_f64()))?;
        let mut drain = [0u8; 64];
        loop {
            match (&*reader).read(&mut drain) {
                Ok(n) if n == drain.len() => continue,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                // Drained (WouldBlock), or a short read that emptied it.
                _ => return Ok(()),
            }
        }
    }
}

/// `_caller()`: the calling thread (or greenlet, under gevent's patching) as `context` numbers
/// it, for the cache's record of the fills each caller runs.
#[pyfunction]
pub fn _caller() -> PyResult<u64> {
    context()
}
