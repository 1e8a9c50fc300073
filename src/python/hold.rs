//! What the lock-like classes share (Lock, Semaphore, and the read and write locks of RWLock),
//! written once: their engine hold (`Held`, `HoldCore`), the methods they all have (acquire,
//! release, extend, owned, `with` and the asyncio twins), and `lock_like_methods!`, which gives
//! each class those methods beside its own, so that all of them wait, report a loss and leave a
//! block in exactly the same way.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::types::{PyTuple, PyWeakrefMethods, PyWeakrefReference};
use pyo3::{IntoPyObjectExt, PyClass, PyTypeInfo};

use super::args;
use super::awaitable::{self, OnCancel};
use super::blocking;
use super::errors::{type_error, value_error, About, LockTimeoutError, Named};
use super::log;
use super::loop_hold;
use crate::engine::executor::Now;
use crate::engine::hold::{Holder, Leased, OnLost, Ticket};
use crate::engine::lock::{LockHandle, LockSpec, Wait};
use crate::engine::renew::{Listener, Loss};
use crate::engine::rwlock::{RwHandle, RwSide};
use crate::engine::semaphore::{SemaphoreHandle, SemaphoreSpec};
use crate::engine::{Error, Result};

/// The wait of one `acquire(blocking, timeout)`; `default` is the constructor's timeout.
fn wait_for(
    blocking: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    default: Option<Duration>,
) -> PyResult<Wait> {
    let blocking = blocking.map_or(Ok(true), args::blocking)?;
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
fn extend_lease(ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
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
    fn lost(&self, how: Loss) {
        let target = self.target.clone();
        let on_lost = self.on_lost.clone();
        let message = format!("{} was lost: {how}", self.label);
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

/// Renewal's listener for `obj` (held weakly: renewal must not keep the object alive).
fn listener(
    obj: &Bound<'_, PyAny>,
    label: String,
    on_lost: Option<Arc<Py<PyAny>>>,
) -> PyResult<OnLost> {
    Ok(Arc::new(PyListener {
        target: Arc::new(PyWeakrefReference::new(obj)?.unbind()),
        label,
        on_lost,
    }))
}

/// The error of a `with` that could not acquire within the object's timeout.
fn enter_timeout(py: Python<'_>, about: &About, default_timeout: Option<Duration>) -> PyErr {
    let waited = default_timeout.map_or(f64::INFINITY, |d| d.as_secs_f64());
    about.raise(
        &LockTimeoutError::type_object(py),
        &format!("could not acquire {} within {waited} s", about.label()),
    )
}

/// An engine object with one hold (the handles of Lock, Semaphore and the read and write locks),
/// which the shared methods below drive through its `Holder`.
pub trait Held: Send + Sync + 'static {
    type Primitive: Leased<Args: Send + 'static>;
    fn holder(&self) -> &Holder<Self::Primitive>;
    /// Whether anything may extend a hold in the background (renewal's listener is needed).
    fn renews(&self) -> bool {
        self.holder().auto_renew()
    }
}

/// The asyncio loop path (`loop_hold`) drives every held object's holder.
impl<H: Held> loop_hold::Held for H {
    type Primitive = H::Primitive;
    fn holder(&self) -> &Holder<H::Primitive> {
        Held::holder(self)
    }
}

/// What one acquire of `H` is told beyond the wait (the read and write locks: the caller).
pub type Context<H> = <<H as Held>::Primitive as Leased>::Args;

/// A bare `Holder` is held too (for a primitive without a handle of its own).
impl<P: Leased<Args: Send + 'static>> Held for Holder<P> {
    type Primitive = P;
    fn holder(&self) -> &Holder<P> {
        self
    }
}

impl Held for LockHandle {
    type Primitive = LockSpec;
    fn holder(&self) -> &Holder<LockSpec> {
        LockHandle::holder(self)
    }
    fn renews(&self) -> bool {
        LockHandle::renews(self)
    }
}

impl Held for SemaphoreHandle {
    type Primitive = SemaphoreSpec;
    fn holder(&self) -> &Holder<SemaphoreSpec> {
        SemaphoreHandle::holder(self)
    }
}

impl Held for RwHandle {
    type Primitive = RwSide;
    fn holder(&self) -> &Holder<RwSide> {
        RwHandle::holder(self)
    }
}

/// What every lock-like Python object keeps: its engine hold, and what its methods need to wait
/// for it, name it in errors and report its loss.
pub struct HoldCore<H: Held> {
    pub handle: Arc<H>,
    pub name: String,
    /// Names the object in its errors.
    pub about: About,
    pub ttl: Duration,
    /// The wait of `acquire()`/`with` when no timeout is given: None waits forever.
    pub default_timeout: Option<Duration>,
    pub on_lost: Option<Arc<Py<PyAny>>>,
    /// Renewal's listener, made on the first acquire that needs one and shared by the later
    /// ones (its target, label and callback never change): see `listener_for`.
    pub listener: OnceLock<OnLost>,
}

impl<H: Held> HoldCore<H> {
    /// The core of an object named `name` (raw bytes, shown lossily) that errors call a `kind`
    /// ("lock", "semaphore", ...).
    pub fn new(
        handle: H,
        kind: &'static str,
        name: &[u8],
        ttl: Duration,
        default_timeout: Option<Duration>,
        on_lost: Option<Arc<Py<PyAny>>>,
    ) -> Self {
        let name = String::from_utf8_lossy(name).into_owned();
        HoldCore {
            handle: Arc::new(handle),
            about: About::new(kind, &name),
            name,
            ttl,
            default_timeout,
            on_lost,
            listener: OnceLock::new(),
        }
    }

    pub fn holder(&self) -> &Holder<H::Primitive> {
        self.handle.holder()
    }

    /// One blocking call of the hold, its error naming the object: the engine runs it on the
    /// caller's thread or leaves a future to wait on through the runtime (`blocking::run`).
    fn call<T, F>(
        &self,
        py: Python<'_>,
        start: impl FnOnce() -> Now<Result<T>, F> + Send,
    ) -> PyResult<T>
    where
        T: Send,
        F: Future<Output = Result<T>> + Send,
    {
        blocking::run(py, start)?.about(py, &self.about)
    }

    pub fn release(&self, py: Python<'_>) -> PyResult<()> {
        let holder = self.holder();
        self.call(py, || holder.release_blocking())
    }

    pub fn extend(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let lease = extend_lease(ttl)?;
        let holder = self.holder();
        self.call(py, || holder.extend_blocking(lease))
    }

    pub fn owned(&self, py: Python<'_>) -> PyResult<bool> {
        let holder = self.holder();
        self.call(py, || holder.owned_blocking())
    }

    pub fn remaining(&self) -> Option<f64> {
        self.holder().remaining().map(|d| d.as_secs_f64())
    }

    pub fn token(&self) -> Option<String> {
        self.holder().token()
    }

    pub fn lost(&self) -> bool {
        self.holder().lost()
    }

    pub fn ttl(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    /// "True" or "False": whether the object holds now, for its repr.
    pub fn held_repr(&self) -> &'static str {
        if self.token().is_some() {
            "True"
        } else {
            "False"
        }
    }

    /// `__exit__`: releases; if the lease was lost while the block ran, raises
    /// `LockLostError("lock was lost")`, unless the block itself raised: then its exception goes
    /// on and the loss (or any release error) is logged as a warning.
    pub fn exit(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let body_raised = exc.get_item(0).is_ok_and(|t| !t.is_none());
        let holder = self.holder();
        let (token, depth) = (holder.token().unwrap_or_default(), holder.depth());
        let released = match blocking::run(py, || holder.release_blocking()) {
            Ok(released) => released,
            Err(interrupted) => {
                holder.drop_unreleased_level(&token, depth, None);
                return Err(interrupted);
            }
        };
        if let Err(err) = &released {
            holder.drop_unreleased_level(&token, depth, Some(err));
        }
        leave_block(py, &self.about, body_raised, exit_outcome(holder, released))
    }

    /// An asyncio step that runs to its end even if the awaiting task is cancelled, resolving
    /// to None.
    fn finish_async<'py, F>(&self, py: Python<'py>, step: F) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let about = self.about.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(step.await) },
            move |py, done| {
                done.about(py, &about)?;
                Ok(py.None().into_bound(py))
            },
        )
    }

    pub fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(conn) = loop_hold::conn_for(py, &self.handle)? {
            let about = self.about.clone();
            return loop_hold::release(&conn, self.handle.clone(), move |py, done| {
                done.about(py, &about)?;
                Ok(py.None().into_bound(py))
            });
        }
        // Begun here, not on the runtime: a cancel that reaches the caller right after this
        // finds the release under way (see `Holder::release_abandoned`).
        let begun = self.holder().begin_release_call();
        let handle = self.handle.clone();
        self.finish_async(
            py,
            async move { handle.holder().release_begun(begun?).await },
        )
    }

    pub fn extend_async<'py>(
        &self,
        py: Python<'py>,
        ttl: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lease = extend_lease(ttl)?;
        if let Some(conn) = loop_hold::conn_for(py, &self.handle)? {
            let about = self.about.clone();
            return loop_hold::extend(&conn, self.handle.clone(), lease, move |py, done| {
                done.about(py, &about)?;
                Ok(py.None().into_bound(py))
            });
        }
        let handle = self.handle.clone();
        self.finish_async(py, async move { handle.holder().extend(lease).await })
    }

    pub fn owned_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(conn) = loop_hold::conn_for(py, &self.handle)? {
            let about = self.about.clone();
            return loop_hold::owned(&conn, self.handle.clone(), move |py, owned| {
                owned.about(py, &about)?.into_bound_py_any(py)
            });
        }
        let handle = self.handle.clone();
        query_async(
            py,
            async move { handle.holder().owned().await },
            self.about.clone(),
        )
    }

    /// `_give_back(token)`: see `Holder::give_back`.
    pub fn give_back(&self, token: &str) -> bool {
        self.holder().give_back(token)
    }

    /// `__aexit__`, resolving like `exit`.
    pub fn exit_async<'py>(
        &self,
        py: Python<'py>,
        body_raised: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (handle, about) = (self.handle.clone(), self.about.clone());
        if let Some(conn) = loop_hold::conn_for(py, &self.handle)? {
            let holder = handle.clone();
            let (token, depth) = (
                holder.holder().token().unwrap_or_default(),
                holder.holder().depth(),
            );
            return loop_hold::release(&conn, handle, move |py, released| {
                if let Err(err) = &released {
                    holder
                        .holder()
                        .drop_unreleased_level(&token, depth, Some(err));
                }
                let outcome = exit_outcome(holder.holder(), released);
                leave_block(py, &about, body_raised, outcome)?.into_bound_py_any(py)
            });
        }
        let (token, depth) = (
            handle.holder().token().unwrap_or_default(),
            handle.holder().depth(),
        );
        let begun = handle.holder().begin_release_call();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move {
                let holder = handle.holder();
                let released = match begun {
                    Ok(begun) => holder.release_begun(begun).await,
                    Err(err) => Err(err),
                };
                if let Err(err) = &released {
                    holder.drop_unreleased_level(&token, depth, Some(err));
                }
                Ok(exit_outcome(holder, released))
            },
            move |py, outcome| leave_block(py, &about, body_raised, outcome)?.into_bound_py_any(py),
        )
    }
}

