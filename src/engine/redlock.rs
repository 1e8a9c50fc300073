//! Redlock over N independent masters: every master runs the very scripts of a single server;
//! this module asks them all in parallel and decides by majority (`protocol::quorum`).
//!
//! - Acquire: one round sends the acquire script to every master at once; it is won when a
//!   majority grants within the lease's validity (ttl − elapsed − drift). A round that is not won
//!   gives its partial grants back everywhere. `Error::Quorum` when no majority of the masters
//!   can answer; a lock that is simply held makes the caller wait (wake-ups come from every
//!   master, and the holder's lease end is a deadline too) and finally time out.
//! - A master whose `run_id` changed since this client last saw it (in any reply, a busy vote's
//!   too; restarted, possibly empty) has its votes discounted until the longest lease this client
//!   uses has passed since it restarted: it may have forgotten a lease it granted to somebody
//!   else. The restart is dated from INFO's uptime, which may be up to a second too high.
//! - Fencing: the fence is the largest counter among the granting masters, written back to every
//!   granting master before acquire returns (see `protocol::quorum` for why that makes fences
//!   strictly increasing per name whenever a majority agrees), and in the background to every
//!   other master that answers. Each master's counter also has the server-clock floor of
//!   `fence_next.lua`, so a master that restarted empty counts from its clock, not from 1.
//! - Release, extend and `owned` count confirmations by majority, too.
//! - A vote still out when a round is won goes on in the background (a late grant is ours), and
//!   whatever later runs on that master for the same token (the release, a give-back) waits for
//!   it to settle first: a vote that needs a second send (EVALSHA answered NOSCRIPT, so SCRIPT
//!   LOAD and EVALSHA again) can never land after the release and keep the master for a ttl.
//! - Each master must be a separate server: two entries whose servers report the same `run_id`
//!   (one server under two names) are refused with `Error::Invalid` at first contact, since
//!   one server's vote would count twice; what that round set is given back before the error
//!   returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::future::Future;

use futures_util::future::{join_all, BoxFuture, FutureExt, Shared as SharedFuture};
use futures_util::stream::{FuturesUnordered, Stream, StreamExt};

use super::error::{Error, Result};
use super::executor;
use super::kept_holds::KeptHolds;
use super::name_map::NameMap;
use super::node::{Identity, Retry};
use super::redlock_held::HeldVotes;
use super::runtime;
use super::shared::Shared;
use super::waiting::{self, Gate, Undo};
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::lock;
use crate::protocol::quorum::{self, Holders, Incarnation, Majority, Vote};
use crate::protocol::step::Step;

/// How long a waiter sleeps when no master gives a lease to wait for.
pub(super) const NO_HINT_LOOK: Duration = Duration::from_millis(500);
/// After a split vote (we won some votes, not a majority), a contender retries after a random
/// pause, so that contenders do not split again in lockstep: up to this long at first...
pub(super) const SPLIT_PAUSE: Duration = Duration::from_millis(25);
/// ...doubling while the vote keeps splitting (a stale holder, a restarted master), up to this,
/// and sooner when a release is heard.
pub(super) const SPLIT_PAUSE_MAX: Duration = Duration::from_secs(1);

pub(super) struct Master {
    pub(super) index: usize,
    pub(super) shared: Arc<Shared>,
    /// The URL, redacted, for messages.
    label: String,
    incarnation: Mutex<Incarnation>,
}

/// One master's vote in an acquire round: `(master index, vote, error text)`. Shared, so that
/// what runs later on that master for the same token can wait for it to settle.
pub(super) type VoteResult = (usize, Vote, Option<String>);
pub(super) type PendingVote = SharedFuture<BoxFuture<'static, VoteResult>>;

/// Which of this client's votes still out on a master a call there goes after (see
/// `keep_pending`): a check right after a won round (`owned`, `extend`, `locked`) must see the
/// round's late grants, not overtake a vote sent again after NOSCRIPT (or still waiting for its
/// connection) and count that master as a denial. A hold's own steps wait for their token's
/// votes only: a call still waiting when a majority has decided is dropped unsent, which must
/// not befall an unrelated hold's renewal on a slow master.
#[derive(Clone, Copy)]
pub(super) enum After<'a> {
    Nothing,
    Token(&'a str),
    /// Every token's (`locked()`: it names no holder, and a read dropped unsent costs nothing).
    Any,
}

impl<'a> After<'a> {
    pub(super) fn of(token: Option<&'a str>) -> Self {
        token.map_or(After::Nothing, After::Token)
    }
}

/// Votes of won rounds still out, per token: `(round id, master index, vote)`.
type PendingVotes = HashMap<String, Vec<(u64, usize, PendingVote)>>;

/// A release still under way on one master after the caller heard the majority's answer (see
/// `release_by`); done once that master answered or failed.
pub(super) type Releasing = SharedFuture<BoxFuture<'static, ()>>;

