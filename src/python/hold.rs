//! What the lock-like classes share (Lock, Semaphore, and the read and write locks of RWLock):
//! the wait of `acquire()`, renewal's listener, and the `with` protocol, so that all of them
//! wait, report a loss and leave a block in exactly the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyWeakrefMethods, PyWeakrefReference};
use pyo3::{IntoPyObjectExt, PyTypeInfo};

use super::args;
use super::awaitable::{self, OnCancel};
use super::blocking;
use super::errors::{type_error, value_error, About, LockTimeoutError, Named};
use super::log;
use crate::engine::hold::{Holder, Leased, OnLost, Ticket};
use crate::engine::lock::{LockHandle, LockSpec, Wait};
use crate::engine::renew::Listener;
use crate::engine::rwlock::{RwHandle, RwSide};
use crate::engine::semaphore::{SemaphoreHandle, SemaphoreSpec};
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
        let label = self.label.clone();
        if super::interpreter_exiting() {
            return;
        }
        std::thread::spawn(move || {
            // Checked again here, atomically with the exit hook: this thread may only now get
            // to run, after the interpreter began to exit.
            let Some(_pass) = super::enter_python() else {
                return;
            };
            Python::attach(|py| {
                log::warning(py, &message);
                let (Some(callback), Some(target)) = (on_lost, target.bind(py).upgrade()) else {
                    return;
                };
                if let Err(err) = callback.bind(py).call1((target,)) {
                    log::error_with(py, &format!("{label}: on_lost callback raised"), &err);
                }
            })
        });
    }

    fn warn(&self, message: &str) {
        let message = format!("{}: {message}", self.label);
        if super::interpreter_exiting() {
            return;
        }
        std::thread::spawn(move || {
            let Some(_pass) = super::enter_python() else {
                return;
            };
            Python::attach(|py| log::warning(py, &message))
        });
    }
}

/// Renewal's listener for `obj` (held weakly: renewal must not keep the object alive), when
/// anything may extend its hold in the background (auto-renewal, a fair lock's top-up).
pub fn listener(
    obj: &Bound<'_, PyAny>,
    renews: bool,
    label: String,
    on_lost: Option<Arc<Py<PyAny>>>,
) -> PyResult<Option<OnLost>> {
    if !renews {
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
pub fn enter_timeout(py: Python<'_>, about: &About, default_timeout: Option<Duration>) -> PyErr {
    let waited = default_timeout.map_or(f64::INFINITY, |d| d.as_secs_f64());
    about.raise(
        &LockTimeoutError::type_object(py),
        &format!("could not acquire {} within {waited} s", about.label()),
    )
}

/// An engine hold that a `with` block gives back on leaving, and that asyncio drives.
pub trait Releasable: Send + Sync + 'static {
    /// What one acquire is told beyond the wait (the read/write locks: the caller's context).
    type Context: Send + 'static;
    type Primitive: Leased;
    fn holder(&self) -> &Holder<Self::Primitive>;
    /// The asyncio acquire: `abandon(ticket)` gives back whatever it obtains.
    fn acquire(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        context: Self::Context,
        ticket: Ticket,
    ) -> impl Future<Output = Result<bool>> + Send;
    fn release(&self) -> impl Future<Output = Result<()>> + Send;
    fn extend(&self, lease: Option<Duration>) -> impl Future<Output = Result<()>> + Send;
    fn owned(&self) -> impl Future<Output = Result<bool>> + Send;
    fn lost(&self) -> bool;
}

impl Releasable for LockHandle {
    type Context = ();
    type Primitive = LockSpec;
    fn holder(&self) -> &Holder<LockSpec> {
        LockHandle::holder(self)
    }
    #[allow(clippy::unused_unit)]
    fn acquire(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        _context: (),
        ticket: Ticket,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.holder().acquire_ticketed(wait, listener, &(), ticket)
    }
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        self.holder().release()
    }
    fn extend(&self, lease: Option<Duration>) -> impl Future<Output = Result<()>> + Send {
        self.holder().extend(lease)
    }
    fn owned(&self) -> impl Future<Output = Result<bool>> + Send {
        self.holder().owned()
    }
    fn lost(&self) -> bool {
        self.holder().lost()
    }
}

impl Releasable for SemaphoreHandle {
    type Context = ();
    type Primitive = SemaphoreSpec;
    fn holder(&self) -> &Holder<SemaphoreSpec> {
        SemaphoreHandle::holder(self)
    }
    #[allow(clippy::unused_unit)]
    fn acquire(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        _context: (),
        ticket: Ticket,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.holder().acquire_ticketed(wait, listener, &(), ticket)
    }
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        self.holder().release()
    }
    fn extend(&self, lease: Option<Duration>) -> impl Future<Output = Result<()>> + Send {
        self.holder().extend(lease)
    }
    fn owned(&self) -> impl Future<Output = Result<bool>> + Send {
        self.holder().owned()
    }
    fn lost(&self) -> bool {
        self.holder().lost()
    }
}

impl Releasable for RwHandle {
    type Context = u64;
    type Primitive = RwSide;
    fn holder(&self) -> &Holder<RwSide> {
        RwHandle::holder(self)
    }
    async fn acquire(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        context: u64,
        ticket: Ticket,
    ) -> Result<bool> {
        self.holder()
            .acquire_ticketed(wait, listener, &context, ticket)
            .await
    }
    fn release(&self) -> impl Future<Output = Result<()>> + Send {
        self.holder().release()
    }
    fn extend(&self, lease: Option<Duration>) -> impl Future<Output = Result<()>> + Send {
        self.holder().extend(lease)
    }
    fn owned(&self) -> impl Future<Output = Result<bool>> + Send {
        self.holder().owned()
    }
    fn lost(&self) -> bool {
        self.holder().lost()
    }
}