/// The core a call of a lock-like object acts on: the object's own, or, for a re-entrant Lock,
/// the calling owner's (see `LockLike::owner_core`).
pub enum CoreRef<'a, H: Held> {
    Own(&'a HoldCore<H>),
    Owner(Arc<HoldCore<H>>),
}

impl<H: Held> std::ops::Deref for CoreRef<'_, H> {
    type Target = HoldCore<H>;
    fn deref(&self) -> &HoldCore<H> {
        match self {
            CoreRef::Own(core) => core,
            CoreRef::Owner(core) => core,
        }
    }
}

/// A Python class whose objects hold like a lock (Lock, Semaphore, the read and write locks):
/// `lock_like_methods!` gives it the methods they share.
pub trait LockLike: PyClass<Frozen = True> + Sync {
    type Handle: Held;
    fn core(&self) -> &HoldCore<Self::Handle>;
    /// The core that acquire, release, extend and `owned` act on: the object's own, unless the
    /// object keeps one hold per owner (a re-entrant Lock: the calling thread's; telling the
    /// caller fails only with what a signal handler raised, see `greenlets::context`).
    fn owner_core(&self) -> PyResult<CoreRef<'_, Self::Handle>> {
        Ok(CoreRef::Own(self.core()))
    }
    /// The core an asyncio call acts on (the owner is the task): the object's own unless the
    /// object keeps one hold per owner (a re-entrant Lock: never another object's, see `PyLock`).
    fn task_core(&self) -> CoreRef<'_, Self::Handle> {
        CoreRef::Own(self.core())
    }
    /// The core whose hold has `token`, whichever thread calls: a token names one hold, and a
    /// call naming it may come from another thread than its owner (an event loop closed there).
    /// `task_core` unless the object keeps one hold per owner (a re-entrant Lock).
    fn core_holding(&self, _token: &str) -> CoreRef<'_, Self::Handle> {
        self.task_core()
    }
    /// The core that `token`, `lost` and `remaining()` describe (see `owner_core`).
    fn view(&self) -> PyResult<CoreRef<'_, Self::Handle>> {
        self.owner_core()
    }
    /// What a blocking acquire tells the primitive of its caller (the read and write locks: the
    /// calling thread, or greenlet: see `greenlets::context`).
    fn blocking_context() -> PyResult<Context<Self::Handle>>;
}

