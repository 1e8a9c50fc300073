//! Semaphore operations: at most `limit` live holders across all processes, each with a token
//! and a lease of its own kept in Redis (zset token -> lease end, from the server's clock), so a
//! holder that dies stops counting when its lease ends and no client clock can over-admit.
//! Waiting is the shared `waiting` loop: woken by releases, or when the soonest lease ends.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::Client;
use super::error::{Error, Result};
use super::executor::{self, Now};
use super::hold::{Holder, Leased, Naming};
use super::redlock::Redlock;
use super::redlock_semaphore;
use super::shared::Shared;
use super::waiting::{self, Contender, Outcome, Plan, Undo, UndoStep, Wait, QUEUE_PLACE};
use crate::protocol::keys::Keys;
use crate::protocol::replies::Admission;
use crate::protocol::scripts::Queueing;
pub use crate::protocol::semaphore::SemaphoreSpec;
use crate::protocol::semaphore::{self as steps, Admit};
use crate::protocol::step::Step;

pub struct SemaphoreContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a SemaphoreSpec,
    token: &'a str,
}

impl SemaphoreContender<'_> {
    fn step(&self, queueing: Queueing) -> Step<Admit> {
        steps::attempt(self.spec, self.token, queueing)
    }
}

impl Contender for SemaphoreContender<'_> {
    /// When the winning request was sent: the lease's start.
    type Grant = Instant;
    type Reply = Admit;

    /// Never queues: a fair waiter takes its place in the wait that follows a refusal.
    fn first_step(&self) -> Step<Admit> {
        self.step(Queueing::TryOnly)
    }

    /// An unfair waiter's place only tells that it waits: its first attempt may take it (a
    /// fair one's would be a turn in the queue, which the wait that follows a refusal takes).
    fn joins_first(&self) -> bool {
        !self.spec.fair
    }

    fn first_step_joining(&self) -> Step<Admit> {
        let queueing = if self.spec.fair {
            Queueing::TryOnly
        } else {
            waiting::queueing(true)
        };
        self.step(queueing)
    }

    fn read(&self, admit: Admit, sent_at: Instant) -> Result<Outcome<Instant>> {
        Ok(waiting::admission(admitted(self.spec, admit)?, sent_at))
    }

    async fn attempt(&self, join: bool) -> Result<Outcome<Instant>> {
        let step = self.step(waiting::queueing(join));
        waiting::attempt_step(self, self.shared, &step).await
    }

    async fn leave(&self) -> Result<()> {
        executor::run(self.shared, &steps::leave(self.spec, self.token)).await
    }

    fn undo(&self) -> Undo {
        let shared = self.shared.clone();
        let spec = self.spec.clone();
        let token = self.token.to_string();
        let horizon = spec.lease.max(QUEUE_PLACE);
        let step = move || -> UndoStep {
            let (shared, spec, token) = (shared.clone(), spec.clone(), token.clone());
            Box::pin(async move {
                executor::run(&shared, &steps::release(&spec, &token)).await?;
                executor::run(&shared, &steps::leave(&spec, &token)).await
            })
        };
        Undo {
            step: Box::new(step),
            horizon,
        }
    }
}

/// The admission of an attempt; `Error::Limit` when it was refused because the semaphore's live
/// limit differs.
fn admitted(spec: &SemaphoreSpec, admit: Admit) -> Result<Admission> {
    match admit {
        Admit::Answered(admission) => Ok(admission),
        // (The binding names the semaphore before the message.)
        Admit::OtherLimit(live) => Err(Error::Limit(format!(
            "limit {} differs from the limit {live} its holders or waiters use (kept in Redis); \
             a new limit takes effect once none of them remains",
            spec.limit
        ))),
    }
}

