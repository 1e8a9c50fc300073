//! The pyo3 binding: classes and functions of `redmutex._core`. Only conversion lives here; the
//! behaviour is the engine's.

mod admin;
mod args;
mod awaitable;
mod blocking;
mod cache;
mod client;
mod compat;
mod compat_holds;
mod errors;
mod greenlets;
mod hold;
mod holds_by_token;
mod lock;
mod log;
mod loop_conn;
mod loop_hold;
mod multilock;
mod recipe_holds;
mod recipes;
mod rwlock;
mod semaphore;

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// The gate through which background threads call into Python. CPython ends a thread that
/// takes the GIL once the interpreter finalizes (pthread_exit), which cannot unwind through
/// Rust frames: the process aborts. So an atexit hook (`_interpreter_exiting`, run while the
/// interpreter still works) closes the gate and waits for the threads already inside to leave;
/// a thread that finds it closed never touches Python. Checking a flag before spawning such a
/// thread is not enough: the thread may take the GIL only after finalization began.
struct PythonGate {
    /// (closed, how many threads are inside)
    state: Mutex<(bool, usize)>,
    left: Condvar,
}

static GATE: PythonGate = PythonGate {
    state: Mutex::new((false, 0)),
    left: Condvar::new(),
};

/// How long interpreter exit waits for background threads still in Python (an `on_lost`
/// callback that runs on): past that, exit goes on.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// A background thread's pass into Python; the gate counts it until dropped.
pub struct InPython(());

impl Drop for InPython {
    fn drop(&mut self) {
        let mut state = GATE.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1 = state.1.saturating_sub(1);
        if state.1 == 0 {
            GATE.left.notify_all();
        }
    }
}

/// Lets a background thread (never a thread that Python started) call into Python: None once
/// the interpreter is exiting, and then the thread must not attach.
pub fn enter_python() -> Option<InPython> {
    let mut state = GATE.state.lock().unwrap_or_else(|p| p.into_inner());
    if state.0 {
        return None;
    }
    state.1 += 1;
    Some(InPython(()))
}

pub fn interpreter_exiting() -> bool {
    GATE.state.lock().unwrap_or_else(|p| p.into_inner()).0
}

/// The atexit hook: closes the gate, then waits (without the GIL, so they can finish) for the
/// threads inside to leave.
#[pyfunction]
fn _interpreter_exiting(py: Python<'_>) {
    GATE.state.lock().unwrap_or_else(|p| p.into_inner()).0 = true;
    py.detach(|| {
        let until = Instant::now() + EXIT_WAIT;
        let mut state = GATE.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.1 > 0 {
            let now = Instant::now();
            if now >= until {
                return;
            }
            state = match GATE.left.wait_timeout(state, until - now) {
                Ok((state, _)) => state,
                Err(p) => p.into_inner().0,
            };
        }
    });
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<awaitable::LoopWaker>()?;
    m.add_class::<loop_conn::LoopConn>()?;
    m.add_class::<lock::PyLock>()?;
    m.add_class::<multilock::PyMultiLock>()?;
    m.add_class::<compat::PyCompatLock>()?;
    m.add_class::<compat::PyCompatHold>()?;
    m.add_class::<semaphore::PySemaphore>()?;
    m.add_class::<rwlock::PyRwLock>()?;
    m.add_class::<rwlock::PyRwSide>()?;
    m.add_class::<cache::PyCacheStore>()?;
    m.add_class::<cache::PyFillClaim>()?;
    m.add_class::<cache::PyCacheHit>()?;
    m.add_function(wrap_pyfunction!(recipes::acquire_token, m)?)?;
    m.add_function(wrap_pyfunction!(recipes::release_token, m)?)?;
    m.add_function(wrap_pyfunction!(_interpreter_exiting, m)?)?;
    m.add_function(wrap_pyfunction!(blocking::_waiting_attempts, m)?)?;
    m.add_function(wrap_pyfunction!(greenlets::_caller, m)?)?;
    m.add_function(wrap_pyfunction!(greenlets::_woken_waits, m)?)?;
    m.add_function(wrap_pyfunction!(loop_conn::_aio_calls, m)?)?;
    m.add_function(wrap_pyfunction!(loop_hold::_loop_cancelled, m)?)?;
    admin::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