/// Renewal's listener for the object, when anything may extend its hold in the background
/// (auto-renewal, the top-up of a hold granted by a release): made once per core, since every
/// blocking acquire of a default lock needs one and making it (a weakref, the label) costs.
fn listener_for<C: LockLike>(
    slf: &Bound<'_, C>,
    core: &HoldCore<C::Handle>,
) -> PyResult<Option<OnLost>> {
    if !core.handle.renews() {
        return Ok(None);
    }
    if let Some(made) = core.listener.get() {
        return Ok(Some(made.clone()));
    }
    let made = listener(slf.as_any(), core.about.label(), core.on_lost.clone())?;
    Ok(Some(core.listener.get_or_init(|| made).clone()))
}

/// The blocking acquire: the engine makes one direct attempt on this thread when the hold
/// offers it; the runtime (interruptible by signals) only to wait.
fn acquire_with<C: LockLike>(slf: &Bound<'_, C>, wait: Wait) -> PyResult<bool> {
    let core = slf.get().owner_core()?;
    let listener = listener_for(slf, &core)?;
    let holder = core.holder();
    let context = C::blocking_context()?;
    core.call(slf.py(), || {
        holder.acquire_blocking(wait, listener, &context)
    })
}

/// `acquire(blocking=None, timeout=None)`.
pub fn acquire<C: LockLike>(
    slf: &Bound<'_, C>,
    blocking: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<bool> {
    let wait = wait_for(blocking, timeout, slf.get().core().default_timeout)?;
    acquire_with(slf, wait)
}

/// `__enter__`: acquires within the object's timeout, else LockTimeoutError.
pub fn enter<'py, C: LockLike>(slf: &Bound<'py, C>) -> PyResult<Bound<'py, C>> {
    let core = slf.get().owner_core()?;
    if acquire_with(slf, Wait::from_timeout(core.default_timeout))? {
        return Ok(slf.clone());
    }
    Err(enter_timeout(slf.py(), &core.about, core.default_timeout))
}

