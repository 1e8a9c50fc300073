//! The state of one object's hold on a leased primitive (a lock, a semaphore permit, a read or
//! write lock), shared by the blocking and the asyncio bindings: at most one hold at a time,
//! owned by the object (not by a thread; a re-entrant primitive's holder may take it again while
//! it holds, counting its acquires), forgotten in a forked child, renewed in the background
//! when asked, and marked lost once renewal, extend or release finds the lease gone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;

use super::client::{Backend, Client};
use super::error::{Error, Result};
use super::executor::{self, Now};
pub use super::hold_status::HoldStatus;
use super::hold_status::PendingExtend;
use super::interrupt;
use super::node::gave_up_at_deadline;
use super::redlock::{Granted, Redlock, Whose};
use super::renew::{self, Renewal, Schedule};
use super::runtime::pid;
use super::shared::Shared;
use super::token::new_token;
use super::waiting::{
    self, attempt_direct, spawn_undo, undo_unknown, Contender, Outcome, Plan, Undo, UndoStep, Wait,
};
use crate::protocol::lease;
use crate::protocol::step::Step;

mod carried;
pub use carried::{Tried, Try, Waiting};

/// Told by renewal when a hold is lost or renewal falters.
pub type OnLost = Arc<dyn renew::Listener>;

/// How an object and what it holds are called in messages: "this {object} object does not hold
/// {held}".
#[derive(Clone, Copy, Debug)]
pub struct Naming {
    pub object: &'static str,
    pub held: &'static str,
}

/// A primitive whose holds are leases, every change checked by owner token. It supplies its
/// steps (`protocol/`), its attempts (a `waiting::Contender`) and how its waiters wait (a
/// `waiting::Plan`); the `Holder` runs acquire (the direct first attempt, then the wait),
/// release, extend and `owned` for every primitive alike, on the transport that fits.
pub trait Leased: Send + Sync + 'static {
    /// What a hold keeps beside its token (the lock's fence; nothing for the others).
    type Detail: Clone + Send + Sync + 'static;
    /// What one acquire is told beyond the wait (the read lock: whether it re-enters).
    type Args: Sync;

    fn naming(&self) -> Naming;

    /// The lease of an acquire, and of extend and renewal when they are not told one.
    fn lease(&self) -> Duration;

    /// The lease a hold was granted, from its start: `lease()` unless the grant says otherwise
    /// (a fair lock handed on by a release may be granted less, and is then topped up).
    fn granted_lease(&self, _detail: &Self::Detail) -> Duration {
        self.lease()
    }

    /// Gives `token`'s hold back; false when it was not ours (any more).
    fn release(&self, token: &str) -> Step<bool>;

    /// The fences a hold was granted, if the primitive issues fences (a lock, a MultiLock):
    /// kept by a release for `unmoved_since` (numbers: the read itself is built only when
    /// needed).
    fn fences_of(&self, _detail: &Self::Detail) -> Option<HeldFences> {
        None
    }

    /// A read that shows no other hold of the names was granted since the one granted `fences`
    /// (the fencing counter unmoved): asked when a release that met a restart of the server
    /// found the hold gone, it tells the first send's delete (kept by the restarted server) from
    /// a loss. None: the primitive has no such record, and the hold then counts as lost.
    fn unmoved_since(&self, _fences: &[i64]) -> Option<Step<bool>> {
        None
    }

    /// The lease of `token`'s hold now ends `lease` from now; false when not ours.
    fn extend(&self, token: &str, lease: Duration) -> Step<bool>;

    /// Whether `token` holds it.
    fn owned(&self, token: &str) -> Step<bool>;

    /// Whether the holder may take its hold again while it holds (`Lock(reentrant=True)`): each
    /// acquire then needs a release of its own, and the hold ends with the last. Otherwise a
    /// second acquire is refused.
    fn reentrant(&self) -> bool {
        false
    }

    /// The step that sets the hold count of `token`'s hold to `depth`: a re-entry (`lease`: the
    /// lease then lasts at least that long from now) or the release of a nested acquire (None);
    /// false when the hold is not `token`'s. Asked only of a `reentrant` primitive.
    fn nest(&self, token: &str, _depth: u32, _lease: Option<Duration>) -> Step<bool> {
        self.owned(token)
    }

    // How those steps run on one node (a server, a Sentinel-managed master, a Redis Cluster):
    // the step, by default. A primitive whose keys may span cluster slots (a MultiLock) runs
    // one step per slot instead; the direct path (one server) still sends the single step.

    /// Runs `release(token)` on `shared`.
    fn release_on_node<'a>(
        &'a self,
        shared: &'a Shared,
        token: &'a str,
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        async move { executor::run(shared, &self.release(token)).await }
    }

    /// Runs `extend(token, lease)` on `shared`.
    fn extend_on_node<'a>(
        &'a self,
        shared: &'a Shared,
        token: &'a str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        async move { executor::run(shared, &self.extend(token, lease)).await }
    }

    /// Runs `owned(token)` on `shared`.
    fn owned_on_node<'a>(
        &'a self,
        shared: &'a Shared,
        token: &'a str,
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        async move { executor::run(shared, &self.owned(token)).await }
    }

    /// What one of its attempts grants (see `waiting::Contender`).
    type Grant: Send;
    /// One waiter's attempts for a token: the attempt step and how to read its outcome.
    type Contender<'a>: Contender<Grant = Self::Grant> + Send
    where
        Self: 'a;

    /// The attempts of an acquire for `token` on one node; an error when this acquire may not
    /// go ahead at all (the read-write lock's deadlock guard).
    fn contender<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        token: &'a str,
        args: &Self::Args,
    ) -> Result<Self::Contender<'a>>;

    /// How its waiters for `token` wait (see `waiting::Plan`).
    fn plan<'a>(&self, shared: &'a Arc<Shared>, token: &'a str) -> Plan<'a>;

    /// The hold a grant of `contender` gives: when the winning request was sent (the lease's
    /// start), and the detail.
    fn held(&self, contender: &Self::Contender<'_>, grant: Self::Grant) -> (Instant, Self::Detail);

    /// Whether the blocking API may run this primitive's one-round-trip steps on the caller's
    /// thread (see `direct.rs`), the first acquire attempt included (`Contender::first_step`).
    fn direct(&self) -> bool {
        false
    }

    // Redlock (several independent masters): a primitive takes part only with a quorum acquire
    // of its own (its release, extend and `owned` steps then run on every master, decided by
    // majority); by default it says so. Instants are when the lease counts from (Redlock's
    // drift allowance already taken off).

    /// Whether this primitive has a quorum protocol (`acquire_quorum`).
    fn quorum(&self) -> bool {
        false
    }

    fn acquire_quorum(
        &self,
        _redlock: &Arc<Redlock>,
        _token: &str,
        _wait: Wait,
        _args: &Self::Args,
    ) -> impl Future<Output = Result<Option<(Instant, Self::Detail)>>> + Send {
        let err = no_quorum(self.naming());
        async move { Err(err) }
    }

    /// The release step of a hold that each master runs (`release` by default; see
    /// `quorum_extend`). A give-back of what an acquire left runs `release`.
    fn quorum_release(&self, token: &str, _detail: &Self::Detail) -> Step<bool> {
        self.release(token)
    }

    /// The extend step of a hold that each master runs (`extend` by default): a primitive whose
    /// masters may keep the token in another form than the one won (a semaphore's slot) checks
    /// there what the hold won (its detail).
    fn quorum_extend(&self, token: &str, _detail: &Self::Detail, lease: Duration) -> Step<bool> {
        self.extend(token, lease)
    }

    /// The ownership step that each master runs (`owned` by default; see `quorum_extend`).
    fn quorum_owned(&self, token: &str, _detail: &Self::Detail) -> Step<bool> {
        self.owned(token)
    }
}

/// The error of a primitive used on a Redlock client without a quorum protocol of its own.
pub fn no_quorum(naming: Naming) -> Error {
    Error::Unsupported(format!(
        "{} is not available on a Redlock client (several independent masters): it has no \
         quorum protocol; use one Redis, Sentinel or Redis Cluster",
        naming.object
    ))
}

/// One acquire's link to whoever awaits it (an asyncio task). Once they stop waiting
/// (`Holder::abandon`), whatever the attempt obtained is given back instead of kept: at once when
/// it holds already, or as it settles when the grant arrives later (an aborted runtime task still
/// finishes a poll that is under way). An attempt dropped before it settles undoes itself
/// (`waiting::Cleanup`), so an abandoned acquire neither keeps nor later takes anything.
#[derive(Clone, Default)]
pub struct Ticket(Arc<Mutex<TicketState>>);

