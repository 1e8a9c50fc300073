//! `redmutex.RWLock`: many readers or one writer. `read()` and `write()` return a new lock object
//! each call, with the same acquire/release/extend/owned/`with` behaviour as `Lock`.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args;
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::{About, Named};
use super::greenlets;
use super::hold::{self, lock_like_methods, HoldCore, LockLike};
use crate::engine::rwlock::{Mode, RwHandle, RwLock};

/// A read-write lock: `with rw.read(): ...` (many readers) or `with rw.write(): ...` (one writer).
///
/// `ttl: float = 10.0` is each side's lease in seconds. `timeout: float | None = None` is the
/// default wait: None waits forever, 0 tries once. Options: `auto_renew=False`, `on_lost=None`.
///
/// Writer-preferring: while a writer holds the write lock or waits for it, no new reader gets
/// in, so readers that keep arriving never starve a writer, but writers that follow each other
/// without a gap starve readers (a reader gets in only when no writer holds or waits). When
/// readers must get through: leave such gaps (batch writes, or have each writer pause after its
/// release for longer than the other writers hold), give readers a timeout and a fallback, or
/// use one `Lock(..., fair=True)` for both to serve them in arrival order (readers then do not
/// share).
///
/// Nesting: a thread that holds a read lock gets another read at once, even while a writer
/// waits; a read->write upgrade, or any acquire while it holds the write lock, raises LockError
/// instead of waiting for itself. Both hold through any RWLock object of the same client and
/// name (a function that makes its own `RWLock(client, name)` on each call nests too).
#[pyclass(frozen, module = "redmutex", name = "RWLock")]
pub struct PyRwLock {
    client: Py<PyClient>,
    core: Arc<RwLock>,
    name: String,
    /// Names the RWLock in its errors.
    about: About,
    ttl: Duration,
    default_timeout: Option<Duration>,
    auto_renew: bool,
    on_lost: Option<Arc<Py<PyAny>>>,
}

/// The read or the write lock of an RWLock (made by `RWLock.read()` / `RWLock.write()`),
/// with the acquire/release/extend/owned methods and `with` behaviour of Lock.
#[pyclass(frozen, weakref, module = "redmutex", name = "RWLockSide")]
pub struct PyRwSide {
    rwlock: Py<PyRwLock>,
    core: HoldCore<RwHandle>,
}

impl PyRwLock {
    fn side(slf: &Bound<'_, Self>, mode: Mode) -> PyRwSide {
        let this = slf.get();
        PyRwSide {
            rwlock: slf.clone().unbind(),
            core: HoldCore {
                handle: Arc::new(this.core.side(mode)),
                name: this.name.clone(),
                about: this.about.as_kind(match mode {
                    Mode::Read => "read lock",
                    Mode::Write => "write lock",
                }),
                ttl: this.ttl,
                default_timeout: this.default_timeout,
                on_lost: this.on_lost.clone(),
                listener: Default::default(),
            },
        }
    }
}

#[pymethods]
impl PyRwLock {
    #[new]
    #[pyo3(signature = (client, name, *, ttl=10.0, timeout=None, auto_renew=None, on_lost=None))]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::ttl)] ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        let ttl = args::seconds("ttl", ttl)?;
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let on_lost = hold::on_lost_arg(on_lost)?;
        let client = coerce_client(client)?;
        let engine_client = client.get().inner.clone();
        Ok(PyRwLock {
            core: Arc::new(RwLock::new(engine_client, &name_bytes, ttl, auto_renew)?),
            client,
            about: About::new("RWLock", &String::from_utf8_lossy(&name_bytes)),
            name: String::from_utf8_lossy(&name_bytes).into_owned(),
            ttl,
            default_timeout,
            auto_renew,
            on_lost,
        })
    }

    /// A new read lock object: many readers may hold the lock at once; it waits while a writer
    /// holds or waits for the write lock.
    fn read(slf: &Bound<'_, Self>) -> PyRwSide {
        Self::side(slf, Mode::Read)
    }

    /// A new write lock object: one writer and no readers; while it waits, new readers wait too.
    fn write(slf: &Bound<'_, Self>) -> PyRwSide {
        Self::side(slf, Mode::Write)
    }

    /// Somebody holds the lock: a writer, or at least one live reader.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        let core = self.core.clone();
        let state =
            blocking::wait(py, async move { core.state().await })?.about(py, &self.about)?;
        Ok(state.writer || state.readers > 0)
    }

    /// How many live readers hold the lock now, in every process.
    fn readers(&self, py: Python<'_>) -> PyResult<i64> {
        let core = self.core.clone();
        Ok(blocking::wait(py, async move { core.state().await })?
            .about(py, &self.about)?
            .readers)
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core.clone();
        hold::query_async(
            py,
            async move {
                let state = core.state().await?;
                Ok(state.writer || state.readers > 0)
            },
            self.about.clone(),
        )
    }

    fn _readers_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.core.clone();
        hold::query_async(
            py,
            async move { Ok(core.state().await?.readers) },
            self.about.clone(),
        )
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn ttl(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    #[getter]
    fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        format!("RWLock('{}', ttl={})", self.name, self.ttl.as_secs_f64())
    }
}

impl LockLike for PyRwSide {
    type Handle = RwHandle;
    fn core(&self) -> &HoldCore<RwHandle> {
        &self.core
    }
    fn blocking_context() -> PyResult<u64> {
        // The calling thread (or greenlet, under gevent), as the deadlock guard tells contexts
        // apart.
        greenlets::context()
    }
}

impl PyRwSide {
    fn mode_name(&self) -> &'static str {
        match self.core.handle.mode() {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

lock_like_methods! {
    PyRwSide;
    /// Takes the lock; False when not acquired in time (`blocking=False` tries once).
    /// Raises LockError where waiting would deadlock on this thread's own holds of the same
    /// name, through any RWLock of the client (a read->write upgrade, or any lock while holding
    /// its write lock).
    fn acquire;
    /// Releases the hold (LockNotOwnedError when none, LockLostError when the lease was lost).
    fn release;
    /// The lease now ends `ttl` (default: the RWLock's ttl) from now.
    fn extend;
    /// This object holds its lock, checked against Redis.
    fn owned;
    /// `context` tells the caller apart for the deadlock guard (asyncio: the task's id).
    fn _acquire_async(context: u64);

    /// Somebody holds the read-write lock: a writer, or at least one live reader.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        blocking::wait(py, self.core.handle.locked())?.about(py, &self.core.about)
    }

    /// "read" or "write".
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode_name()
    }

    /// The RWLock this lock object belongs to.
    #[getter]
    fn rwlock(&self, py: Python<'_>) -> Py<PyRwLock> {
        self.rwlock.clone_ref(py)
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.core.handle.clone();
        hold::query_async(py, async move { handle.locked().await }, self.core.about.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "RWLock('{}').{}(held={})",
            self.core.name,
            self.mode_name(),
            self.core.held_repr()
        )
    }
}
