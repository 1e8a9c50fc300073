//! Waiting without polling, shared by every primitive (lock, semaphore, read-write lock).
//!
//! A waiter registers on the primitive's wake channel, makes sure it is subscribed, then
//! attempts; when the attempt is not granted it sleeps until a release is published or until the
//! time the server named (the soonest lease end or place lapse), whichever comes first. A fair
//! lock's release grants the lock to the first waiter of its queue and publishes the grant: that
//! waiter takes the hold from the message (`Contender::granted`) without attempting again. An
//! acquire whose outcome is unknown (cancelled mid-flight, or its reply lost) is undone in the
//! background, so it neither keeps nor later takes anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::direct::Overdue;
use super::error::{Error, Result};
use super::executor;
use super::interrupt;
use super::listener::Listener;
use super::node::{gave_up_at_deadline, giving_up_at, GiveUp};
use super::runtime;
use super::shared::Shared;
use super::wake::Registration;
use crate::protocol::lease;
use crate::protocol::replies::Admission;
use crate::protocol::scripts::Queueing;
use crate::protocol::step::Step;
use crate::protocol::wake::{meant_for, parse_wake, GrantNote, WakeMessage};

/// How long a silent waiter keeps its place in a Redis queue (fair lock, fair semaphore,
/// waiting writer): a waiter that died stops holding others back within this time (the
/// contract allows 10 s). Live waiters refresh it every third. A fair lock granted to a waiter
/// that died meanwhile holds the others back at most `scripts::GRANT_SLACK_MS` longer.
pub const QUEUE_PLACE: Duration = Duration::from_secs(6);
/// The place of an unfair lock's waiter in the same queue: the contract promises nothing for a
/// dead waiter of an unfair lock, and before it queued one cost the others nothing, so its place
/// is kept short. A waiter that died holds the others back at most this long, or, when a release
/// granted it the lock meanwhile, this plus `scripts::GRANT_SLACK_MS` (5 s, against 9 s for a
/// fair waiter). Refreshing it every third costs one script every 0.67 s per waiting process.
pub const UNFAIR_QUEUE_PLACE: Duration = Duration::from_secs(2);
/// How long a waiter sleeps when Redis gives no lease to wait for (a key without expiry).
const NO_HINT_LOOK: Duration = Duration::from_millis(500);

