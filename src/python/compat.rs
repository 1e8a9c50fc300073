//! `redmutex._core._CompatLock`: the engine of the drop-in shims (`redmutex.compat`), a lock on
//! another library's key with the caller's token. Private: the shims check their arguments the
//! way the original libraries do and call this with clean values.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::IntoPyObjectExt;

use super::args;
use super::awaitable::{self, OnCancel};
use super::blocking;
use super::client::coerce_client;
use super::compat_holds;
use super::errors::{About, Named};
use super::log;
use crate::engine::compat::{CompatHold, CompatLock};
use crate::engine::hold::OnLost;
use crate::engine::lock::Wait;
use crate::engine::renew::{Listener, Loss};
use crate::protocol::compat::Extended;

/// A lock on `lock_key` (another library's key); `name` names redmutex's keys beside it.
#[pyclass(frozen, module = "redmutex._core", name = "_CompatLock")]
pub struct PyCompatLock {
    engine: Arc<CompatLock>,
    about: About,
}

/// One hold taken by `_CompatLock.acquire`.
#[pyclass(frozen, module = "redmutex._core", name = "_CompatHold")]
pub struct PyCompatHold {
    hold: CompatHold,
}

#[pymethods]
impl PyCompatHold {
    #[getter]
    fn fence(&self) -> i64 {
        self.hold.fence
    }

    /// Renewal found the lease gone.
    #[getter]
    fn lost(&self) -> bool {
        self.hold.lost()
    }

    /// Stops renewal (before a release).
    fn stop(&self) {
        self.hold.stop();
    }
}

/// An asyncio acquire's meeting point with its cancellation (see `_acquire_async`).
#[derive(Default)]
struct CancelTicket {
    cancelled: bool,
    /// The token the acquire took and its fence, until the awaitable settles or is cancelled.
    held: Option<(String, i64)>,
}

/// Renewal's listener: a lost hold is logged (a WARNING on the `redmutex` logger).
struct LogListener {
    label: String,
}

impl Listener for LogListener {
    fn lost(&self, how: Loss) {
        self.say(format!("{} was lost: {how}", self.label));
    }

    fn warn(&self, message: &str) {
        self.say(format!("{}: {message}", self.label));
    }
}

impl LogListener {
    fn say(&self, message: String) {
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

fn wait_of(timeout: Option<f64>) -> PyResult<Wait> {
    Ok(match timeout {
        None => Wait::Forever,
        // inf, or past any wait's end: the originals wait for good (their deadline is never
        // reached).
        Some(t) if t > 0.0 && Duration::try_from_secs_f64(t).is_err() => Wait::Forever,
        Some(t) => Wait::from_timeout(Some(args::seconds("timeout", t.max(0.0))?)),
    })
}

fn poll_of(poll: Option<f64>) -> PyResult<Option<Duration>> {
    poll.map(|p| args::seconds("sleep", p.max(0.001)))
        .transpose()
}

/// What `extend` answers Python: the new lease in ms, -1 not owned, -2 no expiry.
fn extended_code(extended: Extended) -> i64 {
    match extended {
        Extended::To(ms) => ms.max(0),
        Extended::NotOwned => -1,
        Extended::NoExpiry => -2,
    }
}

/// Notes `hold` of `token` on `engine`'s lock for its release (see `compat_holds`); with the
/// GIL held.
fn note_hold(engine: &CompatLock, token: &str, hold: &CompatHold) {
    if let Ok(shared) = engine.shared() {
        compat_holds::taken(&shared, &engine.lock_key(), token, hold);
    }
}

/// The fence of the hold of `token` on `engine`'s lock that this process took, forgotten as it
/// is released (None: taken elsewhere); with the GIL held.
fn released_fence(engine: &CompatLock, token: &str) -> Option<i64> {
    let shared = engine.shared().ok()?;
    compat_holds::released(&shared, &engine.lock_key(), token)
}

impl PyCompatLock {
    fn renewal(&self, renew: bool) -> Option<Option<OnLost>> {
        renew.then(|| {
            let listener: OnLost = Arc::new(LogListener {
                label: self.about.label(),
            });
            Some(listener)
        })
    }
}

#[pymethods]
impl PyCompatLock {
    #[new]
    #[pyo3(signature = (client, name, lock_key, *, signal=None, signal_expire_ms=1000))]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        lock_key: &[u8],
        signal: Option<&[u8]>,
        signal_expire_ms: u64,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        let client = coerce_client(client)?;
        let engine_client = client.get().inner.clone();
        let label = String::from_utf8_lossy(&name_bytes).into_owned();
        let engine = CompatLock::new(
            engine_client,
            &name_bytes,
            lock_key,
            signal.map(|s| (s, signal_expire_ms)),
        )?;
        Ok(PyCompatLock {
            engine: Arc::new(engine),
            about: About::new("lock", &label),
        })
    }

    /// Takes the lock for `token` with a lease of `lease` s, waiting `timeout` s (None: for
    /// ever, 0: one try), looking again at least every `poll` s while busy (None: only when
    /// woken or a lease ends); None when not acquired in time.
    #[pyo3(signature = (token, lease, timeout, chosen, renew, poll=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        py: Python<'_>,
        token: String,
        lease: f64,
        timeout: Option<f64>,
        chosen: bool,
        renew: bool,
        poll: Option<f64>,
    ) -> PyResult<Option<PyCompatHold>> {
        let lease = args::seconds("timeout", lease)?;
        let wait = wait_of(timeout)?;
        let poll = poll_of(poll)?;
        let renewal = self.renewal(renew);
        let engine = &self.engine;
        let hold = blocking::run(py, || {
            engine.acquire_blocking(&token, lease, wait, chosen, poll, renewal)
        })?
        .about(py, &self.about)?;
        if let Some(hold) = &hold {
            note_hold(engine, &token, hold);
        }
        Ok(hold.map(|hold| PyCompatHold { hold }))
    }

