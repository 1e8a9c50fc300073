//! Waiting without polling, shared by every primitive (lock, semaphore, read-write lock).
//!
//! A waiter registers on the primitive's wake channel, makes sure it is subscribed, then
//! attempts; when the attempt is not granted it sleeps until a release is published or until the
//! time the server named (the soonest lease end or place lapse), whichever comes first. An
//! acquire whose outcome is unknown (cancelled mid-flight, or its reply lost) is undone in the
//! background, so it neither keeps nor later takes anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::Shared;
use super::error::Result;
use super::runtime;
use crate::protocol::lease;

/// How long a silent waiter keeps its place in a Redis queue (fair lock, fair semaphore,
/// waiting writer): a waiter that died stops holding others back within this time (the
/// contract allows 10 s). Live waiters refresh it every third.
pub const QUEUE_PLACE: Duration = Duration::from_secs(6);
/// How long a waiter sleeps when Redis gives no lease to wait for (a key without expiry).
const NO_HINT_LOOK: Duration = Duration::from_millis(500);

/// How long `acquire` may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// One attempt, no waiting.
    Once,
    Until(Instant),
    Forever,
}

impl Wait {
    pub fn from_timeout(timeout: Option<Duration>) -> Wait {
        match timeout {
            None => Wait::Forever,
            Some(t) if t.is_zero() => Wait::Once,
            Some(t) => Instant::now()
                .checked_add(t)
                .map_or(Wait::Forever, Wait::Until),
        }
    }

    pub fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Once => Some(Instant::now()),
            Wait::Until(d) => Some(d),
            Wait::Forever => None,
        }
    }

    pub fn expired(self, now: Instant) -> bool {
        match self {
            Wait::Once => true,
            Wait::Until(d) => now >= d,
            Wait::Forever => false,
        }
    }
}

/// What one attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<G> {
    /// The caller holds it now.
    Granted(G),
    /// Not now; look again within `retry_ms` at the latest (negative: the server gave no hint).
    Busy { retry_ms: i64 },
    /// Granted but given back at once (e.g. replicas did not confirm it): the acquire fails like
    /// a timeout, without waiting any longer.
    Refused,
}

/// A future that runs detached on the runtime.
pub type Detached = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// One waiter's attempts on one primitive, for one token.
pub trait Contender: Sync {
    type Grant: Send;

    /// One attempt. `join` is false for the first try (never take a place in a queue) and true
    /// while waiting (take or refresh the waiter's place, if the primitive keeps one).
    fn attempt(&self, join: bool) -> impl Future<Output = Result<Outcome<Self::Grant>>> + Send;

    /// Gives up a waiter's place at once (called only when the plan says `queued`).
    fn leave(&self) -> impl Future<Output = Result<()>> + Send;

    /// Best-effort undo of an attempt whose outcome is unknown: give back whatever the token may
    /// hold or occupy. Runs detached, after the caller is gone.
    fn undo(&self) -> Detached;
}

/// How a primitive's waiters wait.
pub struct Plan<'a> {
    pub shared: &'a Arc<Shared>,
    /// The channel on which releases publish.
    pub channel: Vec<u8>,
    /// Some(token): woken only by messages naming this token or nobody (''); None: by every one.
    pub wake_token: Option<&'a str>,
    /// Some(id): only one waiter per id in this process competes in Redis at a time; the others
    /// queue in process, in FIFO order (Redis work per hand-off grows with processes, not threads).
    pub gate: Option<&'a [u8]>,
    /// The waiter keeps a place in Redis (a queue entry or a waiting-writer mark) that it must
    /// refresh while it waits and give back when it gives up.
    pub queued: bool,
}

/// Sends `undo` if dropped while armed.
struct Cleanup<'a, C: Contender> {
    contender: &'a C,
    armed: bool,
}

impl<C: Contender> Cleanup<'_, C> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<C: Contender> Drop for Cleanup<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            runtime::spawn(self.contender.undo());
        }
    }
}

/// Tries to get `contender` what it wants, waiting as `wait` allows. Waiting never polls: it
/// sleeps until a release is published or the server's hint comes due, whichever comes first.
pub async fn acquire<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
) -> Result<Option<C::Grant>> {
    let cleanup = Cleanup {
        contender,
        armed: true,
    };
    // An error leaves `cleanup` armed: the script may have run.
    match contender.attempt(false).await? {
        Outcome::Granted(grant) => {
            cleanup.disarm();
            return Ok(Some(grant));
        }
        Outcome::Refused => {
            cleanup.disarm();
            return Ok(None);
        }
        Outcome::Busy { .. } => {}
    }
    if wait.expired(Instant::now()) {
        cleanup.disarm();
        return Ok(None);
    }
    let waited = wait_for_turn(contender, plan, wait).await;
    match &waited {
        Ok(Some(_)) => cleanup.disarm(),
        Ok(None) if !plan.queued => cleanup.disarm(),
        // A waiter that gives up leaves its place now, not when the place lapses.
        Ok(None) => {
            if contender.leave().await.is_ok() {
                cleanup.disarm();
            }
        }
        Err(_) => {}
    }
    waited
}

async fn wait_for_turn<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
) -> Result<Option<C::Grant>> {
    let gate = plan.gate.map(|id| plan.shared.gate(id));
    let _turn = match &gate {
        Some(gate) => match wait.deadline() {
            None => Some(gate.lock().await),
            Some(d) => match tokio::time::timeout_at(d.into(), gate.lock()).await {
                Ok(turn) => Some(turn),
                Err(_) => return Ok(None),
            },
        },
        None => None,
    };
    let registration = plan
        .shared
        .hub
        .register(plan.channel.clone(), plan.wake_token);
    loop {
        // Subscribed before looking, so a release after the look is always heard.
        registration.ready().await?;
        let retry_ms = match contender.attempt(true).await? {
            Outcome::Granted(grant) => return Ok(Some(grant)),
            Outcome::Refused => return Ok(None),
            Outcome::Busy { retry_ms } => retry_ms,
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(None);
        }
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if plan.queued {
            // Refresh the place well before it lapses.
            nap = nap.min(QUEUE_PLACE / 3);
        }
        tokio::select! {
            _ = registration.notified() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_from_timeout() {
        assert_eq!(Wait::from_timeout(None), Wait::Forever);
        assert_eq!(Wait::from_timeout(Some(Duration::ZERO)), Wait::Once);
        assert!(matches!(
            Wait::from_timeout(Some(Duration::from_secs(1))),
            Wait::Until(_)
        ));
        let now = Instant::now();
        assert!(Wait::Once.expired(now));
        assert!(!Wait::Forever.expired(now));
        assert!(Wait::Until(now).expired(now));
        assert!(!Wait::Until(now + Duration::from_secs(1)).expired(now));
    }
}
