//! Lock operations: the acquire loop that waits without polling, release, extend, and the state
//! of one lock object's hold (shared by the blocking and the asyncio bindings).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Backend, Client, Shared};
use super::error::{Error, Result};
use super::node::Retry;
use super::redlock;
use super::renew::{self, Renewal};
use super::runtime::{self, pid};
use super::token::new_token;
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::replies::{parse_attempt, parse_flag, Attempt};
use crate::protocol::scripts::{self, Queueing};

/// How long a silent fair waiter keeps its place: a waiter that died stops holding back the
/// queue within this time (the contract allows 10 s). Live waiters refresh it every third.
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

    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Once => Some(Instant::now()),
            Wait::Until(d) => Some(d),
            Wait::Forever => None,
        }
    }

    pub(crate) fn expired(self, now: Instant) -> bool {
        match self {
            Wait::Once => true,
            Wait::Until(d) => now >= d,
            Wait::Forever => false,
        }
    }
}

/// What identifies a lock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct LockSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub lease: Duration,
    pub fair: bool,
    /// Replicas that must acknowledge the lock write (Redis WAIT) before a grant counts.
    pub replicas: u32,
}

/// A successful acquire: the fence, and the local deadline of the lease (measured from before
/// the winning request was sent; on Redlock also less the clock-drift allowance).
#[derive(Clone, Copy, Debug)]
pub struct Granted {
    pub fence: i64,
    pub deadline: Instant,
}

impl Granted {
    /// A grant on one server: the lease runs from when the winning request was sent.
    pub fn single(fence: i64, sent_at: Instant, lease: Duration) -> Self {
        Granted {
            fence,
            deadline: lease::deadline(sent_at, lease),
        }
    }
}

/// Sends best-effort cleanup for `token` if dropped while armed: an acquire whose outcome is
/// unknown (cancelled mid-flight, or its reply lost) must not leave a lock or a queue place.
struct Cleanup {
    shared: Arc<Shared>,
    keys: Keys,
    token: String,
    armed: bool,
}

impl Cleanup {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.armed {
            let token = std::mem::take(&mut self.token);
            spawn_cleanup(self.shared.clone(), self.keys.clone(), token);
        }
    }
}

/// Gives back whatever `token` may hold or queue for, in the background (idempotent).
fn spawn_cleanup(shared: Arc<Shared>, keys: Keys, token: String) {
    runtime::spawn(async move {
        let _ = shared
            .node
            .invoke(&scripts::release(&keys, &token), Retry::Once)
            .await;
        let _ = shared
            .node
            .invoke(&scripts::leave_queue(&keys, &token), Retry::Once)
            .await;
    });
}

/// One acquire attempt made directly on the caller's thread (see `direct.rs`).
pub fn attempt_direct(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
) -> Result<(Attempt, Instant)> {
    let fair = spec.fair.then_some(Queueing::TryOnly);
    let inv = scripts::acquire(&spec.keys, token, lease::lease_ms(spec.lease), fair);
    let Some(direct) = shared.direct.as_ref() else {
        return Err(Error::Usage(
            "no direct connection to this deployment".into(),
        ));
    };
    let sent_at = Instant::now();
    match direct.invoke(&inv, Retry::Once) {
        Ok(reply) => Ok((parse_attempt(&reply)?, sent_at)),
        Err(err) => {
            // The script may have run before the connection failed.
            spawn_cleanup(shared.clone(), spec.keys.clone(), token.to_string());
            Err(err)
        }
    }
}

async fn attempt(
    shared: &Shared,
    spec: &LockSpec,
    token: &str,
    queueing: Queueing,
) -> Result<(Attempt, Instant)> {
    let fair = spec.fair.then_some(queueing);
    let inv = scripts::acquire(&spec.keys, token, lease::lease_ms(spec.lease), fair);
    let sent_at = Instant::now();
    let reply = shared
        .node_for(spec.replicas)
        .invoke(&inv, Retry::Once)
        .await?;
    Ok((parse_attempt(&reply)?, sent_at))
}

