//! gevent. The greenlets of a thread that runs a gevent hub take turns on it, so a blocking call
//! that waits lets the others run (`Wakeup`): blocking the OS thread would stall all of them,
//! the holder it waits for included. Under gevent's monkey-patching the greenlets are also what
//! `threading` calls threads, so a caller is then told apart by its greenlet (`context`):
//! another greenlet is another owner of a re-entrant lock and of an RWLock's holds, as for
//! `threading.RLock`. The Python side is `redmutex._greenlets`; without gevent loaded nothing
//! here calls it.

use std::cell::{Cell, RefCell};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// `sys.modules`, and the names gevent and its patching module have there.
static MODULES: PyOnceLock<(Py<PyDict>, Py<PyString>, Py<PyString>)> = PyOnceLock::new();

/// Whether `sys.modules` has gevent (`monkey`: its patching module): a dictionary lookup.
fn loaded(py: Python<'_>, monkey: bool) -> PyResult<bool> {
    let (modules, gevent, patching) = MODULES.get_or_try_init(py, || -> PyResult<_> {
        let modules = py
            .import("sys")?
            .getattr("modules")?
            .cast_into::<PyDict>()?;
        Ok((
            modules.unbind(),
            PyString::intern(py, "gevent").unbind(),
            PyString::intern(py, "gevent.monkey").unbind(),
        ))
    })?;
    let name = if monkey { patching } else { gevent };
    Ok(modules.bind(py).get_item(name.bind(py))?.is_some())
}

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
    if !loaded(py, true)? {
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

/// Whether a wait on this thread should let its other greenlets run: this thread runs a gevent
/// hub (a thread of gevent's threadpool, or a runtime callback's, has none and blocks as
/// without gevent). With or without the patching: `patch_all(thread=False)` leaves threads
/// alone, but the greenlets of a hub's thread still take turns on it. An error is the
/// caller's (see `patched`): taken for "no hub", it would block the thread, its other
/// greenlets with it.
pub fn cooperative(py: Python<'_>) -> PyResult<bool> {
    if HUB.with(Cell::get) == Some(true) {
        return Ok(true);
    }
    if !loaded(py, false)? {
        return Ok(false);
    }
    // Asked again until a hub exists: a thread makes its hub on its first gevent call.
    let has_hub = helpers(py)?.call_method0("has_hub")?.is_truthy()?;
    HUB.with(|h| h.set(Some(has_hub)));
    Ok(has_hub)
}

/// The wake-ups of one OS thread's cooperative waits: one socket for all of them, which the
/// thread's hub watches (`redmutex._greenlets.Wakeups`), and the waits woken since it was last
/// read. One per thread, not per wait: a thousand greenlets waiting at once would otherwise
/// take two file descriptors each.
struct ThreadWakeups {
    pid: u32,
    reader: UnixStream,
    writer: UnixStream,
    woken: Mutex<Vec<u64>>,
}

thread_local! {
    /// This thread's wake-ups and their Python side, made by its first cooperative wait (again
    /// in a forked child, which must not share the parent's socket).
    static THREAD_WAKEUPS: RefCell<Option<(Arc<ThreadWakeups>, Py<PyAny>)>> =
        const { RefCell::new(None) };
}

static NEXT_WAIT: AtomicU64 = AtomicU64::new(1);

/// One wait's waker: notes the wait as woken and wakes the thread's hub.
struct WaitWaker {
    wait: u64,
    thread: Arc<ThreadWakeups>,
}

impl Wake for WaitWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut woken = self.thread.woken.lock().unwrap_or_else(|p| p.into_inner());
        if !woken.contains(&self.wait) {
            woken.push(self.wait);
        }
        drop(woken);
        // A full socket already has a wake-up pending; after any other error the greenlet
        // still polls again once its slice passed.
        let _ = (&self.thread.writer).write(&[1]);
    }
}

/// This thread's wake-ups, made on first use (and anew in a forked child).
fn thread_wakeups(py: Python<'_>) -> PyResult<(Arc<ThreadWakeups>, Py<PyAny>)> {
    let pid = std::process::id();
    if let Some(found) = THREAD_WAKEUPS.with(|w| {
        w.borrow()
            .as_ref()
            .filter(|(t, _)| t.pid == pid)
            .map(|(t, p)| (t.clone(), p.clone_ref(py)))
    }) {
        return Ok(found);
    }
    let (reader, writer) = UnixStream::pair()?;
    reader.set_nonblocking(true)?;
    writer.set_nonblocking(true)?;
    let thread = Arc::new(ThreadWakeups {
        pid,
        reader,
        writer,
        woken: Mutex::new(Vec::new()),
    });
    let fd = thread.reader.as_raw_fd();
    let waits = helpers(py)?.getattr("Wakeups")?.call1((fd,))?.unbind();
    THREAD_WAKEUPS.with(|w| *w.borrow_mut() = Some((thread.clone(), waits.clone_ref(py))));
    Ok((thread, waits))
}

/// `_woken_waits()`: the waits of this thread woken since the last call, its socket drained
/// (for `redmutex._greenlets.Wakeups`, on the thread's hub).
#[pyfunction]
pub fn _woken_waits() -> Vec<u64> {
    THREAD_WAKEUPS.with(|w| {
        let Some(thread) = w.borrow().as_ref().map(|(t, _)| t.clone()) else {
            return Vec::new();
        };
        let mut drain = [0u8; 256];
        loop {
            match (&thread.reader).read(&mut drain) {
                Ok(n) if n == drain.len() => continue,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                // Drained (WouldBlock), or a short read that emptied it.
                _ => break,
            }
        }
        let mut woken = thread.woken.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *woken)
    })
}

/// One cooperative wait: its waker (`waker`), and its sleeps through gevent (`sleep`), during
/// which the thread's other greenlets run.
pub struct Wakeup {
    wait: u64,
    waker: Waker,
    waits: Py<PyAny>,
}

impl Wakeup {
    pub fn new(py: Python<'_>) -> PyResult<Self> {
        let (thread, waits) = thread_wakeups(py)?;
        let wait = NEXT_WAIT.fetch_add(1, Ordering::Relaxed);
        waits.call_method1(py, "begin", (wait,))?;
        Ok(Wakeup {
            wait,
            waker: Waker::from(Arc::new(WaitWaker { wait, thread })),
            waits,
        })
    }

    pub fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Lets the thread's other greenlets run until the waker was woken or `slice` passed.
    pub fn sleep(&self, py: Python<'_>, slice: Duration) -> PyResult<()> {
        self.waits
            .call_method1(py, "sleep", (self.wait, slice.as_secs_f64()))?;
        Ok(())
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        // (Nothing to do with an error here: the wait is over either way.)
        Python::attach(|py| {
            let _ = self.waits.call_method1(py, "end", (self.wait,));
        });
    }
}

/// `_caller()`: the calling thread (or greenlet, under gevent's patching) as `context` numbers
/// it, for the cache's record of the fills each caller runs.
#[pyfunction]
pub fn _caller() -> PyResult<u64> {
    context()
}
