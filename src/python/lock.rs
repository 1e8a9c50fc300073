//! `redmutex.Lock`: a lease on a name, held by this object, used as `with` or acquire/release.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyWeakrefMethods, PyWeakrefReference};
use pyo3::IntoPyObjectExt;

use super::args;
use super::awaitable::{self, OnCancel};
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::{value_error, LockLostError, LockTimeoutError};
use super::log;
use crate::engine::lock::{Direct, LockHandle, OnLost, Wait};
use crate::engine::renew::Listener;
use crate::engine::Error;

#[pyclass(frozen, weakref, module = "redmutex", name = "Lock")]
pub struct PyLock {
    client: Py<PyClient>,
    handle: Arc<LockHandle>,
    name: String,
    ttl: Duration,
    /// The wait of `acquire()`/`with` when no timeout is given: None waits forever.
    default_timeout: Option<Duration>,
    on_lost: Option<Arc<Py<PyAny>>>,
}

/// Tells the Python side what renewal finds, from a thread of its own (never a runtime worker).
struct PyListener {
    lock: Arc<Py<PyWeakrefReference>>,
    name: String,
    on_lost: Option<Arc<Py<PyAny>>>,
}

impl Listener for PyListener {
    fn lost(&self) {
        let lock = self.lock.clone();
        let on_lost = self.on_lost.clone();
        let message = format!(
            "lock '{}' was lost: its lease ended before renewal",
            self.name
        );
        std::thread::spawn(move || {
            Python::attach(|py| {
                log::warning(py, &message);
                let (Some(callback), Some(target)) = (on_lost, lock.bind(py).upgrade()) else {
                    return;
                };
                if let Err(err) = callback.bind(py).call1((target,)) {
                    log::error_with(py, "on_lost callback raised", &err);
                }
            })
        });
    }

    fn warn(&self, message: &str) {
        let message = format!("lock '{}': {message}", self.name);
        std::thread::spawn(move || Python::attach(|py| log::warning(py, &message)));
    }
}

impl PyLock {
    fn wait_for(&self, blocking: bool, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Wait> {
        let given = args::timeout("timeout", timeout)?;
        if !blocking {
            if given.is_some() {
                return Err(value_error(
                    "timeout",
                    "cannot be given for a non-blocking acquire",
                ));
            }
            return Ok(Wait::Once);
        }
        Ok(Wait::from_timeout(given.unwrap_or(self.default_timeout)))
    }

    /// The handle and, with auto_renew, the listener that reports to this object.
    fn prepare_acquire(
        &self,
        slf: &Bound<'_, Self>,
    ) -> PyResult<(Arc<LockHandle>, Option<OnLost>)> {
        let listener = if self.handle.auto_renew() {
            let listener: OnLost = Arc::new(PyListener {
                lock: Arc::new(PyWeakrefReference::new(slf.as_any())?.unbind()),
                name: self.name.clone(),
                on_lost: self.on_lost.clone(),
            });
            Some(listener)
        } else {
            None
        };
        Ok((self.handle.clone(), listener))
    }

    /// The blocking acquire: one direct attempt on this thread, then, if it must wait, the
    /// runtime's wait (interruptible by signals).
    fn acquire_with(slf: &Bound<'_, Self>, wait: Wait) -> PyResult<bool> {
        let py = slf.py();
        let (handle, listener) = slf.get().prepare_acquire(slf)?;
        let first = py.detach(|| handle.acquire_direct(wait, listener.clone()))?;
        match first {
            Direct::Done(acquired) => Ok(acquired),
            Direct::Wait(pending) => Ok(blocking::wait(
                py,
                handle.acquire_pending(pending, wait, listener),
            )??),
        }
    }

    fn timeout_message(&self) -> String {
        let waited = self
            .default_timeout
            .map_or(f64::INFINITY, |d| d.as_secs_f64());
        format!("could not acquire lock '{}' within {waited} s", self.name)
    }
}

/// The release on leaving a `with` block; a hold that renewal found lost counts as lost even
/// if Redis still let us delete it.
fn exit_outcome(handle: &LockHandle, released: Result<(), Error>) -> Result<(), Error> {
    match released {
        Ok(()) if handle.lost() => Err(Error::Lost("lock was lost".into())),
        other => other,
    }
}

async fn release_for_exit(handle: Arc<LockHandle>) -> Result<(), Error> {
    let released = handle.release().await;
    exit_outcome(&handle, released)
}

/// What leaving a block does with the release's outcome: a loss raises LockLostError, unless
/// the block itself raised — then its exception propagates and the loss is logged.
pub fn leave_block(
    py: Python<'_>,
    name: &str,
    body_raised: bool,
    outcome: Result<(), Error>,
) -> PyResult<bool> {
    match outcome {
        Ok(()) => Ok(false),
        Err(err) if body_raised => {
            log::warning(
                py,
                &format!("lock '{name}': on leaving a block that raised: {err}"),
            );
            Ok(false)
        }
        Err(Error::Lost(_)) => Err(LockLostError::new_err("lock was lost")),
        Err(err) => Err(err.into()),
    }
}

#[pymethods]
impl PyLock {
    #[new]
    #[pyo3(signature = (client, name, *, ttl=None, timeout=None, auto_renew=None, fair=None, replicas=None, on_lost=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        ttl: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        fair: Option<&Bound<'_, PyAny>>,
        replicas: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        let ttl = match ttl {
            Some(t) if !t.is_none() => args::duration("ttl", t, 0.001)?,
            _ => Duration::from_secs(10),
        };
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let fair = fair.map_or(Ok(false), |v| args::flag("fair", v))?;
        let replicas = replicas.map_or(Ok(0), |v| args::count("replicas", v, 0, 1_000_000))?;
        let on_lost = match on_lost {
            Some(cb) if !cb.is_none() => {
                if !cb.is_callable() {
                    return Err(super::errors::type_error("on_lost", "a callable", cb));
                }
                Some(Arc::new(cb.clone().unbind()))
            }
            _ => None,
        };
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
        let blocking = blocking.map_or(Ok(true), |b| args::flag("blocking", b))?;
        let wait = slf.get().wait_for(blocking, timeout)?;
        Self::acquire_with(slf, wait)
    }

