//! The one executor: runs any step (`protocol::step`) on the connection that fits — the node of
//! the runtime (a server, a Sentinel-managed master, a Redis Cluster), or for a blocking caller,
//! a direct connection on the caller's own thread (to the server, the master, or the cluster
//! node that owns the step's slot), falling back to the runtime where that one cannot serve.
//! It knows no primitive.
//! Redlock's quorum executor (`redlock.rs`) runs the same steps on every master.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::LocalKey;

use redis::{ScriptInvocation, Value};

use super::direct::{Miss, Overdue};
use super::error::{Error, Result};
use super::node::{giving_up_at, GiveUp, Identity, Node, Retry};
use super::runtime;
use super::shared::Shared;
use crate::protocol::step::{Call, Step};

/// Runs `step` through the runtime (every step of redmutex is token-checked, so a resend after
/// a dropped connection is safe: `Retry::Once`).
pub async fn run<T>(shared: &Shared, step: &Step<T>) -> Result<T> {
    let reply = send(shared, step).await?;
    Ok(step.parse(reply)?)
}

/// Sends `step` through the runtime and leaves its reply to the caller (who tells a reply it
/// cannot read from a failed call).
pub async fn send<T>(shared: &Shared, step: &Step<T>) -> Result<Value> {
    match step.call() {
        Call::Script(inv) => shared.node.invoke(inv, Retry::Once).await,
        Call::Command(cmd) => shared.node.query::<Value>(cmd, Retry::Once).await,
    }
}

/// Runs `step` on the caller's thread (see `direct.rs`); what the direct path leaves to the
/// runtime (Cluster and Sentinel: a redirect, a failover, a broken connection) is sent through
/// it, this thread waiting for the answer.
pub fn run_direct<T>(shared: &Shared, step: &Step<T>) -> Result<T> {
    let reply = match step.call() {
        Call::Script(inv) => shared.direct.invoke(inv, Retry::Once),
        Call::Command(cmd) => shared.direct.query::<Value>(cmd, Retry::Once),
    };
    let reply = match reply {
        Ok(reply) => reply,
        Err(Miss::Failed(err, _)) => return Err(err),
        Err(Miss::Elsewhere) => on_runtime(send(shared, step))??,
    };
    Ok(step.parse(reply)?)
}

/// Runs the script `step` through the runtime; a resend after a dropped connection goes as
/// `resend` (a form that tells the first send's work from another call's), or not at all (None).
pub async fn run_or_resend<T>(
    shared: &Shared,
    step: &Step<T>,
    resend: Option<&ScriptInvocation<'_>>,
) -> Result<T> {
    let first = script_of(step)?;
    let reply = match resend {
        Some(resend) => shared.node.invoke_or_resend(first, resend).await?,
        None => shared.node.invoke(first, Retry::Never).await?,
    };
    Ok(step.parse(reply)?)
}

/// `run_or_resend` on the caller's thread (see `run_direct`). What the direct path leaves to
/// the runtime may have run already (a routed connection that broke under it), so the runtime
/// sends `resend` itself.
pub fn run_direct_or_resend<T>(
    shared: &Shared,
    step: &Step<T>,
    resend: &ScriptInvocation<'_>,
) -> Result<T> {
    let reply = match shared.direct.invoke_or_resend(script_of(step)?, resend) {
        Ok(reply) => reply,
        Err(Miss::Failed(err, _)) => return Err(err),
        Err(Miss::Elsewhere) => on_runtime(shared.node.invoke(resend, Retry::Once))??,
    };
    Ok(step.parse(reply)?)
}

/// A script sent on the caller's thread like `run_direct`, failing with the call that may still
/// run when it timed out (`Overdue`: its direct connection, or the runtime's timed-out calls
/// when it went through the runtime), so that an undo can wait for it.
/// `deadline`: the acquire's (see `node::giving_up_at`), if it has one.
pub fn invoke_direct(
    shared: &Shared,
    inv: &ScriptInvocation<'_>,
    deadline: Option<GiveUp>,
) -> std::result::Result<Value, (Error, Option<Overdue>)> {
    match shared.direct.invoke(inv, Retry::Once) {
        Ok(reply) => Ok(reply),
        Err(Miss::Failed(err, overdue)) => Err((err, overdue)),
        Err(Miss::Elsewhere) => {
            let call = shared.node.invoke(inv, Retry::Once);
            let sent = match deadline {
                Some(deadline) => on_runtime(giving_up_at(deadline, call)),
                None => on_runtime(call),
            };
            let sent = sent.and_then(|sent| sent);
            sent.map_err(|err| {
                let overdue = shared.node.overdue_calls();
                let overdue = (err.is_connection() && !overdue.is_empty())
                    .then_some(Overdue::Runtime(overdue));
                (err, overdue)
            })
        }
    }
}