/// Tries to take a permit for `token`, waiting as `wait` allows; Some(sent_at) when taken.
pub async fn acquire(
    shared: &Arc<Shared>,
    spec: &SemaphoreSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Instant>> {
    let contender = spec.contender(shared, token, &())?;
    waiting::acquire(&contender, &spec.plan(shared, token), wait).await
}

/// Gives a permit back; `Ok(false)` when `token` held none (any more).
pub async fn release(shared: &Shared, spec: &SemaphoreSpec, token: &str) -> Result<bool> {
    executor::run(shared, &steps::release(spec, token)).await
}

/// The number of live holders.
pub async fn holders(shared: &Shared, keys: &Keys) -> Result<i64> {
    executor::run(shared, &steps::holders(keys)).await
}

impl Leased for SemaphoreSpec {
    /// On Redlock, the slot the permit won (see `redlock_semaphore`).
    type Detail = Option<u64>;
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

    type Grant = Instant;
    type Contender<'a> = SemaphoreContender<'a>;

    fn contender<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        token: &'a str,
        _args: &(),
    ) -> Result<SemaphoreContender<'a>> {
        Ok(SemaphoreContender {
            shared,
            spec: self,
            token,
        })
    }

    fn plan<'a>(&self, shared: &'a Arc<Shared>, token: &'a str) -> Plan<'a> {
        // Fair: every waiter keeps its place in the Redis queue and is woken by name.
        // Unfair: one competitor per semaphore in this process, woken by any release; it keeps
        // a place too (no turn: it tells that a waiter of its limit remains). One per limit:
        // a waiter of another limit must not queue behind it, but be refused by Redis at once.
        Plan {
            shared,
            channel: self.keys.wake_channel(),
            inbox: None,
            wake_token: self.fair.then_some(token),
            gate: (!self.fair).then(|| self.keys.semaphore_gate(self.limit)),
            queued: true,
        }
    }

    fn held(
        &self,
        _contender: &SemaphoreContender<'_>,
        sent_at: Instant,
    ) -> (Instant, Self::Detail) {
        (sent_at, None)
    }

    fn release(&self, token: &str) -> Step<bool> {
        steps::release_any(self, token)
    }

    fn extend(&self, token: &str, lease: Duration) -> Step<bool> {
        steps::extend(&self.keys, token, lease)
    }

    fn owned(&self, token: &str) -> Step<bool> {
        steps::owned(&self.keys, token)
    }

    fn direct(&self) -> bool {
        true
    }

    fn quorum(&self) -> bool {
        self.slots
    }

    async fn acquire_quorum(
        &self,
        redlock: &Arc<Redlock>,
        token: &str,
        wait: Wait,
        _args: &(),
    ) -> Result<Option<(Instant, Self::Detail)>> {
        let granted = redlock_semaphore::acquire(redlock, self, token, wait).await?;
        Ok(granted.map(|(start, slot)| (start, Some(slot))))
    }

    // A master counts for a Redlock permit only while it holds the token in the slot it won.
    fn quorum_release(&self, token: &str, slot: &Option<u64>) -> Step<bool> {
        match slot {
            Some(slot) => steps::slot_release(self, token, *slot),
            None => self.release(token),
        }
    }

    fn quorum_extend(&self, token: &str, slot: &Option<u64>, lease: Duration) -> Step<bool> {
        match slot {
            Some(slot) => steps::slot_extend(self, token, *slot, lease),
            None => self.extend(token, lease),
        }
    }

    fn quorum_owned(&self, token: &str, slot: &Option<u64>) -> Step<bool> {
        match slot {
            Some(slot) => steps::slot_owned(self, token, *slot),
            None => self.owned(token),
        }
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
        client.check_lease("ttl", lease)?;
        let spec = SemaphoreSpec {
            name: name.to_vec(),
            keys: client.keys(name)?,
            limit: limit.max(1),
            lease,
            fair,
            slots: client.is_redlock(),
        };
        if fair && spec.slots {
            return Err(Error::Unsupported(
                "fair: a fair (FIFO) semaphore is not available on a Redlock client (several \
                 independent masters): no queue order can be kept by majority"
                    .into(),
            ));
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

    /// How many live holders the semaphore has (in every process).
    pub async fn holders(&self) -> Result<i64> {
        let shared = self.holder.client().shared()?;
        holders(&shared, &self.spec().keys).await
    }

    /// The object's hold: acquire, release, extend, `owned` and the hold's state.
    pub fn holder(&self) -> &Holder<SemaphoreSpec> {
        &self.holder
    }

    /// The blocking API's `holders`: on the caller's thread when the client allows it.
    pub fn holders_blocking(
        &self,
    ) -> Now<Result<i64>, impl Future<Output = Result<i64>> + Send + '_> {
        if !self.holder.client().supports_direct() {
            return Now::Later(self.holders());
        }
        Now::Done(
            self.holder.client().shared().and_then(|shared| {
                executor::run_direct(&shared, &steps::holders(&self.spec().keys))
            }),
        )
    }
}