    fn release(&self, py: Python<'_>) -> PyResult<()> {
        Ok(py.detach(|| self.handle.release_direct())?)
    }

    /// The lease now ends `ttl` (default: the lock's ttl) from now.
    #[pyo3(signature = (ttl=None))]
    fn extend(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let lease = match ttl {
            Some(t) if !t.is_none() => Some(args::duration("ttl", t, 0.001)?),
            _ => None,
        };
        Ok(py.detach(|| self.handle.extend_direct(lease))?)
    }

    /// Somebody holds the lock.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(py.detach(|| self.handle.locked_direct())?)
    }

    /// This object holds the lock, checked against Redis.
    fn owned(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(py.detach(|| self.handle.owned_direct())?)
    }

    /// Seconds left on this object's lease; None if not held, 0.0 once the local deadline passed.
    fn remaining(&self) -> Option<f64> {
        self.handle.remaining().map(|d| d.as_secs_f64())
    }

    #[getter]
    fn token(&self) -> Option<String> {
        self.handle.token()
    }

    #[getter]
    fn fence(&self) -> Option<i64> {
        self.handle.fence()
    }

    #[getter]
    fn lost(&self) -> bool {
        self.handle.lost()
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
        let waited = this
            .default_timeout
            .map_or(f64::INFINITY, |d| d.as_secs_f64());
        Err(LockTimeoutError::new_err(format!(
            "could not acquire lock '{}' within {waited} s",
            this.name
        )))
    }

    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let body_raised = exc.get_item(0).is_ok_and(|t| !t.is_none());
        let outcome = py.detach(|| self.handle.release_direct());
        leave_block(
            py,
            &self.name,
            body_raised,
            exit_outcome(&self.handle, outcome),
        )
    }

    // The asyncio side (`redmutex.aio.Lock`) awaits these; same semantics as the blocking ones.

    #[pyo3(signature = (blocking=None, timeout=None))]
    fn _acquire_async<'py>(
        slf: &Bound<'py, Self>,
        blocking: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = blocking.map_or(Ok(true), |b| args::flag("blocking", b))?;
        let wait = slf.get().wait_for(blocking, timeout)?;
        let (handle, listener) = slf.get().prepare_acquire(slf)?;
        awaitable::spawn(
            slf.py(),
            OnCancel::Abort,
            async move { handle.acquire(wait, listener).await },
            |py, v| v.into_bound_py_any(py),
        )
    }

    fn _enter_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let wait = Wait::from_timeout(this.default_timeout);
        let (handle, listener) = this.prepare_acquire(slf)?;
        let message = this.timeout_message();
        awaitable::spawn(
            slf.py(),
            OnCancel::Abort,
            async move { handle.acquire(wait, listener).await },
            move |py, v| {
                if v {
                    Ok(py.None().into_bound(py))
                } else {
                    Err(LockTimeoutError::new_err(message))
                }
            },
        )
    }

    fn _release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { handle.release().await },
            |py, ()| Ok(py.None().into_bound(py)),
        )
    }

    #[pyo3(signature = (ttl=None))]
    fn _extend_async<'py>(
        &self,
        py: Python<'py>,
        ttl: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lease = match ttl {
            Some(t) if !t.is_none() => Some(args::duration("ttl", t, 0.001)?),
            _ => None,
        };
        let handle = self.handle.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { handle.extend(lease).await },
            |py, ()| Ok(py.None().into_bound(py)),
        )
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        awaitable::spawn(
            py,
            OnCancel::Abort,
            async move { handle.locked().await },
            |py, v| v.into_bound_py_any(py),
        )
    }

    fn _owned_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        awaitable::spawn(
            py,
            OnCancel::Abort,
            async move { handle.owned().await },
            |py, v| v.into_bound_py_any(py),
        )
    }

    fn _exit_async<'py>(&self, py: Python<'py>, body_raised: bool) -> PyResult<Bound<'py, PyAny>> {
        let name = self.name.clone();
        let outcome = release_for_exit(self.handle.clone());
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(outcome.await) },
            move |py, outcome| leave_block(py, &name, body_raised, outcome)?.into_bound_py_any(py),
        )
    }

    fn __repr__(&self) -> String {
        let held = self.handle.token().is_some();
        format!(
            "Lock('{}', ttl={}, held={})",
            self.name,
            self.ttl.as_secs_f64(),
            if held { "True" } else { "False" }
        )
    }
}
