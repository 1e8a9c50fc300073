//! The asyncio calls of the lock-like objects on the loop path (`loop_conn`): the engine begins
//! each one-round-trip operation (`Holder::begin_try`, `begin_release_step`, ...), its step goes
//! out on the loop's own connection, and the reply settles it on the loop's thread
//! (`finish_*`), with the same state changes as the blocking API's direct path. An acquire that
//! must wait goes on through the runtime (`Holder::acquire_waiting`), as do calls whose
//! connection broke under them (sent again there, as the runtime's calls retry) and calls that
//! the server answered LOADING (nothing ran: a release is then judged as a first send).
//!
//! Cancellation keeps the runtime path's guarantees: an acquire whose awaitable is cancelled
//! before its reply comes abandons its ticket as the reply settles it, so a grant is given back
//! at once; release and extend always settle, whoever still waits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::awaitable::{self, Abandon, OnCancel};
use super::loop_conn::{self, Finish, LoopConn, Ready, Reply};
use crate::engine::hold::{Holder, Leased, OnLost, Ticket, Tried};
use crate::engine::lock::Wait;
use crate::engine::{Error, Result};
use crate::protocol::resp::{self, Packed};
use crate::protocol::step::Step;
use redis::Value;

/// An object with one hold (`hold::Held` is one).
pub trait Held: Send + Sync + 'static {
    type Primitive: Leased<Args: Send + 'static>;
    fn holder(&self) -> &Holder<Self::Primitive>;
}

/// What one acquire of `H` is told beyond the wait.
type Context<H> = <<H as Held>::Primitive as Leased>::Args;

/// Turns an operation's outcome into the awaitable's result, on the loop's thread.
pub trait Convert<T>: for<'a> FnOnce(Python<'a>, Result<T>) -> PyResult<Bound<'a, PyAny>> {}

impl<T, C> Convert<T> for C where
    C: for<'a> FnOnce(Python<'a>, Result<T>) -> PyResult<Bound<'a, PyAny>>
{
}

/// `_loop_cancelled(future)`: `future`, an acquire's awaitable, was cancelled: told as the
/// cancellation reaches the awaiting task (see `awaitable::on_cancelled`).
#[pyfunction]
pub fn _loop_cancelled(future: &Bound<'_, PyAny>) {
    awaitable::run_cancelled_hook(future);
}

/// The loop's ready connection for `handle`'s client, when the loop path serves its calls.
pub fn conn_for<'py, H: Held>(py: Python<'py>, handle: &Arc<H>) -> PyResult<Option<Ready<'py>>> {
    let holder = handle.holder();
    if !holder.carried() {
        return Ok(None);
    }
    loop_conn::ready_for(py, holder.client())
}

/// Resolves `future` with `outcome`, unless it is done (cancelled) already.
fn resolve(py: Python<'_>, future: &Bound<'_, PyAny>, outcome: PyResult<Bound<'_, PyAny>>) {
    let resolved = (|| -> PyResult<()> {
        if future.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        match outcome {
            Ok(value) => future.call_method1("set_result", (value,))?,
            Err(err) => future.call_method1("set_exception", (err.into_value(py),))?,
        };
        Ok(())
    })();
    if let Err(err) = resolved {
        err.write_unraisable(py, Some(future));
    }
}

/// Runs `fut` on the runtime, resolving `future` through `convert` (a call the loop path hands
/// over: a wait, or a resend after its connection broke).
fn hand_over<T, F, C>(
    py: Python<'_>,
    future: &Bound<'_, PyAny>,
    on_cancel: OnCancel,
    abandon: Option<Abandon>,
    fut: F,
    convert: C,
) where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
    C: Convert<T> + Send + 'static,
{
    let spawned = loop_conn::running_loop(py).and_then(|event_loop| {
        awaitable::spawn_into(
            py,
            &event_loop,
            future,
            on_cancel,
            abandon,
            async move { Ok(fut.await) },
            convert,
        )
    });
    if let Err(err) = spawned {
        resolve(py, future, Err(err));
    }
}