/// A hold that renewal found lost counts as lost even if Redis still let us delete it.
fn exit_outcome<P: Leased>(holder: &Holder<P>, released: Result<()>) -> Result<()> {
    match released {
        Ok(()) if holder.lost() => Err(Error::Lost("lock was lost".into())),
        other => other,
    }
}

/// What leaving a block does with the release's outcome: a loss raises LockLostError, unless
/// the block itself raised — then its exception propagates and the loss is logged.
fn leave_block(
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

/// An asyncio acquire resolving through `settle`. Cancelling its awaitable makes the attempt
/// give back whatever it obtained, now or as it settles (a grant may be on its way).
fn spawn_acquire<'py, C: LockLike>(
    slf: &Bound<'py, C>,
    wait: Wait,
    context: Context<C::Handle>,
    settle: impl for<'a> FnOnce(Python<'a>, bool) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    let core = slf.get().task_core();
    let listener = listener_for(slf, &core)?;
    if let Some(conn) = loop_hold::conn_for(slf.py(), &core.handle)? {
        let about = core.about.clone();
        return loop_hold::acquire(
            &conn,
            core.handle.clone(),
            wait,
            listener,
            context,
            move |py, acquired| settle(py, acquired.about(py, &about)?),
        );
    }
    let ticket = Ticket::default();
    let abandon: awaitable::Abandon = {
        let (handle, ticket) = (core.handle.clone(), ticket.clone());
        Arc::new(move || handle.holder().abandon(&ticket))
    };
    let (handle, about) = (core.handle.clone(), core.about.clone());
    awaitable::spawn_abandonable(
        slf.py(),
        abandon,
        async move {
            let holder = handle.holder();
            Ok(holder
                .acquire_ticketed(wait, listener, &context, ticket)
                .await)
        },
        move |py, acquired| settle(py, acquired.about(py, &about)?),
    )
}

