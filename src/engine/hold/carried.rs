//! The first acquire attempt for a caller that carries its step over a connection of its own
//! (the asyncio loop path, `python/loop_conn.rs`): `begin_try` makes the object Acquiring and
//! gives the call as bytes, `finish_try` reads the reply like the blocking direct path's first
//! attempt (`Holder::read_first`), and what must wait goes on through the runtime
//! (`acquire_waiting`). Like the direct path's, a first attempt that will likely find the
//! primitive taken listens first and takes the waiter's place in a queue (`listen_early`).
//! Release, extend and `owned` use the steps of `hold.rs` (`begin_release_step`, ...), shared
//! with the direct path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use super::{EarlyWait, Holder, Leased, OnLost, Pending, Ticket};
use crate::engine::client::{Backend, Shared};
use crate::engine::error::{Error, Result};
use crate::engine::token::new_token;
use crate::engine::waiting::{spawn_undo, Contender, Early, Wait};
use crate::protocol::resp::{self, Packed};

/// A first acquire attempt whose step a caller sends itself (`Holder::begin_try`); the object
/// stays Acquiring until `Holder::finish_try` (or `Holder::abort_acquire`).
pub struct Try {
    token: String,
    /// Which acquire of the object (see `Holder::abort_acquire`).
    attempt: u64,
    shared: Arc<Shared>,
    sent_at: Instant,
    /// The waiter's registrations when it listened before the attempt; the attempt then was
    /// the joining one (`Contender::first_step_joining`).
    early: Option<Early>,
}

/// What a first attempt sent by the caller left.
pub enum Tried {
    Done(bool),
    /// The acquire goes on through the runtime (`Holder::acquire_waiting`): it found the
    /// primitive busy and the caller waits, or its connection broke (a fresh acquire). The
    /// object stays Acquiring until then.
    Wait(Waiting),
}

/// An acquire left to the runtime by `Holder::finish_try`.
pub struct Waiting {
    attempt: u64,
    token: Option<String>,
    busy_retry_ms: Option<i64>,
    /// What a first attempt that listened early leaves to the wait (its place in a queue).
    early: Option<Box<EarlyWait>>,
}

impl Waiting {
    /// Which acquire of the object it is, for `Holder::abort_acquire`.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }
}

/// An acquire that never goes on to wait gives back the place its first attempt took.
impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(undo) = self.early.take().and_then(|e| e.undo) {
            spawn_undo(undo);
        }
    }
}

impl<P: Leased> Holder<P> {
    /// Whether a caller that carries the steps itself (the asyncio loop path) may use
    /// `begin_try`, `begin_release_step`, `begin_extend_step` and `owned_step`: the primitive
    /// has the direct path, the client is one server, and the primitive is not re-entrant (its
    /// nested acquires and releases go through the runtime).
    pub fn carried(&self) -> bool {
        self.has_direct() && !self.primitive.reentrant()
    }

    /// Begins an acquire whose first attempt the caller sends itself: the call as bytes and the
    /// attempt to finish with `finish_try`. As on the direct path, a caller that will wait
    /// listens first when the last first attempt found the primitive taken, and its attempt
    /// then takes its place in a queue (`waiting::listen_early`). Only when `carried`.
    pub fn begin_try(&self, args: &P::Args, wait: Wait) -> Result<(Packed, Try)> {
        let shared = self.client.shared()?;
        let mut pending = self.begin_acquire()?;
        let token = new_token()?;
        let (call, early) = {
            let contender = self.primitive.contender(&shared, &token, args)?;
            let plan = (wait != Wait::Once).then(|| self.primitive.plan(&shared, &token));
            let (step, early) = self.first_attempt(&contender, plan.as_ref(), false);
            (resp::pack(step.call()), early)
        };
        // The `Try` carries the Acquiring state from here on.
        pending.settled = true;
        let attempt = Try {
            attempt: pending.attempt,
            token,
            shared,
            sent_at: Instant::now(),
            early,
        };
        Ok((call, attempt))
    }

    /// Settles a first attempt begun by `begin_try` with its reply. `Err((error, resend))`: the
    /// call failed; whatever it may have taken is given back, and with `resend` (the connection
    /// broke, as the runtime would retry) the acquire goes on through the runtime with a new
    /// token. `ticket`: the caller may have stopped waiting (see `Ticket`).
    pub fn finish_try(
        &self,
        attempt: Try,
        reply: std::result::Result<Value, (Error, bool)>,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
        ticket: Ticket,
    ) -> Result<Tried> {
        let mut pending = Pending {
            holder: self,
            attempt: attempt.attempt,
            token: None,
            busy_retry_ms: None,
            early: None,
            settled: false,
            ticket: Some(ticket),
        };
        let Try {
            attempt: _,
            token,
            shared,
            sent_at,
            early,
        } = attempt;
        let outcome = {
            let contender = self.primitive.contender(&shared, &token, args)?;
            // The step the attempt sent, to read its reply (a joining one also tells the
            // contender that it holds a place to give back).
            let step = if early.is_some() {
                contender.first_step_joining()
            } else {
                contender.first_step()
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err((err, resend)) => {
                    spawn_undo(contender.undo());
                    if !resend {
                        return Err(err);
                    }
                    pending.settled = true;
                    return Ok(Tried::Wait(Waiting {
                        attempt: pending.attempt,
                        token: None,
                        busy_retry_ms: None,
                        early: None,
                    }));
                }
            };
            self.read_first(&mut pending, &contender, &step, reply, sent_at, wait, early)?
        };
        self.found_busy
            .store(pending.busy_retry_ms.is_some(), Ordering::Relaxed);
        if let Some(retry_ms) = pending.busy_retry_ms {
            pending.settled = true;
            return Ok(Tried::Wait(Waiting {
                attempt: pending.attempt,
                token: Some(token),
                busy_retry_ms: Some(retry_ms),
                early: pending.early.take(),
            }));
        }
        let backend = Backend::Single(shared);
        pending
            .settle(&backend, token, Ok(outcome), listener)
            .map(Tried::Done)
    }

    /// Gives back what a first attempt sent by the caller may have taken, once more: its reply
    /// came after the call had failed (timed out), or never will (the connection closed).
    pub fn undo_try(&self, token: &str, args: &P::Args) {
        if let Ok(shared) = self.client.shared() {
            if let Ok(contender) = self.primitive.contender(&shared, token, args) {
                spawn_undo(contender.undo());
            }
        }
    }

    /// The token of a first attempt, for `undo_try`.
    pub fn try_token(attempt: &Try) -> &str {
        &attempt.token
    }

    /// Which acquire of the object a first attempt is, for `abort_acquire`.
    pub fn try_attempt(attempt: &Try) -> u64 {
        attempt.attempt
    }

    /// Finishes, through the runtime, an acquire that `finish_try` left waiting.
    pub async fn acquire_waiting(
        &self,
        mut waiting: Waiting,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
        ticket: Ticket,
    ) -> Result<bool> {
        let pending = Pending {
            holder: self,
            attempt: waiting.attempt,
            token: waiting.token.take(),
            busy_retry_ms: waiting.busy_retry_ms,
            early: waiting.early.take(),
            settled: false,
            ticket: Some(ticket),
        };
        self.acquire_pending(pending, wait, listener, args).await
    }
}
