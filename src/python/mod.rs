//! The pyo3 binding: classes and functions of `redmutex._core`. Only conversion lives here; the
//! behaviour is the engine's.

mod args;
mod awaitable;
mod blocking;
mod cache;
mod client;
mod errors;
mod hold;
mod lock;
mod log;
mod recipes;
mod rwlock;
mod semaphore;

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;

/// Set by an atexit hook: from then on no background thread calls into Python (a thread that
/// takes the GIL during interpreter shutdown is ended by CPython, which aborts through Rust).
static EXITING: AtomicBool = AtomicBool::new(false);

pub fn interpreter_exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

#[pyfunction]
fn _interpreter_exiting() {
    EXITING.store(true, Ordering::Release);
}

#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<awaitable::LoopWaker>()?;
    m.add_class::<lock::PyLock>()?;
    m.add_class::<semaphore::PySemaphore>()?;
    m.add_class::<rwlock::PyRwLock>()?;
    m.add_class::<rwlock::PyRwSide>()?;
    m.add_class::<cache::PyCacheStore>()?;
    m.add_class::<cache::PyFillClaim>()?;
    m.add("CACHE_HIT", cache::HIT)?;
    m.add("CACHE_CLAIMED", cache::CLAIMED)?;
    m.add("CACHE_BUSY", cache::BUSY)?;
    m.add_function(wrap_pyfunction!(recipes::acquire_token, m)?)?;
    m.add_function(wrap_pyfunction!(recipes::release_token, m)?)?;
    m.add_function(wrap_pyfunction!(_interpreter_exiting, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