/// How long a try-once (`Wait::Once`) keeps trying a call that a cluster refuses while the
/// slot migrates (nothing ran): a few of its short pauses, then it gives up, not acquired,
/// instead of trying for the whole command timeout.
const ONCE_ON_A_CLUSTER: Duration = Duration::from_millis(100);

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

    /// When a call that a cluster keeps refusing (nothing ran) is given up, not acquired (see
    /// `node::giving_up_at`): at the wait's deadline; a try-once's slot in migration
    /// `ONCE_ON_A_CLUSTER` from now; None (forever): tried until the command timeout.
    pub fn gives_up_at(self) -> Option<GiveUp> {
        match self {
            Wait::Once => Some(GiveUp::once(ONCE_ON_A_CLUSTER)),
            Wait::Until(d) => Some(GiveUp::at(d)),
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

/// One try of an undo, run detached on the runtime.
pub type UndoStep = Pin<Box<dyn Future<Output = Result<()>> + Send + 'static>>;

/// How to undo an attempt whose outcome is unknown: a step to try (again), and for how long
/// trying is worth it (after that, whatever the attempt could have taken has lapsed by itself).
pub struct Undo {
    pub step: Box<dyn FnMut() -> UndoStep + Send>,
    pub horizon: Duration,
}

/// A first attempt on a direct connection of the caller's thread: the reply, and when the
/// request was sent. When the call fails the script may still have run before the connection
/// broke, so whatever the token may hold is given back in the background (`undo`). When it timed
/// out, the attempt may also run later than any undo sent on another connection (a request
/// stuck in the server's or the network's queue): the undo is sent again once the attempt's own
/// connection has answered it (or ended), so it never leaves an orphan for a whole lease.
/// With a deadline (`wait`'s, see `Wait::gives_up_at`), a call that a cluster keeps refusing is
/// given up then (see `node::giving_up_at`): the error says so (`node::gave_up_at_deadline`),
/// and the acquire is not granted.
pub fn attempt_direct(
    shared: &Shared,
    inv: &redis::ScriptInvocation<'_>,
    wait: Wait,
    undo: impl Fn() -> Undo,
) -> Result<(redis::Value, Instant)> {
    let sent_at = Instant::now();
    match executor::invoke_direct(shared, inv, wait.gives_up_at()) {
        Ok(reply) => Ok((reply, sent_at)),
        Err((err, overdue)) => Err(undo_failed(err, overdue, undo)),
    }
}

/// Gives back whatever a direct attempt that failed may have taken (see `attempt_direct`);
/// the error goes on. For any primitive's direct call that may have taken something (the
/// cache's first lookup too).
pub fn undo_failed(err: Error, overdue: Option<Overdue>, undo: impl Fn() -> Undo) -> Error {
    spawn_undo(undo());
    if let Some(overdue) = overdue {
        undo_once_settled(overdue, undo());
    }
    err
}

/// Gives back whatever an attempt through the runtime may have taken when its outcome is
/// unknown (cancelled, or failed), and once more after the calls that timed out on the node
/// have been answered (or their connections ended): a timed-out attempt may run later than
/// the first undo, which a new connection carried (a request stuck in the server's or the
/// network's queue).
pub fn undo_unknown(shared: &Shared, undo: impl Fn() -> Undo) {
    spawn_undo(undo());
    let overdue = shared.node.overdue_calls();
    if !overdue.is_empty() {
        let again = undo();
        runtime::spawn(async move {
            overdue.settle(again.horizon).await;
            spawn_undo(again);
        });
    }
}

/// Sends `undo` again once a direct call that timed out has been answered (or its connection
/// ended): the call may run later than an undo sent on another connection.
fn undo_once_settled(overdue: Overdue, undo: Undo) {
    if let Ok(handle) = runtime::handle() {
        handle.spawn_blocking(move || {
            overdue.settle(undo.horizon);
            spawn_undo(undo);
        });
    }
}

/// How many attempts waiting acquires made, through the runtime or on the caller's thread
/// (`compete_listening`); first attempts are not counted. For tests (see `waiting_attempts`).
static ON_RUNTIME: AtomicU64 = AtomicU64::new(0);

/// Attempts made by waiting acquires (`compete`) in this process so far; first attempts are not
/// counted.
pub fn waiting_attempts() -> u64 {
    ON_RUNTIME.load(Ordering::Relaxed)
}

/// One attempt of a waiting acquire (which takes or refreshes the waiter's place, if it keeps
/// one), through the runtime.
async fn attempt_waiting<C: Contender>(contender: &C) -> Result<Outcome<C::Grant>> {
    ON_RUNTIME.fetch_add(1, Ordering::Relaxed);
    contender.attempt(true).await
}

/// Runs `undo` in the background until Redis has answered it, retrying with backoff while it
/// cannot be reached, so an orphan does not outlive a short outage by a whole lease.
pub fn spawn_undo(mut undo: Undo) {
    let until = Instant::now() + undo.horizon;
    runtime::spawn(async move {
        let mut pause = Duration::from_millis(50);
        loop {
            if (undo.step)().await.is_ok() || Instant::now() + pause >= until {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    });
}

/// One waiter's attempts on one primitive, for one token.
pub trait Contender: Sync {
    type Grant: Send;
    /// What the first attempt's step replies.
    type Reply;

    /// The step of a first attempt (it never takes a place in a queue): the direct path sends
    /// it on the caller's thread, then reads its reply with `read`.
    fn first_step(&self) -> Step<Self::Reply>;

    /// What an attempt's reply means; `sent_at`: when the attempt was sent.
    fn read(&self, reply: Self::Reply, sent_at: Instant) -> Result<Outcome<Self::Grant>>;

    /// One attempt. `join` is false for the first try (never take a place in a queue) and true
    /// while waiting (take or refresh the waiter's place, if the primitive keeps one).
    fn attempt(&self, join: bool) -> impl Future<Output = Result<Outcome<Self::Grant>>> + Send;

    /// Whether a wait that the blocking caller's thread drives may listen for itself and
    /// attempt on the caller's direct connection (`compete_listening`, with `waiting_step`);
    /// false (the default): it goes through the hub and the runtime.
    fn waits_on_own_thread(&self) -> bool {
        false
    }

    /// The step of an attempt while waiting (as `attempt(true)`) when `waits_on_own_thread`;
    /// called only when the step will be sent.
    fn waiting_step(&self) -> Option<Step<Self::Reply>> {
        None
    }

    /// The hold that a grant published for this waiter's token gives it (a fair lock's release
    /// hands the lock on by itself), or None when the grant is stale (it came before one of the
    /// waiter's attempts that found the lock not its own) or the primitive has no grants.
    fn granted(&self, _note: GrantNote) -> Option<Self::Grant> {
        None
    }

    /// Whether `first_step_joining` takes the waiter's place in the queue (a primitive whose
    /// waiters keep one), so that a wait may trust that first attempt without looking again.
    fn joins_first(&self) -> bool {
        false
    }

    /// The step of a first attempt by a waiter that listens already and will wait when refused
    /// (`listen_early`): it takes the waiter's place if `joins_first`.
    fn first_step_joining(&self) -> Step<Self::Reply> {
        self.first_step()
    }

    /// What this waiter's attempts taught it that a later contender for the same token must
    /// know to take a grant (the fair lock: when its last refused attempt was sent, and the
    /// fence it saw); `resume` hands it on.
    fn memo(&self) -> Option<(Instant, i64)> {
        None
    }

    fn resume(&self, _memo: Option<(Instant, i64)>) {}

    /// How long the waiter's place in a Redis queue lasts unless refreshed (`plan.queued`); the
    /// wait refreshes it every third.
    fn place(&self) -> Duration {
        QUEUE_PLACE
    }

    /// Gives up a waiter's place at once (called only when the plan says `queued`).
    fn leave(&self) -> impl Future<Output = Result<()>> + Send;

    /// Best-effort undo of an attempt whose outcome is unknown: give back whatever the token may
    /// hold or occupy. Runs detached, after the caller is gone.
    fn undo(&self) -> Undo;

    /// Channels beside the plan's on which releases wake this waiter too (a MultiLock listens
    /// on the channel of each of its names); none by default.
    fn other_channels(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
}

/// How an attempt treats the primitive's queue, if it keeps one: a first try (`join` false)
/// never takes a place; an attempt while waiting takes or refreshes it.
pub fn queueing(join: bool) -> Queueing {
    if join {
        join_for(QUEUE_PLACE)
    } else {
        Queueing::TryOnly
    }
}

/// An attempt while waiting that takes or refreshes a place lasting `place`.
pub fn join_for(place: Duration) -> Queueing {
    Queueing::Join {
        place_ms: lease::lease_ms(place),
    }
}

/// The outcome of an attempt that a primitive answers with an `Admission` (a semaphore, a
/// read-write lock): granted, the lease started when the attempt was sent.
pub fn admission(admission: Admission, sent_at: Instant) -> Outcome<Instant> {
    match admission {
        Admission::Admitted { .. } => Outcome::Granted(sent_at),
        Admission::Busy { retry_ms } => Outcome::Busy { retry_ms },
    }
}

/// One attempt from the runtime: sends `step` and reads its reply with `Contender::read`.
pub async fn attempt_step<C: Contender>(
    contender: &C,
    shared: &Shared,
    step: &Step<C::Reply>,
) -> Result<Outcome<C::Grant>> {
    let sent_at = Instant::now();
    let reply = executor::run(shared, step).await?;
    contender.read(reply, sent_at)
}

/// How a primitive's waiters wait.
pub struct Plan<'a> {
    pub shared: &'a Arc<Shared>,
    /// The channel on which releases publish.
    pub channel: Vec<u8>,
    /// The channel on which this waiter alone is told of grants (a fair lock), if any.
    pub inbox: Option<Vec<u8>>,
    /// Some(token): woken only by messages naming this token or nobody (''); None: by every one.
    pub wake_token: Option<&'a str>,
    /// Some(id): only one waiter per id in this process competes in Redis at a time; the others
    /// queue in process, in FIFO order (Redis work per hand-off grows with processes, not threads).
    /// The id is the full Redis key the competitors contend for (`protocol::keys`), never a bare
    /// name: keys of different primitives differ by their suffix, so no two primitives share a
    /// gate, even when one's name spells out the other's key. (A semaphore adds its limit:
    /// `Keys::semaphore_gate`.)
    pub gate: Option<Vec<u8>>,
    /// The waiter keeps a place in Redis (a queue entry or a waiting-writer mark) that it must
    /// refresh while it waits and give back when it gives up.
    pub queued: bool,
}

/// What a waiter listens with, made and found subscribed before its first attempt was sent
/// (`listen_early`).
pub struct Early {
    heard: Heard,
    /// The process's turn to compete (a gated plan that keeps a place: only the competitor may
    /// take one), taken before the first attempt.
    turn: Option<Turn>,
}

enum Heard {
    /// Registrations on the hub: the wake channel and, for grants, the inbox.
    Hub {
        wake: Registration,
        inbox: Option<Registration>,
    },
    /// The blocking caller's own listener, subscribed to both (`listener.rs`).
    Own(Borrowed),
}

/// A listener taken from the pool, given back when dropped unused (the first attempt settled
/// the acquire, or the wait did not start).
struct Borrowed {
    listener: Option<Listener>,
    shared: Arc<Shared>,
}

impl Borrowed {
    fn take(mut self) -> Option<Listener> {
        self.listener.take()
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.take() {
            self.shared.direct.give_back_listener(listener);
        }
    }
}

/// One competitor's turn at a gate (see `Plan::gate`).
type Turn = tokio::sync::OwnedMutexGuard<GateState>;

/// Registers a waiter before its first attempt is sent. Some when its channels are subscribed
/// on the live connection already: every release after that attempt then notifies these
/// registrations, so the wait may trust the attempt's answer instead of looking again once
/// subscribed (`acquire_from`'s `early`). A waiter that keeps a place in a queue must take it
/// with that attempt (`Contender::joins_first`, `first_step_joining`); None when it cannot, or
/// when the channels are not subscribed yet (nothing to gain). With a gate, only the process's
/// competitor keeps a place: the waiter takes the turn now if nobody of this process competes,
/// else it does not listen early (its first attempt must not join; it waits for its turn). It
/// also does not unless `busy_likely` (the caller's previous first attempt found it taken):
/// when the lock is likely free, the plain first attempt is the cheaper one (an unfair lock's).
pub fn listen_early<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    busy_likely: bool,
    own_thread: bool,
) -> Option<Early> {
    let gated = plan.gate.is_some() && plan.queued;
    if (plan.queued && !contender.joins_first()) || (gated && !busy_likely) {
        return None;
    }
    let turn = match &plan.gate {
        Some(id) if gated => Some(plan.shared.locals.get::<Gate>(id).try_lock_owned().ok()?),
        _ => None,
    };
    if let Some(listener) = own_thread
        .then(|| listening_already(contender, plan))
        .flatten()
    {
        return Some(Early {
            heard: Heard::Own(Borrowed {
                listener: Some(listener),
                shared: plan.shared.clone(),
            }),
            turn,
        });
    }
    let hub = &plan.shared.hub;
    let wake = hub.register(plan.channel.clone(), plan.wake_token);
    let inbox = plan
        .inbox
        .as_ref()
        .map(|channel| hub.register(channel.clone(), plan.wake_token));
    let ready = wake.is_ready() && inbox.as_ref().map_or(true, Registration::is_ready);
    if !ready {
        return None;
    }
    Some(Early {
        heard: Heard::Hub { wake, inbox },
        turn,
    })
}

/// The channels a waiter of `plan` listens on: the wake channel, and the inbox if any.
fn channels_of(plan: &Plan<'_>) -> Vec<Vec<u8>> {
    std::iter::once(plan.channel.clone())
        .chain(plan.inbox.clone())
        .collect()
}

/// An idle listener of this process subscribed to `plan`'s channels already (an earlier wait's
/// on the same name), for a waiter whose wait its blocking caller's thread will drive
/// (`Contender::waits_on_own_thread`); it has dropped what it heard before now.
fn listening_already<C: Contender>(contender: &C, plan: &Plan<'_>) -> Option<Listener> {
    if !contender.waits_on_own_thread() || !contender.other_channels().is_empty() {
        return None;
    }
    let channels = channels_of(plan);
    let mut listener = plan.shared.direct.idle_listener_on(&channels)?;
    listener.listen(&channels, None).ok()?;
    Some(listener)
}

/// Whether another waiter of this process competes at `plan`'s gate now, keeping a place in
/// Redis: a new waiter would only queue in process behind it (see `Plan::gate`), so its first
/// attempt can tell it nothing worth a round trip (the lock is held, or granted to that waiter).
pub fn behind_own_competitor(plan: &Plan<'_>) -> bool {
    plan.queued
        && plan
            .gate
            .as_ref()
            .is_some_and(|id| plan.shared.locals.get::<Gate>(id).try_lock().is_err())
}

/// Sends `undo` if dropped while armed.
struct Cleanup<'a, C: Contender> {
    contender: &'a C,
    shared: &'a Arc<Shared>,
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
            undo_unknown(self.shared, || self.contender.undo());
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
    acquire_from(contender, plan, wait, None, None, None).await
}

/// `acquire`, given the outcome of a first attempt already made for this contender (on the
/// caller's thread, see `direct.rs`); None makes that first attempt here. `early`: the waiter's
/// registrations, subscribed before that first attempt was sent (`listen_early`; the attempt
/// took the waiter's place if it keeps one), or, when the first attempt is made here, before it
/// goes out (it then joins, as `Contender::first_step_joining` does). `found_busy`: where to
/// note whether a first attempt made here found the primitive taken.
pub async fn acquire_from<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
    first: Option<Outcome<C::Grant>>,
    early: Option<Early>,
    found_busy: Option<&AtomicBool>,
) -> Result<Option<C::Grant>> {
    let acquiring = acquire_within(contender, plan, wait, first, early, found_busy);
    match wait.gives_up_at() {
        // A call that a cluster keeps refusing (nothing ran) is not retried past the deadline:
        // the acquire gives up then. `Cleanup` gave back whatever an earlier try may have taken.
        Some(at) => match giving_up_at(at, acquiring).await {
            Err(err) if gave_up_at_deadline(&err) => Ok(None),
            done => done,
        },
        None => acquiring.await,
    }
}

async fn acquire_within<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
    first: Option<Outcome<C::Grant>>,
    early: Option<Early>,
    found_busy: Option<&AtomicBool>,
) -> Result<Option<C::Grant>> {
    let cleanup = Cleanup {
        contender,
        shared: plan.shared,
        armed: true,
    };
    let (first, early) = match first {
        Some(outcome) => (outcome, early),
        None => match contender.attempt(early.is_some()).await {
            Ok(outcome) => {
                if let Some(flag) = found_busy {
                    flag.store(matches!(outcome, Outcome::Busy { .. }), Ordering::Relaxed);
                }
                (outcome, early)
            }
            // Other errors leave `cleanup` armed: the script may have run.
            Err(err) => {
                if err.took_nothing() {
                    cleanup.disarm();
                }
                return Err(err);
            }
        },
    };
    match first {
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
    // What the first attempt found holds until a release notifies the early registrations.
    let early = match (first, early) {
        (Outcome::Busy { retry_ms }, Some(early)) => {
            let now = Instant::now();
            let until =
                (retry_ms >= 0).then(|| now + lease::next_look(retry_ms, NO_HINT_LOOK, None, now));
            Some((early, until))
        }
        _ => None,
    };
    // (With early registrations the wait gives up by itself, leaving a place it took.)
    if early.is_none() && wait.expired(Instant::now()) {
        cleanup.disarm();
        return Ok(None);
    }
    let waited = wait_for_turn(contender, plan, wait, early).await;
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

/// What the in-process competitors of one id hand on to each other through the gate, so that a
/// waiter taking over does not ask Redis again what the one before it already learned.
#[derive(Default)]
pub struct GateState {
    /// The previous competitor's subscription: a wake-up that came while nobody waited on it is
    /// kept there (as a stored notification), so the next competitor still hears it.
    registration: Option<(Vec<u8>, Registration)>,
    /// Until when Redis said it stays busy, as of the previous competitor's last attempt.
    busy_until: Option<Instant>,
}

/// Only one competitor per id in this process: the others wait here, in FIFO order.
pub type Gate = tokio::sync::Mutex<GateState>;

async fn wait_for_turn<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
    mut early: Option<(Early, Option<Instant>)>,
) -> Result<Option<C::Grant>> {
    let taken = early.as_mut().and_then(|(early, _)| early.turn.take());
    let gate = plan
        .gate
        .as_deref()
        .filter(|_| taken.is_none())
        .map(|id| plan.shared.locals.get::<Gate>(id));
    let mut turn = match gate {
        Some(gate) => match wait.deadline() {
            None => Some(gate.lock_owned().await),
            Some(d) => match tokio::time::timeout_at(d.into(), gate.lock_owned()).await {
                Ok(turn) => Some(turn),
                Err(_) => return Ok(None),
            },
        },
        None => taken,
    };
    // A subscription can be handed on only when it wakes on every message (no token filter).
    let inherited = match (&mut turn, plan.wake_token) {
        (Some(state), None) => match state.registration.take() {
            Some((channel, registration)) if channel == plan.channel => {
                Some((registration, state.busy_until.take()))
            }
            _ => None,
        },
        _ => None,
    };
    // A registration handed on through the gate has heard everything since the competitor
    // before looked; an early one, everything since this waiter's first attempt.
    let heard = early.map(|(early, until)| (early.heard, until));
    let (registration, inbox, mut busy_until, mut own) = match (inherited, heard) {
        // (An early listener of this thread goes back to the pool, see `Borrowed`.)
        (Some((registration, until)), _) => (Some(registration), None, until, None),
        (None, Some((Heard::Hub { wake, inbox }, until))) => (Some(wake), inbox, until, None),
        (None, Some((Heard::Own(borrowed), until))) => {
            (None, None, None, borrowed.take().map(|l| (l, until)))
        }
        (None, None) => (None, None, None, None),
    };
    // A blocking caller that drives its own wait, with nothing heard through the hub, listens
    // on its own connection (see `listener.rs`).
    if registration.is_none()
        && executor::on_caller_thread()
        && contender.waits_on_own_thread()
        && contender.other_channels().is_empty()
    {
        let listening = match own.take() {
            Some(early) => Some(early),
            // (Its handshake's reads must not run Python's signal handlers here, inside the
            // runtime: see `compete_listening`.) None could be made (the server refuses more
            // clients, no file descriptor left): the hub serves the wait.
            // A server that stayed unreachable while the listener waited out its restart
            // (`connect::Restart`): the hub would only wait once more, the wait fails now.
            None => match interrupt::unwatched(|| plan.shared.direct.listener(false)) {
                Some(Ok(made)) => Some((made, None)),
                Some(Err(err)) if err.is_restarting() => return Err(err),
                Some(Err(_)) | None => None,
            },
        };
        if let (Some((listener, until)), Some(step)) = (listening, contender.waiting_step()) {
            match compete_listening(contender, plan, wait, &step, listener, until).await? {
                Listened::Ended(outcome) => return Ok(outcome),
                // The hub's registration comes after the last look: it looks again first.
                Listened::Unheard => busy_until = None,
            }
        }
    }
    // (Not on the caller's thread after all: the hub serves the wait, which looks first.)
    if let Some((listener, _)) = own {
        plan.shared.direct.give_back_listener(listener);
    }
    let registration = match registration {
        Some(registration) => registration,
        None => plan
            .shared
            .hub
            .register(plan.channel.clone(), plan.wake_token),
    };
    let inbox = inbox.or_else(|| {
        plan.inbox
            .as_ref()
            .map(|channel| plan.shared.hub.register(channel.clone(), plan.wake_token))
    });
    let others: Vec<Registration> = contender
        .other_channels()
        .into_iter()
        .map(|channel| plan.shared.hub.register(channel, plan.wake_token))
        .collect();
    let registrations = Registrations {
        wake: &registration,
        inbox: inbox.as_ref(),
        others: &others,
    };
    let outcome = compete(contender, plan, wait, &registrations, &mut busy_until).await;
    if let (Some(state), None) = (&mut turn, plan.wake_token) {
        state.registration = Some((plan.channel.clone(), registration));
        state.busy_until = match outcome {
            Ok(None) => busy_until,
            _ => None,
        };
    }
    outcome
}

/// A waiter's places on the wake channel and, for grants, on its inbox (and on the contender's
/// other channels, if any).
struct Registrations<'a> {
    wake: &'a Registration,
    inbox: Option<&'a Registration>,
    others: &'a [Registration],
}