/// `__exit__`: releases; if the lease was lost while the block ran, raises
/// `LockLostError("lock was lost")`, unless the block itself raised: then its exception goes on
/// and the loss (or any release error) is logged as a warning.
pub fn exit<H: Releasable>(
    py: Python<'_>,
    handle: &Arc<H>,
    exc: &Bound<'_, PyTuple>,
    about: &About,
) -> PyResult<bool> {
    let body_raised = exc.get_item(0).is_ok_and(|t| !t.is_none());
    let released = blocking::run(py, || handle.holder().release_blocking())?;
    leave_block(py, about, body_raised, exit_outcome(&**handle, released))
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
    about: &About,
    body_raised: bool,
    outcome: Result<()>,
) -> PyResult<bool> {
    match outcome {
        Ok(()) => Ok(false),
        Err(err) if body_raised => {
            log::warning(
                py,
                &format!("{}: on leaving a block that raised: {err}", about.label()),
            );
            Ok(false)
        }
        Err(err) => Err(about.error(py, err)),
    }
}

// The asyncio side: awaitables with the same semantics as the blocking methods. Acquiring stops
// (and cleans up) when cancelled; releasing and extending run to their end regardless.

/// What cancelling an acquire's awaitable does beside aborting it: the attempt gives back
/// whatever it obtained, now or as it settles (a grant may be on its way).
fn abandoner<H: Releasable>(handle: &Arc<H>, ticket: &Ticket) -> awaitable::Abandon {
    let (handle, ticket) = (handle.clone(), ticket.clone());
    Box::new(move || handle.holder().abandon(&ticket))
}

pub fn acquire_async<'py, H: Releasable>(
    py: Python<'py>,
    handle: Arc<H>,
    wait: Wait,
    listener: Option<OnLost>,
    context: H::Context,
    about: About,
) -> PyResult<Bound<'py, PyAny>> {
    let ticket = Ticket::default();
    awaitable::spawn_abandonable(
        py,
        abandoner(&handle, &ticket),
        async move { Ok(handle.acquire(wait, listener, context, ticket).await) },
        move |py, acquired| acquired.about(py, &about)?.into_bound_py_any(py),
    )
}

/// `__aenter__`: like `acquire_async` with the object's timeout; LockTimeoutError if not acquired.
pub fn enter_async<'py, H: Releasable>(
    py: Python<'py>,
    handle: Arc<H>,
    wait: Wait,
    listener: Option<OnLost>,
    context: H::Context,
    timeout_error: PyErr,
    about: About,
) -> PyResult<Bound<'py, PyAny>> {
    let ticket = Ticket::default();
    awaitable::spawn_abandonable(
        py,
        abandoner(&handle, &ticket),
        async move { Ok(handle.acquire(wait, listener, context, ticket).await) },
        move |py, acquired| {
            if acquired.about(py, &about)? {
                Ok(py.None().into_bound(py))
            } else {
                Err(timeout_error)
            }
        },
    )
}

/// `_give_back(token)`: see `Holder::give_back`.
pub fn give_back<H: Releasable>(handle: &H, token: &str) -> bool {
    handle.holder().give_back(token)
}

pub fn release_async<H: Releasable>(
    py: Python<'_>,
    handle: Arc<H>,
    about: About,
) -> PyResult<Bound<'_, PyAny>> {
    awaitable::spawn(
        py,
        OnCancel::Finish,
        async move { Ok(handle.release().await) },
        move |py, released| {
            released.about(py, &about)?;
            Ok(py.None().into_bound(py))
        },
    )
}

pub fn extend_async<H: Releasable>(
    py: Python<'_>,
    handle: Arc<H>,
    lease: Option<Duration>,
    about: About,
) -> PyResult<Bound<'_, PyAny>> {
    awaitable::spawn(
        py,
        OnCancel::Finish,
        async move { Ok(handle.extend(lease).await) },
        move |py, extended| {
            extended.about(py, &about)?;
            Ok(py.None().into_bound(py))
        },
    )
}

pub fn owned_async<H: Releasable>(
    py: Python<'_>,
    handle: Arc<H>,
    about: About,
) -> PyResult<Bound<'_, PyAny>> {
    query_async(py, async move { handle.owned().await }, about)
}

/// `__aexit__`, resolving like `exit`.
pub fn exit_awaitable<H: Releasable>(
    py: Python<'_>,
    handle: Arc<H>,
    about: About,
    body_raised: bool,
) -> PyResult<Bound<'_, PyAny>> {
    awaitable::spawn(
        py,
        OnCancel::Finish,
        async move { Ok(exit_async(handle).await) },
        move |py, outcome| leave_block(py, &about, body_raised, outcome)?.into_bound_py_any(py),
    )
}

/// Any engine query as an awaitable (cancelling it just stops waiting for the answer).
pub fn query_async<'py, T, F>(py: Python<'py>, fut: F, about: About) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    awaitable::spawn(
        py,
        OnCancel::Abort,
        async move { Ok(fut.await) },
        move |py, value| value.about(py, &about)?.into_bound_py_any(py),
    )
}