/// An acquire: its first attempt on the loop's connection; waiting (when it found the
/// primitive busy) through the runtime.
pub fn acquire<'py, H, C>(
    ready: &Ready<'py>,
    handle: Arc<H>,
    wait: Wait,
    listener: Option<OnLost>,
    context: Context<H>,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    H: Held,
    C: Convert<bool> + Send + 'static,
{
    let py = ready.conn.py();
    let future = ready.create_future()?;
    let (packed, attempt) = match handle.holder().begin_try(&context, wait) {
        Ok(begun) => begun,
        Err(err) => {
            resolve(py, &future, convert(py, Err(err)));
            return Ok(future);
        }
    };
    let token = Holder::<H::Primitive>::try_token(&attempt).to_string();
    let attempt_id = Holder::<H::Primitive>::try_attempt(&attempt);
    let context = Arc::new(context);
    let undo = {
        let (handle, context) = (handle.clone(), context.clone());
        move || handle.holder().undo_try(&token, &context)
    };
    let late = Box::new(undo.clone()) as loop_conn::Late;
    // True while the first attempt is out. Cancelled meanwhile, the object is idle again at once
    // (another acquire may begin), and the reply, when it comes, only gives back what the
    // attempt took.
    let out = Arc::new(AtomicBool::new(true));
    let on_cancel = {
        let (handle, out) = (handle.clone(), out.clone());
        Box::new(move || {
            if out.swap(false, Ordering::AcqRel) {
                handle.holder().abort_acquire(attempt_id);
            }
        })
    };
    let key = awaitable::on_cancelled(&future, on_cancel);
    let target = future.clone().unbind();
    let finish: Finish = Box::new(move |py: Python<'_>, reply: Reply| {
        let future = target.bind(py);
        drop(key);
        if !out.swap(false, Ordering::AcqRel) {
            undo();
            return;
        }
        let holder = handle.holder();
        let ticket = Ticket::default();
        // Cancelled while the attempt was out: whatever it obtained is given back as it settles.
        let gone = future
            .call_method0("cancelled")
            .and_then(|c| c.is_truthy())
            .unwrap_or(true);
        if gone {
            holder.abandon(&ticket);
        }
        match holder.finish_try(
            attempt,
            reply,
            wait,
            listener.clone(),
            &context,
            ticket.clone(),
        ) {
            Ok(Tried::Done(acquired)) => resolve(py, future, convert(py, Ok(acquired))),
            Err(err) => resolve(py, future, convert(py, Err(err))),
            Ok(Tried::Wait(waiting)) if gone => holder.abort_acquire(waiting.attempt()),
            Ok(Tried::Wait(waiting)) => {
                // Cancelled while it waits: the object is idle again at once (its next acquire
                // may begin before the runtime drops the wait, which then changes nothing, or
                // before the wait ever ran).
                let abandon: Abandon = {
                    let (handle, ticket) = (handle.clone(), ticket.clone());
                    let attempt = waiting.attempt();
                    Arc::new(move || {
                        handle.holder().abandon(&ticket);
                        handle.holder().abort_acquire(attempt);
                    })
                };
                let handle = handle.clone();
                hand_over(
                    py,
                    future,
                    OnCancel::Abort,
                    Some(abandon),
                    async move {
                        handle
                            .holder()
                            .acquire_waiting(waiting, wait, listener, &context, ticket)
                            .await
                    },
                    convert,
                );
            }
        }
    });
    LoopConn::send(&ready.conn, packed, finish, Some(late))?;
    Ok(future)
}