impl Registrations<'_> {
    async fn ready(&self) -> Result<()> {
        self.wake.ready().await?;
        if let Some(inbox) = self.inbox {
            inbox.ready().await?;
        }
        for other in self.others {
            other.ready().await?;
        }
        Ok(())
    }

    async fn notified(&self) {
        if !self.others.is_empty() {
            let all = std::iter::once(self.wake)
                .chain(self.inbox)
                .chain(self.others)
                .map(|r| Box::pin(r.notified()));
            futures_util::future::select_all(all).await;
            return;
        }
        match self.inbox {
            None => self.wake.notified().await,
            Some(inbox) => tokio::select! {
                _ = self.wake.notified() => {}
                _ = inbox.notified() => {}
            },
        }
    }

    fn take_grant(&self) -> Option<GrantNote> {
        let inbox = self.inbox.and_then(Registration::take_grant);
        inbox.or_else(|| self.wake.take_grant())
    }
}

/// The longest read of a listening wait (`compete_listening`) before it yields: the binding
/// blocks on the wait in slices of its own and runs Python's signal handlers between them,
/// outside the runtime (`python::blocking`), which it can do only when the wait yields.
const LISTEN_SLICE: Duration = Duration::from_millis(50);

/// How a listening wait (`compete_listening`) ended.
enum Listened<G> {
    /// As a wait ends: granted, or not (refused, or the deadline came).
    Ended(Option<G>),
    /// Without a listener: none could be had (the server refuses more clients, no file
    /// descriptor left), the hub serves the rest of the wait.
    Unheard,
}