#[derive(Default)]
struct TicketState {
    abandoned: bool,
    /// The acquire of the object it is for, once begun (`Holder::abandon` puts it back to idle).
    attempt: Option<u64>,
    /// The token of the hold the attempt settled into.
    held: Option<String>,
}

impl Ticket {
    /// Changed only under the holder's state lock, so that settling and abandoning see each
    /// other: either the settle finds the ticket abandoned, or the abandon finds the hold.
    fn lock(&self) -> std::sync::MutexGuard<'_, TicketState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An acquire under way (the object is in its Acquiring state). Dropped unsettled — the caller
/// was interrupted between the steps — it puts the object back to idle.
struct Pending<'a, P: Leased> {
    holder: &'a Holder<P>,
    /// Which acquire of the object (`State::Acquiring`).
    attempt: u64,
    token: Option<String>,
    busy_retry_ms: Option<i64>,
    /// The waiter's registrations, subscribed before the direct first attempt went out
    /// (`waiting::listen_early`).
    early: Option<Box<EarlyWait>>,
    settled: bool,
    ticket: Option<Ticket>,
}

impl<P: Leased> Pending<'_, P> {
    fn settle(
        mut self,
        backend: &Backend,
        token: String,
        granted: Result<Option<(Instant, P::Detail)>>,
        listener: Option<OnLost>,
    ) -> Result<bool> {
        self.settled = true;
        let holder = self.holder;
        let mut state = holder.state();
        if !holder.acquiring(&state, self.attempt) {
            // Given up (`abort_acquire`): the object may be acquiring again; a grant goes back.
            drop(state);
            if let Ok(Some(_)) = granted {
                holder.give_back_in_background(backend, token);
            }
            return Ok(false);
        }
        match granted {
            Ok(Some(_)) if self.ticket.as_ref().is_some_and(|t| t.lock().abandoned) => {
                // Nobody waits for this hold any more: never kept, never topped up.
                *state = State::Idle { lost: false };
                drop(state);
                holder.give_back_in_background(backend, token);
                Ok(false)
            }
            Ok(Some((sent_at, detail))) => {
                if let Some(ticket) = &self.ticket {
                    ticket.lock().held = Some(token.clone());
                }
                let lease = holder.primitive.lease();
                let granted = holder.primitive.granted_lease(&detail).min(lease);
                let deadline = lease::deadline(sent_at, granted);
                let status = Arc::new(match backend {
                    Backend::Single(shared) => HoldStatus::granted_on(deadline, shared.run_id()),
                    Backend::Redlock(redlock) => {
                        HoldStatus::granted_on_masters(deadline, redlock.run_ids())
                    }
                });
                // A shorter grant is topped up to the full lease once, when half of what is left
                // of it has passed, unless renewal comes anyway (sooner than that, if need be).
                let left = lease::remaining(deadline, Instant::now());
                let schedule = if holder.auto_renew {
                    Some(Schedule::renewing(lease, left))
                } else {
                    (granted < lease).then(|| Schedule::top_up(left))
                };
                let renewal = schedule.map(|schedule| {
                    holder.start_renewal(backend, &token, &detail, schedule, &status, listener)
                });
                *state = State::Held(Hold {
                    pid: pid(),
                    token,
                    detail,
                    status,
                    renewal,
                    depth: 1,
                });
                Ok(true)
            }
            Ok(None) => {
                *state = State::Idle { lost: false };
                Ok(false)
            }
            Err(err) => {
                *state = State::Idle { lost: false };
                Err(err)
            }
        }
    }
}

/// What a direct first attempt that found the primitive busy leaves to the wait, when the
/// waiter listened before it (`waiting::listen_early`).
struct EarlyWait {
    early: waiting::Early,
    /// What the attempt taught its contender (`Contender::memo`).
    memo: Option<(Instant, i64)>,
    /// Gives back the place the attempt took, should the wait never start.
    undo: Option<Undo>,
}

impl<P: Leased> Drop for Pending<'_, P> {
    fn drop(&mut self) {
        if let Some(undo) = self.early.take().and_then(|e| e.undo) {
            spawn_undo(undo);
        }
        if !self.settled {
            self.holder.abort_acquire(self.attempt);
        }
    }
}

/// The outcome of `Holder::acquire_direct`.
enum Direct<'a, P: Leased> {
    Done(bool),
    /// Must wait: finish with `Holder::acquire_pending` (through the runtime).
    Wait(Pending<'a, P>),
}

/// What a blocking acquire leaves to the runtime: the wait of a new hold, or a re-entry.
enum Later<'a, P: Leased> {
    Wait(Pending<'a, P>),
    Reenter(Nesting),
}

/// A re-entry or a nested release under way (a re-entrant primitive): the hold, and the hold
/// count it will have.
struct Nesting {
    hold: HoldRef,
    depth: u32,
}

/// Sets the count back (`Holder::count_back`) if dropped armed: a re-entry through the runtime
/// that failed or whose caller stopped waiting before it settled.
struct CountBack<'a, P: Leased> {
    holder: &'a Holder<P>,
    backend: &'a Backend,
    nesting: &'a Nesting,
    armed: bool,
}

impl<P: Leased> CountBack<'_, P> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<P: Leased> Drop for CountBack<'_, P> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (hold, backend) = (&self.nesting.hold, self.backend);
        let undo = || self.holder.count_back(backend, &hold.token, &hold.status);
        match backend {
            Backend::Single(shared) => undo_unknown(shared, undo),
            Backend::Redlock(_) => spawn_undo(undo()),
        }
    }
}

struct Hold<D> {
    pid: u32,
    token: String,
    detail: D,
    status: Arc<HoldStatus>,
    renewal: Option<Renewal>,
    /// How many acquires this hold stands for (1 unless the primitive is re-entrant); a release
    /// of a nested one (depth > 1) only counts down.
    depth: u32,
}

impl<D> Hold<D> {
    /// Sets the hold count here and in the status, which a background give-back reads.
    fn set_depth(&mut self, depth: u32) {
        self.depth = depth;
        self.status.set_depth(depth);
    }
}

impl<D> Drop for Hold<D> {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.stop();
        }
    }
}

/// An object dropped while it holds leaves the lease to run out, as a dead holder's would. A
/// waited-for Lock's grant (shorter than the ttl) still gets its one top-up: the caller asked for
/// `ttl`, and an acquire that did not wait would have left that much. Auto-renewal stops.
impl<P: Leased> Drop for Holder<P> {
    fn drop(&mut self) {
        if self.auto_renew {
            return;
        }
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let State::Held(hold) = state {
            if hold.pid == pid() {
                if let Some(top_up) = hold.renewal.take() {
                    top_up.detach();
                }
            }
        }
    }
}

enum State<D> {
    Idle {
        lost: bool,
    },
    /// An acquire is under way in process `pid` (a forked child's copy is no acquire of its own).
    /// `attempt` tells it from a later acquire of the object: one that was given up (an asyncio
    /// caller cancelled, the object idle again at once) never changes the state after that.
    Acquiring {
        pid: u32,
        attempt: u64,
    },
    Held(Hold<D>),
}

/// What the caller needs of a hold to act on it without holding the state lock.
struct HoldRef {
    token: String,
    status: Arc<HoldStatus>,
    /// Set for a release (`begin_release`): ends it, whatever happens to the release.
    _release: Option<ReleaseUnderWay>,
}

/// One release of a hold under way (`HoldStatus::begin_release`); dropped, it is over.
struct ReleaseUnderWay(Arc<HoldStatus>);

impl Drop for ReleaseUnderWay {
    fn drop(&mut self) {
        self.0.end_release();
    }
}

/// A release begun on the caller's thread (`Holder::begin_release_call`): a nested one that
/// only counts down, or the hold's own.
pub struct ReleaseBegun(Begun);

enum Begun {
    Leave(Nesting),
    /// The hold and its quorum release step (Redlock's; unused on one node), built when the
    /// release begins: the hold's detail (an RWLock's held mark) then stays with the object's
    /// state, and ends with it when the caller abandons the release (`release_abandoned`),
    /// instead of living on with the release in flight.
    Release(HoldRef, Step<bool>, Option<HeldFences>),
}

/// The fences a hold was granted (`Leased::fences_of`): a lock's one, or one per name of a
/// MultiLock (in its names' order).
#[derive(Clone, Debug)]
pub enum HeldFences {
    One(i64),
    Each(Vec<i64>),
}

impl HeldFences {
    pub fn as_slice(&self) -> &[i64] {
        match self {
            HeldFences::One(fence) => std::slice::from_ref(fence),
            HeldFences::Each(fences) => fences,
        }
    }
}

