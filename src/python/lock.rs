//! `redmutex.Lock`: a lease on a name, held by this object, used as `with` or acquire/release.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args;
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::Named;
use super::hold::{self, lock_like_methods, HoldCore, LockLike};
use crate::engine::lock::LockHandle;

/// A distributed mutex on Redis: `with Lock(client, "name", ttl=5): ...`.
///
/// `ttl: float = 10.0` is the lease in seconds (never None; use `auto_renew=True` for long
/// holds). `timeout: float | None = None` is the default wait of `acquire()` and `with`: None
/// waits forever, 0 tries once. Options: `auto_renew=False`, `fair=False`, `replicas=0`,
/// `on_lost=None`. Not re-entrant; ownership belongs to this object.
#[pyclass(frozen, weakref, module = "redmutex", name = "Lock")]
pub struct PyLock {
    client: Py<PyClient>,
    core: HoldCore<LockHandle>,
}

impl LockLike for PyLock {
    type Handle = LockHandle;
    fn core(&self) -> &HoldCore<LockHandle> {
        &self.core
    }
    fn blocking_context() {}
}

lock_like_methods! {
    PyLock;
    /// Takes the lock; False when not acquired in time (`blocking=False` tries once).
    fn acquire;
    /// Releases the hold (LockNotOwnedError when none, LockLostError when the lease was lost).
    fn release;
    /// The lease now ends `ttl` (default: the lock's ttl) from now.
    fn extend;
    /// This object holds the lock, checked against Redis.
    fn owned;
    fn _acquire_async();

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
        let handle = LockHandle::new(
            engine_client,
            &name_bytes,
            ttl,
            fair,
            replicas as u32,
            auto_renew,
        )?;
        Ok(PyLock {
            core: HoldCore::new(handle, "lock", &name_bytes, ttl, default_timeout, on_lost),
            client,
        })
    }

    /// Somebody holds the lock.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        let (handle, about) = (&self.core.handle, &self.core.about);
        blocking::run(py, || handle.locked_blocking())?.about(py, about)
    }

    #[getter]
    fn fence(&self) -> Option<i64> {
        self.core.handle.fence()
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.core.handle.clone();
        hold::query_async(py, async move { handle.locked().await }, self.core.about.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "Lock('{}', ttl={}, held={})",
            self.core.name,
            self.core.ttl(),
            self.core.held_repr()
        )
    }
}