/// `compete` on the blocking caller's own thread, listening on its own subscriber connection
/// (`listener.rs`) and attempting on its direct connection (`step`): a wake-up costs the
/// caller one thread wake-up (the read returning), not two (the hub's runtime thread, then the
/// caller). Subscribed before each look, so a release after the look is always heard; a
/// broken listener makes the waiter look again on a new one; the server's hint and the
/// deadline bound each read. Its reads and attempts block this thread without asking
/// `interrupt` (that would run Python's signal handlers inside the runtime): it reads in
/// slices and yields between them, so that Ctrl-C, handled by the binding, drops the wait
/// (whatever the waiter may hold is given back, see `Cleanup`; the listener goes back to the
/// pool, see `Borrowed`).
async fn compete_listening<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
    step: &Step<C::Reply>,
    listener: Listener,
    busy_until: Option<Instant>,
) -> Result<Listened<C::Grant>> {
    let shared = plan.shared;
    let channels = channels_of(plan);
    let token = plan.wake_token.map(str::as_bytes);
    let inv = executor::script_of(step)?;
    let deadline = match wait {
        Wait::Until(deadline) => Some(deadline),
        Wait::Once | Wait::Forever => None,
    };
    let mut held = Borrowed {
        listener: Some(listener),
        shared: shared.clone(),
    };
    // Busy as the first attempt found, and the listener has heard everything since (see
    // `listen_early`): no need to look before a wake-up.
    let mut busy_until = busy_until;
    'look: loop {
        let now = Instant::now();
        let retry_ms = match busy_until.take().filter(|until| *until > now) {
            Some(until) => i64::try_from((until - now).as_millis()).unwrap_or(i64::MAX),
            None => {
                // Subscribed before looking, so a release after the look is always heard.
                let heard = interrupt::unwatched(|| match held.listener.take() {
                    Some(mut heard) => match heard.listen(&channels, deadline) {
                        Ok(()) => Ok(heard),
                        // One that failed is dropped, with the idle ones (the server closed
                        // them): one new connection is tried.
                        Err(_) => listen_fresh(shared, &channels, deadline),
                    },
                    None => listen_fresh(shared, &channels, deadline),
                });
                let heard = match heard {
                    Ok(heard) => heard,
                    // Unreachable for the whole restart window (see above): fails the wait.
                    Err(err) if err.is_restarting() => return Err(err),
                    Err(_) => return Ok(Listened::Unheard),
                };
                held.listener = Some(heard);
                ON_RUNTIME.fetch_add(1, Ordering::Relaxed);
                let sent_at = Instant::now();
                let give_up = deadline.map(GiveUp::at);
                let sent = interrupt::unwatched(|| executor::invoke_direct(shared, inv, give_up));
                let reply = match sent {
                    Ok(reply) => reply,
                    // `Cleanup` gives back whatever it may have taken; once more after a
                    // timed-out call has been answered.
                    Err((err, overdue)) => {
                        if let Some(overdue) = overdue {
                            undo_once_settled(overdue, contender.undo());
                        }
                        return Err(err);
                    }
                };
                match contender.read(step.parse(reply)?, sent_at)? {
                    Outcome::Granted(grant) => return Ok(Listened::Ended(Some(grant))),
                    Outcome::Refused => return Ok(Listened::Ended(None)),
                    Outcome::Busy { retry_ms } => retry_ms,
                }
            }
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(Listened::Ended(None));
        }
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if plan.queued {
            // Refresh the place well before it lapses.
            nap = nap.min(contender.place() / 3);
        }
        let until = now + nap;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let message = if left.is_zero() {
                None
            } else {
                // The binding's chance to run signal handlers (and the deadline's to drop the
                // wait) before this thread blocks again.
                tokio::task::yield_now().await;
                let Some(heard) = held.listener.as_mut() else {
                    continue 'look;
                };
                match interrupt::unwatched(|| heard.next_message(left.min(LISTEN_SLICE))) {
                    Ok(message) => message,
                    // Broken: look again, listening on a new connection.
                    Err(_) => {
                        held.listener = None;
                        continue 'look;
                    }
                }
            };
            let Some(message) = message else {
                if Instant::now() < until {
                    continue;
                }
                // Our own deadline: give up without one more look (a grant that comes now is
                // given back by the leave).
                if wait.expired(Instant::now()) {
                    return Ok(Listened::Ended(None));
                }
                continue 'look;
            };
            if !channels.contains(&message.channel) {
                continue;
            }
            let wake = parse_wake(&message.payload);
            if !meant_for(wake, token) {
                continue;
            }
            // A grant: the lock is ours already, no need to look.
            if let (Some(_), WakeMessage::Grant { note, .. }) = (token, wake) {
                if let Some(grant) = contender.granted(note) {
                    return Ok(Listened::Ended(Some(grant)));
                }
            }
            continue 'look;
        }
    }
}

