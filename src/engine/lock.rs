//! Lock operations: acquire (waiting without polling, see `waiting`), release, extend, and the
//! lock object's hold (shared by the blocking and the asyncio bindings).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Backend, Client};
use super::error::{Error, Result};
use super::executor::{self, Now};
use super::hold::{HeldFences, Holder, Leased, Naming};
use super::node::Retry;
use super::redlock::Redlock;
use super::redlock_lock;
use super::replicas::attempt_with_replicas;
use super::shared::Shared;
use super::waiting::{self, Contender, Outcome, Plan, Undo, UndoStep};
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::lock as steps;
use crate::protocol::replies::Attempt;
use crate::protocol::scripts::{self, Queueing};
use crate::protocol::step::Step;
use crate::protocol::wake::GrantNote;

pub use super::hold::{HoldStatus, OnLost};
pub use super::waiting::{Wait, QUEUE_PLACE, UNFAIR_QUEUE_PLACE};
pub use crate::protocol::lock::{Granted, LockSpec};

/// What a lock hold keeps beside its token: the fence, and the lease it was granted (shorter
/// than the lock's ttl when a release granted it to a fair waiter, see `lock_grant.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced {
    pub fence: i64,
    pub lease: Duration,
}

impl From<Granted> for (Instant, Fenced) {
    fn from(g: Granted) -> Self {
        (
            g.sent_at,
            Fenced {
                fence: g.fence,
                lease: g.lease,
            },
        )
    }
}

/// One waiter's attempts on a lock.
pub struct LockContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a LockSpec,
    token: &'a str,
    /// The token was chosen by the caller (the recipes' identifier), so another call may use it
    /// too: an attempt that finds it in place is refused, its resend after a dropped connection
    /// as well (the token may have been in place before the first send).
    shared_token: bool,
    /// The latest attempt that found the fair lock not ours: when it was sent, and the fence
    /// counter it saw. A grant with a larger fence ran after it, so its lease started later.
    last_busy: Mutex<Option<(Instant, i64)>>,
    /// An attempt of this waiter took a place in the queue (an unfair lock's waiter joins only
    /// once it competes, so one that gave up before has no place to leave).
    joined: AtomicBool,
}

impl<'a> LockContender<'a> {
    fn new(shared: &'a Arc<Shared>, spec: &'a LockSpec, token: &'a str) -> Self {
        LockContender {
            shared,
            spec,
            token,
            shared_token: false,
            last_busy: Mutex::new(None),
            joined: AtomicBool::new(false),
        }
    }
}

impl<'a> LockContender<'a> {
    /// The attempts of a drop-in shim (`engine::compat`) for `token`; `chosen`: the caller chose
    /// the token and another call may use it too (see `shared_token`).
    pub(crate) fn for_token(
        shared: &'a Arc<Shared>,
        spec: &'a LockSpec,
        token: &'a str,
        chosen: bool,
    ) -> Self {
        LockContender {
            shared_token: chosen,
            ..LockContender::new(shared, spec, token)
        }
    }
}

impl LockContender<'_> {
    /// Whether this waiter waits in the queue: a fair lock's, or an unfair lock's that queues
    /// (`LockSpec::queued`) with a token of its own (a shared one races, see `shared_token`).
    fn queues(&self) -> bool {
        self.spec.fair || (self.spec.queued && !self.shared_token)
    }

    /// How an attempt treats the queue: a fair lock's as `waiting::queueing`; an unfair lock's
    /// never looks at it to take a free lock (it barges), and joins it while waiting if it queues.
    fn queueing(&self, join: bool) -> Option<Queueing> {
        if self.spec.fair {
            Some(waiting::queueing(join))
        } else if join && self.queues() {
            Some(waiting::join_for(UNFAIR_QUEUE_PLACE))
        } else {
            None
        }
    }
}

