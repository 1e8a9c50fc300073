//! Semaphore operations: at most `limit` live holders across all processes, each with a token
//! and a lease of its own kept in Redis (zset token -> lease end, from the server's clock), so a
//! holder that dies stops counting when its lease ends and no client clock can over-admit.
//! Waiting is the shared `waiting` loop: woken by releases, or when the soonest lease ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{Client, Shared};
use super::error::{Error, Result};
use super::hold::{DirectTry, Holder, Leased, Naming, OnLost};
use super::node::Retry;
use super::waiting::{
    self, attempt_direct, Contender, Outcome, Plan, Undo, UndoStep, Wait, QUEUE_PLACE,
};
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::replies::{
    parse_admission, parse_count, parse_flag, parse_limit_refusal, Admission,
};
use crate::protocol::scripts::{self, Queueing};

/// What identifies a semaphore in Redis and how its permits are leased.
#[derive(Clone, Debug)]
pub struct SemaphoreSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    /// The most live holders at any time (>= 1).
    pub limit: u64,
    pub lease: Duration,
    /// Waiters get permits in the order in which they started waiting (FIFO queue in Redis).
    pub fair: bool,
}

struct SemaphoreContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a SemaphoreSpec,
    token: &'a str,
}

impl Contender for SemaphoreContender<'_> {
    /// When the winning request was sent: the lease's start.
    type Grant = Instant;

    async fn attempt(&self, join: bool) -> Result<Outcome<Instant>> {
        let queueing = if join {
            Queueing::Join {
                place_ms: lease::lease_ms(QUEUE_PLACE),
            }
        } else {
            Queueing::TryOnly
        };
        let inv = attempt_invocation(self.spec, self.token, queueing);
        let sent_at = Instant::now();
        let reply = self.shared.node.invoke(&inv, Retry::Once).await?;
        refuse_other_limit(self.spec, &reply)?;
        Ok(match parse_admission(&reply)? {
            Admission::Admitted { .. } => Outcome::Granted(sent_at),
            Admission::Busy { retry_ms } => Outcome::Busy { retry_ms },
        })
    }

    async fn leave(&self) -> Result<()> {
        let inv = scripts::semaphore_leave(&self.spec.keys, self.token, self.spec.limit);
        self.shared.node.invoke(&inv, Retry::Once).await?;
        Ok(())
    }

    fn undo(&self) -> Undo {
        let shared = self.shared.clone();
        let spec = self.spec.clone();
        let token = self.token.to_string();
        let horizon = spec.lease.max(QUEUE_PLACE);
        let step = move || -> UndoStep {
            let (shared, spec, token) = (shared.clone(), spec.clone(), token.clone());
            Box::pin(async move {
                let release = scripts::semaphore_release(&spec.keys, &token, spec.limit);
                shared.node.invoke(&release, Retry::Once).await?;
                if spec.fair {
                    let leave = scripts::semaphore_leave(&spec.keys, &token, spec.limit);
                    shared.node.invoke(&leave, Retry::Once).await?;
                }
                Ok(())
            })
        };
        Undo {
            step: Box::new(step),
            horizon,
        }
    }
}

/// `Error::Limit` when the attempt was refused because the semaphore's live limit differs.
fn refuse_other_limit(spec: &SemaphoreSpec, reply: &redis::Value) -> Result<()> {
    match parse_limit_refusal(reply) {
        None => Ok(()),
        Some(live) => Err(Error::Limit(format!(
            "semaphore '{}': limit {} differs from the limit {live} its holders or waiters use \
             (kept in Redis); a new limit takes effect once none of them remains",
            String::from_utf8_lossy(&spec.name),
            spec.limit
        ))),
    }
}

/// One admission attempt for `token` (`queueing` matters to a fair semaphore only).
fn attempt_invocation(
    spec: &SemaphoreSpec,
    token: &str,
    queueing: Queueing,
) -> redis::ScriptInvocation<'static> {
    scripts::semaphore_acquire(
        &spec.keys,
        token,
        lease::lease_ms(spec.lease),
        spec.limit,
        spec.fair.then_some(queueing),
    )
}

