//! What the lock-like classes share (Lock, Semaphore, and the read and write locks of RWLock):
//! the wait of `acquire()`, renewal's listener, and the `with` protocol, so that all of them
//! wait, report a loss and leave a block in exactly the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::args;
use super::blocking;
use super::errors::{type_error, value_error, LockLostError, LockTimeoutError};
use super::log;
use crate::engine::hold::OnLost;
use crate::engine::lock::{LockHandle, Wait};
use crate::engine::renew::Listener;
use crate::engine::rwlock::RwHandle;
use crate::engine::semaphore::SemaphoreHandle;
use crate::engine::{Error, Result};

/// The wait of one `acquire(blocking, timeout)`; `default` is the constructor's timeout.
pub fn wait_for(
    blocking: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    default: Option<Duration>,
) -> PyResult<Wait> {
    let blocking = blocking.map_or(Ok(true), |b| args::flag("blocking", b))?;
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
    Ok(Wait::from_timeout(given.unwrap_or(default)))
}

/// The lease of `extend(ttl)`: None means the object's own ttl.
pub fn extend_lease(ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    match ttl {
        Some(t) if !t.is_none() => Ok(Some(args::duration("ttl", t, 0.001)?)),
        _ => Ok(None),
    }
}

/// The `ttl` of a constructor (10 s when not given).
pub fn ttl_arg(ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Duration> {
    match ttl {
        Some(t) if !t.is_none() => args::duration("ttl", t, 0.001),
        _ => Ok(Duration::from_secs(10)),
    }
}

/// The `on_lost` of a constructor: a callable or None.
pub fn on_lost_arg(on_lost: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Arc<Py<PyAny>>>> {
    match on_lost {
        Some(cb) if !cb.is_none() => {
            if !cb.is_callable() {
                return Err(type_error("on_lost", "a callable", cb));
            }
            Ok(Some(Arc::new(cb.clone().unbind())))
        }
        _ => Ok(None),
    }
}

/// Tells the Python side what renewal finds, from a thread of its own (never a runtime worker).
struct PyListener {
    target: Arc<Py<PyWeakrefReference>>,
    /// "lock 'name'", "semaphore 'name'", ...
    label: String,
    on_lost: Option<Arc<Py<PyAny>>>,
}

impl Listener for PyListener {
    fn lost(&self) {
        let target = self.target.clone();
        let on_lost = self.on_lost.clone();
        let message = format!("{} was lost: its lease ended before renewal", self.label);
        std::thread::spawn(move || {
            Python::attach(|py| {
                log::warning(py, &message);
                let (Some(callback), Some(target)) = (on_lost, target.bind(py).upgrade()) else {
                    return;
                };
                if let Err(err) = callback.bind(py).call1((target,)) {
                    log::error_with(py, "on_lost callback raised", &err);
                }
            })
        });
    }

    fn warn(&self, message: &str) {
        let message = format!("{}: {message}", self.label);
        std::thread::spawn(move || Python::attach(|py| log::warning(py, &message)));
    }
}

/// Renewal's listener for `obj` (held weakly: renewal must not keep the object alive), when
/// auto-renewal is on.
pub fn listener(
    obj: &Bound<'_, PyAny>,
    auto_renew: bool,
    label: String,
    on_lost: Option<Arc<Py<PyAny>>>,
) -> PyResult<Option<OnLost>> {
    if !auto_renew {
        return Ok(None);
    }
    let listener: OnLost = Arc::new(PyListener {
        target: Arc::new(PyWeakrefReference::new(obj)?.unbind()),
        label,
        on_lost,
    });
    Ok(Some(listener))
}

/// The error of a `with` that could not acquire within the object's timeout.
pub fn enter_timeout(label: &str, default_timeout: Option<Duration>) -> PyErr {
    let waited = default_timeout.map_or(f64::INFINITY, |d| d.as_secs_f64());
    LockTimeoutError::new_err(format!("could not acquire {label} within {waited} s"))
}

/// An engine hold that a `with` block gives back on leaving.
pub trait Releasable: Send + Sync + 'static {
    fn release(&self) -> impl Future<Output = Result<()>> + Send;
    fn lost(&self) -> bool;
    /// The release on the caller's thread, when the primitive offers one.
    fn release_direct(&self) -> Option<Result<()>> {
        None
    }
}

impl Releasable for LockHandle {
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        LockHandle::release(self)
    }
    fn lost(&self) -> bool {
        LockHandle::lost(self)
    }
    fn release_direct(&self) -> Option<Result<()>> {
        self.has_direct().then(|| LockHandle::release_direct(self))
    }
}

impl Releasable for SemaphoreHandle {
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        SemaphoreHandle::release(self)
    }
    fn lost(&self) -> bool {
        SemaphoreHandle::lost(self)
    }
}

impl Releasable for RwHandle {
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        RwHandle::release(self)
    }
    fn lost(&self) -> bool {
        RwHandle::lost(self)
    }
}

/// `__exit__`: releases; if the lease was lost while the block ran, raises
/// `LockLostError("lock was lost")`, unless the block itself raised: then its exception goes on
/// and the loss (or any release error) is logged as a warning.
pub fn exit<H: Releasable>(
    py: Python<'_>,
    handle: &Arc<H>,
    exc: &Bound<'_, PyTuple>,
    label: &str,
) -> PyResult<bool> {
    let body_raised = exc.get_item(0).is_ok_and(|t| !t.is_none());
    let released = match py.detach(|| handle.release_direct()) {
        Some(released) => released,
        None => {
            let handle = handle.clone();
            blocking::wait(py, async move { handle.release().await })?
        }
    };
    leave_block(py, label, body_raised, exit_outcome(&**handle, released))
}

/// The asyncio `__aexit__`'s release; resolve its outcome with `leave_block`.
pub async fn exit_async<H: Releasable>(handle: Arc<H>) -> Result<()> {
    let released = handle.release().await;
    exit_outcome(&*handle, released)
}

/// A hold that renewal found lost counts as lost even if Redis still let us delete it.
fn exit_outcome<H: Releasable>(handle: &H, released: Result<()>) -> Result<()> {
    match released {
        Ok(()) if handle.lost() => Err(Error::Lost("lock was lost".into())),
        other => other,
    }
}

/// What leaving a block does with the release's outcome: a loss raises LockLostError, unless
/// the block itself raised — then its exception propagates and the loss is logged.
pub fn leave_block(
    py: Python<'_>,
    label: &str,
    body_raised: bool,
    outcome: Result<()>,
) -> PyResult<bool> {
    match outcome {
        Ok(()) => Ok(false),
        Err(err) if body_raised => {
            log::warning(
                py,
                &format!("{label}: on leaving a block that raised: {err}"),
            );
            Ok(false)
        }
        Err(Error::Lost(_)) => Err(LockLostError::new_err("lock was lost")),
        Err(err) => Err(err.into()),
    }
}