/// The releases under way, per master: `(release id, done)`.
type ReleasesUnderWay = Arc<Mutex<Vec<Vec<(u64, Releasing)>>>>;

/// Whose token a release frees, which decides when it returns.
pub(super) enum Whose {
    /// One the library drew, never used again: decided by majority, the rest in the background.
    Drawn,
    /// One the library drew for a recipe (`acquire_lock` without an identifier), whose hold this
    /// client won: deleted and resent as `Drawn`'s, but every master's answer is awaited, as
    /// `release_lock` does for any identifier: when it returns, no delete is still on its way.
    DrawnRecipe,
    /// One the caller chose, which another call may take next (the recipes' identifier): every
    /// master's answer is awaited, so that no send still on its way can delete the next holder's
    /// copy after the release returned. `Some`: this client won the hold, and the release goes
    /// only where its own votes set the token (see `Held`; every other master answers "not
    /// ours"; votes of the won round still out settle first, marking `held` themselves).
    Chosen(Option<Held>),
}

pub struct Redlock {
    pub(super) masters: Vec<Master>,
    pub(super) gates: NameMap<Gate>,
    /// The longest lease used through this client, in ms: how long the votes of a restarted
    /// master are discounted.
    max_lease_ms: AtomicU64,
    /// Votes still out after their round was won (see `keep_pending`).
    pending: Mutex<PendingVotes>,
    next_round: AtomicU64,
    /// Releases still under way (see `releases_on`).
    releasing: ReleasesUnderWay,
    next_release: AtomicU64,
    /// The `run_id` each master last reported, to find one server listed twice.
    run_ids: Mutex<Vec<Option<String>>>,
    /// Set (for good) once two masters turned out to be one server.
    refused: OnceLock<String>,
    /// The recipes' holds won through this client, per (lock key, token), for their release
    /// (see `RecipeHold`); swept of those surely over (see `keep_hold`).
    holds: Mutex<KeptHolds<Kept>>,
}

/// A recipe's hold kept for its release, with what tells when it is surely over.
struct Kept {
    hold: RecipeHold,
    lease: Duration,
    /// When the hold was kept: every vote counted in its won round was heard before then.
    at: Instant,
}

/// Scheduling slack on top of a lease and its drift allowance before a kept hold counts as
/// surely over.
const KEPT_SLACK: Duration = Duration::from_secs(1);

/// A hold that a recipe (`acquire_lock`) won through this client, kept for `release_chosen`.
pub(super) enum RecipeHold {
    /// An identifier the caller chose: the masters where this hold's own votes set it, the only
    /// ones its release deletes (see `Held`).
    Chosen(Held),
    /// An identifier the library drew, which went as a Lock's token (nobody else has it): its
    /// release goes as a Lock hold's, by token on every master and resent after a broken
    /// connection, a "not ours" then counting as its first send's work (see `Granted`); every
    /// master's answer is awaited (`Whose::DrawnRecipe`).
    Drawn(Arc<Granted>),
}

/// A hold's release as the hold knows it, so that a master's "not ours" that may be the work of
/// the release's own first send counts as released there (as `hold::resent_own` on one server).
pub struct Granted {
    /// Until when the hold is surely ours: a send after it may find the lease ended.
    pub deadline: Instant,
    /// The run_id of each master when the hold was granted (`Redlock::run_ids`).
    pub run_ids: Vec<Option<Arc<str>>>,
}

impl Granted {
    /// Whether a release sent to master `index` at `sent_at`, whose connection broke under it
    /// (`faulted`) and whose resend was answered by `answered_by`, may have deleted the token
    /// with its first send: it went out while the lease was ours, and the server that answered
    /// is the incarnation the hold was granted on (a restart in between forgot the token, so a
    /// "not ours" there proves nothing). A master whose first connection was still opening
    /// when the hold was granted (its vote came late) is judged by `before`, its run_id when the
    /// release went out. An unknown run_id proves nothing.
    fn resent_own(
        &self,
        index: usize,
        sent_at: Instant,
        before: Option<Arc<str>>,
        faulted: bool,
        answered_by: Option<&Identity>,
    ) -> bool {
        let granted_on = self.run_ids.get(index).cloned().flatten().or(before);
        faulted
            && sent_at < self.deadline
            && matches!((granted_on, answered_by), (Some(g), Some(a)) if *g == *a.run_id)
    }
}

/// What one master said to an operation, and whether its word counts now.
pub(super) struct Answer<T> {
    value: Result<T>,
    counted: bool,
}

/// The masters' answers to a yes/no step so far: confirmations, denials (counted answers only),
/// answers of masters discounted after a restart, and what went wrong (for the quorum error).
#[derive(Default)]
struct Count {
    confirmed: usize,
    denied: usize,
    discounted: usize,
    errors: Vec<String>,
}