/// A new listener on `shared`'s server (the idle ones forgotten), subscribed to `channels`.
fn listen_fresh(
    shared: &Shared,
    channels: &[Vec<u8>],
    within: Option<Instant>,
) -> Result<Listener> {
    let mut listener = shared
        .direct
        .listener(true)
        .ok_or_else(|| Error::Usage("no subscriber connection of this thread here".into()))??;
    listener.listen(channels, within)?;
    Ok(listener)
}

/// The competitor's loop: look, then sleep until a wake-up or the server's hint comes due.
/// `busy_until`: what is known of the primitive without looking (from the competitor before).
async fn compete<C: Contender>(
    contender: &C,
    plan: &Plan<'_>,
    wait: Wait,
    registration: &Registrations<'_>,
    busy_until: &mut Option<Instant>,
) -> Result<Option<C::Grant>> {
    loop {
        let now = Instant::now();
        let known_busy = busy_until.filter(|until| *until > now);
        let retry_ms = match known_busy {
            // Busy as far as anybody here knows, and no wake-up since: no need to look.
            Some(until) => i64::try_from((until - now).as_millis()).unwrap_or(i64::MAX),
            None => {
                // Subscribed before looking, so a release after the look is always heard.
                registration.ready().await?;
                match attempt_waiting(contender).await? {
                    Outcome::Granted(grant) => return Ok(Some(grant)),
                    Outcome::Refused => return Ok(None),
                    Outcome::Busy { retry_ms } => retry_ms,
                }
            }
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(None);
        }
        let hint = lease::next_look(retry_ms, NO_HINT_LOOK, None, now);
        *busy_until = (retry_ms >= 0).then(|| now + hint);
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if plan.queued {
            // Refresh the place well before it lapses.
            nap = nap.min(contender.place() / 3);
        }
        tokio::select! {
            _ = registration.notified() => {
                // A grant: the lock is ours already, no need to look.
                if let Some(grant) = registration.take_grant().and_then(|n| contender.granted(n)) {
                    return Ok(Some(grant));
                }
                *busy_until = None;
            }
            _ = tokio::time::sleep(nap) => {
                if let Some(grant) = registration.take_grant().and_then(|n| contender.granted(n)) {
                    return Ok(Some(grant));
                }
                // Our own deadline: give up without one more look (a grant that comes now is
                // given back by the leave).
                if wait.expired(Instant::now()) {
                    return Ok(None);
                }
                if plan.queued {
                    *busy_until = None;
                }
            }
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