/// A one-step call (release, extend, owned) on the loop's connection: `begun` is its request
/// and what settling it needs, or its outcome when it needs no step; `settle` turns the reply
/// into the outcome; a call whose connection broke under it (`resend(state, true)`: it may have
/// run) or that the server answered LOADING (`resend(state, false)`: it did not) goes on
/// through the runtime, cancelled as `on_cancel` says.
fn one_step<'py, S, T, F, R, G, C>(
    ready: &Ready<'py>,
    begun: std::result::Result<(Packed, S), Result<T>>,
    settle: F,
    resend: R,
    on_cancel: OnCancel,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    S: Send + 'static,
    T: Send + 'static,
    F: FnOnce(S, Result<Value>) -> Settled<T, S> + Send + 'static,
    R: FnOnce(S, bool) -> G + Send + 'static,
    G: std::future::Future<Output = Result<T>> + Send + 'static,
    C: Convert<T> + Send + 'static,
{
    let py = ready.conn.py();
    let future = ready.create_future()?;
    let (packed, state) = match begun {
        Ok(begun) => begun,
        Err(outcome) => {
            resolve(py, &future, convert(py, outcome));
            return Ok(future);
        }
    };
    let target = future.clone().unbind();
    let finish: Finish = Box::new(move |py: Python<'_>, reply: Reply| {
        let future = target.bind(py);
        let reply = match reply {
            Ok(value) => Ok(value),
            Err((err, true)) => {
                // LOADING (`is_restarting`) says nothing ran; a broken connection does not.
                let may_have_run = !err.is_restarting();
                hand_over(
                    py,
                    future,
                    on_cancel,
                    None,
                    resend(state, may_have_run),
                    convert,
                );
                return;
            }
            Err((err, false)) => Err(err),
        };
        match settle(state, reply) {
            Settled::Now(outcome) => resolve(py, future, convert(py, outcome)),
            Settled::Later(state) => {
                hand_over(py, future, on_cancel, None, resend(state, true), convert);
            }
        }
    });
    LoopConn::send(&ready.conn, packed, finish, None)?;
    Ok(future)
}

/// What a step's reply settles: the call's outcome now, or the call goes on through the runtime
/// (as when the loop's connection broke under it) with what the step began.
enum Settled<T, S> {
    Now(Result<T>),
    Later(S),
}

/// A step the holder began (with what its finish needs), packed for the loop's connection; a
/// step that could not begin settles the call with its error at once.
type Begun<R, S, T> = std::result::Result<(Packed, (Step<R>, S)), Result<T>>;

fn packed<R, S, T>(begun: Result<(Step<R>, S)>) -> Begun<R, S, T> {
    begun
        .map(|(step, state)| (resp::pack(step.call()), (step, state)))
        .map_err(Err)
}

/// A step's reply (or the connection's error), read by the step.
fn read<R>(step: &Step<R>, reply: Result<Value>) -> Result<R> {
    reply.and_then(|value| step.parse(value).map_err(Error::from))
}

/// A release: its step on the loop's connection; it settles even when nobody awaits it.
pub fn release<'py, H, C>(
    ready: &Ready<'py>,
    handle: Arc<H>,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    H: Held,
    C: Convert<()> + Send + 'static,
{
    let begun = packed(handle.holder().begin_release_step());
    let again = handle.clone();
    one_step(
        ready,
        begun,
        move |(step, releasing), reply| {
            let outcome = read(&step, reply);
            // Found gone after a restart: the runtime reads whether it was this release's own
            // delete (see `Holder::release_needs_read`).
            if handle.holder().release_needs_read(&releasing, &outcome) {
                return Settled::Later((step, releasing));
            }
            Settled::Now(handle.holder().finish_release_step(releasing, outcome))
        },
        move |(_, releasing), may_have_run| async move {
            let holder = again.holder();
            if may_have_run {
                holder.release_resent(releasing).await
            } else {
                holder.release_unrun(releasing).await
            }
        },
        OnCancel::Finish,
        convert,
    )
}

/// An extend: its step on the loop's connection; it settles even when nobody awaits it.
pub fn extend<'py, H, C>(
    ready: &Ready<'py>,
    handle: Arc<H>,
    lease: Option<Duration>,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    H: Held,
    C: Convert<()> + Send + 'static,
{
    let begun = packed(handle.holder().begin_extend_step(lease));
    let again = handle.clone();
    one_step(
        ready,
        begun,
        move |(step, extending), reply| {
            Settled::Now(
                handle
                    .holder()
                    .finish_extend_step(extending, read(&step, reply)),
            )
        },
        move |_, _| async move { again.holder().extend(lease).await },
        OnCancel::Finish,
        convert,
    )
}

/// `owned()`: its step on the loop's connection.
pub fn owned<'py, H, C>(
    ready: &Ready<'py>,
    handle: Arc<H>,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    H: Held,
    C: Convert<bool> + Send + 'static,
{
    let begun = match handle.holder().owned_step() {
        Some(step) => Ok((resp::pack(step.call()), step)),
        None => Err(Ok(false)),
    };
    one_step(
        ready,
        begun,
        |step, reply| Settled::Now(read(&step, reply)),
        move |_, _| async move { handle.holder().owned().await },
        OnCancel::Abort,
        convert,
    )
}