/// A release under way whose step a caller sends itself (`Holder::begin_release_step`).
pub struct Releasing {
    hold: HoldRef,
    shared: Arc<Shared>,
    epoch: u64,
    sent_at: Instant,
    /// The hold's fences, for the read that tells a release's own delete from a loss after a
    /// restart (`Leased::unmoved_since`).
    fences: Option<HeldFences>,
}

/// An extend under way whose step a caller sends itself (`Holder::begin_extend_step`).
pub struct Extending {
    hold: HoldRef,
    lease: Duration,
    sent_at: Instant,
    pending: PendingExtend,
}

/// One object's hold on a primitive `P`.
pub struct Holder<P: Leased> {
    client: Arc<Client>,
    primitive: Arc<P>,
    auto_renew: bool,
    state: Mutex<State<P::Detail>>,
    /// The last direct first attempt found the primitive taken (a hint for the next one, see
    /// `waiting::listen_early`).
    found_busy: AtomicBool,
    /// Numbers the acquires of this object (`State::Acquiring`).
    attempts: AtomicU64,
}

impl<P: Leased> Holder<P> {
    pub fn new(client: Arc<Client>, primitive: P, auto_renew: bool) -> Self {
        Holder {
            client,
            primitive: Arc::new(primitive),
            auto_renew,
            state: Mutex::new(State::Idle { lost: false }),
            found_busy: AtomicBool::new(false),
            attempts: AtomicU64::new(0),
        }
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    pub fn primitive(&self) -> &P {
        &self.primitive
    }

    pub fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<P::Detail>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // In a forked child the parent's hold, or its acquire under way in another thread (which
        // the child does not have), is not ours: forget it without touching it.
        let inherited = match &*state {
            State::Held(hold) => hold.pid != pid(),
            State::Acquiring { pid: by, .. } => *by != pid(),
            State::Idle { .. } => false,
        };
        if inherited {
            std::mem::forget(std::mem::replace(&mut *state, State::Idle { lost: false }));
        }
        state
    }

    /// Whether acquire `attempt` is the one under way (not given up, not settled).
    fn acquiring(&self, state: &State<P::Detail>, attempt: u64) -> bool {
        matches!(state, State::Acquiring { attempt: a, .. } if *a == attempt)
    }

    /// Puts the object back to idle if acquire `attempt` is still under way: its caller gave it
    /// up (cancelled), or it never goes on. A later acquire of the object is left alone.
    pub fn abort_acquire(&self, attempt: u64) {
        let mut state = self.state();
        if self.acquiring(&state, attempt) {
            *state = State::Idle { lost: false };
        }
    }

    fn current(&self) -> Option<HoldRef> {
        self.current_with_detail().map(|(hold, _)| hold)
    }

    /// `current`, with what the hold keeps beside its token (read together: one hold's).
    fn current_with_detail(&self) -> Option<(HoldRef, P::Detail)> {
        match &*self.state() {
            State::Held(h) => Some((
                HoldRef {
                    token: h.token.clone(),
                    status: h.status.clone(),
                    _release: None,
                },
                h.detail.clone(),
            )),
            _ => None,
        }
    }

    /// Takes a hold for this object; `listener` hears from auto-renewal, if it is on.
    pub async fn acquire(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
    ) -> Result<bool> {
        if let Some(nesting) = self.begin_reentry()? {
            return self.reenter(nesting, None).await;
        }
        let pending = self.begin_acquire()?;
        self.acquire_pending(pending, wait, listener, args).await
    }

    /// `acquire` for a caller that may stop waiting for it: `abandon(ticket)` then gives back
    /// whatever this attempt obtains (see `Ticket`).
    pub async fn acquire_ticketed(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
        ticket: Ticket,
    ) -> Result<bool> {
        if let Some(nesting) = self.begin_reentry()? {
            return self.reenter(nesting, Some(&ticket)).await;
        }
        let mut pending = self.begin_acquire()?;
        ticket.lock().attempt = Some(pending.attempt);
        pending.ticket = Some(ticket);
        self.acquire_pending(pending, wait, listener, args).await
    }

    /// The caller of `acquire_ticketed(.., ticket)` stopped waiting (cancelled): the hold it
    /// settled into, if any, is given back now; a grant still on its way is given back as it
    /// settles. Never touches a hold that another acquire took.
    pub fn abandon(&self, ticket: &Ticket) {
        let mut state = self.state();
        let (held, attempt) = {
            let mut ticket = ticket.lock();
            ticket.abandoned = true;
            (ticket.held.take(), ticket.attempt)
        };
        // Still waiting: the object is idle again at once, so that its caller may acquire again
        // before the aborted wait is dropped (which then changes nothing).
        if attempt.is_some_and(|a| self.acquiring(&state, a)) {
            *state = State::Idle { lost: false };
        }
        drop(state);
        if let Some(token) = held {
            self.give_back(&token);
        }
    }

    /// Gives back the hold with `token` at once, if this object still has it: the object is idle
    /// when this returns (no renewal, no top-up), and the lease is released in the background.
    /// For an acquire that succeeded but whose caller was cancelled before it learned so.
    pub fn give_back(&self, token: &str) -> bool {
        let mut state = self.state();
        if !matches!(&*state, State::Held(h) if h.token == token) {
            return false;
        }
        // A re-entry given back: one count less, the hold itself stays.
        if let State::Held(hold) = &mut *state {
            if hold.depth > 1 {
                hold.set_depth(hold.depth - 1);
                let status = hold.status.clone();
                drop(state);
                if let Ok(backend) = self.client.backend() {
                    spawn_undo(self.count_back(&backend, token, &status));
                }
                return true;
            }
        }
        // A hold already found lost stays reported so (`lost`).
        let lost = matches!(&*state, State::Held(h) if h.status.is_lost());
        let taken = std::mem::replace(&mut *state, State::Idle { lost });
        drop(state);
        // Dropping the hold stops its renewal or top-up.
        drop(taken);
        if let Ok(backend) = self.client.backend() {
            self.give_back_in_background(&backend, token.to_string());
        }
        true
    }

    /// Whether the hold's latest extend by the caller still waits for a renewal extend that
    /// may have cut it back (see `HoldStatus::wait_for_renewal`); false when nothing is held.
    pub fn extend_settling(&self) -> bool {
        self.current()
            .is_some_and(|hold| hold.status.caller_extend_unsettled())
    }

    /// Ends the background renewal of the hold with `token`, if this object still has it: its
    /// lease then runs out within the ttl unless it is released or extended. For a hold whose
    /// owner is gone (its asyncio event loop was closed while it held).
    pub fn stop_renewal(&self, token: &str) -> bool {
        let mut state = self.state();
        let State::Held(hold) = &mut *state else {
            return false;
        };
        if hold.token != token {
            return false;
        }
        match hold.renewal.take() {
            Some(renewal) => {
                renewal.stop();
                true
            }
            None => false,
        }
    }

    /// The caller of the release under way stopped waiting for it (its asyncio task was
    /// cancelled): the release goes on, and the object is idle at once, as the release leaves
    /// it, so that its next acquire takes a new hold (waiting, like any other, for the release
    /// to free the name). A hold whose release already failed stays held.
    pub fn release_abandoned(&self) -> bool {
        let mut state = self.state();
        if !matches!(&*state, State::Held(h) if h.depth <= 1 && h.status.is_release_under_way()) {
            return false;
        }
        *state = State::Idle { lost: false };
        true
    }

    /// Releases `token`'s hold in Redis from the runtime, retrying while Redis cannot be reached
    /// (until the lease would have ended by itself).
    fn give_back_in_background(&self, backend: &Backend, token: String) {
        let primitive = self.primitive.clone();
        let backend = backend.clone();
        let step = move || -> UndoStep {
            let (primitive, backend, token) = (primitive.clone(), backend.clone(), token.clone());
            Box::pin(async move {
                release_on(&*primitive, &backend, &token).await?;
                Ok(())
            })
        };
        spawn_undo(Undo {
            step: Box::new(step),
            horizon: self.primitive.lease(),
        });
    }