impl Count {
    fn add<T>(&mut self, answer: &Answer<T>, yes: impl Fn(&T) -> Option<bool>) {
        match (&answer.value, answer.counted) {
            (Ok(v), true) => match yes(v) {
                Some(true) => self.confirmed += 1,
                Some(false) => self.denied += 1,
                None => self.errors.push("unexpected reply".to_string()),
            },
            (Ok(_), false) => self.discounted += 1,
            (Err(err), _) => self.errors.push(err.to_string()),
        }
    }
}

/// A hold of a token the caller chose, shared by its votes, give-backs and release.
pub(super) type Held = Arc<HeldVotes>;

impl Redlock {
    pub fn new(masters: Vec<(Arc<Shared>, String)>) -> Self {
        Redlock {
            run_ids: Mutex::new(vec![None; masters.len()]),
            releasing: Arc::new(Mutex::new(vec![Vec::new(); masters.len()])),
            masters: masters
                .into_iter()
                .enumerate()
                .map(|(index, (shared, label))| Master {
                    index,
                    shared,
                    label,
                    incarnation: Mutex::new(Incarnation::default()),
                })
                .collect(),
            gates: NameMap::new(),
            max_lease_ms: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            next_round: AtomicU64::new(0),
            next_release: AtomicU64::new(0),
            refused: OnceLock::new(),
            holds: Mutex::new(KeptHolds::new()),
        }
    }

    /// The run_id that each master's latest connection opened on (None: none yet), for a hold
    /// granted now: a late vote is still on its way there, so no answer of it was counted yet.
    pub fn run_ids(&self) -> Vec<Option<Arc<str>>> {
        self.masters.iter().map(|m| m.shared.run_id()).collect()
    }

    /// `Error::Invalid` once two masters turned out to be one server.
    pub(super) fn check_distinct(&self) -> Result<()> {
        match self.refused.get() {
            Some(message) => Err(Error::Invalid(message.clone())),
            None => Ok(()),
        }
    }

    /// Notes that `master` answered as the server `run_id`; refuses the set (for good) when
    /// another master reported that very server.
    fn note_run_id(&self, master: &Master, run_id: &str) {
        let mut run_ids = self.run_ids.lock().unwrap_or_else(|p| p.into_inner());
        let twin = run_ids
            .iter()
            .enumerate()
            .find(|(i, seen)| *i != master.index && seen.as_deref() == Some(run_id))
            .map(|(i, _)| i);
        if let Some(slot) = run_ids.get_mut(master.index) {
            *slot = Some(run_id.to_string());
        }
        drop(run_ids);
        if let Some(other) = twin.and_then(|i| self.masters.get(i)) {
            let (first, second) = if other.index < master.index {
                (other, master)
            } else {
                (master, other)
            };
            let _ = self.refused.set(format!(
                "url: the Redlock masters '{}' and '{}' are the same server (one run_id); \
                 each master must be a separate server, or one server's vote counts twice",
                first.label, second.label
            ));
        }
    }

    /// Votes of earlier won rounds of `token` still out on master `index`.
    pub(super) fn pending_on(&self, token: &str, index: usize) -> Vec<PendingVote> {
        self.pending_before(After::Token(token), index)
    }

