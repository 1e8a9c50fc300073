//! `redmutex.Lock`: a lease on a name, held by this object, used as `with` or acquire/release.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args;
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::{About, Named};
use super::hold;
use crate::engine::lock::{LockHandle, OnLost, Wait};

/// A distributed mutex on Redis: `with Lock(client, "name", ttl=5): ...`.
///
/// `ttl: float = 10.0` is the lease in seconds (never None; use `auto_renew=True` for long
/// holds). `timeout: float | None = None` is the default wait of `acquire()` and `with`: None
/// waits forever, 0 tries once. Options: `auto_renew=False`, `fair=False`, `replicas=0`,
/// `on_lost=None`. Not re-entrant; ownership belongs to this object.
#[pyclass(frozen, weakref, module = "redmutex", name = "Lock")]
pub struct PyLock {
    client: Py<PyClient>,
    handle: Arc<LockHandle>,
    name: String,
    /// Names the lock in its errors.
    about: About,
    ttl: Duration,
    /// The wait of `acquire()`/`with` when no timeout is given: None waits forever.
    default_timeout: Option<Duration>,
    on_lost: Option<Arc<Py<PyAny>>>,
}

impl PyLock {
    fn label(&self) -> String {
        self.about.label()
    }

    fn acquire_with(slf: &Bound<'_, Self>, wait: Wait) -> PyResult<bool> {
        let this = slf.get();
        let listener = hold::listener(
            slf.as_any(),
            this.handle.renews(),
            this.label(),
            this.on_lost.clone(),
        )?;
        let handle = this.handle.clone();
        let py = slf.py();
        // The engine decides: done on this thread, or a wait through the runtime
        // (interruptible by signals).
        blocking::run(py, || handle.holder().acquire_blocking(wait, listener, &()))?
            .about(py, &this.about)
    }

    fn listener_for(slf: &Bound<'_, Self>) -> PyResult<Option<OnLost>> {
        let this = slf.get();
        hold::listener(
            slf.as_any(),
            this.handle.renews(),
            this.label(),
            this.on_lost.clone(),
        )
    }
}

#[pymethods]
impl PyLock {
    #[new]
    #[pyo3(signature = (client, name, *, ttl=10.0, timeout=None, auto_renew=None, fair=None, replicas=None, on_lost=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::ttl)] ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        fair: Option<&Bound<'_, PyAny>>,
        replicas: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        let ttl = args::seconds("ttl", ttl)?;
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let fair = fair.map_or(Ok(false), |v| args::flag("fair", v))?;
        let replicas = replicas.map_or(Ok(0), |v| args::count("replicas", v, 0, 1_000_000))?;
        let on_lost = hold::on_lost_arg(on_lost)?;
        let client = coerce_client(client)?;
        let engine_client = client.get().inner.clone();
        Ok(PyLock {
            handle: Arc::new(LockHandle::new(
                engine_client,
                &name_bytes,
                ttl,
                fair,
                replicas as u32,
                auto_renew,
            )?),
            client,
            about: About::new("lock", &String::from_utf8_lossy(&name_bytes)),
            name: String::from_utf8_lossy(&name_bytes).into_owned(),
            ttl,
            default_timeout,
            on_lost,
        })
    }

    /// Takes the lock; False when not acquired in time (`blocking=False` tries once).
    #[pyo3(signature = (blocking=None, timeout=None))]
    fn acquire(
        slf: &Bound<'_, Self>,
        blocking: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let wait = hold::wait_for(blocking, timeout, slf.get().default_timeout)?;
        Self::acquire_with(slf, wait)
    }

    /// Releases the hold (LockNotOwnedError when none, LockLostError when the lease was lost).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        blocking::run(py, || self.handle.holder().release_blocking())?.about(py, &self.about)
    }

    /// The lease now ends `ttl` (default: the lock's ttl) from now.
    #[pyo3(signature = (ttl=None))]
    fn extend(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let lease = hold::extend_lease(ttl)?;
        blocking::run(py, || self.handle.holder().extend_blocking(lease))?.about(py, &self.about)
    }

    /// Somebody holds the lock.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        blocking::run(py, || self.handle.locked_blocking())?.about(py, &self.about)
    }

    /// This object holds the lock, checked against Redis.
    fn owned(&self, py: Python<'_>) -> PyResult<bool> {
        blocking::run(py, || self.handle.holder().owned_blocking())?.about(py, &self.about)
    }

    /// Seconds left on this object's lease; None if not held, 0.0 once the local deadline passed.
    fn remaining(&self) -> Option<f64> {
        self.handle.holder().remaining().map(|d| d.as_secs_f64())
    }

    #[getter]
    fn token(&self) -> Option<String> {
        self.handle.holder().token()
    }

    #[getter]
    fn fence(&self) -> Option<i64> {
        self.handle.fence()
    }

    #[getter]
    fn lost(&self) -> bool {
        self.handle.holder().lost()
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
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn __enter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let this = slf.get();
        let wait = Wait::from_timeout(this.default_timeout);
        if Self::acquire_with(slf, wait)? {
            return Ok(slf.clone());
        }
        Err(hold::enter_timeout(
            slf.py(),
            &this.about,
            this.default_timeout,
        ))
    }

    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        hold::exit(py, &self.handle, exc, &self.about)
    }

    // The asyncio side (`redmutex.aio`) awaits these; same semantics as the blocking ones.

    #[pyo3(signature = (blocking=None, timeout=None))]
    fn _acquire_async<'py>(
        slf: &Bound<'py, Self>,
        blocking: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let wait = hold::wait_for(blocking, timeout, slf.get().default_timeout)?;
        let listener = Self::listener_for(slf)?;
        let this = slf.get();
        hold::acquire_async(
            slf.py(),
            this.handle.clone(),
            wait,
            listener,
            (),
            this.about.clone(),
        )
    }

    fn _enter_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let wait = Wait::from_timeout(this.default_timeout);
        let listener = Self::listener_for(slf)?;
        let timeout_error = hold::enter_timeout(slf.py(), &this.about, this.default_timeout);
        hold::enter_async(
            slf.py(),
            this.handle.clone(),
            wait,
            listener,
            (),
            timeout_error,
            this.about.clone(),
        )
    }

    fn _release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        hold::release_async(py, self.handle.clone(), self.about.clone())
    }

    /// Gives back the hold with `token` at once (released in Redis in the background), if this
    /// object still has it: an acquire that succeeded after its task was cancelled.
    fn _give_back(&self, token: &str) -> bool {
        hold::give_back(&*self.handle, token)
    }

    #[pyo3(signature = (ttl=None))]
    fn _extend_async<'py>(
        &self,
        py: Python<'py>,
        ttl: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        hold::extend_async(
            py,
            self.handle.clone(),
            hold::extend_lease(ttl)?,
            self.about.clone(),
        )
    }

    fn _owned_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        hold::owned_async(py, self.handle.clone(), self.about.clone())
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        hold::query_async(py, async move { handle.locked().await }, self.about.clone())
    }

    fn _exit_async<'py>(&self, py: Python<'py>, body_raised: bool) -> PyResult<Bound<'py, PyAny>> {
        hold::exit_awaitable(py, self.handle.clone(), self.about.clone(), body_raised)
    }

    fn __repr__(&self) -> String {
        let held = self.handle.holder().token().is_some();
        format!(
            "Lock('{}', ttl={}, held={})",
            self.name,
            self.ttl.as_secs_f64(),
            if held { "True" } else { "False" }
        )
    }
}