    /// Sets the hold count of `token`'s hold in Redis back to the count the hold has when this
    /// runs (`HoldStatus::depth`): for a re-entry that went out but did not count (it raised, or
    /// its caller stopped waiting), which may have set it one higher. A later re-entry or
    /// release may have moved the count meanwhile, so it is read then, not now, and only once
    /// no such step is under way (`HoldStatus::nest_turn`): read while one was, it would undo
    /// that step when landing after it. A hold that ended meanwhile is not touched (the step
    /// checks the token). Also for a nested level given back without asking the caller
    /// (`give_back`): the count then is already the one to set.
    fn count_back(&self, backend: &Backend, token: &str, status: &Arc<HoldStatus>) -> Undo {
        let primitive = self.primitive.clone();
        let (backend, token, status) = (backend.clone(), token.to_string(), status.clone());
        let step = move || -> UndoStep {
            let (primitive, backend) = (primitive.clone(), backend.clone());
            let (token, status) = (token.clone(), status.clone());
            Box::pin(async move {
                // Connected before its turn: a re-entry or release waiting for the turn must
                // not wait out this step's connect as well as its own (twice the timeout).
                if let Backend::Single(shared) = &backend {
                    shared.node.connected().await?;
                }
                let _turn = status.nest_turn().await;
                let step = primitive.nest(&token, status.depth(), None);
                nest_on(&*primitive, &backend, &step).await?;
                Ok(())
            })
        };
        Undo {
            step: Box::new(step),
            horizon: self.primitive.lease(),
        }
    }

    /// A re-entry, when the primitive is re-entrant and this holder holds: the hold and its
    /// count after it. A hold already found lost is not re-entered (LockLostError).
    fn begin_reentry(&self) -> Result<Option<Nesting>> {
        if !self.primitive.reentrant() {
            return Ok(None);
        }
        let state = self.state();
        let State::Held(hold) = &*state else {
            return Ok(None);
        };
        if hold.status.is_lost() {
            return Err(lost_error());
        }
        Ok(Some(Nesting {
            hold: HoldRef {
                token: hold.token.clone(),
                status: hold.status.clone(),
                _release: None,
            },
            depth: hold.depth.saturating_add(1),
        }))
    }

    /// Takes the hold once more (one step: the count in Redis, the lease at least the
    /// primitive's from now). `ticket`: the caller may stop waiting (see `Ticket`).
    async fn reenter(&self, nesting: Nesting, ticket: Option<&Ticket>) -> Result<bool> {
        let status = nesting.hold.status.clone();
        let _turn = status.nest_turn().await;
        let begun = Instant::now();
        let lease = self.primitive.lease();
        let step = self
            .primitive
            .nest(&nesting.hold.token, nesting.depth, Some(lease));
        let outcome = match self.client.backend() {
            Ok(backend) => {
                // Until it is answered, the re-entry may set the count in Redis although it
                // will not count here: it fails, or its caller stops waiting (dropped).
                let guard = CountBack {
                    holder: self,
                    backend: &backend,
                    nesting: &nesting,
                    armed: true,
                };
                let outcome = reenter_on(&*self.primitive, &backend, step, lease).await;
                if outcome.is_ok() {
                    guard.disarm();
                }
                outcome
            }
            Err(err) => Err(err),
        };
        self.finish_reentry(nesting, lease, begun, outcome, ticket)
    }

    /// `reenter` on the caller's thread (only when `has_direct`).
    fn reenter_direct(&self, nesting: Nesting) -> Result<bool> {
        let status = nesting.hold.status.clone();
        let _turn = status.nest_turn_blocking();
        let begun = Instant::now();
        let lease = self.primitive.lease();
        let outcome = self.client.shared().and_then(|shared| {
            let step = self
                .primitive
                .nest(&nesting.hold.token, nesting.depth, Some(lease));
            // Failed (unanswered, timed out, interrupted), it may still set the count in Redis
            // (even later than an undo sent now): the count goes back as for a first attempt.
            let backend = Backend::Single(shared.clone());
            let undo = || self.count_back(&backend, &nesting.hold.token, &nesting.hold.status);
            let script = executor::script_of(&step)?;
            let (reply, sent_at) = attempt_direct(&shared, script, Wait::Forever, undo)?;
            Ok(step.parse(reply)?.then_some(sent_at))
        });
        self.finish_reentry(nesting, lease, begun, outcome, None)
    }

    /// `begun`: before the re-entry's request went out (see `HoldStatus::answered_at_least`).
    fn finish_reentry(
        &self,
        nesting: Nesting,
        lease: Duration,
        begun: Instant,
        outcome: Result<Option<Instant>>,
        ticket: Option<&Ticket>,
    ) -> Result<bool> {
        let Some(sent_at) = outcome? else {
            nesting.hold.status.mark_lost();
            return Err(lost_error());
        };
        let mut state = self.state();
        let State::Held(hold) = &mut *state else {
            return Err(self.not_owned());
        };
        if hold.token != nesting.hold.token {
            return Err(self.not_owned());
        }
        if let Some(ticket) = ticket {
            let mut ticket = ticket.lock();
            if ticket.abandoned {
                // Nobody waits for this re-entry any more: the count goes back (once this
                // step's turn is over).
                let (token, status) = (hold.token.clone(), hold.status.clone());
                drop(ticket);
                drop(state);
                if let Ok(backend) = self.client.backend() {
                    spawn_undo(self.count_back(&backend, &token, &status));
                }
                return Ok(false);
            }
            ticket.held = Some(hold.token.clone());
        }
        hold.set_depth(nesting.depth);
        hold.status
            .answered_at_least(begun, lease::deadline(sent_at, lease));
        Ok(true)
    }

    /// The release of a nested acquire, when this holder holds more than one: the count it
    /// sets. A hold already found lost counts down at once and says so (LockLostError) without
    /// asking Redis.
    fn begin_leave(&self) -> Result<Option<Nesting>> {
        let mut state = self.state();
        let State::Held(hold) = &mut *state else {
            return Ok(None);
        };
        if hold.depth <= 1 {
            return Ok(None);
        }
        if hold.status.is_lost() {
            hold.set_depth(hold.depth - 1);
            return Err(lost_error());
        }
        Ok(Some(Nesting {
            hold: HoldRef {
                token: hold.token.clone(),
                status: hold.status.clone(),
                _release: None,
            },
            depth: hold.depth - 1,
        }))
    }

    /// The count goes down once Redis answered (whatever it said, that acquire is released).
    /// Unanswered (ConnectionError), the level stays, as a plain release that raised leaves the
    /// hold: the count is set, not decremented, so a retried release is the same release, never
    /// the outer one's.
    fn finish_leave(&self, nesting: &Nesting, outcome: Result<bool>) -> Result<()> {
        let answered = outcome?;
        if let State::Held(hold) = &mut *self.state() {
            if hold.token == nesting.hold.token && hold.depth == nesting.depth + 1 {
                hold.set_depth(nesting.depth);
            }
        }
        if answered {
            return Ok(());
        }
        nesting.hold.status.mark_lost();
        Err(lost_error())
    }

    /// A block's exit cannot be retried: when its release of `token`'s hold at `depth` failed
    /// (`err`; None: interrupted), the level goes now (a nested one's, or the hold's own) and
    /// Redis is told in the background (retried until the lease would end), so the object holds
    /// nothing it cannot give up and may enter a block again. (A plain `release()` that raised
    /// keeps the hold for the caller's retry.) Nothing goes when the release never began here
    /// (another thread's was under way) or found the hold lost (the object holds nothing then).
    pub fn drop_unreleased_level(&self, token: &str, depth: u32, err: Option<&Error>) {
        if matches!(err, Some(Error::NotOwned(_) | Error::Lost(_))) {
            return;
        }
        if matches!(&*self.state(), State::Held(hold) if hold.token == token && hold.depth == depth)
        {
            self.give_back(token);
        }
    }

    async fn leave(&self, nesting: Nesting) -> Result<()> {
        let status = nesting.hold.status.clone();
        let _turn = status.nest_turn().await;
        let step = self
            .primitive
            .nest(&nesting.hold.token, nesting.depth, None);
        let outcome = match self.client.backend() {
            Ok(backend) => nest_on(&*self.primitive, &backend, &step).await,
            Err(err) => Err(err),
        };
        self.finish_leave(&nesting, outcome)
    }

    fn leave_direct(&self, nesting: Nesting) -> Result<()> {
        let status = nesting.hold.status.clone();
        let _turn = status.nest_turn_blocking();
        let outcome = self.client.shared().and_then(|shared| {
            let step = self
                .primitive
                .nest(&nesting.hold.token, nesting.depth, None);
            executor::run_direct(&shared, &step)
        });
        self.finish_leave(&nesting, outcome)
    }