    /// The votes of earlier won rounds still out on master `index` that `after` names.
    fn pending_before(&self, after: After<'_>, index: usize) -> Vec<PendingVote> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let votes: Box<dyn Iterator<Item = &(u64, usize, PendingVote)>> = match after {
            After::Nothing => return Vec::new(),
            After::Token(token) => Box::new(pending.get(token).into_iter().flatten()),
            After::Any => Box::new(pending.values().flatten()),
        };
        votes
            .filter(|(_, i, _)| *i == index)
            .map(|(_, _, vote)| vote.clone())
            .collect()
    }

    /// Keeps the votes of a won round that are still out, until they settle (driven in the
    /// background): a release or give-back of `token` on their master waits for them first.
    pub(super) fn keep_pending(self: &Arc<Self>, token: &str, votes: Vec<(usize, PendingVote)>) {
        if votes.is_empty() {
            return;
        }
        let round = self.next_round.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending
                .entry(token.to_string())
                .or_default()
                .extend(votes.iter().map(|(i, vote)| (round, *i, vote.clone())));
        }
        let me = self.clone();
        let token = token.to_string();
        runtime::spawn(async move {
            join_all(votes.into_iter().map(|(_, vote)| vote)).await;
            let mut pending = me.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(votes) = pending.get_mut(&token) {
                votes.retain(|(r, _, _)| *r != round);
                if votes.is_empty() {
                    pending.remove(&token);
                }
            }
        });
    }

    pub fn len(&self) -> usize {
        self.masters.len()
    }

    /// The longest command timeout of the masters' connections (one client's: all the same).
    pub fn command_timeout(&self) -> Duration {
        self.masters
            .iter()
            .map(|m| m.shared.node.timeouts().command)
            .max()
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.masters.is_empty()
    }

    pub(super) fn quorum(&self) -> usize {
        quorum::quorum(self.masters.len())
    }

    pub(super) fn note_lease(&self, lease: Duration) {
        self.max_lease_ms
            .fetch_max(lease::lease_ms(lease), Ordering::Relaxed);
    }

    fn max_lease(&self) -> Duration {
        Duration::from_millis(self.max_lease_ms.load(Ordering::Relaxed))
    }

    /// None when the word of `master` (answering through `identity`) counts now, else how long
    /// until it does.
    pub(super) fn discounted(
        &self,
        master: &Master,
        identity: Option<&Identity>,
    ) -> Option<Duration> {
        let id = identity?;
        self.note_run_id(master, &id.run_id);
        let mut inc = master.incarnation.lock().unwrap_or_else(|p| p.into_inner());
        inc.observe(&id.run_id, id.uptime, id.observed_at);
        inc.discounted_for(Instant::now(), self.max_lease())
    }

    pub(super) fn labelled(master: &Master, err: &Error) -> String {
        format!("{}: {err}", master.label)
    }

    /// Runs `op` on every master at once (given its index) and collects every answer; an
    /// error when the answers show two masters to be one server.
    async fn on_all<'s, T, F, Fut>(&'s self, op: F) -> Result<Vec<Answer<T>>>
    where
        F: Fn(usize, &'s Shared) -> Fut,
        Fut: Future<Output = Result<(T, Option<Arc<Identity>>)>> + 's,
    {
        self.check_distinct()?;
        let answers = join_all(self.answers_of(op, After::Nothing)).await;
        self.check_distinct()?;
        Ok(answers)
    }

    /// `op` on every master, each call's answer as it comes (see `Answer`). Each master's call
    /// goes out after the votes `after` names there (see `After`).
    fn answers_of<'s, T, F, Fut>(
        &'s self,
        op: F,
        after: After<'_>,
    ) -> Vec<impl Future<Output = Answer<T>> + 's>
    where
        F: Fn(usize, &'s Shared) -> Fut,
        Fut: Future<Output = Result<(T, Option<Arc<Identity>>)>> + 's,
    {
        self.masters
            .iter()
            .map(|m| {
                let earlier = self.pending_before(after, m.index);
                let call = op(m.index, &m.shared);
                async move {
                    join_all(earlier).await;
                    self.answer(m, call.await)
                }
            })
            .collect()
    }

    /// What `master`'s reply (or failure) counts as.
    fn answer<T>(&self, master: &Master, reply: Result<(T, Option<Arc<Identity>>)>) -> Answer<T> {
        match reply {
            Ok((value, identity)) => Answer {
                counted: self.discounted(master, identity.as_deref()).is_none(),
                value: Ok(value),
            },
            Err(err) => Answer {
                value: Err(Error::Connection(Self::labelled(master, &err))),
                counted: false,
            },
        }
    }

    /// `op` on every master, decided as soon as a majority confirms (true) or denies (false):
    /// a master that is slow or stopped answering (a minority) does not hold up a renewal or an
    /// ownership check until its command timeout, which can outlast the lease. The calls still
    /// out are dropped (each was sent already unless its master could not be reached, or it
    /// was still waiting for `after`'s votes there: see `After`).
    async fn decided_by_majority<'s, T, F, Fut>(
        &'s self,
        op: F,
        yes: impl Fn(&T) -> Option<bool>,
        after: After<'_>,
    ) -> Result<bool>
    where
        F: Fn(usize, &'s Shared) -> Fut,
        Fut: Future<Output = Result<(T, Option<Arc<Identity>>)>> + 's,
    {
        self.check_distinct()?;
        let answers: FuturesUnordered<_> = self.answers_of(op, after).into_iter().collect();
        self.decide_as_they_come(answers, yes, true).await
    }

    /// Counts `answers` as they come, until a majority confirms or denies when `early`, else
    /// until all are in.
    async fn decide_as_they_come<T>(
        &self,
        mut answers: impl Stream<Item = Answer<T>> + Unpin,
        yes: impl Fn(&T) -> Option<bool>,
        early: bool,
    ) -> Result<bool> {
        let mut count = Count::default();
        while let Some(answer) = answers.next().await {
            count.add(&answer, &yes);
            if early
                && quorum::majority(self.masters.len(), count.confirmed, count.denied)
                    != Majority::Unknown
            {
                break;
            }
        }
        self.check_distinct()?;
        self.decide(&count)
    }

    /// Yes / no by majority of what `count` counted; too few answers is a quorum error.
    fn decide(&self, count: &Count) -> Result<bool> {
        match quorum::majority(self.masters.len(), count.confirmed, count.denied) {
            Majority::Yes => Ok(true),
            Majority::No => Ok(false),
            Majority::Unknown => Err(self.undecided_error(
                count.confirmed,
                count.denied,
                count.discounted,
                &count.errors,
            )),
        }
    }

    /// The quorum error of a step whose answers decided nothing: what the masters said, so that
    /// a master that answered but is discounted after a restart is not taken for a silent one.
    pub(super) fn undecided_error(
        &self,
        confirmed: usize,
        denied: usize,
        discounted: usize,
        errors: &[String],
    ) -> Error {
        let answered = confirmed + denied + discounted;
        let mut message = format!(
            "Redlock: {answered} of {} masters answered, but no majority ({}) either way: \
             {confirmed} confirmed, {denied} denied, {discounted} restarted within the longest \
             lease (not counted until it has passed), {} failed",
            self.masters.len(),
            self.quorum(),
            errors.len()
        );
        if let Some(last) = errors.last() {
            message.push_str(&format!(" (last error: {last})"));
        }
        Error::Quorum(message)
    }

    /// The error of a step that no majority can answer: `errors` (the masters that failed)
    /// leave too few; `answered` had answered when that was clear (others may still have been
    /// on their way, and what they took is given back).
    pub(super) fn quorum_error(&self, answered: usize, errors: &[String]) -> Error {
        let mut message = format!(
            "Redlock: {} of {} masters failed, so no majority ({}) can answer ({answered} had \
             answered)",
            errors.len(),
            self.masters.len(),
            self.quorum()
        );
        if let Some(last) = errors.last() {
            message.push_str(&format!(" (last error: {last})"));
        }
        Error::Quorum(message)
    }

    /// Subscribes the waiter on a majority of the masters (a release publishes on every master
    /// that held the lock, a majority, so one of them is heard).
    pub(super) async fn ready(&self, registrations: &[super::wake::Registration]) -> Result<()> {
        let mut pending: FuturesUnordered<_> = registrations.iter().map(|r| r.ready()).collect();
        let mut ready = 0;
        let mut errors = Vec::new();
        while let Some(outcome) = pending.next().await {
            match outcome {
                Ok(()) => {
                    ready += 1;
                    if ready >= self.quorum() {
                        return Ok(());
                    }
                }
                Err(err) => errors.push(err.to_string()),
            }
        }
        Err(self.quorum_error(ready, &errors))
    }

    /// Compare-and-delete on every master; `Ok(false)` when a majority says it is not ours.
    pub async fn release(&self, keys: &Keys, token: &str) -> Result<bool> {
        self.release_by(token, Arc::new(lock::release(keys, token)))
            .await
    }

    /// Runs the release step of `token`'s hold on every master; `Ok(false)` when a majority
    /// says it is not ours. Decided as soon as a majority confirms or denies, as `extend` is, so
    /// a minority that stopped answering does not hold every release up to the command timeout:
    /// the sends still out go on in the background, and each master's next vote (of any token:
    /// `releases_on`) is sent after they finished, never overtaking them. Each master's send
    /// waits for its votes of `token` still out. A send that fails (the master silent past the
    /// command timeout, then its earlier calls still unanswered: nothing is sent) leaves that
    /// master's copy to run out with its lease, as before. For a token the library drew (never
    /// used again); caller-chosen ones: `release_chosen`.
    pub async fn release_by(&self, token: &str, step: Arc<Step<bool>>) -> Result<bool> {
        self.release_where(token, step, Whose::Drawn, None).await
    }

    /// `release_by` of a token drawn or chosen (see `Whose`); `granted`: a hold's release, on
    /// whose masters a "not ours" may be the first send's work (see `Granted`).
    pub(super) async fn release_where(
        &self,
        token: &str,
        step: Arc<Step<bool>>,
        whose: Whose,
        granted: Option<Arc<Granted>>,
    ) -> Result<bool> {
        let handle = runtime::handle()?;
        // A set refused (two masters are one server) after the hold was won, by a vote that came
        // late: the release still deletes the token everywhere, and every delete lands before
        // the refusal is raised (below, as `decide_as_they_come` ends), as an acquire refused
        // gives back first.
        let refused = self.check_distinct().is_err();
        // None: a drawn token's release; Some(None): a chosen token's hold this client did not
        // win; Some(Some(held)): one it won.
        let (early, chosen) = match whose {
            Whose::Drawn => (!refused, None),
            Whose::DrawnRecipe => (false, None),
            Whose::Chosen(held) => (false, Some(held)),
        };
        // How long a drawn token's delete that could not be sent is tried again (`delete_again`):
        // until its lease would have lapsed anyway.
        let horizon = granted.as_ref().map_or(self.max_lease(), |g| {
            g.deadline.saturating_duration_since(Instant::now())
        });
        let mut sends = Vec::with_capacity(self.masters.len());
        let answers: FuturesUnordered<_> = self
            .masters
            .iter()
            .map(|m| {
                // A vote of this token still out on this master settles first: sent again
                // after a NOSCRIPT, it would otherwise land after the release.
                let earlier = self.pending_on(token, m.index);
                let (shared, step, chosen, index, granted) = (
                    m.shared.clone(),
                    step.clone(),
                    chosen.clone(),
                    m.index,
                    granted.clone(),
                );
                let token = token.to_string();
                let drawn = chosen.is_none();
                let send = async move {
                    join_all(earlier).await;
                    let (epoch, sent_at, before) =
                        (shared.fault_epoch(), Instant::now(), shared.run_id());
                    // `held`: this client's hold of a chosen token, whose resend may tell
                    // that the first send deleted it (see `HeldVotes`).
                    let (sent, held) = match (chosen, step.invocation()) {
                        (None, _) | (_, None) => {
                            let sent = executor::send_identified(&shared.node, &step).await;
                            if drawn && matches!(&sent, Err(err) if err.is_connection()) {
                                delete_again(shared.clone(), step.clone(), horizon);
                            }
                            (sent, None)
                        }
                        // Resent after a broken connection only as the delete of this hold's
                        // own grant (see `HeldVotes`).
                        (Some(Some(held)), Some(first)) => {
                            let Some(resend) = held.take(index, &token, false) else {
                                return Ok(((redis::Value::Int(0), false), None));
                            };
                            let node = &shared.node;
                            let sent = node.invoke_or_resend_identified(first, &resend).await;
                            (sent, Some(held))
                        }
                        // Another client's hold: nothing tells its grant from a later one
                        // under the same token, so the delete is not resent.
                        (Some(None), Some(first)) => (
                            shared.node.invoke_identified(first, Retry::Never).await,
                            None,
                        ),
                    };
                    let (value, identity) = sent.map_err(|err| err.to_string())?;
                    let faulted = shared.fault_epoch() != epoch;
                    let own = granted.is_some_and(|g| {
                        g.resent_own(index, sent_at, before, faulted, identity.as_deref())
                    }) || held.is_some_and(|h| h.released_by_first_send(&value, sent_at));
                    Ok(((value, own), identity))
                }
                .boxed()
                .shared();
                let done = send.clone().map(|_| ()).boxed().shared();
                self.under_way(handle, m.index, done.clone());
                sends.push(done);
                async move { self.answer(m, send.await.map_err(Error::Connection)) }
            })
            .collect();
        // A "not ours" that may be the first send's work counts as released (see `Granted`,
        // and `HeldVotes` for a chosen token's hold).
        let released = |(v, own): &(redis::Value, bool)| {
            step.parse(v.clone()).ok().map(|released| released || *own)
        };
        let decided = self.decide_as_they_come(answers, released, early).await;
        if decided.is_err() && self.check_distinct().is_err() {
            // Refused while the release went on (a late vote told of the twin): every delete
            // lands before the refusal is raised, as when it was refused before.
            join_all(sends).await;
        }
        decided
    }

    /// Drives `done` (a release's send to master `index`) to its end in the background, listed
    /// under `releases_on(index)` until then.
    fn under_way(&self, handle: &tokio::runtime::Handle, index: usize, done: Releasing) {
        let id = self.next_release.fetch_add(1, Ordering::Relaxed);
        let releasing = self.releasing.clone();
        if let Some(list) = releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(index)
        {
            list.push((id, done.clone()));
        }
        handle.spawn(async move {
            done.await;
            if let Some(list) = releasing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(index)
            {
                list.retain(|(i, _)| *i != id);
            }
        });
    }

    /// The releases still under way on master `index`: a vote there is sent after them.
    pub(super) fn releases_on(&self, index: usize) -> Vec<Releasing> {
        self.releasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(index)
            .map(|list| list.iter().map(|(_, done)| done.clone()).collect())
            .unwrap_or_default()
    }

    /// `release` of a recipe's token (`release_lock`). A caller-chosen one's hold that this
    /// client won: only on the masters where its own votes set the token (a token on any other
    /// master belongs to another call with the same identifier, and deleting it could let a
    /// third call in beside that one); waits for every master's answer (see `Whose::Chosen`).
    /// A drawn one's hold that this client won: as a Lock's hold, every answer awaited
    /// (`RecipeHold::Drawn`). A hold this client did not win (released by another client): on
    /// every master, not resent, every answer awaited, since nothing tells whose the token is.
    pub async fn release_chosen(&self, keys: &Keys, token: &str) -> Result<bool> {
        let hold = self
            .holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(keys.lock(), token)
            .map(|kept| kept.hold);
        let step = Arc::new(lock::release_chosen(keys, token));
        match hold {
            Some(RecipeHold::Drawn(granted)) => {
                self.release_where(token, step, Whose::DrawnRecipe, Some(granted))
                    .await
            }
            Some(RecipeHold::Chosen(held)) => {
                self.release_where(token, step, Whose::Chosen(Some(held)), None)
                    .await
            }
            None => {
                self.release_where(token, step, Whose::Chosen(None), None)
                    .await
            }
        }
    }

    /// Keeps the hold of a recipe's `token` on the lock `key` that this client won (for a lease
    /// of `lease`), for `release_chosen`. A recipe hold is never extended, and one that is never
    /// released (its caller lets `ltime` run out) must not stay here for the life of the
    /// process: as the record grows, the holds surely over on every master are dropped
    /// (`surely_over`). A release of a dropped hold goes as one this client did not win
    /// (`Whose::Chosen(None)`), which for each kind of hold deletes nothing it would have spared:
    ///
    /// - A drawn token is nobody else's: its release with or without the record deletes it by
    ///   token on every master, and once the lease is over every master answers "not ours"
    ///   either way (a "not ours" counts as the first send's work only before the deadline).
    /// - A caller's identifier: the record keeps the release to the masters where this hold's
    ///   votes set it, so that it cannot delete another call's votes elsewhere while this hold
    ///   is live there. Once every key its votes set has expired, a release deletes only other
    ///   calls' keys, record or not, and any other call that holds the identifier by then
    ///   holds a majority, which shares a master with this hold's: the restricted release
    ///   deletes its key there and leaves it short of a majority all the same (as a late
    ///   release does on one server). What the record still spares then is a round of another
    ///   call under way at that moment whose votes so far avoid this hold's masters. Surely
    ///   expired means: no vote of the token still out (a late grant would set the key later),
    ///   and a lease, its drift allowance and a slack past the latest grant heard (each key was
    ///   set before its grant was heard and expires a lease after, by the master's clock).
    pub(super) fn keep_hold(&self, key: Vec<u8>, token: &str, hold: RecipeHold, lease: Duration) {
        let now = Instant::now();
        let kept = Kept {
            hold,
            lease,
            at: now,
        };
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            token,
            kept,
            |token, kept| self.surely_over(token, kept, now),
        );
    }

    /// Whether every key that the votes of `kept` (a hold of `token`) set has expired by `now`
    /// (see `keep_hold`).
    fn surely_over(&self, token: &str, kept: &Kept, now: Instant) -> bool {
        let heard = match &kept.hold {
            RecipeHold::Drawn(_) => kept.at,
            RecipeHold::Chosen(held) => {
                let still_out = self
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(token);
                if still_out {
                    return false;
                }
                held.last_grant().map_or(kept.at, |t| t.max(kept.at))
            }
        };
        let lapse = kept.lease + quorum::drift(kept.lease) + KEPT_SLACK;
        heard.checked_add(lapse).is_some_and(|end| now >= end)
    }

    /// How many recipe holds this client keeps.
    #[cfg(test)]
    pub(super) fn kept_holds(&self) -> usize {
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether this client keeps a recipe hold of `token` on the lock `key`.
    #[cfg(test)]
    pub(super) fn keeps(&self, key: &[u8], token: &str) -> bool {
        self.holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key, token)
    }

    /// Compare-and-pexpire on every master: `Ok(Some(start))` when a majority extended (the
    /// new lease counts from `start`: the send less the drift allowance), `Ok(None)` when a
    /// majority says it is not ours.
    pub async fn extend(
        &self,
        keys: &Keys,
        token: &str,
        lease_for: Duration,
    ) -> Result<Option<Instant>> {
        self.extend_by(
            Arc::new(lock::extend(keys, token, lease_for)),
            lease_for,
            Some(token),
        )
        .await
    }

    /// Runs an extend step (to `lease_for`) of `token`'s hold (if the step has one) on every
    /// master; see `extend`. Decided as soon as a majority confirms or denies, but every
    /// master's send is driven to its end in the background: one that waited for a vote still
    /// out there (or that was slow) must extend too, or its copy runs out with the old lease and
    /// the hold stands on a bare majority that one more failure ends.
    pub async fn extend_by(
        &self,
        step: Arc<Step<bool>>,
        lease_for: Duration,
        token: Option<&str>,
    ) -> Result<Option<Instant>> {
        self.note_lease(lease_for);
        let handle = runtime::handle()?;
        self.check_distinct()?;
        let sent_at = Instant::now();
        let mut sends = Vec::with_capacity(self.masters.len());
        let answers: FuturesUnordered<_> = self
            .masters
            .iter()
            .map(|m| {
                let earlier = self.pending_before(After::of(token), m.index);
                let (shared, step) = (m.shared.clone(), step.clone());
                let send = async move {
                    join_all(earlier).await;
                    executor::send_identified(&shared.node, &step)
                        .await
                        .map_err(|err| err.to_string())
                }
                .boxed()
                .shared();
                sends.push(send.clone());
                async move { self.answer(m, send.await.map_err(Error::Connection)) }
            })
            .collect();
        let extended = self
            .decide_as_they_come(answers, |v| step.parse(v.clone()).ok(), true)
            .await;
        let still_out: Vec<_> = sends.into_iter().filter(|s| s.peek().is_none()).collect();
        if !still_out.is_empty() {
            handle.spawn(join_all(still_out));
        }
        if !extended? {
            return Ok(None);
        }
        Ok(Some(quorum::lease_start(sent_at, lease_for)))
    }

    /// Whether `token` holds the lock on a majority of the masters.
    pub async fn owned(&self, keys: &Keys, token: &str) -> Result<bool> {
        self.owned_by(&lock::owned(keys, token), Some(token)).await
    }

    /// Whether an ownership step (of `token`'s hold, if it has one) says yes on a majority of
    /// the masters.
    pub async fn owned_by(&self, step: &Step<bool>, token: Option<&str>) -> Result<bool> {
        self.decided_by_majority(
            |_, s| executor::send_identified(&s.node, step),
            |v| step.parse(v.clone()).ok(),
            After::of(token),
        )
        .await
    }

    /// Whether some owner holds the lock on a majority of the masters; decided as soon as the
    /// answers in tell (a stopped minority does not hold it up to the command timeout).
    pub async fn locked(&self, keys: &Keys) -> Result<bool> {
        self.check_distinct()?;
        let key = keys.lock();
        let mut answers: FuturesUnordered<_> = self
            .answers_of(
                |_, s| {
                    let key = key.clone();
                    async move {
                        s.node
                            .query_identified::<Option<Vec<u8>>>(
                                redis::cmd("GET").arg(key),
                                Retry::Once,
                            )
                            .await
                    }
                },
                After::Any,
            )
            .into_iter()
            .collect();
        let n = self.masters.len();
        let mut holders = Holders::default();
        let mut errors = Vec::new();
        let mut decision = Majority::Unknown;
        while let Some(answer) = answers.next().await {
            match answer.value {
                Ok(owner) => holders.add(owner, answer.counted),
                Err(err) => errors.push(err.to_string()),
            }
            decision = holders.majority(n);
            if decision != Majority::Unknown {
                break;
            }
        }
        self.check_distinct()?;
        match decision {
            Majority::Yes => Ok(true),
            Majority::No => Ok(false),
            Majority::Unknown => {
                // Confirmed: the counted masters that name the owner denied least.
                let (_, denied) = holders.held_and_denied();
                let confirmed = holders.counted - denied;
                Err(self.undecided_error(confirmed, denied, holders.discounted, &errors))
            }
        }
    }

    /// PING every master; fine when a majority answers.
    pub async fn ping(&self) -> Result<()> {
        let answers = self
            .on_all(|_, s| async move {
                s.node
                    .query_identified::<String>(&redis::cmd("PING"), Retry::Once)
                    .await
            })
            .await?;
        let mut errors = Vec::new();
        let mut alive = 0;
        for answer in answers {
            match answer.value {
                Ok(_) => alive += 1,
                Err(err) => errors.push(err.to_string()),
            }
        }
        if alive >= self.quorum() {
            return Ok(());
        }
        let mut message = format!(
            "Redlock: only {alive} of {} masters answered PING; a majority ({}) is needed",
            self.masters.len(),
            self.quorum()
        );
        if let Some(last) = errors.last() {
            message.push_str(&format!(" (last error: {last})"));
        }
        Err(Error::Connection(message))
    }
}