impl Contender for LockContender<'_> {
    type Grant = Granted;
    type Reply = Attempt;

    fn first_step(&self) -> Step<Attempt> {
        let fair = self.spec.fair.then_some(Queueing::TryOnly);
        // A first try never queues, so it names no inbox.
        steps::attempt(self.spec, self.token, fair, "")
    }

    fn joins_first(&self) -> bool {
        self.queues()
    }

    /// A fair waiter joins; an unfair lock's takes a free lock past the queue, else joins.
    fn first_step_joining(&self) -> Step<Attempt> {
        let queueing = if self.spec.fair {
            Some(waiting::queueing(true))
        } else if self.queues() {
            Some(Queueing::BargeOrJoin {
                place_ms: lease::lease_ms(UNFAIR_QUEUE_PLACE),
            })
        } else {
            None
        };
        self.joined.store(queueing.is_some(), Ordering::Relaxed);
        steps::attempt(self.spec, self.token, queueing, self.shared.hub.inbox())
    }

    fn memo(&self) -> Option<(Instant, i64)> {
        *self.last_busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resume(&self, memo: Option<(Instant, i64)>) {
        // Only the queue's script answers with the fence it saw: the first attempt joined.
        if memo.is_some() {
            self.joined.store(true, Ordering::Relaxed);
        }
        *self.last_busy.lock().unwrap_or_else(|p| p.into_inner()) = memo;
    }

    fn read(&self, attempt: Attempt, sent_at: Instant) -> Result<Outcome<Granted>> {
        if let Attempt::Busy {
            fence: Some(seen), ..
        } = attempt
        {
            *self.last_busy.lock().unwrap_or_else(|p| p.into_inner()) = Some((sent_at, seen));
        }
        Ok(match attempt {
            Attempt::Granted { fence } => Outcome::Granted(Granted {
                fence,
                sent_at,
                lease: self.spec.lease,
            }),
            Attempt::Busy { retry_ms, .. } => Outcome::Busy { retry_ms },
        })
    }

    async fn attempt(&self, join: bool) -> Result<Outcome<Granted>> {
        let fair = self.queueing(join);
        if matches!(
            fair,
            Some(Queueing::Join { .. } | Queueing::BargeOrJoin { .. })
        ) {
            self.joined.store(true, Ordering::Relaxed);
        }
        let sent_at = Instant::now();
        let attempt = if self.spec.replicas > 0 {
            match attempt_with_replicas(self.shared, self.spec, fair, self.token).await? {
                Some(attempt) => attempt,
                None => return Ok(Outcome::Refused),
            }
        } else {
            let step = steps::attempt(self.spec, self.token, fair, self.shared.hub.inbox());
            if self.shared_token && fair.is_none() {
                // A resend after a dropped connection goes as a first send too: the token it
                // finds may be another call's (in place before the first send), which it must
                // never count as its own. One its lost first send set is then refused as well:
                // the call waits on, and that copy lapses with its lease (as Redlock's votes).
                let lease_ms = lease::lease_ms(self.spec.lease);
                let first = scripts::acquire_first_send(&self.spec.keys, self.token, lease_ms);
                step.parse(self.shared.node.invoke(&first, Retry::Once).await?)?
            } else {
                executor::run(self.shared, &step).await?
            }
        };
        self.read(attempt, sent_at)
    }

    /// An unfair lock's queued waiter: one per process competes (`Plan::gate`), so one
    /// listener per process and name hears its grants. (A fair lock's waiters all compete: each
    /// would read every grant to the process, which the hub hands to the one it names.)
    /// `replicas` need WAIT on the write's connection (the runtime's path, see `attempt`).
    fn waits_on_own_thread(&self) -> bool {
        !self.spec.fair && self.queues() && self.spec.replicas == 0
    }

    fn waiting_step(&self) -> Option<Step<Attempt>> {
        if !self.waits_on_own_thread() {
            return None;
        }
        let queueing = self.queueing(true);
        self.joined.store(true, Ordering::Relaxed);
        Some(steps::attempt(
            self.spec,
            self.token,
            queueing,
            self.shared.hub.inbox(),
        ))
    }

    fn place(&self) -> Duration {
        if self.spec.fair {
            QUEUE_PLACE
        } else {
            UNFAIR_QUEUE_PLACE
        }
    }

    fn granted(&self, note: GrantNote) -> Option<Granted> {
        // With `replicas`, a hold counts only once replicas acknowledged its write: the waiter
        // takes the grant with its next attempt (which finds its token) and a WAIT instead.
        if self.spec.replicas > 0 {
            return None;
        }
        let (sent_at, seen) = (*self.last_busy.lock().unwrap_or_else(|p| p.into_inner()))?;
        // A fence no larger than the last one seen busy: an old grant, lapsed by then.
        if note.fence <= seen {
            return None;
        }
        // The lease counts from the last attempt that found the lock held (the grant came after
        // it), up to a refresh of the place ago. When little of it would be left so, the waiter
        // looks once more instead: that attempt finds its token, renews the lease from now and
        // counts it from there (else a wait longer than the lease since the last refresh gave a
        // hold with `remaining()` near 0, reported lost by renewal at once).
        let lease = Duration::from_millis(note.lease_ms).min(self.spec.lease);
        if lease::deadline(sent_at, lease) < Instant::now() + lease / 2 {
            return None;
        }
        Some(Granted {
            fence: note.fence,
            sent_at,
            lease,
        })
    }

    async fn leave(&self) -> Result<()> {
        if !self.spec.fair && !self.joined.load(Ordering::Relaxed) {
            return Ok(());
        }
        executor::run(
            self.shared,
            &steps::leave_queue(&self.spec.keys, self.token),
        )
        .await
    }

    fn undo(&self) -> Undo {
        let shared = self.shared.clone();
        let keys = self.spec.keys.clone();
        let token = self.token.to_string();
        // A token the caller chose found in place may be another call's lock (same identifier):
        // with no proof that this attempt set it, it is left to lapse (at most one lease). Such
        // a contender never queues either (`queues`), so there is no place to leave, and the
        // leave would delete the lock it finds holding the token (a grant given back).
        let give_back = !self.shared_token;
        let step = move || -> UndoStep {
            let (shared, keys, token) = (shared.clone(), keys.clone(), token.clone());
            Box::pin(async move {
                if !give_back {
                    return Ok(());
                }
                executor::run(&shared, &steps::release(&keys, &token)).await?;
                executor::run(&shared, &steps::leave_queue(&keys, &token)).await
            })
        };
        Undo {
            step: Box::new(step),
            horizon: self.spec.lease.max(QUEUE_PLACE),
        }
    }
}