    /// The blocking API's first step, on the caller's thread: one direct attempt when the
    /// primitive offers it. `Done` when that settles it; otherwise finish with `acquire_pending`.
    fn acquire_direct(
        &self,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
    ) -> Result<Direct<'_, P>> {
        let mut pending = self.begin_acquire()?;
        if !self.has_direct() {
            return Ok(Direct::Wait(pending));
        }
        let shared = self.client.shared()?;
        let backend = Backend::Single(shared.clone());
        let token = new_token()?;
        let outcome = {
            let contender = self.primitive.contender(&shared, &token, args)?;
            // Behind this process's competitor, a waiter waits without a first attempt: it
            // finds the primitive taken (or granted to that competitor) when its turn comes.
            let plan = (wait != Wait::Once).then(|| self.primitive.plan(&shared, &token));
            if plan.as_ref().is_some_and(waiting::behind_own_competitor) {
                None
            } else {
                let (step, early) = self.first_attempt(&contender, plan.as_ref(), true);
                let script = executor::script_of(&step)?;
                match attempt_direct(&shared, script, wait, || contender.undo()) {
                    Ok((reply, sent_at)) => Some(self.read_first(
                        &mut pending,
                        &contender,
                        &step,
                        reply,
                        sent_at,
                        wait,
                        early,
                    )?),
                    // The deadline passed while the cluster refused it (undone meanwhile).
                    Err(err) if gave_up_at_deadline(&err) => Some(None),
                    Err(err) => return Err(err),
                }
            }
        };
        let Some(outcome) = outcome else {
            self.found_busy.store(true, Ordering::Relaxed);
            pending.token = Some(token);
            pending.busy_retry_ms = Some(-1);
            return Ok(Direct::Wait(pending));
        };
        let busy = pending.busy_retry_ms.is_some();
        self.found_busy.store(busy, Ordering::Relaxed);
        if busy {
            pending.token = Some(token);
            return Ok(Direct::Wait(pending));
        }
        let acquired = pending.settle(&backend, token, Ok(outcome), listener)?;
        Ok(Direct::Done(acquired))
    }

    /// The step of a first attempt (on the caller's thread, or carried by the caller) and, when
    /// the caller will wait (`plan`: its wait's) and the object's last first attempt found the
    /// primitive taken, the waiter's registrations made before it (`waiting::listen_early`):
    /// the step is then the joining one, so the wait needs no second look and a queued waiter
    /// its place at once. `own_thread`: the caller's thread will drive the wait (the blocking
    /// API), which may then listen on its own connection (`listener.rs`).
    #[allow(clippy::type_complexity)]
    fn first_attempt<'c>(
        &self,
        contender: &P::Contender<'c>,
        plan: Option<&Plan<'_>>,
        own_thread: bool,
    ) -> (
        Step<<P::Contender<'c> as Contender>::Reply>,
        Option<waiting::Early>,
    ) {
        let busy_likely = self.found_busy.load(Ordering::Relaxed);
        let early =
            plan.and_then(|plan| waiting::listen_early(contender, plan, busy_likely, own_thread));
        let step = if early.is_some() {
            contender.first_step_joining()
        } else {
            contender.first_step()
        };
        (step, early)
    }

    /// What the reply of a first attempt (`Contender::first_step`, or its joining twin when the
    /// waiter listened `early`) means: the hold it grants, or None; when it found the primitive
    /// busy and the caller will wait, `pending` keeps what the wait needs.
    #[allow(clippy::too_many_arguments)]
    fn read_first<'c>(
        &self,
        pending: &mut Pending<'_, P>,
        contender: &P::Contender<'c>,
        step: &Step<<P::Contender<'c> as Contender>::Reply>,
        reply: Value,
        sent_at: Instant,
        wait: Wait,
        early: Option<waiting::Early>,
    ) -> Result<Option<(Instant, P::Detail)>> {
        Ok(match contender.read(step.parse(reply)?, sent_at)? {
            Outcome::Granted(grant) => Some(self.primitive.held(contender, grant)),
            Outcome::Busy { retry_ms } if wait != Wait::Once => {
                pending.busy_retry_ms = Some(retry_ms);
                pending.early = early.map(|early| {
                    Box::new(EarlyWait {
                        early,
                        memo: contender.memo(),
                        undo: contender.joins_first().then(|| contender.undo()),
                    })
                });
                None
            }
            Outcome::Busy { .. } | Outcome::Refused => None,
        })
    }

    /// The blocking API's `acquire`: a first attempt on the caller's thread when the direct
    /// path serves this primitive (`Done` when that settles it), else a future to wait on
    /// (through the runtime) that finishes the acquire.
    pub fn acquire_blocking<'a>(
        &'a self,
        wait: Wait,
        listener: Option<OnLost>,
        args: &'a P::Args,
    ) -> Now<Result<bool>, impl Future<Output = Result<bool>> + Send + 'a> {
        let later = match self.begin_reentry() {
            // (Not while a count step is under way: its turn is waited for through the runtime,
            // which Ctrl-C interrupts and gevent's other greenlets run beside.)
            Ok(Some(nesting)) if self.has_direct() && !nesting.hold.status.nest_busy() => {
                return Now::Done(self.reenter_direct(nesting));
            }
            Ok(Some(nesting)) => Later::Reenter(nesting),
            Ok(None) => match self.acquire_direct(wait, listener.clone(), args) {
                Ok(Direct::Wait(pending)) => Later::Wait(pending),
                Ok(Direct::Done(acquired)) => return Now::Done(Ok(acquired)),
                Err(err) => return Now::Done(Err(err)),
            },
            Err(err) => return Now::Done(Err(err)),
        };
        // The caller's thread drives the wait: with the direct path, its attempts go there too.
        Now::Later(executor::caller_driven(self.has_direct(), async move {
            match later {
                Later::Wait(pending) => self.acquire_pending(pending, wait, listener, args).await,
                Later::Reenter(nesting) => self.reenter(nesting, None).await,
            }
        }))
    }

    /// Finishes an acquire begun by `acquire_direct` (or `acquire`), waiting as `wait` allows.
    async fn acquire_pending(
        &self,
        mut pending: Pending<'_, P>,
        wait: Wait,
        listener: Option<OnLost>,
        args: &P::Args,
    ) -> Result<bool> {
        let backend = self.client.backend()?;
        let token = match pending.token.take() {
            Some(token) => token,
            None => new_token()?,
        };
        let granted = match &backend {
            Backend::Single(shared) => {
                let first = pending.busy_retry_ms.take();
                let early = pending.early.take();
                self.acquire_on_node(shared, &token, wait, args, first, early)
                    .await
            }
            Backend::Redlock(redlock) => {
                self.primitive
                    .acquire_quorum(redlock, &token, wait, args)
                    .await
            }
        };
        pending.settle(&backend, token, granted, listener)
    }

    /// Waits on one node for the primitive's hold (see `waiting`); `busy_retry_ms`: a first
    /// attempt (made directly) found it busy.
    async fn acquire_on_node(
        &self,
        shared: &Arc<Shared>,
        token: &str,
        wait: Wait,
        args: &P::Args,
        busy_retry_ms: Option<i64>,
        early: Option<Box<EarlyWait>>,
    ) -> Result<Option<(Instant, P::Detail)>> {
        let contender = match self.primitive.contender(shared, token, args) {
            Ok(contender) => contender,
            Err(err) => {
                if let Some(undo) = early.and_then(|e| e.undo) {
                    spawn_undo(undo);
                }
                return Err(err);
            }
        };
        let plan = self.primitive.plan(shared, token);
        let made_here = busy_retry_ms.is_none();
        let early = match early {
            Some(wait) => {
                contender.resume(wait.memo);
                Some(wait.early)
            }
            // The first attempt is made here, through the runtime (asyncio's while the loop's
            // connection is made): as on the direct path, a waiter whose object's last first
            // attempt found the primitive taken listens first and joins with it.
            None if made_here && wait != Wait::Once && contender.joins_first() => {
                let busy_likely = self.found_busy.load(Ordering::Relaxed);
                waiting::listen_early(&contender, &plan, busy_likely, false)
            }
            None => None,
        };
        let first = busy_retry_ms.map(|retry_ms| Outcome::Busy { retry_ms });
        let found_busy = made_here.then_some(&self.found_busy);
        let grant =
            waiting::acquire_from(&contender, &plan, wait, first, early, found_busy).await?;
        Ok(grant.map(|grant| self.primitive.held(&contender, grant)))
    }

    fn begin_acquire(&self) -> Result<Pending<'_, P>> {
        let naming = self.primitive.naming();
        let mut state = self.state();
        match &*state {
            // Its loss is told by the release (LockLostError), or when leaving the `with`.
            State::Held(hold) if hold.status.is_lost() => Err(Error::Usage(format!(
                "this {} object's hold of {} was lost and is not released yet: release() it \
                 first (it raises LockLostError), or use another object",
                naming.object, naming.held
            ))),
            State::Held(_) => Err(Error::Usage(format!(
                "this {} object already holds {} (it is not re-entrant)",
                naming.object, naming.held
            ))),
            State::Acquiring { .. } => Err(Error::Usage(format!(
                "this {} object is already acquiring (in another thread or task)",
                naming.object
            ))),
            State::Idle { .. } => {
                let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
                *state = State::Acquiring {
                    pid: pid(),
                    attempt,
                };
                Ok(Pending {
                    holder: self,
                    attempt,
                    token: None,
                    busy_retry_ms: None,
                    early: None,
                    settled: false,
                    ticket: None,
                })
            }
        }
    }

    /// Whether the blocking API may use the `*_direct` calls (the primitive offers them and
    /// the client is one server, reached directly).
    fn has_direct(&self) -> bool {
        self.primitive.direct() && self.client.supports_direct()
    }

    fn start_renewal(
        &self,
        backend: &Backend,
        token: &str,
        detail: &P::Detail,
        schedule: Schedule,
        status: &Arc<HoldStatus>,
        listener: Option<OnLost>,
    ) -> Renewal {
        let primitive = self.primitive.clone();
        let backend = backend.clone();
        let token = token.to_string();
        // Only Redlock's steps read the detail: kept elsewhere it would outlive the hold for as
        // long as the renewal task takes to end (an RWLock's mark of its holding thread, whose
        // next write acquire would then be refused as an upgrade).
        let detail = matches!(backend, Backend::Redlock(_)).then(|| detail.clone());
        let extend = move |lease: Duration| {
            let primitive = primitive.clone();
            let backend = backend.clone();
            let token = token.clone();
            let detail = detail.clone();
            async move { extend_on(&*primitive, &backend, &token, detail.as_ref(), lease).await }
        };
        renew::start(
            extend,
            self.primitive.lease(),
            schedule,
            status.clone(),
            listener,
        )
    }

    /// Stops renewal before the release goes out: whatever the release's outcome, the hold is
    /// renewed no more (see `HoldStatus::releasing`). While one release is under way, another
    /// (from another thread) finds nothing this object may release, as `threading.Lock` would
    /// once the first one ran; after a release that failed, the holder may try again.
    fn begin_release(&self) -> Result<(HoldRef, P::Detail)> {
        let mut state = self.state();
        let State::Held(hold) = &mut *state else {
            return Err(self.not_owned());
        };
        if !hold.status.begin_release() {
            return Err(self.not_owned());
        }
        hold.status.set_releasing();
        if let Some(renewal) = hold.renewal.take() {
            renewal.stop();
        }
        let releasing = HoldRef {
            token: hold.token.clone(),
            status: hold.status.clone(),
            _release: Some(ReleaseUnderWay(hold.status.clone())),
        };
        Ok((releasing, hold.detail.clone()))
    }

    /// `retried`: the release went out while the lease was still ours and its connection broke
    /// meanwhile, so a "not ours" may be the answer of a resend to our own first delete: that
    /// counts as released (the local deadline never outlives Redis's lease) only when the server
    /// that answered is the incarnation the hold was granted on (see `resent_own`).
    fn finish_release(&self, hold: HoldRef, outcome: Result<bool>, retried: bool) -> Result<()> {
        let released = outcome? || retried;
        let lost = !released || hold.status.is_lost();
        {
            let mut state = self.state();
            if matches!(&*state, State::Held(h) if h.token == hold.token) {
                *state = State::Idle { lost };
            }
        }
        if lost {
            // Also when the delete went through: renewal already told the holder its lease
            // ended (an extend unanswered at the local deadline), and the release agrees.
            hold.status.mark_lost();
            Err(lost_error())
        } else {
            Ok(())
        }
    }

    pub async fn release(&self) -> Result<()> {
        let begun = self.begin_release_call()?;
        self.release_begun(begun).await
    }

    /// The start of `release`, on the caller's thread: from here on a release is under way
    /// (`release_abandoned` sees it), even before the runtime runs the rest
    /// (`release_begun`).
    pub fn begin_release_call(&self) -> Result<ReleaseBegun> {
        if let Some(nesting) = self.begin_leave()? {
            return Ok(ReleaseBegun(Begun::Leave(nesting)));
        }
        let (hold, detail) = self.begin_release()?;
        let quorum_step = self.primitive.quorum_release(&hold.token, &detail);
        let fences = self.primitive.fences_of(&detail);
        Ok(ReleaseBegun(Begun::Release(hold, quorum_step, fences)))
    }

    /// The rest of a release begun by `begin_release_call`.
    pub async fn release_begun(&self, begun: ReleaseBegun) -> Result<()> {
        let (hold, quorum_step, fences) = match begun.0 {
            Begun::Leave(nesting) => return self.leave(nesting).await,
            Begun::Release(hold, quorum_step, fences) => (hold, quorum_step, fences),
        };
        let backend = match self.client.backend() {
            Ok(backend) => backend,
            Err(err) => return self.finish_release(hold, Err(err), false),
        };
        let Backend::Single(shared) = &backend else {
            // A master's "not ours" after its connection broke under the send may be the first
            // send's work (as `resent_own` on one server).
            let granted = Granted {
                deadline: hold.status.deadline(),
                run_ids: hold.status.masters_run_ids.clone(),
            };
            let outcome = release_by_quorum(
                &*self.primitive,
                &backend,
                &hold.token,
                quorum_step,
                Some(granted),
            )
            .await;
            return self.finish_release(hold, outcome, false);
        };
        let (epoch, sent_at) = (shared.fault_epoch(), Instant::now());
        let outcome = self.primitive.release_on_node(shared, &hold.token).await;
        let faulted = shared.fault_epoch() != epoch;
        let mut retried = resent_own(shared, &hold, epoch, sent_at);
        if !retried && restarted_under(shared, &hold, &outcome, faulted, sent_at) {
            retried = self.read_unmoved(shared, fences.as_ref()).await;
        }
        note_unanswered(&hold, &outcome, sent_at);
        self.finish_release(hold, outcome, retried)
    }

    /// `release` on the caller's thread (only when `has_direct`).
    fn release_direct(&self) -> Result<()> {
        if let Some(nesting) = self.begin_leave()? {
            return self.leave_direct(nesting);
        }
        let (step, releasing) = self.begin_release_step()?;
        let outcome = executor::run_direct(&releasing.shared, &step);
        if self.release_needs_read(&releasing, &outcome) {
            let read = releasing
                .fences
                .as_ref()
                .and_then(|f| self.primitive.unmoved_since(f.as_slice()));
            let shared = &releasing.shared;
            let found = read.is_some_and(|read| executor::run_direct(shared, &read) == Ok(true));
            return self.settle_release_step(releasing, outcome, found);
        }
        self.finish_release_step(releasing, outcome)
    }

    /// The release of a (not nested) hold as one step for a caller that sends it itself (the
    /// direct path, the asyncio loop path): renewal stops now; finish with
    /// `finish_release_step`, or `release_resent` when the connection broke under it.
    pub fn begin_release_step(&self) -> Result<(Step<bool>, Releasing)> {
        let (hold, detail) = self.begin_release()?;
        let shared = self.client.shared()?;
        let step = self.primitive.release(&hold.token);
        let releasing = Releasing {
            epoch: shared.fault_epoch(),
            sent_at: Instant::now(),
            hold,
            shared,
            fences: self.primitive.fences_of(&detail),
        };
        Ok((step, releasing))
    }

    /// Whether a release begun by `begin_release_step` that answered `outcome` found the hold
    /// gone after a restart of the server since the grant (`restarted_under`): a read then
    /// decides (`unmoved_since`). The asyncio loop path leaves that to `release_resent`; the
    /// caller's thread reads it itself and settles with `settle_release_step`.
    pub fn release_needs_read(&self, releasing: &Releasing, outcome: &Result<bool>) -> bool {
        let Releasing {
            hold,
            shared,
            epoch,
            sent_at,
            fences,
        } = releasing;
        // (A release that released, the common answer, looks no further.)
        matches!(outcome, Ok(false))
            && fences.is_some()
            && !resent_own(shared, hold, *epoch, *sent_at)
            && restarted_under(
                shared,
                hold,
                outcome,
                shared.fault_epoch() != *epoch,
                *sent_at,
            )
    }

    /// Settles a release begun by `begin_release_step` with what its step answered.
    pub fn finish_release_step(&self, releasing: Releasing, outcome: Result<bool>) -> Result<()> {
        self.settle_release_step(releasing, outcome, false)
    }

    /// `finish_release_step`; `unmoved`: the read of `release_needs_read` found no hold of the
    /// name granted since this one, so a "not ours" was the first send's delete.
    fn settle_release_step(
        &self,
        releasing: Releasing,
        outcome: Result<bool>,
        unmoved: bool,
    ) -> Result<()> {
        let Releasing {
            hold,
            shared,
            epoch,
            sent_at,
            ..
        } = releasing;
        let retried = unmoved || resent_own(&shared, &hold, epoch, sent_at);
        note_unanswered(&hold, &outcome, sent_at);
        self.finish_release(hold, outcome, retried)
    }

    /// A release begun by `begin_release_step` whose connection broke under it: sent again
    /// through the runtime, a "not ours" then counting as released when the first send may have
    /// deleted our token (see `resent_own`).
    pub async fn release_resent(&self, releasing: Releasing) -> Result<()> {
        let Releasing {
            hold,
            shared,
            sent_at,
            fences,
            ..
        } = releasing;
        let outcome = self.primitive.release_on_node(&shared, &hold.token).await;
        let mut retried = may_have_released(&shared, &hold, sent_at);
        if !retried && restarted_under(&shared, &hold, &outcome, true, sent_at) {
            retried = self.read_unmoved(&shared, fences.as_ref()).await;
        }
        note_unanswered(&hold, &outcome, sent_at);
        self.finish_release(hold, outcome, retried)
    }

    /// A release begun by `begin_release_step` that its server answered LOADING: it did not
    /// run. Sent through the runtime, which waits the load out (`connect::Restart`), and judged
    /// as the direct path judges its own, which waits on its connection (`release_direct`): a
    /// "not ours" after the load is no first send's work unless this send met a fault.
    pub async fn release_unrun(&self, releasing: Releasing) -> Result<()> {
        let shared = releasing.shared.clone();
        let outcome = self
            .primitive
            .release_on_node(&shared, &releasing.hold.token)
            .await;
        let unmoved = self.release_needs_read(&releasing, &outcome)
            && self.read_unmoved(&shared, releasing.fences.as_ref()).await;
        self.settle_release_step(releasing, outcome, unmoved)
    }

    /// The blocking API's `release`: done on the caller's thread when the direct path serves
    /// this hold, else a future to wait on (through the runtime).
    pub fn release_blocking(
        &self,
    ) -> Now<Result<()>, impl Future<Output = Result<()>> + Send + '_> {
        // (A nested release while a count step is under way waits for its turn through the
        // runtime, as a re-entry does.)
        if self.has_direct() && !self.nest_busy() {
            Now::Done(self.release_direct())
        } else {
            Now::Later(self.release())
        }
    }

    /// Whether a step that sets this hold's count in Redis is under way (`HoldStatus::nest_busy`).
    fn nest_busy(&self) -> bool {
        matches!(&*self.state(), State::Held(hold) if hold.depth > 1 && hold.status.nest_busy())
    }

    /// `pending`: begun before the extend was sent (`HoldStatus::begin_extend`); an extend that
    /// got no answer leaves it unsettled, so the deadline stays no later than its end.
    fn finish_extend(
        &self,
        hold: &HoldRef,
        lease: Duration,
        pending: PendingExtend,
        outcome: Result<Option<Instant>>,
    ) -> Result<()> {
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                // Unanswered: the deadline drops to the extend's end if that is sooner, so
                // renewal (if any) plans from it, as after an answer.
                drop(pending);
                self.deadline_moved(hold);
                return Err(err);
            }
        };
        match outcome {
            Some(sent_at) => {
                pending.answered(lease::deadline(sent_at, lease));
                self.deadline_moved(hold);
                Ok(())
            }
            // "Not ours" because this object's own release (begun meanwhile, from another
            // thread) got there first: nothing was lost.
            None if hold.status.is_release_under_way() || self.released_since(&hold.token) => {
                Err(self.not_owned())
            }
            None => {
                hold.status.mark_lost();
                Err(lost_error())
            }
        }
    }

    /// The caller's extend moved the hold's deadline: its renewal plans again (a task not
    /// spawned yet is spawned now, see `Renewal::plan_again`).
    fn deadline_moved(&self, hold: &HoldRef) {
        hold.status.deadline_was_moved();
        if let State::Held(h) = &*self.state() {
            if h.token == hold.token {
                if let Some(renewal) = &h.renewal {
                    renewal.plan_again();
                }
            }
        }
    }

    pub async fn extend(&self, lease: Option<Duration>) -> Result<()> {
        let (hold, detail) = self.current_with_detail().ok_or_else(|| self.not_owned())?;
        let lease = lease.unwrap_or(self.primitive.lease());
        let pending = hold
            .status
            .begin_caller_extend(lease::deadline(Instant::now(), lease));
        let outcome = match self.client.backend() {
            Ok(backend) => {
                extend_on(
                    &*self.primitive,
                    &backend,
                    &hold.token,
                    Some(&detail),
                    lease,
                )
                .await
            }
            Err(err) => Err(err),
        };
        self.finish_extend(&hold, lease, pending, outcome)
    }

    /// `extend` on the caller's thread (only when `has_direct`). Once answered, it waits for a
    /// renewal extend that was under way when it began (see `HoldStatus::wait_for_renewal`):
    /// when it returns, the lease in Redis is the one it asked for.
    fn extend_direct(&self, lease: Option<Duration>) -> Result<()> {
        let (step, extending) = self.begin_extend_step(lease)?;
        let status = extending.hold.status.clone();
        let id = extending.pending.id();
        let shared = match self.client.shared() {
            Ok(shared) => shared,
            Err(err) => return self.finish_extend_step(extending, Err(err)),
        };
        let outcome = executor::run_direct(&shared, &step);
        self.finish_extend_step(extending, outcome)?;
        let limit = Instant::now() + shared.node.timeouts().command;
        status.wait_for_renewal(id, limit, interrupt::interrupted);
        Ok(())
    }

    /// `extend` as one step for a caller that sends it itself; finish with `finish_extend_step`.
    pub fn begin_extend_step(&self, lease: Option<Duration>) -> Result<(Step<bool>, Extending)> {
        let hold = self.current().ok_or_else(|| self.not_owned())?;
        let lease = lease.unwrap_or(self.primitive.lease());
        let step = self.primitive.extend(&hold.token, lease);
        let sent_at = Instant::now();
        let pending = hold
            .status
            .begin_caller_extend(lease::deadline(sent_at, lease));
        let extending = Extending {
            hold,
            lease,
            sent_at,
            pending,
        };
        Ok((step, extending))
    }

    /// Settles an extend begun by `begin_extend_step` with what its step answered.
    pub fn finish_extend_step(&self, extending: Extending, outcome: Result<bool>) -> Result<()> {
        let Extending {
            hold,
            lease,
            sent_at,
            pending,
        } = extending;
        let outcome = outcome.map(|extended| extended.then_some(sent_at));
        self.finish_extend(&hold, lease, pending, outcome)
    }

    /// The blocking API's `extend` (see `release_blocking`).
    pub fn extend_blocking(
        &self,
        lease: Option<Duration>,
    ) -> Now<Result<()>, impl Future<Output = Result<()>> + Send + '_> {
        if self.has_direct() {
            Now::Done(self.extend_direct(lease))
        } else {
            Now::Later(self.extend(lease))
        }
    }

    pub async fn owned(&self) -> Result<bool> {
        let Some((hold, detail)) = self.current_with_detail() else {
            return Ok(false);
        };
        owned_on(
            &*self.primitive,
            &self.client.backend()?,
            &hold.token,
            &detail,
        )
        .await
    }

    /// `owned` on the caller's thread (only when `has_direct`).
    fn owned_direct(&self) -> Result<bool> {
        let Some(step) = self.owned_step() else {
            return Ok(false);
        };
        let shared = self.client.shared()?;
        executor::run_direct(&shared, &step)
    }

    /// The step that tells whether this object's hold is still its own; None when it holds
    /// nothing (then it does not own it).
    pub fn owned_step(&self) -> Option<Step<bool>> {
        self.current().map(|hold| self.primitive.owned(&hold.token))
    }

    /// The blocking API's `owned` (see `release_blocking`).
    pub fn owned_blocking(
        &self,
    ) -> Now<Result<bool>, impl Future<Output = Result<bool>> + Send + '_> {
        if self.has_direct() {
            Now::Done(self.owned_direct())
        } else {
            Now::Later(self.owned())
        }
    }

    pub fn token(&self) -> Option<String> {
        self.current().map(|h| h.token)
    }

    /// How many acquires the current hold stands for (0 when none; more than 1 only for a
    /// re-entrant primitive).
    pub fn depth(&self) -> u32 {
        match &*self.state() {
            State::Held(h) => h.depth,
            _ => 0,
        }
    }

    pub fn detail(&self) -> Option<P::Detail> {
        match &*self.state() {
            State::Held(h) => Some(h.detail.clone()),
            _ => None,
        }
    }

    pub fn lost(&self) -> bool {
        match &*self.state() {
            State::Held(h) => h.status.is_lost(),
            State::Idle { lost } => *lost,
            State::Acquiring { .. } => false,
        }
    }

    pub fn remaining(&self) -> Option<Duration> {
        self.current()
            .map(|h| lease::remaining(h.status.deadline(), Instant::now()))
    }

    /// Whether the hold of `token` has left this object other than by being found lost (its
    /// release, or a give-back, ran).
    fn released_since(&self, token: &str) -> bool {
        match &*self.state() {
            State::Held(hold) => hold.token != token,
            State::Idle { lost } => !lost,
            State::Acquiring { .. } => true,
        }
    }

    /// Runs the read of `restarted_under` for the hold granted `fences`
    /// (`Leased::unmoved_since`); true only when it found no hold granted since (a failed read,
    /// or none to make, counts the hold lost).
    async fn read_unmoved(&self, shared: &Shared, fences: Option<&HeldFences>) -> bool {
        match fences.and_then(|f| self.primitive.unmoved_since(f.as_slice())) {
            Some(read) => executor::run(shared, &read).await == Ok(true),
            None => false,
        }
    }

    fn not_owned(&self) -> Error {
        let naming = self.primitive.naming();
        Error::NotOwned(format!(
            "this {} object does not hold {}",
            naming.object, naming.held
        ))
    }
}

