//! The state a hold shares with its renewal task: its deadline, and whether it was lost or is
//! being released.
//!
//! The deadline is what this process may count on, never later than Redis's lease. Extends of
//! one hold can be under way at once on different connections (the renewal task's and the
//! caller's), and their answers can be read in another order than Redis ran them: an extend
//! moves the deadline to its own end only when it was sent after every answered extend's answer
//! was read (so Redis ran it after them); otherwise Redis may have run it first or last, and the
//! earlier of the two ends is kept. While an extend is unanswered, the deadline is at most the
//! end it would set (a shortening extend may already have run), and one that gets no answer
//! leaves it there: its request may still run late (held back by the network) within the
//! time the nodes keep a timed-out call's connection (`node::OVERDUE_KEEP`), so until then no
//! answer of another extend moves the deadline past that end either.
//!
//! The caller's extend is what the lease should be: renewal never asks for less than the end the
//! caller's latest extend asked for. A renewal extend already on its way when the caller's began
//! may still run after it in Redis and cut that lease back; renewal then extends again at once
//! (`renewal_answered`), and the caller's extend, on its own thread, waits for that before it
//! returns (`wait_for_renewal`), so that the lease it asked for is the one in Redis.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::node::OVERDUE_KEEP;

/// The deadline, with what decides how the next answer may move it.
#[derive(Debug)]
struct Deadline {
    /// What the answered extends (and the grant) allow.
    settled: Instant,
    /// When the latest answer (of the grant or an extend) was read, or an unanswered extend
    /// was given up.
    answered_at: Instant,
    /// Until when a shortening extend that got no answer may still run in Redis.
    late_until: Option<Instant>,
    /// The unanswered extends.
    pending: Vec<Pending>,
    next_id: u64,
    /// The caller's latest extend: its id (extends are numbered in the order they begin), and
    /// the end it asked for.
    asked: Option<(u64, Instant)>,
    /// A renewal extend may have cut the caller's lease back, and renewal extends again.
    renewing_again: bool,
}

#[derive(Debug)]
struct Pending {
    id: u64,
    /// The end it would set.
    end: Instant,
}

impl Deadline {
    fn effective(&self) -> Instant {
        self.pending
            .iter()
            .fold(self.settled, |earliest, p| earliest.min(p.end))
    }

    /// An answer to an extend begun at `begun_at` (before its request went out): the lease
    /// ends at `end` (with `at_least`: no earlier than that) if Redis ran it after every
    /// answered extend (see the module's note).
    fn settle(&mut self, begun_at: Instant, end: Instant, at_least: bool) {
        let late_one_may_follow = self.late_until.is_some_and(|until| begun_at < until);
        let ran_last = begun_at > self.answered_at && !late_one_may_follow;
        self.settled = match (ran_last, at_least) {
            (true, false) => end,
            (true, true) => self.settled.max(end),
            (false, false) => self.settled.min(end),
            (false, true) => self.settled,
        };
        self.answered_at = self.answered_at.max(Instant::now());
    }

    fn take_pending(&mut self, id: u64) -> Option<Instant> {
        let at = self.pending.iter().position(|p| p.id == id)?;
        Some(self.pending.swap_remove(at).end)
    }

    /// Whether an extend begun before extend `id` is unanswered, or renewal extends again.
    fn renewal_unsettled(&self, id: u64) -> bool {
        self.renewing_again || self.pending.iter().any(|p| p.id < id)
    }

    /// Registers an extend that would end the lease at `end`, under its id.
    fn begin(&mut self, end: Instant) -> (u64, Instant) {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push(Pending { id, end });
        (id, Instant::now())
    }
}

/// An extend under way (`HoldStatus::begin_extend`): settle it with `answered`; dropped
/// unanswered, it leaves the deadline no later than the end it would have set.
#[derive(Debug)]
pub struct PendingExtend {
    status: Arc<HoldStatus>,
    id: u64,
    /// When it was begun, before its request went out.
    begun_at: Instant,
    settled: bool,
    /// Renewal's extend again after one that may have cut the caller's lease back.
    again: bool,
}