/// A random pause in `0..=max`.
pub(super) fn jitter(max: Duration) -> Duration {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return max / 2;
    }
    let ms = u64::from_le_bytes(bytes) % (max.as_millis() as u64 + 1);
    Duration::from_millis(ms)
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.masters.iter().map(|m| m.label.as_str()).collect();
        f.debug_struct("Redlock").field("masters", &labels).finish()
    }
}

/// A drawn token's delete on one master that could not be sent (the master unreachable, or a
/// call that timed out there still unanswered, which the delete must not overtake): sent again
/// with backoff until `horizon` (the lease's end) has passed, as an acquire's give-back is
/// (`waiting::spawn_undo`). The token is never asked for again, so the delete removes nothing
/// else; without it, a vote of the token that runs late there would keep it for the lease.
fn delete_again(shared: Arc<Shared>, step: Arc<Step<bool>>, horizon: Duration) {
    waiting::spawn_undo(Undo {
        step: Box::new(move || {
            let (shared, step) = (shared.clone(), step.clone());
            async move {
                let Some(inv) = step.invocation() else {
                    return Ok(());
                };
                match shared.node.invoke(inv, Retry::Once).await {
                    Err(err) if err.is_connection() => Err(err),
                    _ => Ok(()),
                }
            }
            .boxed()
        }),
        horizon,
    });
}