/// Runs `token`'s release step on the deployment (on Redlock, on every master by majority).
async fn release_on<P: Leased>(primitive: &P, backend: &Backend, token: &str) -> Result<bool> {
    match backend {
        Backend::Single(shared) => primitive.release_on_node(shared, token).await,
        Backend::Redlock(_) => {
            release_by_quorum(primitive, backend, token, primitive.release(token), None).await
        }
    }
}

/// Runs a release `step` of `token` on every Redlock master, by majority; `granted`: the hold's
/// (see `redlock::Granted`).
async fn release_by_quorum<P: Leased>(
    primitive: &P,
    backend: &Backend,
    token: &str,
    step: Step<bool>,
    granted: Option<Granted>,
) -> Result<bool> {
    match backend {
        Backend::Redlock(redlock) if primitive.quorum() => {
            let whose = Whose::Drawn;
            redlock
                .release_where(token, Arc::new(step), whose, granted.map(Arc::new))
                .await
        }
        Backend::Redlock(_) => Err(no_quorum(primitive.naming())),
        Backend::Single(shared) => executor::run(shared, &step).await,
    }
}

/// Runs `token`'s extend step (to `lease`); Some(when the new lease counts from) when extended.
async fn extend_on<P: Leased>(
    primitive: &P,
    backend: &Backend,
    token: &str,
    detail: Option<&P::Detail>,
    lease: Duration,
) -> Result<Option<Instant>> {
    match backend {
        Backend::Single(shared) => {
            let sent_at = Instant::now();
            let extended = primitive.extend_on_node(shared, token, lease).await?;
            Ok(extended.then_some(sent_at))
        }
        Backend::Redlock(redlock) if primitive.quorum() => {
            redlock
                .extend_by(
                    Arc::new(match detail {
                        Some(detail) => primitive.quorum_extend(token, detail, lease),
                        None => primitive.extend(token, lease),
                    }),
                    lease,
                    Some(token),
                )
                .await
        }
        Backend::Redlock(_) => Err(no_quorum(primitive.naming())),
    }
}