    #[pyo3(signature = (token, lease, timeout, chosen, renew, poll=None))]
    #[allow(clippy::too_many_arguments)]
    fn _acquire_async<'py>(
        &self,
        py: Python<'py>,
        token: String,
        lease: f64,
        timeout: Option<f64>,
        chosen: bool,
        renew: bool,
        poll: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let lease = args::seconds("timeout", lease)?;
        let wait = wait_of(timeout)?;
        let poll = poll_of(poll)?;
        let renewal = self.renewal(renew);
        let engine = self.engine.clone();
        let about = self.about.clone();
        // An awaitable cancelled once the lock was taken gives it back, as redmutex.aio's do:
        // whichever of the cancel and the grant comes second sees the other under the ticket.
        let ticket = Arc::new(Mutex::new(CancelTicket::default()));
        let abandon: awaitable::Abandon = {
            let (engine, ticket) = (engine.clone(), ticket.clone());
            Arc::new(move || {
                let mut ticket = ticket.lock().unwrap_or_else(|p| p.into_inner());
                ticket.cancelled = true;
                if let Some((token, fence)) = ticket.held.take() {
                    engine.give_back(token, lease, Some(fence));
                }
            })
        };
        let (noted_by, noted_token) = (engine.clone(), token.clone());
        awaitable::spawn_abandonable(
            py,
            abandon,
            async move {
                let hold = engine
                    .acquire(&token, lease, wait, chosen, poll, renewal)
                    .await;
                if let Ok(Some(taken)) = &hold {
                    let mut ticket = ticket.lock().unwrap_or_else(|p| p.into_inner());
                    if ticket.cancelled {
                        taken.stop();
                        engine.give_back(token, lease, Some(taken.fence));
                        return Ok(Ok(None));
                    }
                    ticket.held = Some((token, taken.fence));
                }
                Ok(hold)
            },
            move |py, hold| match hold.about(py, &about)? {
                Some(hold) => {
                    note_hold(&noted_by, &noted_token, &hold);
                    Ok(Bound::new(py, PyCompatHold { hold })?.into_any())
                }
                None => Ok(py.None().into_bound(py)),
            },
        )
    }

    /// Releases `token`'s hold in the background (an asyncio acquire that succeeded, whose task
    /// was cancelled before it resumed: nobody holds that hold).
    fn _give_back(&self, token: String, lease: f64) -> PyResult<()> {
        let lease = args::seconds("timeout", lease)?;
        let fence = released_fence(&self.engine, &token);
        self.engine.give_back(token, lease, fence);
        Ok(())
    }

    /// Compare-and-delete for `token`; False when the lock was not `token`'s.
    /// A release whose connection broke is resent only for a hold that this process took
    /// (see `compat_holds`); otherwise its error stands.
    fn release(&self, py: Python<'_>, token: String) -> PyResult<bool> {
        let engine = &self.engine;
        let fence = released_fence(engine, &token);
        blocking::run(py, || engine.release_blocking(&token, fence))?.about(py, &self.about)
    }

    fn _release_async<'py>(&self, py: Python<'py>, token: String) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.engine.clone();
        let about = self.about.clone();
        let fence = released_fence(&engine, &token);
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(engine.release(&token, fence).await) },
            move |py, released| released.about(py, &about)?.into_bound_py_any(py),
        )
    }

    /// redis-py's extend: the new lease in ms, -1 when not `token`'s, -2 when it has no expiry.
    fn extend(&self, py: Python<'_>, token: String, ms: i64, replace: bool) -> PyResult<i64> {
        let engine = &self.engine;
        let extended = blocking::run(py, || engine.extend_blocking(&token, ms, replace))?
            .about(py, &self.about)?;
        Ok(extended_code(extended))
    }

    fn _extend_async<'py>(
        &self,
        py: Python<'py>,
        token: String,
        ms: i64,
        replace: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.engine.clone();
        let about = self.about.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(engine.extend(&token, ms, replace).await) },
            move |py, extended| {
                let code = extended_code(extended.about(py, &about)?);
                code.into_bound_py_any(py)
            },
        )
    }

    /// The owner's token, or None when the lock is free.
    fn owner<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let engine = &self.engine;
        let owner = blocking::run(py, || engine.owner_blocking())?.about(py, &self.about)?;
        Ok(owner.map(|o| PyBytes::new(py, &o)))
    }

    fn _owner_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = self.engine.clone();
        let about = self.about.clone();
        awaitable::spawn(
            py,
            OnCancel::Abort,
            async move { Ok(engine.owner().await) },
            move |py, owner| match owner.about(py, &about)? {
                Some(o) => Ok(PyBytes::new(py, &o).into_any()),
                None => Ok(py.None().into_bound(py)),
            },
        )
    }

    /// Deletes the lock whoever holds it, waking every waiter; 1 when it was held.
    fn reset(&self, py: Python<'_>) -> PyResult<i64> {
        let engine = &self.engine;
        blocking::run(py, || engine.reset_blocking())?.about(py, &self.about)
    }
}