impl PendingExtend {
    /// Redis answered: the lease now ends at `end`.
    pub fn answered(self, end: Instant) {
        self.settle(end, false);
    }

    /// Renewal's extend was answered (as `answered`): true when the caller's extend, begun
    /// after it was, asked for a later end, which this one may have cut back (Redis may have
    /// run the two in either order): renewal must extend again at once, to that end.
    pub fn renewal_answered(self, end: Instant) -> bool {
        self.settle(end, true)
    }

    /// Its number: extends are numbered in the order they begin.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn settle(mut self, end: Instant, renewal: bool) -> bool {
        self.settled = true;
        let mut deadline = self.status.lock_deadline();
        deadline.take_pending(self.id);
        deadline.settle(self.begun_at, end, false);
        let id = self.id;
        // Under the same lock as the answer, so that a caller waiting for renewal never sees
        // it settled in between.
        let again = renewal
            && deadline
                .asked
                .is_some_and(|(asked_id, asked_end)| asked_id > id && asked_end > end);
        deadline.renewing_again = again || (deadline.renewing_again && !self.again);
        self.status.settled.notify_all();
        again
    }
}

impl Drop for PendingExtend {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut deadline = self.status.lock_deadline();
        deadline.renewing_again &= !self.again;
        self.status.settled.notify_all();
        if let Some(end) = deadline.take_pending(self.id) {
            if end < deadline.settled {
                deadline.settled = end;
                let until = self.begun_at + OVERDUE_KEEP;
                deadline.late_until = Some(deadline.late_until.map_or(until, |u| u.max(until)));
            }
            // An extend begun before now and answered after may have run before this one.
            deadline.answered_at = deadline.answered_at.max(Instant::now());
        }
    }
}

/// Shared between a hold and its renewal task.
#[derive(Debug)]
pub struct HoldStatus {
    deadline: Mutex<Deadline>,
    /// Told whenever an extend settles (answered or given up).
    settled: Condvar,
    lost: AtomicBool,
    /// A release of this hold is under way (`begin_release`): another is refused meanwhile, so
    /// that its "not ours" (the first one's delete) is not taken for a loss.
    release_under_way: AtomicBool,
    /// When the first release of this hold that got no answer was sent: it may have deleted
    /// the token, so a later release's "not ours" may be its work (see `hold::resent_own`).
    unanswered_release: Mutex<Option<Instant>>,
    /// Set once a release was attempted, and never cleared: renewal stops for good (a release
    /// that failed must not leave the lease renewed for as long as the object lives; it ends by
    /// itself within the ttl), and no "not ours" it hears from then on is a loss.
    releasing: AtomicBool,
    /// The run_id of the server incarnation known when the hold was granted (None: unknown).
    pub(super) run_id: Option<Arc<str>>,
    /// On Redlock, the run_id each master last reported when the hold was granted (see
    /// `redlock::Granted`); empty on one server.
    pub(super) masters_run_ids: Vec<Option<Arc<str>>>,
    /// Told when the caller moved the deadline (`extend`): the renewal task plans again.
    moved: tokio::sync::Notify,
    /// The hold count (`Hold::depth`, kept in step with it): what a re-entry that did not count
    /// sets the count in Redis back to, from the background, when that runs.
    depth: AtomicU32,
    /// Set while a step that sets the hold count in Redis is under way (`NestTurn`).
    nesting: Mutex<bool>,
    /// Told when `nesting` is cleared: a blocked caller's thread, and the runtime's waiters.
    nesting_over: Condvar,
    nesting_over_async: tokio::sync::Notify,
}

/// One step that sets the hold count in Redis (a re-entry, a nested release, a count set back):
/// one at a time per hold, from its send until the holder's count says what it did. A count
/// set back reads the holder's count once no step is under way, so it never overwrites the
/// count of a step whose answer had not come yet, and a step never overtakes it.
pub struct NestTurn<'a>(&'a HoldStatus);