thread_local! {
    /// Set while this thread polls a wait of the blocking API that it drives itself
    /// (`caller_driven`).
    static CALLER_DRIVEN: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread polls a wait that must not block it (`cooperatively`).
    static COOPERATIVE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `poll` (one poll of a blocking API's future) as a caller whose thread runs other work
/// between polls (gevent's greenlets): its wait is then served as a runtime task's would be
/// (no listening or attempts on the caller's own connections, which block the thread).
pub fn cooperatively<R>(poll: impl FnOnce() -> R) -> R {
    let _restore = Flag::set(&COOPERATIVE, true);
    poll()
}

/// Whether the future being polled now runs on its blocking caller's own thread (see
/// `caller_driven`): a one-round-trip step may then go on that thread's direct connections.
pub fn on_caller_thread() -> bool {
    CALLER_DRIVEN.with(Cell::get)
}

/// A future of the blocking API that its caller's thread drives (the binding blocks on it
/// there, `Handle::block_on`): while that thread polls it, and `direct` (the client and the
/// primitive allow the direct path), `on_caller_thread` is true, so that the attempts of a wait
/// go on the caller's direct connection, as its first attempt did, instead of crossing to a
/// runtime thread and back. Polled as a runtime task, it is the plain future.
pub fn caller_driven<F: Future>(direct: bool, fut: F) -> CallerDriven<F> {
    CallerDriven {
        fut: Box::pin(fut),
        direct,
    }
}

pub struct CallerDriven<F> {
    fut: Pin<Box<F>>,
    direct: bool,
}

impl<F: Future> Future for CallerDriven<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // A runtime task is polled on a runtime thread, which must never block.
        // (A caller that must not block its thread is served as a runtime task.)
        let caller = self.direct && tokio::task::try_id().is_none() && !COOPERATIVE.with(Cell::get);
        let _flag = Flag::set(&CALLER_DRIVEN, caller);
        self.fut.as_mut().poll(cx)
    }
}

/// Puts a thread-local flag (`CALLER_DRIVEN`, `COOPERATIVE`) back as it was when dropped (after
/// a poll, even one that panicked).
struct Flag {
    key: &'static LocalKey<Cell<bool>>,
    was: bool,
}

impl Flag {
    fn set(key: &'static LocalKey<Cell<bool>>, value: bool) -> Flag {
        Flag {
            key,
            was: key.with(|flag| flag.replace(value)),
        }
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        let was = self.was;
        self.key.with(|flag| flag.set(was));
    }
}

/// Waits on this thread for `fut`, run on the runtime. Not from a runtime thread (which must
/// never block): there it is an error.
fn on_runtime<F>(fut: F) -> Result<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Usage(
            "a blocking call was made from the runtime's own thread".into(),
        ));
    }
    Ok(runtime::handle()?.block_on(fut))
}

/// Sends `step` on `node` and tells which server incarnation answered, leaving the reply to
/// the caller (Redlock tallies replies of every master).
pub async fn send_identified<T>(
    node: &Node,
    step: &Step<T>,
) -> Result<(Value, Option<Arc<Identity>>)> {
    match step.call() {
        Call::Script(inv) => node.invoke_identified(inv, Retry::Once).await,
        Call::Command(cmd) => node.query_identified::<Value>(cmd, Retry::Once).await,
    }
}

/// The script of a step that must go out as one (an acquire attempt sent directly, or as a
/// first send with a resend); a plain command is refused.
pub fn script_of<T>(step: &Step<T>) -> Result<&ScriptInvocation<'static>> {
    step.invocation()
        .ok_or_else(|| Error::Usage("this step is a plain command, not a script".into()))
}

/// What a blocking entry point did: ran on the caller's thread already (`Done`), or left a
/// future for the binding to wait on (through the runtime, interruptible).
pub enum Now<T, F: Future<Output = T>> {
    Done(T),
    Later(F),
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn probe() -> bool {
        on_caller_thread()
    }

    #[test]
    fn only_a_wait_its_caller_polls_counts_as_on_the_callers_thread() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // Polled by the caller's own thread (block_on), with the direct path: yes.
        assert!(rt.block_on(caller_driven(true, probe())));
        // Without the direct path, or as a runtime task (a runtime thread must never block): no.
        assert!(!rt.block_on(caller_driven(false, probe())));
        let handle = rt.handle().clone();
        let spawned = rt.block_on(async move { handle.spawn(caller_driven(true, probe())).await });
        assert!(!spawned.unwrap());
        // Outside such a poll (and after it), no.
        assert!(!on_caller_thread());
        assert!(!rt.block_on(probe()));
    }
}