/// Tries to take the lock for `token`, waiting as `wait` allows. Waiting never polls: it sleeps
/// until a release is published or the holder's lease ends, whichever comes first.
pub async fn acquire(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Granted>> {
    acquire_from(shared, spec, token, wait, None, false).await
}

/// `acquire`, after a first attempt (made directly) found the lock busy. `shared_token`: the
/// caller chose the token, and another call may hold the lock with it (see `LockContender`).
async fn acquire_from(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    first: Option<Outcome<Granted>>,
    shared_token: bool,
) -> Result<Option<Granted>> {
    let contender = LockContender {
        shared_token,
        ..LockContender::new(shared, spec, token)
    };
    let plan = spec.waiting_plan(shared, token, contender.queues());
    waiting::acquire_from(&contender, &plan, wait, first, None, None).await
}

/// Compare-and-delete; `Ok(false)` when the lock was not ours (any more).
pub async fn release(shared: &Shared, keys: &Keys, token: &str) -> Result<bool> {
    executor::run(shared, &steps::release(keys, token)).await
}

/// `acquire` on any deployment for a recipe's token (the recipes' entry point). `chosen`: the
/// caller chose it (the identifier), so two calls may use it: they never both hold the lock on
/// one node, as a token already in place never counts as this call's own, not even on a resend
/// after a dropped connection, and an attempt whose outcome is unknown is not given back (what
/// it finds may be the other call's hold). A token the library drew is nobody else's: on one
/// server it goes as a `Lock`'s (a resend that finds it found its own grant; an attempt whose
/// outcome is unknown is given back in the background), on Redlock too, where `release_lock`
/// then releases it as a Lock's hold (see `redlock_lock::acquire_recipe`).
pub async fn acquire_on(
    backend: &Backend,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    chosen: bool,
) -> Result<Option<Granted>> {
    match backend {
        Backend::Single(shared) => acquire_from(shared, spec, token, wait, None, chosen).await,
        Backend::Redlock(r) => redlock_lock::acquire_recipe(r, spec, token, wait, chosen).await,
    }
}

/// `release` of a token the caller chose (the recipes' identifier) on one server. A resend
/// after a dropped connection must not delete a hold that another call took under the same
/// token once the first send had released ours: it releases only the hold granted `fence`. With
/// no fence known (the hold was taken elsewhere), the release is not resent: its error stands,
/// and a hold it left in place lapses with its lease.
pub async fn release_chosen(
    shared: &Shared,
    keys: &Keys,
    token: &str,
    fence: Option<i64>,
) -> Result<bool> {
    let step = steps::release_chosen(keys, token);
    let first = executor::script_of(&step)?;
    let reply = match fence {
        Some(fence) => {
            let resend = scripts::release_chosen(keys, token, &[fence]);
            shared.node.invoke_or_resend(first, &resend).await?
        }
        None => shared.node.invoke(first, Retry::Never).await?,
    };
    Ok(step.parse(reply)?)
}

/// `release` on any deployment for a token the caller chose (the recipes' entry point);
/// `Ok(false)` when the lock was not ours (any more). On Redlock see `Redlock::release_chosen`.
pub async fn release_on(backend: &Backend, keys: &Keys, token: &str) -> Result<bool> {
    match backend {
        Backend::Single(shared) => release(shared, keys, token).await,
        Backend::Redlock(r) => r.release_chosen(keys, token).await,
    }
}

/// The current owner token of a lock, if anybody holds it.
pub async fn owner(shared: &Shared, keys: &Keys) -> Result<Option<Vec<u8>>> {
    executor::run(shared, &steps::owner(keys)).await
}

impl Leased for LockSpec {
    type Detail = Fenced;
    type Args = ();

    fn naming(&self) -> Naming {
        Naming {
            object: "Lock",
            held: "the lock",
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn granted_lease(&self, detail: &Fenced) -> Duration {
        detail.lease
    }

    type Grant = Granted;
    type Contender<'a> = LockContender<'a>;

    fn contender<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        token: &'a str,
        _args: &(),
    ) -> Result<LockContender<'a>> {
        Ok(LockContender::new(shared, self, token))
    }

    fn plan<'a>(&self, shared: &'a Arc<Shared>, token: &'a str) -> Plan<'a> {
        self.waiting_plan(shared, token, self.fair || self.queued)
    }

    fn held(&self, _contender: &LockContender<'_>, grant: Granted) -> (Instant, Fenced) {
        grant.into()
    }

    fn release(&self, token: &str) -> Step<bool> {
        if self.reentrant {
            steps::release_reentrant(&self.keys, token)
        } else {
            steps::release(&self.keys, token)
        }
    }

    fn fences_of(&self, detail: &Fenced) -> Option<HeldFences> {
        Some(HeldFences::One(detail.fence))
    }

    fn unmoved_since(&self, fences: &[i64]) -> Option<Step<bool>> {
        match fences {
            [fence] => Some(steps::fence_unmoved(&self.keys, *fence)),
            _ => None,
        }
    }

    fn extend(&self, token: &str, lease: Duration) -> Step<bool> {
        if self.reentrant {
            steps::extend_reentrant(&self.keys, token, lease)
        } else {
            steps::extend(&self.keys, token, lease)
        }
    }

    fn reentrant(&self) -> bool {
        self.reentrant
    }

    fn nest(&self, token: &str, depth: u32, lease: Option<Duration>) -> Step<bool> {
        steps::reenter(&self.keys, token, depth, lease)
    }

    fn owned(&self, token: &str) -> Step<bool> {
        steps::owned(&self.keys, token)
    }

    /// WAIT must follow the write on the same connection, so `replicas` locks use the runtime.
    fn direct(&self) -> bool {
        self.replicas == 0
    }

    fn quorum(&self) -> bool {
        true
    }

    async fn acquire_quorum(
        &self,
        redlock: &Arc<Redlock>,
        token: &str,
        wait: Wait,
        _args: &(),
    ) -> Result<Option<(Instant, Fenced)>> {
        let granted = redlock_lock::acquire(redlock, self, token, wait, false).await?;
        Ok(granted.map(Into::into))
    }
}

impl LockSpec {
    /// How a waiter for `token` waits; `queued`: in the Redis queue, granted the lock by a
    /// release (see `LockContender::queues`).
    /// Unfair: one competitor per lock in this process; the others queue here, in FIFO order
    /// (Redis work grows with processes, not threads). The competitor of a queued unfair lock
    /// holds a place in the Redis queue like a fair waiter; a racing one is woken by every
    /// release. Fair: every waiter takes its own place in the Redis queue, which orders them all.
    fn waiting_plan<'a>(&self, shared: &'a Arc<Shared>, token: &'a str, queued: bool) -> Plan<'a> {
        Plan {
            shared,
            channel: self.keys.wake_channel(),
            inbox: (queued && !shared.hub.inbox().is_empty())
                .then(|| self.keys.wake_inbox(shared.hub.inbox())),
            wake_token: queued.then_some(token),
            gate: (!self.fair).then(|| self.keys.lock()),
            queued,
        }
    }
}

/// One lock object: at most one hold at a time, owned by the object (not by a thread).
pub struct LockHandle {
    holder: Holder<LockSpec>,
}

impl LockHandle {
    pub fn new(
        client: Arc<Client>,
        name: &[u8],
        lease: Duration,
        fair: bool,
        replicas: u32,
        auto_renew: bool,
    ) -> Result<Self> {
        Self::with_reentry(client, name, lease, fair, replicas, auto_renew, false)
    }

    /// `new`, re-entrant when `reentrant`: its holder may take the lock again while it holds
    /// (each acquire then needs a release of its own; see `Holder`).
    pub fn with_reentry(
        client: Arc<Client>,
        name: &[u8],
        lease: Duration,
        fair: bool,
        replicas: u32,
        auto_renew: bool,
        reentrant: bool,
    ) -> Result<Self> {
        if fair && client.is_redlock() {
            return Err(Error::Unsupported(
                "fair: a fair (FIFO) lock is not available on a Redlock client (several \
                 independent masters): one queue cannot be kept by majority; use one Redis, \
                 Sentinel or Redis Cluster"
                    .into(),
            ));
        }
        client.check_lease("ttl", lease)?;
        let spec = LockSpec {
            name: name.to_vec(),
            keys: client.keys(name)?,
            lease,
            fair,
            replicas,
            reentrant,
            // Redlock keeps no queue (one cannot be kept by majority): its waiters race.
            queued: !client.is_redlock(),
        };
        Ok(LockHandle {
            holder: Holder::new(client, spec, auto_renew),
        })
    }

    pub fn auto_renew(&self) -> bool {
        self.holder.auto_renew()
    }

    /// Whether a hold may be extended in the background: auto-renewal, or the top-up of a lock
    /// granted by a release to a queued waiter for less than its ttl.
    pub fn renews(&self) -> bool {
        self.holder.auto_renew() || self.spec().fair || self.spec().queued
    }

    pub fn spec(&self) -> &LockSpec {
        self.holder.primitive()
    }

    pub fn client(&self) -> &Arc<Client> {
        self.holder.client()
    }

    /// The object's hold: acquire, release, extend, `owned` and the hold's state.
    pub fn holder(&self) -> &Holder<LockSpec> {
        &self.holder
    }

    pub async fn locked(&self) -> Result<bool> {
        match self.holder.client().backend()? {
            Backend::Single(shared) => Ok(owner(&shared, &self.spec().keys).await?.is_some()),
            Backend::Redlock(redlock) => redlock.locked(&self.spec().keys).await,
        }
    }

    /// The blocking API's `locked`: on the caller's thread when the client allows it.
    pub fn locked_blocking(
        &self,
    ) -> Now<Result<bool>, impl Future<Output = Result<bool>> + Send + '_> {
        if !self.holder.client().supports_direct() {
            return Now::Later(self.locked());
        }
        let owner = self
            .holder
            .client()
            .shared()
            .and_then(|shared| executor::run_direct(&shared, &steps::owner(&self.spec().keys)));
        Now::Done(owner.map(|owner| owner.is_some()))
    }

    pub fn fence(&self) -> Option<i64> {
        self.holder.detail().map(|d| d.fence)
    }
}