impl Drop for NestTurn<'_> {
    fn drop(&mut self) {
        *self.0.nesting.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.0.nesting_over.notify_all();
        self.0.nesting_over_async.notify_waiters();
    }
}

impl HoldStatus {
    pub fn new(deadline: Instant) -> Self {
        HoldStatus {
            deadline: Mutex::new(Deadline {
                settled: deadline,
                answered_at: Instant::now(),
                late_until: None,
                pending: Vec::new(),
                next_id: 0,
                asked: None,
                renewing_again: false,
            }),
            settled: Condvar::new(),
            lost: AtomicBool::new(false),
            release_under_way: AtomicBool::new(false),
            unanswered_release: Mutex::new(None),
            releasing: AtomicBool::new(false),
            run_id: None,
            masters_run_ids: Vec::new(),
            moved: tokio::sync::Notify::new(),
            depth: AtomicU32::new(1),
            nesting: Mutex::new(false),
            nesting_over: Condvar::new(),
            nesting_over_async: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn granted_on(deadline: Instant, run_id: Option<Arc<str>>) -> Self {
        HoldStatus {
            run_id,
            ..HoldStatus::new(deadline)
        }
    }

    /// A hold granted by Redlock masters that last reported `run_ids`.
    pub(super) fn granted_on_masters(deadline: Instant, run_ids: Vec<Option<Arc<str>>>) -> Self {
        HoldStatus {
            masters_run_ids: run_ids,
            ..HoldStatus::new(deadline)
        }
    }

    fn lock_deadline(&self) -> std::sync::MutexGuard<'_, Deadline> {
        self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Until when the hold is surely ours (see the module's note).
    pub fn deadline(&self) -> Instant {
        self.lock_deadline().effective()
    }

    /// An extend is about to be sent; if Redis runs it, the lease ends at `end` (reckoned from
    /// no later than its send). The library's extends are the caller's (`begin_caller_extend`)
    /// and renewal's (`begin_renewal`); the tests use this plain one.
    #[cfg(test)]
    pub fn begin_extend(self: &Arc<Self>, end: Instant) -> PendingExtend {
        let (id, begun_at) = self.lock_deadline().begin(end);
        self.pending_extend(id, begun_at)
    }

    /// The caller's extend is about to be sent (as `begin_extend`): from now on renewal asks
    /// for no earlier end than `end`.
    pub fn begin_caller_extend(self: &Arc<Self>, end: Instant) -> PendingExtend {
        let mut deadline = self.lock_deadline();
        let (id, begun_at) = deadline.begin(end);
        deadline.asked = Some((id, end));
        drop(deadline);
        self.pending_extend(id, begun_at)
    }

    /// Renewal's extend is about to be sent: for `lease` from now, or longer to keep what the
    /// hold counts on or what the caller's latest extend asked for (read under the same lock
    /// as the extend is registered, so that a caller's extend begun later is never missed).
    /// `again`: it puts back a lease that the last one may have cut (see `renewal_answered`).
    /// Returns it with the lease it asks for.
    pub fn begin_renewal(
        self: &Arc<Self>,
        lease: Duration,
        again: bool,
    ) -> (PendingExtend, Duration) {
        let mut deadline = self.lock_deadline();
        let now = Instant::now();
        let asked = deadline.asked.map_or(now, |(_, end)| end);
        let wanted = lease
            .max(deadline.effective().saturating_duration_since(now))
            .max(asked.saturating_duration_since(now));
        let (id, begun_at) = deadline.begin(crate::protocol::lease::deadline(now, wanted));
        drop(deadline);
        let mut pending = self.pending_extend(id, begun_at);
        pending.again = again;
        (pending, wanted)
    }

    fn pending_extend(self: &Arc<Self>, id: u64, begun_at: Instant) -> PendingExtend {
        PendingExtend {
            status: self.clone(),
            id,
            begun_at,
            settled: false,
            again: false,
        }
    }

    /// Whether the caller's latest extend is still unanswered.
    pub fn caller_extend_pending(&self) -> bool {
        let deadline = self.lock_deadline();
        deadline
            .asked
            .is_some_and(|(id, _)| deadline.pending.iter().any(|p| p.id == id))
    }

    /// Whether the caller's latest extend still waits for renewal (as `wait_for_renewal`
    /// would): for a caller that cannot block its thread, and looks again a little later.
    pub fn caller_extend_unsettled(&self) -> bool {
        let deadline = self.lock_deadline();
        let unsettled = deadline
            .asked
            .is_some_and(|(id, _)| deadline.renewal_unsettled(id));
        unsettled && !self.is_lost() && !self.is_releasing()
    }

    /// After the caller's extend `id` was answered: waits (up to `limit`, in slices that end
    /// early when `stop` says so) until no renewal extend begun before it is unanswered and
    /// renewal is not extending again (see the module's note).
    /// `stop` runs without the lock held: it may run Python's signal handlers, taking the GIL,
    /// and a thread holding the GIL may be waiting for the lock (`deadline()`, for
    /// `remaining()`), or be this thread's own signal handler calling it.
    pub fn wait_for_renewal(&self, id: u64, limit: Instant, stop: impl Fn() -> bool) {
        const SLICE: Duration = Duration::from_millis(50);
        let waits = |deadline: &Deadline| {
            deadline.renewal_unsettled(id) && !self.is_lost() && !self.is_releasing()
        };
        loop {
            if !waits(&self.lock_deadline()) {
                return;
            }
            let now = Instant::now();
            if now >= limit || stop() {
                return;
            }
            // Looked at again under the lock that the wait releases: a renewal settled since
            // the look above is not waited for.
            let deadline = self.lock_deadline();
            if !waits(&deadline) {
                return;
            }
            let wait = limit.saturating_duration_since(Instant::now()).min(SLICE);
            drop(
                self.settled
                    .wait_timeout(deadline, wait)
                    .unwrap_or_else(|p| p.into_inner()),
            );
        }
    }

    /// A re-entry begun at `begun_at` (before its request went out) was answered: the lease
    /// ends no earlier than `end`.
    pub fn answered_at_least(&self, begun_at: Instant, end: Instant) {
        self.lock_deadline().settle(begun_at, end, true);
    }

    /// The caller's `extend` moved the deadline: the renewal task (if any) plans its next
    /// extend again.
    pub fn deadline_was_moved(&self) {
        self.moved.notify_one();
    }

    /// Whether a release of this hold is under way (begun, not yet settled).
    pub fn is_release_under_way(&self) -> bool {
        self.release_under_way.load(Ordering::Acquire)
    }

    /// Begins a release; false when another is under way (see `release_under_way`).
    pub fn begin_release(&self) -> bool {
        !self.release_under_way.swap(true, Ordering::AcqRel)
    }

    /// A release sent at `sent_at` got no answer (the first such send is kept).
    pub fn release_unanswered(&self, sent_at: Instant) {
        let mut first = self
            .unanswered_release
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(sent_at);
    }

    /// When the first release of this hold that got no answer was sent, if one did.
    pub fn unanswered_release(&self) -> Option<Instant> {
        *self
            .unanswered_release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The release begun by `begin_release` has settled (whatever its outcome).
    pub fn end_release(&self) {
        self.release_under_way.store(false, Ordering::Release);
    }

    /// Resolves once the caller moved the deadline (see `move_deadline`).
    pub async fn deadline_moved(&self) {
        self.moved.notified().await;
    }

    /// The hold count as the holder last set it (see `set_depth`).
    pub fn depth(&self) -> u32 {
        self.depth.load(Ordering::SeqCst)
    }

    pub(super) fn set_depth(&self, depth: u32) {
        self.depth.store(depth, Ordering::SeqCst);
    }

    /// Whether a step that sets the hold count is under way: a blocking caller then waits for
    /// its turn through the runtime rather than on its own thread (`nest_turn_blocking`).
    pub(super) fn nest_busy(&self) -> bool {
        *self.nesting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The turn of a step that sets the hold count, waited for on the caller's own thread (only
    /// after `nest_busy` said no: a step that began since is the wait, one call at most).
    pub(super) fn nest_turn_blocking(&self) -> NestTurn<'_> {
        let mut busy = self.nesting.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            busy = self
                .nesting_over
                .wait(busy)
                .unwrap_or_else(|p| p.into_inner());
        }
        *busy = true;
        NestTurn(self)
    }

    /// `nest_turn_blocking`, waited for without blocking the thread.
    pub(super) async fn nest_turn(&self) -> NestTurn<'_> {
        loop {
            let over = self.nesting_over_async.notified();
            tokio::pin!(over);
            over.as_mut().enable();
            {
                let mut busy = self.nesting.lock().unwrap_or_else(|p| p.into_inner());
                if !*busy {
                    *busy = true;
                    return NestTurn(self);
                }
            }
            over.await;
        }
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

    pub fn set_releasing(&self) {
        self.releasing.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::HoldStatus;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_answer_read_after_a_later_extends_keeps_the_earlier_end() {
        let t0 = Instant::now();
        let status = Arc::new(HoldStatus::new(t0 + 10 * S));
        let tick = || std::thread::sleep(Duration::from_millis(2)); // the clock moves on
        tick();
        let renewal = status.begin_extend(t0 + 19 * S);
        tick();
        let shorten = status.begin_extend(t0 + S);
        assert_eq!(
            status.deadline(),
            t0 + S,
            "a shortening under way counts at once"
        );
        shorten.answered(t0 + S);
        // The renewal was begun before that answer was read: Redis may have run it first.
        renewal.answered(t0 + 19 * S);
        assert_eq!(status.deadline(), t0 + S);
        // An extend begun after every answer was read ran last in Redis: its end holds.
        tick();
        let later = Instant::now() + 9 * S;
        status.begin_extend(later).answered(later);
        assert_eq!(status.deadline(), later);
    }

    #[test]
    fn an_extend_without_an_answer_leaves_the_deadline_no_later_than_its_end() {
        let t0 = Instant::now();
        let status = Arc::new(HoldStatus::new(t0 + 10 * S));
        drop(status.begin_extend(t0 + S / 2));
        assert_eq!(status.deadline(), t0 + S / 2);
        drop(status.begin_extend(t0 + 20 * S));
        assert_eq!(
            status.deadline(),
            t0 + S / 2,
            "a longer one unanswered changes nothing"
        );
    }

    #[test]
    fn a_shortening_extend_without_an_answer_holds_back_later_answers_while_it_may_run() {
        let t0 = Instant::now();
        let status = Arc::new(HoldStatus::new(t0 + 10 * S));
        let longer = status.begin_extend(t0 + 10 * S);
        drop(status.begin_extend(t0 + S / 2)); // no answer: it may run after `longer`
        longer.answered(t0 + 10 * S);
        assert_eq!(status.deadline(), t0 + S / 2);
        // Begun after the failure, but while the lost request may still land: no later either.
        let next = Instant::now() + 20 * S;
        status.begin_extend(next).answered(next);
        assert_eq!(status.deadline(), t0 + S / 2);
    }

    #[test]
    fn a_renewal_that_may_have_cut_the_callers_extend_back_extends_again() {
        let t0 = Instant::now();
        let tick = || std::thread::sleep(Duration::from_millis(2));
        let status = Arc::new(HoldStatus::new(t0 + S));
        // Renewal sends an extend of the ttl; the caller's extend to 20 s goes out meanwhile.
        let (renewal, wanted) = status.begin_renewal(S, false);
        assert_eq!(wanted, S);
        let renewal_end = renewal.begun_at + S;
        tick();
        let caller_end = Instant::now() + 20 * S;
        let caller = status.begin_caller_extend(caller_end);
        caller.answered(caller_end);
        assert!(
            renewal.renewal_answered(renewal_end),
            "Redis may have run it last"
        );
        assert_eq!(status.deadline(), renewal_end);
        // Renewal's next extend asks for what the caller asked, and is begun after both answers.
        tick();
        let (again, wanted) = status.begin_renewal(S, true);
        assert!(wanted > 19 * S, "{wanted:?}");
        let again_end = again.begun_at + wanted;
        assert!(!again.renewal_answered(again_end));
        assert_eq!(status.deadline(), again_end);
        // A renewal begun after the caller's extend asks for its end and never cuts it back.
        let (after, wanted) = status.begin_renewal(S, false);
        assert!(wanted > 19 * S, "{wanted:?}");
        let after_end = after.begun_at + wanted;
        assert!(!after.renewal_answered(after_end));
        // Nor does one that asked for a later end than the caller's.
        let status = Arc::new(HoldStatus::new(t0 + 30 * S));
        let (longer, wanted) = status.begin_renewal(S, false);
        let longer_end = longer.begun_at + wanted;
        status
            .begin_caller_extend(t0 + 20 * S)
            .answered(t0 + 20 * S);
        assert!(!longer.renewal_answered(longer_end));
    }

    #[test]
    fn the_callers_extend_waits_for_a_renewal_under_way_and_for_its_extend_again() {
        let t0 = Instant::now();
        let status = Arc::new(HoldStatus::new(t0 + S));
        let never = || false;
        // Nothing under way: no wait.
        let caller = status.begin_caller_extend(t0 + 20 * S);
        let id = caller.id();
        caller.answered(t0 + 20 * S);
        let start = Instant::now();
        status.wait_for_renewal(id, start + 10 * S, never);
        assert!(start.elapsed() < S);
        // A renewal under way when the caller's extend began: the caller waits for its answer,
        // then for the extend again that it calls for.
        let renewal = status.begin_extend(t0 + S);
        let caller = status.begin_caller_extend(t0 + 30 * S);
        let id = caller.id();
        caller.answered(t0 + 30 * S);
        let renewing = {
            let status = status.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                assert!(renewal.renewal_answered(t0 + S));
                std::thread::sleep(Duration::from_millis(100));
                let (again, _) = status.begin_renewal(S, true);
                again.renewal_answered(t0 + 30 * S)
            })
        };
        let start = Instant::now();
        status.wait_for_renewal(id, start + 10 * S, never);
        let waited = start.elapsed();
        assert!(!renewing.join().unwrap());
        assert!(waited >= Duration::from_millis(190), "{waited:?}");
        assert!(waited < 5 * S, "{waited:?}");
        assert_eq!(status.deadline(), t0 + 30 * S);
        // It gives up at its limit, or when asked to stop.
        let stuck = status.begin_extend(t0 + S);
        let later = status.begin_caller_extend(t0 + S);
        let id = later.id();
        later.answered(t0 + S);
        let start = Instant::now();
        status.wait_for_renewal(id, start + Duration::from_millis(100), never);
        assert!(start.elapsed() >= Duration::from_millis(100));
        let start = Instant::now();
        status.wait_for_renewal(id, start + 10 * S, || true);
        assert!(start.elapsed() < S);
        drop(stuck);
    }

    #[test]
    fn a_reentry_never_shortens_and_an_overlapping_one_never_lengthens() {
        let t0 = Instant::now();
        let status = Arc::new(HoldStatus::new(t0 + 10 * S));
        // Begun after every answer was read (a moment safely ahead of the clock: each answer
        // read moves that mark to "now", which a loaded machine may take a while to reach).
        let later = Instant::now() + 60 * S;
        status.answered_at_least(later, later + S);
        assert_eq!(status.deadline(), later + S);
        status.answered_at_least(later, later - S / 2);
        assert_eq!(status.deadline(), later + S, "a re-entry never shortens");
        // Begun before the last answer was read: Redis may have run it before that one.
        let before = t0.checked_sub(Duration::from_millis(1)).unwrap_or(t0);
        status.answered_at_least(before, t0 + 90 * S);
        assert_eq!(status.deadline(), later + S);
    }
}
