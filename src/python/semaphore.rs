//! `redmutex.Semaphore`: at most `limit` live holders across all processes; this object holds at
//! most one permit at a time, used as `with` or acquire/release, exactly like `Lock`.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args;
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::Named;
use super::hold::{self, lock_like_methods, HoldCore, LockLike};
use crate::engine::semaphore::SemaphoreHandle;
use crate::protocol::lease::MAX_MS;

/// At most `limit` holders of a name at once: `with Semaphore(client, "jobs", 3): ...`.
///
/// `ttl: float = 10.0` is each holder's lease in seconds. `timeout: float | None = None` is the
/// default wait: None waits forever, 0 tries once. Options: `fair=True`, `auto_renew=False`,
/// `on_lost=None`.
#[pyclass(frozen, weakref, module = "redmutex", name = "Semaphore")]
pub struct PySemaphore {
    client: Py<PyClient>,
    core: HoldCore<SemaphoreHandle>,
    limit: u64,
    fair: bool,
}

impl LockLike for PySemaphore {
    type Handle = SemaphoreHandle;
    fn core(&self) -> &HoldCore<SemaphoreHandle> {
        &self.core
    }
    fn blocking_context() -> PyResult<()> {
        Ok(())
    }
}

lock_like_methods! {
    PySemaphore;
    /// Takes a permit; False when not acquired in time (`blocking=False` tries once).
    fn acquire;
    /// Gives the permit back and wakes the waiters it lets in.
    fn release;
    /// The permit's lease now ends `ttl` (default: the semaphore's ttl) from now.
    fn extend;
    /// This object holds a live permit, checked against Redis.
    fn owned;
    fn _acquire_async();

    #[new]
    #[pyo3(signature = (client, name, limit, *, ttl=10.0, timeout=None, fair=None, auto_renew=None, on_lost=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        limit: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::ttl)] ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
        fair: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        // Counts travel through Lua numbers (doubles): keep them exact.
        let limit = args::count("limit", limit, 1, MAX_MS)?;
        let ttl = args::seconds("ttl", ttl)?;
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let fair = fair.map(|v| args::flag("fair", v)).transpose()?;
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let on_lost = hold::on_lost_arg(on_lost)?;
        let client = coerce_client(client)?;
        let engine_client = client.get().inner.clone();
        // Fair unless told otherwise; on Redlock (no queue order by majority) unfair by default.
        let fair = fair.unwrap_or(!engine_client.is_redlock());
        let handle =
            SemaphoreHandle::new(engine_client, &name_bytes, limit, ttl, fair, auto_renew)?;
        Ok(PySemaphore {
            core: HoldCore::new(handle, "semaphore", &name_bytes, ttl, default_timeout, on_lost),
            client,
            limit,
            fair,
        })
    }

    /// How many live holders the semaphore has now, in every process.
    fn holders(&self, py: Python<'_>) -> PyResult<i64> {
        let (handle, about) = (&self.core.handle, &self.core.about);
        blocking::run(py, || handle.holders_blocking())?.about(py, about)
    }

    #[getter]
    fn limit(&self) -> u64 {
        self.limit
    }

    #[getter]
    fn fair(&self) -> bool {
        self.fair
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn _holders_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.core.handle.clone();
        hold::query_async(py, async move { handle.holders().await }, self.core.about.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "Semaphore('{}', {}, ttl={}, fair={}, held={})",
            self.core.name,
            self.limit,
            self.core.ttl(),
            if self.fair { "True" } else { "False" },
            self.core.held_repr()
        )
    }
}