/// With `replicas` > 0, a grant counts only once that many replicas acknowledged it (WAIT on
/// the connection that wrote it, at most the command timeout); otherwise it is given back.
pub(crate) async fn confirmed(shared: &Shared, spec: &LockSpec, token: &str) -> Result<bool> {
    if spec.replicas == 0 {
        return Ok(true);
    }
    let node = shared.node_for(spec.replicas);
    let limit = node.timeouts().command;
    // The server gives up a little before the connection's own reply deadline would.
    let margin = (limit / 10).min(Duration::from_millis(200));
    let wait_ms = lease::lease_ms(limit.saturating_sub(margin));
    let acked = node
        .wait_replicas(
            &spec.keys.lock(),
            spec.replicas,
            wait_ms,
            limit + Duration::from_secs(1),
        )
        .await?;
    if acked >= i64::from(spec.replicas) {
        return Ok(true);
    }
    node.invoke(&scripts::release(&spec.keys, token), Retry::Once)
        .await?;
    Ok(false)
}

/// Tries to take the lock for `token`, waiting as `wait` allows. Waiting never polls: it sleeps
/// until a release is published or the holder's lease ends, whichever comes first.
pub async fn acquire(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Granted>> {
    acquire_from(shared, spec, token, wait, None).await
}

/// `acquire`, given the outcome of a first attempt already made (directly) for this token.
pub async fn acquire_from(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    first: Option<(Attempt, Instant)>,
) -> Result<Option<Granted>> {
    let cleanup = Cleanup {
        shared: shared.clone(),
        keys: spec.keys.clone(),
        token: token.to_string(),
        armed: true,
    };
    // The first send's time is the lease's start should a retry find this token in place.
    let (outcome, sent_at) = match first {
        Some(found) => found,
        // On error `cleanup` runs: the script may have executed.
        None => attempt(shared, spec, token, Queueing::TryOnly).await?,
    };
    if let Attempt::Granted { fence } = outcome {
        let ok = confirmed(shared, spec, token).await?;
        cleanup.disarm();
        return Ok(ok.then_some(Granted::single(fence, sent_at, spec.lease)));
    }
    if wait.expired(Instant::now()) {
        cleanup.disarm();
        return Ok(None);
    }
    let mut granted = wait_for_turn(shared, spec, token, wait).await;
    if let Ok(Some(_)) = granted {
        match confirmed(shared, spec, token).await {
            Ok(true) => {}
            Ok(false) => granted = Ok(None),
            Err(err) => granted = Err(err),
        }
    }
    match granted {
        Ok(Some(_)) => cleanup.disarm(),
        Ok(None) if !spec.fair && spec.replicas == 0 => cleanup.disarm(),
        // A fair waiter that gives up leaves the queue now, not when its place lapses.
        Ok(None) => {
            let left = shared
                .node
                .invoke(&scripts::leave_queue(&spec.keys, token), Retry::Once)
                .await;
            if left.is_ok() {
                cleanup.disarm();
            }
        }
        Err(_) => {}
    }
    granted
}

async fn wait_for_turn(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Granted>> {
    // Unfair: one competitor per name in this process; the others queue here, in FIFO order.
    // Fair: every waiter takes its own place in the Redis queue, which orders them all.
    let gate = (!spec.fair).then(|| shared.gate(&spec.name));
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
    let registration = shared
        .hub
        .register(spec.keys.wake_channel(), spec.fair.then_some(token));
    let queueing = Queueing::Join {
        place_ms: lease::lease_ms(QUEUE_PLACE),
    };
    loop {
        // Subscribed before looking, so a release after the look is always heard.
        registration.ready().await?;
        let (outcome, sent_at) = attempt(shared, spec, token, queueing).await?;
        let retry_ms = match outcome {
            Attempt::Granted { fence } => {
                return Ok(Some(Granted::single(fence, sent_at, spec.lease)))
            }
            Attempt::Busy { retry_ms } => retry_ms,
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(None);
        }
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if spec.fair {
            // Refresh the queue place well before it lapses.
            nap = nap.min(QUEUE_PLACE / 3);
        }
        tokio::select! {
            _ = registration.notified() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// Compare-and-delete; `Ok(false)` when the lock was not ours (any more).
pub async fn release(shared: &Shared, keys: &Keys, token: &str) -> Result<bool> {
    let reply = shared
        .node
        .invoke(&scripts::release(keys, token), Retry::Once)
        .await?;
    Ok(parse_flag(&reply)?)
}

/// Compare-and-pexpire; `Ok(Some(sent_at))` when extended, `Ok(None)` when not ours.
pub async fn extend(
    shared: &Shared,
    keys: &Keys,
    token: &str,
    lease: Duration,
) -> Result<Option<Instant>> {
    let inv = scripts::extend(keys, token, lease::lease_ms(lease));
    let sent_at = Instant::now();
    let reply = shared.node.invoke(&inv, Retry::Once).await?;
    Ok(parse_flag(&reply)?.then_some(sent_at))
}

/// `acquire` on any deployment.
pub async fn acquire_on(
    backend: &Backend,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Granted>> {
    match backend {
        Backend::Single(shared) => acquire(shared, spec, token, wait).await,
        Backend::Redlock(r) => redlock::acquire(r, spec, token, wait).await,
    }
}

/// `release` on any deployment; `Ok(false)` when the lock was not ours (any more).
pub async fn release_on(backend: &Backend, keys: &Keys, token: &str) -> Result<bool> {
    match backend {
        Backend::Single(shared) => release(shared, keys, token).await,
        Backend::Redlock(r) => r.release(keys, token).await,
    }
}

/// `extend` on any deployment: `Ok(Some(deadline))` of the new lease, `Ok(None)` when not ours.
pub async fn extend_on(
    backend: &Backend,
    keys: &Keys,
    token: &str,
    lease: Duration,
) -> Result<Option<Instant>> {
    match backend {
        Backend::Single(shared) => Ok(extend(shared, keys, token, lease)
            .await?
            .map(|sent_at| lease::deadline(sent_at, lease))),
        Backend::Redlock(r) => r.extend(keys, token, lease).await,
    }
}

/// The current owner token of a lock, if anybody holds it.
pub async fn owner(shared: &Shared, keys: &Keys) -> Result<Option<Vec<u8>>> {
    shared
        .node
        .query(redis::cmd("GET").arg(keys.lock()), Retry::Once)
        .await
}

/// Shared between a hold and its renewal task.
#[derive(Debug)]
pub struct HoldStatus {
    deadline: Mutex<Instant>,
    lost: AtomicBool,
    /// Set while a release is under way, so renewal does not mistake it for a loss.
    releasing: AtomicBool,
}

impl HoldStatus {
    pub fn new(deadline: Instant) -> Self {
        HoldStatus {
            deadline: Mutex::new(deadline),
            lost: AtomicBool::new(false),
            releasing: AtomicBool::new(false),
        }
    }

    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_deadline(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the hold lost; true only for the first caller (who reports it).
    pub fn mark_lost(&self) -> bool {
        !self.lost.swap(true, Ordering::AcqRel)
    }

    pub fn is_releasing(&self) -> bool {
        self.releasing.load(Ordering::Acquire)
    }
}

/// Told by renewal when a hold is lost or renewal falters.
pub type OnLost = Arc<dyn renew::Listener>;

struct Hold {
    pid: u32,
    token: String,
    fence: i64,
    status: Arc<HoldStatus>,
    renewal: Option<Renewal>,
}

enum State {
    Idle { lost: bool },
    Acquiring,
    Held(Hold),
}

/// One lock object: at most one hold at a time, owned by the object (not by a thread).
pub struct LockHandle {
    client: Arc<Client>,
    spec: LockSpec,
    auto_renew: bool,
    state: Mutex<State>,
}

/// An acquire under way (the object is in its Acquiring state). Dropped unsettled — the caller
/// was interrupted between the steps — it puts the object back to idle.
pub struct Pending<'a> {
    handle: &'a LockHandle,
    token: Option<String>,
    first: Option<(Attempt, Instant)>,
}

impl Pending<'_> {
    fn settle(
        mut self,
        backend: &Backend,
        token: String,
        granted: Result<Option<Granted>>,
        listener: Option<OnLost>,
    ) -> Result<bool> {
        let handle = self.handle;
        self.token = None;
        let outcome = match granted {
            Ok(Some(g)) => {
                let hold = handle.hold(backend, token, g, listener);
                *handle.state() = State::Held(hold);
                Ok(true)
            }
            Ok(None) => {
                *handle.state() = State::Idle { lost: false };
                Ok(false)
            }
            Err(err) => {
                *handle.state() = State::Idle { lost: false };
                Err(err)
            }
        };
        std::mem::forget(self);
        outcome
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut state = self.handle.state();
        if matches!(*state, State::Acquiring) {
            *state = State::Idle { lost: false };
        }
    }
}

/// The outcome of `LockHandle::acquire_direct`.
pub enum Direct<'a> {
    Done(bool),
    Wait(Pending<'a>),
}

/// What the caller needs of a hold to act on it without holding the state lock.
struct HoldRef {
    token: String,
    status: Arc<HoldStatus>,
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
        if fair && client.is_redlock() {
            return Err(Error::Unsupported(
                "fair: a fair (FIFO) lock is not available on a Redlock client (several \
                 independent masters): one queue cannot be kept by majority; use one Redis, \
                 Sentinel or Redis Cluster"
                    .into(),
            ));
        }
        let spec = LockSpec {
            name: name.to_vec(),
            keys: client.keys(name)?,
            lease,
            fair,
            replicas,
        };
        Ok(LockHandle {
            client,
            spec,
            auto_renew,
            state: Mutex::new(State::Idle { lost: false }),
        })
    }

    /// The deployment's connections when the blocking calls may use a direct connection on the
    /// caller's thread (a single server); None for the others, which go through the runtime.
    fn direct_shared(&self) -> Result<Option<Arc<Shared>>> {
        Ok(match self.client.backend()? {
            Backend::Single(shared) if shared.direct.is_some() => Some(shared),
            _ => None,
        })
    }

    pub fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    pub fn spec(&self) -> &LockSpec {
        &self.spec
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // In a forked child the parent's hold is not ours: forget it without touching it.
        if let State::Held(hold) = &*state {
            if hold.pid != pid() {
                if let State::Held(inherited) =
                    std::mem::replace(&mut *state, State::Idle { lost: false })
                {
                    std::mem::forget(inherited);
                }
            }
        }
        state
    }

    fn current(&self) -> Option<HoldRef> {
        match &*self.state() {
            State::Held(h) => Some(HoldRef {
                token: h.token.clone(),
                status: h.status.clone(),
            }),
            _ => None,
        }
    }

    /// Takes the lock for this object; `listener` hears from auto-renewal, if it is on.
    pub async fn acquire(&self, wait: Wait, listener: Option<OnLost>) -> Result<bool> {
        self.begin_acquire()?;
        let pending = Pending {
            handle: self,
            token: None,
            first: None,
        };
        self.acquire_pending(pending, wait, listener).await
    }

    /// The blocking form's first step, on the caller's thread: one direct attempt. `Done` when
    /// that settles it (granted, or a single try that failed); otherwise finish with
    /// `acquire_pending`, which waits through the runtime.
    pub fn acquire_direct(&self, wait: Wait, listener: Option<OnLost>) -> Result<Direct<'_>> {
        self.begin_acquire()?;
        let mut pending = Pending {
            handle: self,
            token: None,
            first: None,
        };
        // WAIT must follow the write on the same connection: replicas take the runtime path.
        if self.spec.replicas > 0 {
            return Ok(Direct::Wait(pending));
        }
        let Some(shared) = self.direct_shared()? else {
            return Ok(Direct::Wait(pending));
        };
        let backend = Backend::Single(shared.clone());
        let token = new_token()?;
        let (outcome, sent_at) = attempt_direct(&shared, &self.spec, &token)?;
        match outcome {
            Attempt::Granted { fence } => {
                let granted = Ok(Some(Granted::single(fence, sent_at, self.spec.lease)));
                Ok(Direct::Done(
                    pending.settle(&backend, token, granted, listener)?,
                ))
            }
            Attempt::Busy { .. } if wait == Wait::Once => Ok(Direct::Done(pending.settle(
                &backend,
                token,
                Ok(None),
                listener,
            )?)),
            Attempt::Busy { .. } => {
                pending.token = Some(token);
                pending.first = Some((outcome, sent_at));
                Ok(Direct::Wait(pending))
            }
        }
    }

    /// Finishes an acquire begun by `acquire_direct` (or `acquire`).
    pub async fn acquire_pending(
        &self,
        mut pending: Pending<'_>,
        wait: Wait,
        listener: Option<OnLost>,
    ) -> Result<bool> {
        let backend = self.client.backend()?;
        let token = match pending.token.take() {
            Some(token) => token,
            None => new_token()?,
        };
        let first = pending.first.take();
        let granted = match &backend {
            Backend::Single(shared) => acquire_from(shared, &self.spec, &token, wait, first).await,
            Backend::Redlock(r) => redlock::acquire(r, &self.spec, &token, wait).await,
        };
        pending.settle(&backend, token, granted, listener)
    }

    fn begin_acquire(&self) -> Result<()> {
        let mut state = self.state();
        match &*state {
            State::Held(_) => Err(Error::Usage(
                "this Lock object already holds the lock (it is not re-entrant)".into(),
            )),
            State::Acquiring => Err(Error::Usage(
                "this Lock object is already acquiring in another thread".into(),
            )),
            State::Idle { .. } => {
                *state = State::Acquiring;
                Ok(())
            }
        }
    }

    fn hold(
        &self,
        backend: &Backend,
        token: String,
        granted: Granted,
        listener: Option<OnLost>,
    ) -> Hold {
        let status = Arc::new(HoldStatus::new(granted.deadline));
        let renewal = match (self.auto_renew, listener) {
            (true, listener) => Some(renew::start(
                backend.clone(),
                self.spec.clone(),
                token.clone(),
                status.clone(),
                listener,
            )),
            (false, _) => None,
        };
        Hold {
            pid: pid(),
            token,
            fence: granted.fence,
            status,
            renewal,
        }
    }

    /// Marks a release under way and returns the hold to release.
    fn begin_release(&self) -> Result<HoldRef> {
        let hold = self.current().ok_or_else(not_owned)?;
        hold.status.releasing.store(true, Ordering::Release);
        Ok(hold)
    }

    fn finish_release(&self, hold: HoldRef, outcome: Result<bool>) -> Result<()> {
        hold.status.releasing.store(false, Ordering::Release);
        let released = outcome?;
        let lost = !released || hold.status.is_lost();
        {
            let mut state = self.state();
            if matches!(&*state, State::Held(h) if h.token == hold.token) {
                *state = State::Idle { lost };
            }
        }
        if released {
            Ok(())
        } else {
            hold.status.mark_lost();
            Err(lost_error())
        }
    }

    pub async fn release(&self) -> Result<()> {
        let hold = self.begin_release()?;
        let outcome = match self.client.backend() {
            Ok(backend) => release_on(&backend, &self.spec.keys, &hold.token).await,
            Err(err) => Err(err),
        };
        self.finish_release(hold, outcome)
    }

    /// `release` on the caller's thread.
    pub fn release_direct(&self) -> Result<()> {
        let Some(shared) = self.direct_shared()? else {
            return runtime::handle()?.block_on(self.release());
        };
        let hold = self.begin_release()?;
        let outcome = shared
            .direct
            .as_ref()
            .ok_or_else(|| Error::Usage("no direct connection".into()))
            .and_then(|direct| {
                let reply =
                    direct.invoke(&scripts::release(&self.spec.keys, &hold.token), Retry::Once)?;
                Ok(parse_flag(&reply)?)
            });
        self.finish_release(hold, outcome)
    }

    fn finish_extend(&self, hold: &HoldRef, outcome: Result<Option<Instant>>) -> Result<()> {
        match outcome? {
            Some(deadline) => {
                hold.status.set_deadline(deadline);
                Ok(())
            }
            None => {
                hold.status.mark_lost();
                Err(lost_error())
            }
        }
    }

    pub async fn extend(&self, lease: Option<Duration>) -> Result<()> {
        let hold = self.current().ok_or_else(not_owned)?;
        let lease = lease.unwrap_or(self.spec.lease);
        let outcome = match self.client.backend() {
            Ok(backend) => extend_on(&backend, &self.spec.keys, &hold.token, lease).await,
            Err(err) => Err(err),
        };
        self.finish_extend(&hold, outcome)
    }

    /// `extend` on the caller's thread.
    pub fn extend_direct(&self, lease: Option<Duration>) -> Result<()> {
        let Some(shared) = self.direct_shared()? else {
            return runtime::handle()?.block_on(self.extend(lease));
        };
        let hold = self.current().ok_or_else(not_owned)?;
        let lease = lease.unwrap_or(self.spec.lease);
        let outcome = shared
            .direct
            .as_ref()
            .ok_or_else(|| Error::Usage("no direct connection".into()))
            .and_then(|direct| {
                let inv = scripts::extend(&self.spec.keys, &hold.token, lease::lease_ms(lease));
                let sent_at = Instant::now();
                let reply = direct.invoke(&inv, Retry::Once)?;
                Ok(parse_flag(&reply)?.then(|| lease::deadline(sent_at, lease)))
            });
        self.finish_extend(&hold, outcome)
    }

    /// The lock's owner token, looked up on the caller's thread.
    fn owner_direct(&self, shared: &Shared) -> Result<Option<Vec<u8>>> {
        match shared.direct.as_ref() {
            Some(direct) => direct.query(redis::cmd("GET").arg(self.spec.keys.lock()), Retry::Once),
            None => Err(Error::Usage("no direct connection".into())),
        }
    }

    pub fn owned_direct(&self) -> Result<bool> {
        let Some(shared) = self.direct_shared()? else {
            return runtime::handle()?.block_on(self.owned());
        };
        let Some(hold) = self.current() else {
            return Ok(false);
        };
        Ok(self.owner_direct(&shared)?.as_deref() == Some(hold.token.as_bytes()))
    }

    pub fn locked_direct(&self) -> Result<bool> {
        let Some(shared) = self.direct_shared()? else {
            return runtime::handle()?.block_on(self.locked());
        };
        Ok(self.owner_direct(&shared)?.is_some())
    }

    pub async fn owned(&self) -> Result<bool> {
        let Some(hold) = self.current() else {
            return Ok(false);
        };
        match self.client.backend()? {
            Backend::Single(shared) => Ok(
                owner(&shared, &self.spec.keys).await?.as_deref() == Some(hold.token.as_bytes())
            ),
            Backend::Redlock(r) => r.owned(&self.spec.keys, &hold.token).await,
        }
    }

    pub async fn locked(&self) -> Result<bool> {
        match self.client.backend()? {
            Backend::Single(shared) => Ok(owner(&shared, &self.spec.keys).await?.is_some()),
            Backend::Redlock(r) => r.locked(&self.spec.keys).await,
        }
    }

    pub fn token(&self) -> Option<String> {
        self.current().map(|h| h.token)
    }

    pub fn fence(&self) -> Option<i64> {
        match &*self.state() {
            State::Held(h) => Some(h.fence),
            _ => None,
        }
    }

    pub fn lost(&self) -> bool {
        match &*self.state() {
            State::Held(h) => h.status.is_lost(),
            State::Idle { lost } => *lost,
            State::Acquiring => false,
        }
    }

    pub fn remaining(&self) -> Option<Duration> {
        self.current()
            .map(|h| lease::remaining(h.status.deadline(), Instant::now()))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop();
        }
    }
}

fn not_owned() -> Error {
    Error::NotOwned("this Lock object does not hold the lock".into())
}

fn lost_error() -> Error {
    Error::Lost("lock was lost".into())
}