/// `_acquire_async([context,] blocking=None, timeout=None)`.
pub fn acquire_async<'py, C: LockLike>(
    slf: &Bound<'py, C>,
    context: Context<C::Handle>,
    blocking: Option<&Bound<'py, PyAny>>,
    timeout: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let wait = wait_for(blocking, timeout, slf.get().core().default_timeout)?;
    spawn_acquire(slf, wait, context, |py, acquired| {
        acquired.into_bound_py_any(py)
    })
}

/// `__aenter__`: like `acquire_async` with the object's timeout; LockTimeoutError if not acquired.
pub fn enter_async<'py, C: LockLike>(
    slf: &Bound<'py, C>,
    context: Context<C::Handle>,
) -> PyResult<Bound<'py, PyAny>> {
    let core = slf.get().task_core();
    let wait = Wait::from_timeout(core.default_timeout);
    let timeout_error = enter_timeout(slf.py(), &core.about, core.default_timeout);
    spawn_acquire(slf, wait, context, move |py, acquired| {
        if acquired {
            Ok(py.None().into_bound(py))
        } else {
            Err(timeout_error)
        }
    })
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

/// The `#[pymethods]` block of a `LockLike` class: the methods every lock-like object shares
/// (acquire, release, extend, owned, remaining, token, lost, name, ttl, `with` and their asyncio
/// twins), then the class's own (`$own`: its constructor, getters and extra methods). pyo3 takes
/// one `#[pymethods]` block per class, hence one macro that writes it whole. The docstrings that
/// differ between the classes come with the call; `_acquire_async` and `_enter_async` take the
/// caller's context first when the class names one (the read and write locks).
macro_rules! lock_like_methods {
    (@context) => { () };
    (@context $context:ident) => { $context };
    (
        $class:ty;
        $(#[$acquire_doc:meta])* fn acquire;
        $(#[$release_doc:meta])* fn release;
        $(#[$extend_doc:meta])* fn extend;
        $(#[$owned_doc:meta])* fn owned;
        $(#[$acquire_async_doc:meta])*
        fn _acquire_async($($context:ident: $context_ty:ty)?);
        $($own:tt)*
    ) => {
        #[pymethods]
        impl $class {
            $(#[$acquire_doc])*
            #[pyo3(signature = (blocking=None, timeout=None))]
            fn acquire(
                slf: &Bound<'_, Self>,
                blocking: Option<&Bound<'_, PyAny>>,
                timeout: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<bool> {
                $crate::python::hold::acquire(slf, blocking, timeout)
            }

            $(#[$release_doc])*
            fn release(&self, py: Python<'_>) -> PyResult<()> {
                self.owner_core()?.release(py)
            }

            $(#[$extend_doc])*
            #[pyo3(signature = (ttl=None))]
            fn extend(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                self.owner_core()?.extend(py, ttl)
            }

            $(#[$owned_doc])*
            fn owned(&self, py: Python<'_>) -> PyResult<bool> {
                self.owner_core()?.owned(py)
            }

            /// Seconds left on this object's lease; None if not held, 0.0 once the local deadline passed.
            fn remaining(&self) -> PyResult<Option<f64>> {
                Ok(self.view()?.remaining())
            }

            #[getter]
            fn token(&self) -> PyResult<Option<String>> {
                Ok(self.view()?.token())
            }

            #[getter]
            fn lost(&self) -> PyResult<bool> {
                Ok(self.view()?.lost())
            }

            #[getter]
            fn name(&self) -> String {
                self.core().name.clone()
            }

            #[getter]
            fn ttl(&self) -> f64 {
                self.core().ttl()
            }

            fn __enter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
                $crate::python::hold::enter(slf)
            }

            #[pyo3(signature = (*exc))]
            fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
                self.owner_core()?.exit(py, exc)
            }

            // The asyncio side (`redmutex.aio`) awaits these; same semantics as the blocking ones.

            $(#[$acquire_async_doc])*
            #[pyo3(signature = ($($context,)? blocking=None, timeout=None))]
            fn _acquire_async<'py>(
                slf: &Bound<'py, Self>,
                $($context: $context_ty,)?
                blocking: Option<&Bound<'py, PyAny>>,
                timeout: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let context = $crate::python::hold::lock_like_methods!(@context $($context)?);
                $crate::python::hold::acquire_async(slf, context, blocking, timeout)
            }

            fn _enter_async<'py>(
                slf: &Bound<'py, Self>,
                $($context: $context_ty,)?
            ) -> PyResult<Bound<'py, PyAny>> {
                let context = $crate::python::hold::lock_like_methods!(@context $($context)?);
                $crate::python::hold::enter_async(slf, context)
            }

            fn _release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.task_core().release_async(py)
            }

            /// Gives back the hold with `token` at once (released in Redis in the background), if this
            /// object still has it: an acquire that succeeded after its task was cancelled.
            fn _give_back(&self, token: &str) -> bool {
                self.task_core().give_back(token)
            }

            /// Ends the background renewal of the hold with `token`, if this object still has it
            /// (the event loop it was taken on was closed, maybe by another thread: its owner is
            /// gone).
            fn _stop_renewal(&self, token: &str) -> bool {
                self.core_holding(token).holder().stop_renewal(token)
            }

            /// The task awaiting this object's release was cancelled: the release goes on, and
            /// the object is idle at once (see `Holder::release_abandoned`).
            fn _release_abandoned(&self) -> bool {
                self.task_core().holder().release_abandoned()
            }

            /// Whether the last extend still waits for renewal to put its lease back (see
            /// `Holder::extend_settling`): `aio`'s extend looks again until it does not.
            fn _extend_settling(&self) -> bool {
                self.task_core().holder().extend_settling()
            }

            #[pyo3(signature = (ttl=None))]
            fn _extend_async<'py>(
                &self,
                py: Python<'py>,
                ttl: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                self.task_core().extend_async(py, ttl)
            }

            fn _owned_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.task_core().owned_async(py)
            }

            fn _exit_async<'py>(&self, py: Python<'py>, body_raised: bool) -> PyResult<Bound<'py, PyAny>> {
                self.task_core().exit_async(py, body_raised)
            }

            $($own)*
        }
    };
}

pub(crate) use lock_like_methods;