/// Runs a re-entry step (`Leased::nest` with a lease); Some(when the lease counts from) when it
/// was done (on Redlock: by majority, with the drift allowance taken off).
async fn reenter_on<P: Leased>(
    primitive: &P,
    backend: &Backend,
    step: Step<bool>,
    lease: Duration,
) -> Result<Option<Instant>> {
    match backend {
        Backend::Single(shared) => {
            let sent_at = Instant::now();
            Ok(executor::run(shared, &step).await?.then_some(sent_at))
        }
        Backend::Redlock(redlock) if primitive.quorum() => {
            redlock.extend_by(Arc::new(step), lease, None).await
        }
        Backend::Redlock(_) => Err(no_quorum(primitive.naming())),
    }
}

/// Runs the step of a nested release (`Leased::nest` without a lease); true when done.
async fn nest_on<P: Leased>(primitive: &P, backend: &Backend, step: &Step<bool>) -> Result<bool> {
    match backend {
        Backend::Single(shared) => executor::run(shared, step).await,
        Backend::Redlock(redlock) if primitive.quorum() => redlock.owned_by(step, None).await,
        Backend::Redlock(_) => Err(no_quorum(primitive.naming())),
    }
}

/// Runs `token`'s ownership step.
async fn owned_on<P: Leased>(
    primitive: &P,
    backend: &Backend,
    token: &str,
    detail: &P::Detail,
) -> Result<bool> {
    match backend {
        Backend::Single(shared) => primitive.owned_on_node(shared, token).await,
        Backend::Redlock(redlock) if primitive.quorum() => {
            redlock
                .owned_by(&primitive.quorum_owned(token, detail), Some(token))
                .await
        }
        Backend::Redlock(_) => Err(no_quorum(primitive.naming())),
    }
}