/// Tries to take a permit for `token`, waiting as `wait` allows; Some(sent_at) when taken.
pub async fn acquire(
    shared: &Arc<Shared>,
    spec: &SemaphoreSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Instant>> {
    acquire_from(shared, spec, token, wait, None).await
}

/// `acquire`, after a first attempt (made directly) found no permit free.
async fn acquire_from(
    shared: &Arc<Shared>,
    spec: &SemaphoreSpec,
    token: &str,
    wait: Wait,
    first: Option<Outcome<Instant>>,
) -> Result<Option<Instant>> {
    let contender = SemaphoreContender {
        shared,
        spec,
        token,
    };
    // Fair: every waiter keeps its place in the Redis queue and is woken by name.
    // Unfair: one competitor per semaphore in this process, woken by any release.
    let gate = spec.keys.semaphore_holders();
    let plan = Plan {
        shared,
        channel: spec.keys.wake_channel(),
        inbox: None,
        wake_token: spec.fair.then_some(token),
        gate: (!spec.fair).then_some(gate.as_slice()),
        queued: spec.fair,
    };
    waiting::acquire_from(&contender, &plan, wait, first).await
}

/// Gives a permit back; `Ok(false)` when `token` held none (any more).
pub async fn release(shared: &Shared, spec: &SemaphoreSpec, token: &str) -> Result<bool> {
    let inv = scripts::semaphore_release(&spec.keys, token, spec.limit);
    let reply = shared.node.invoke(&inv, Retry::Once).await?;
    Ok(parse_flag(&reply)?)
}

/// Compare-and-extend of a permit; `Ok(Some(sent_at))` when extended, `Ok(None)` when not ours.
pub async fn extend(
    shared: &Shared,
    keys: &Keys,
    token: &str,
    lease: Duration,
) -> Result<Option<Instant>> {
    let inv = scripts::semaphore_extend(keys, token, lease::lease_ms(lease));
    let sent_at = Instant::now();
    let reply = shared.node.invoke(&inv, Retry::Once).await?;
    Ok(parse_flag(&reply)?.then_some(sent_at))
}

/// The number of live holders.
pub async fn holders(shared: &Shared, keys: &Keys) -> Result<i64> {
    let reply = shared
        .node
        .invoke(&scripts::semaphore_holders(keys), Retry::Once)
        .await?;
    Ok(parse_count(&reply)?)
}

impl Leased for SemaphoreSpec {
    type Detail = ();
    type Args = ();

    fn naming(&self) -> Naming {
        Naming {
            object: "Semaphore",
            held: "a permit",
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    async fn acquire(
        &self,
        shared: &Arc<Shared>,
        token: &str,
        wait: Wait,
        _args: &(),
    ) -> Result<Option<(Instant, ())>> {
        Ok(acquire(shared, self, token, wait)
            .await?
            .map(|sent_at| (sent_at, ())))
    }

    async fn release(&self, shared: &Shared, token: &str) -> Result<bool> {
        release(shared, self, token).await
    }

    async fn extend(
        &self,
        shared: &Shared,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Instant>> {
        extend(shared, &self.keys, token, lease).await
    }

    async fn owned(&self, shared: &Shared, token: &str) -> Result<bool> {
        let inv = scripts::semaphore_owned(&self.keys, token);
        let reply = shared.node.invoke(&inv, Retry::Once).await?;
        Ok(parse_flag(&reply)?)
    }

    fn direct(&self) -> bool {
        true
    }

    fn try_direct(&self, shared: &Arc<Shared>, token: &str) -> Result<DirectTry<()>> {
        // Never queues: a fair waiter takes its place in the wait that follows a refusal.
        let inv = attempt_invocation(self, token, Queueing::TryOnly);
        let (reply, sent_at) = attempt_direct(shared, &inv, || {
            let contender = SemaphoreContender {
                shared,
                spec: self,
                token,
            };
            contender.undo()
        })?;
        refuse_other_limit(self, &reply)?;
        Ok(match parse_admission(&reply)? {
            Admission::Admitted { .. } => DirectTry::Granted(sent_at, ()),
            Admission::Busy { retry_ms } => DirectTry::Busy { retry_ms },
        })
    }

    async fn acquire_after(
        &self,
        shared: &Arc<Shared>,
        token: &str,
        wait: Wait,
        _args: &(),
        retry_ms: i64,
    ) -> Result<Option<(Instant, ())>> {
        let first = Some(Outcome::Busy { retry_ms });
        let granted = acquire_from(shared, self, token, wait, first).await?;
        Ok(granted.map(|sent_at| (sent_at, ())))
    }

    fn release_direct(&self, shared: &Shared, token: &str) -> Result<bool> {
        let inv = scripts::semaphore_release(&self.keys, token, self.limit);
        Ok(parse_flag(&shared.direct.invoke(&inv, Retry::Once)?)?)
    }

    fn extend_direct(
        &self,
        shared: &Shared,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Instant>> {
        let inv = scripts::semaphore_extend(&self.keys, token, lease::lease_ms(lease));
        let sent_at = Instant::now();
        let reply = shared.direct.invoke(&inv, Retry::Once)?;
        Ok(parse_flag(&reply)?.then_some(sent_at))
    }

    fn owned_direct(&self, shared: &Shared, token: &str) -> Result<bool> {
        let inv = scripts::semaphore_owned(&self.keys, token);
        Ok(parse_flag(&shared.direct.invoke(&inv, Retry::Once)?)?)
    }
}

/// One semaphore object: at most one permit at a time, held by the object (not by a thread).
pub struct SemaphoreHandle {
    holder: Holder<SemaphoreSpec>,
}

impl SemaphoreHandle {
    pub fn new(
        client: Arc<Client>,
        name: &[u8],
        limit: u64,
        lease: Duration,
        fair: bool,
        auto_renew: bool,
    ) -> Result<Self> {
        let spec = SemaphoreSpec {
            name: name.to_vec(),
            keys: client.keys(name)?,
            limit: limit.max(1),
            lease,
            fair,
        };
        if client.is_redlock() {
            return Err(super::hold::no_quorum(spec.naming()));
        }
        Ok(SemaphoreHandle {
            holder: Holder::new(client, spec, auto_renew),
        })
    }

    pub fn spec(&self) -> &SemaphoreSpec {
        self.holder.primitive()
    }

    pub fn client(&self) -> &Arc<Client> {
        self.holder.client()
    }

    pub fn auto_renew(&self) -> bool {
        self.holder.auto_renew()
    }

    /// Takes a permit for this object; `listener` hears from auto-renewal, if it is on.
    pub async fn acquire(&self, wait: Wait, listener: Option<OnLost>) -> Result<bool> {
        self.holder.acquire(wait, listener, &()).await
    }

    pub async fn release(&self) -> Result<()> {
        self.holder.release().await
    }

    pub async fn extend(&self, lease: Option<Duration>) -> Result<()> {
        self.holder.extend(lease).await
    }

    /// This object holds a live permit, checked against Redis.
    pub async fn owned(&self) -> Result<bool> {
        self.holder.owned().await
    }

    /// How many live holders the semaphore has (in every process).
    pub async fn holders(&self) -> Result<i64> {
        let shared = self.holder.client().shared()?;
        holders(&shared, &self.spec().keys).await
    }

    /// The generic hold, for the direct (caller-thread) calls of the blocking API: one round
    /// trip each on a single server, no hand-off to the runtime (see `Holder::has_direct`).
    pub fn holder(&self) -> &Holder<SemaphoreSpec> {
        &self.holder
    }

    pub fn holders_direct(&self) -> Result<i64> {
        let shared = self.holder.client().shared()?;
        let inv = scripts::semaphore_holders(&self.spec().keys);
        Ok(parse_count(&shared.direct.invoke(&inv, Retry::Once)?)?)
    }

    pub fn token(&self) -> Option<String> {
        self.holder.token()
    }

    pub fn lost(&self) -> bool {
        self.holder.lost()
    }

    pub fn remaining(&self) -> Option<Duration> {
        self.holder.remaining()
    }
}