/// Whether a release that met a connection fault (the fault epoch moved since `epoch`) may have
/// deleted our token with its first send: it went out while the lease was ours, and the server
/// that answered in the end is the incarnation the hold was granted on. After a restart or a
/// failover (another run_id: every connection reopened after the fault reads it) the first
/// send reached a server that is gone, so a "not ours" is a loss (another holder may hold it).
/// Without a known run_id (a cluster) the first condition alone decides. An earlier release of
/// the hold that got no answer at all (the call failed) is judged the same way.
fn resent_own(shared: &Shared, hold: &HoldRef, epoch: u64, sent_at: Instant) -> bool {
    let earlier = hold.status.unanswered_release();
    (shared.fault_epoch() != epoch && may_have_released(shared, hold, sent_at))
        || earlier.is_some_and(|first| may_have_released(shared, hold, first))
}

/// Whether a release of `hold` that answered `outcome` found it gone where its own first send
/// may have deleted it on an earlier incarnation of the server (a restart or a failover since
/// the grant, which `resent_own` does not count): it said "not ours", and it went out inside the
/// lease and its connection broke (`faulted`), or an earlier release of the hold went
/// unanswered, and the server answering now is another incarnation than the one that granted
/// the hold. A restarted server that kept its data (AOF, RDB) kept that delete too: a read of
/// what the grant left (`Leased::unmoved_since`) then tells it from a loss.
fn restarted_under(
    shared: &Shared,
    hold: &HoldRef,
    outcome: &Result<bool>,
    faulted: bool,
    sent_at: Instant,
) -> bool {
    let elsewhere = |at: Instant| {
        at < hold.status.deadline()
            && matches!(
                (hold.status.run_id.as_ref(), shared.run_id()),
                (Some(then), Some(now)) if *then != now
            )
    };
    matches!(outcome, Ok(false))
        && ((faulted && elsewhere(sent_at))
            || hold.status.unanswered_release().is_some_and(elsewhere))
}

/// A release that failed (no answer) may still have deleted the token: a later release of the
/// same hold whose "not ours" may be that delete's work counts it as released (`resent_own`).
fn note_unanswered(hold: &HoldRef, outcome: &Result<bool>, sent_at: Instant) {
    if outcome.is_err() {
        hold.status.release_unanswered(sent_at);
    }
}

/// Whether a release sent at `sent_at` whose connection then broke may have deleted our token
/// (see `resent_own`).
fn may_have_released(shared: &Shared, hold: &HoldRef, sent_at: Instant) -> bool {
    release_may_have_landed(
        shared,
        hold.status.deadline(),
        hold.status.run_id.as_ref(),
        sent_at,
    )
}

/// Whether a release sent at `sent_at` of a hold whose lease ran to `deadline`, granted by the
/// server incarnation `granted_on`, may have deleted its token with that send: it went out
/// while the lease was ours, and the server `shared` reached since is that incarnation (unknown
/// run_ids: the first condition alone decides). Shared with the recipes' release.
pub fn release_may_have_landed(
    shared: &Shared,
    deadline: Instant,
    granted_on: Option<&Arc<str>>,
    sent_at: Instant,
) -> bool {
    if sent_at >= deadline {
        return false;
    }
    match (granted_on, shared.run_id()) {
        (Some(granted_on), Some(now)) => *granted_on == now,
        _ => true,
    }
}

pub fn lost_error() -> Error {
    Error::Lost("lock was lost".into())
}
