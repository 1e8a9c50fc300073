//! Redlock over N independent masters: every master runs the very scripts of a single server;
//! this module asks them all in parallel and decides by majority (`protocol::quorum`).
//!
//! - Acquire: one round sends the acquire script to every master at once; it is won when a
//!   majority grants within the lease's validity (ttl − elapsed − drift). A round that is not won
//!   gives its partial grants back everywhere. `Error::Quorum` when no majority of the masters
//!   can answer; a lock that is simply held makes the caller wait (wake-ups come from every
//!   master, and the holder's lease end is a deadline too) and finally time out.
//! - A master whose `run_id` changed since this client last saw it (restarted, possibly empty)
//!   has its votes discounted until the longest lease this client uses has passed since it
//!   restarted: it may have forgotten a lease it granted to somebody else.
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
//!   one server's vote would count twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::future::Future;

use futures_util::future::{join_all, select_all, BoxFuture, Shared as SharedFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

use super::error::{Error, Result};
use super::executor;
use super::name_map::NameMap;
use super::node::{Identity, Retry};
use super::replicas::attempt_with_replicas;
use super::runtime;
use super::shared::Shared;
use super::waiting::{Gate, Wait};
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::lock::{self, Granted, LockSpec};
use crate::protocol::quorum::{self, Incarnation, Majority, Outcome, Tally, Vote};
use crate::protocol::replies::{parse_attempt, parse_flag, parse_int, Attempt};
use crate::protocol::scripts;
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

/// Votes of won rounds still out, per token: `(round id, master index, vote)`.
type PendingVotes = HashMap<String, Vec<(u64, usize, PendingVote)>>;

pub struct Redlock {
    pub(super) masters: Vec<Master>,
    pub(super) gates: NameMap<Gate>,
    /// The longest lease used through this client, in ms: how long the votes of a restarted
    /// master are discounted.
    max_lease_ms: AtomicU64,
    /// Votes still out after their round was won (see `keep_pending`).
    pending: Mutex<PendingVotes>,
    next_round: AtomicU64,
    /// The `run_id` each master last reported, to find one server listed twice.
    run_ids: Mutex<Vec<Option<String>>>,
    /// Set (for good) once two masters turned out to be one server.
    refused: OnceLock<String>,
    /// Holds of caller-chosen tokens won through this client, per (lock key, token): the masters
    /// where their own votes set the token, the only ones their release deletes (see `Held`).
    holds: Mutex<HashMap<(Vec<u8>, String), Held>>,
}

/// What one master said to an operation, and whether its word counts now.
struct Answer<T> {
    value: Result<T>,
    counted: bool,
}

/// How one acquire round ended (other than with an error).
enum RoundEnd {
    Won(Granted),
    Busy { retry_ms: i64, split: bool },
}

/// Releases of earlier rounds still under way, per master: the next vote on a master waits for
/// its release, so a give-back can never delete a later grant of the same token.
type GiveBacks = Vec<Option<tokio::task::JoinHandle<()>>>;

/// For a token the caller chose (the recipes' identifier, which another call may use too): per
/// master, whether this acquire's own vote set the token there and it was not given back yet.
/// The votes are first sends (`scripts::acquire_first_send`), so a grant proves that this call
/// set the key; a give-back or a cancelled acquire deletes only there, never a lock that another
/// call with the same identifier holds.
type Held = Arc<Mutex<Vec<bool>>>;

fn set_held(held: &Held, index: usize, value: bool) {
    if let Some(slot) = held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(index)
    {
        *slot = value;
    }
}

fn is_held(held: &Held, index: usize) -> bool {
    held.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(index)
        .copied()
        .unwrap_or(false)
}

impl Redlock {
    pub fn new(masters: Vec<(Arc<Shared>, String)>) -> Self {
        Redlock {
            run_ids: Mutex::new(vec![None; masters.len()]),
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
            refused: OnceLock::new(),
            holds: Mutex::new(HashMap::new()),
        }
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
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .get(token)
            .map(|votes| {
                votes
                    .iter()
                    .filter(|(_, i, _)| *i == index)
                    .map(|(_, _, vote)| vote.clone())
                    .collect()
            })
            .unwrap_or_default()
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
        inc.observe(&id.run_id, id.uptime, id.observed_at, self.max_lease());
        inc.discounted_for(Instant::now())
    }

    pub(super) fn labelled(master: &Master, err: &Error) -> String {
        format!("{}: {err}", master.label)
    }

    /// Runs `op` on every master at once (given its index) and collects every answer; an
    /// error when the answers show two masters to be one server.
    async fn on_all<'s, T, F, Fut>(&'s self, op: F) -> Result<Vec<Answer<T>>>
    where
        F: Fn(usize, &'s Shared) -> Fut,
        Fut: Future<Output = Result<(T, Option<Arc<Identity>>)>>,
    {
        self.check_distinct()?;
        let calls = self.masters.iter().map(|m| {
            let call = op(m.index, &m.shared);
            async move {
                match call.await {
                    Ok((value, identity)) => Answer {
                        counted: self.discounted(m, identity.as_deref()).is_none(),
                        value: Ok(value),
                    },
                    Err(err) => Answer {
                        value: Err(Error::Connection(Self::labelled(m, &err))),
                        counted: false,
                    },
                }
            }
        });
        let answers = join_all(calls).await;
        self.check_distinct()?;
        Ok(answers)
    }

    pub(super) fn quorum_error(&self, answered: usize, errors: &[String]) -> Error {
        let mut message = format!(
            "Redlock: only {answered} of {} masters answered; a majority ({}) is needed",
            self.masters.len(),
            self.quorum()
        );
        if let Some(last) = errors.last() {
            message.push_str(&format!(" (last error: {last})"));
        }
        Error::Quorum(message)
    }

    /// One master's vote in an acquire round.
    async fn vote(
        self: Arc<Self>,
        index: usize,
        spec: LockSpec,
        token: String,
        before: Option<tokio::task::JoinHandle<()>>,
        held: Option<Held>,
    ) -> VoteResult {
        if let Some(give_back) = before {
            let _ = give_back.await;
        }
        let Some(master) = self.masters.get(index) else {
            return (index, Vote::Failed, None);
        };
        let failed = |err: Error| (index, Vote::Failed, Some(Self::labelled(master, &err)));
        let (attempt, identity) = if spec.replicas == 0 {
            let lease_ms = lease::lease_ms(spec.lease);
            // A token the caller chose may be in place for another call: a first send refuses
            // it. Votes are never resent, so every vote is a first send.
            let inv = match held {
                Some(_) => scripts::acquire_first_send(&spec.keys, &token, lease_ms),
                None => scripts::acquire(&spec.keys, &token, lease_ms, None, ""),
            };
            // No resend after a dropped connection: a vote that fails is one vote fewer, and a
            // resend could land after this round gave its grants back.
            let node = &master.shared.node;
            let (reply, identity) = match node.invoke_identified(&inv, Retry::Never).await {
                Ok(found) => found,
                Err(err) => return failed(err),
            };
            match parse_attempt(&reply) {
                Ok(attempt) => (attempt, identity),
                Err(err) => return failed(err.into()),
            }
        } else {
            // The write and its WAIT on a connection of their own; the master's incarnation is
            // the one its command connection knows (looked up if it has none yet).
            match attempt_with_replicas(&master.shared, &spec, None, &token).await {
                Ok(Some(attempt)) => {
                    let identity = match master.shared.node.identity() {
                        Some(found) => Some(found),
                        None => master
                            .shared
                            .node
                            .query_identified::<String>(&redis::cmd("PING"), Retry::Once)
                            .await
                            .ok()
                            .and_then(|(_, identity)| identity),
                    };
                    (attempt, identity)
                }
                Ok(None) => {
                    let why = format!("fewer than {} replicas acknowledged", spec.replicas);
                    return failed(Error::Timeout(why));
                }
                Err(err) => return failed(err),
            }
        };
        if let Some(id) = identity.as_deref() {
            self.note_run_id(master, &id.run_id);
        }
        let fence = match attempt {
            Attempt::Busy { retry_ms, .. } => return (index, Vote::Busy { retry_ms }, None),
            Attempt::Granted { fence } => fence,
        };
        if let Some(held) = &held {
            set_held(held, index, true);
        }
        let vote = match self.discounted(master, identity.as_deref()) {
            None => Vote::Granted { fence },
            Some(left) => Vote::Discounted {
                fence,
                counts_in_ms: i64::try_from(lease::lease_ms(left)).unwrap_or(i64::MAX),
            },
        };
        (index, vote, None)
    }

    /// One round: every master votes at once; decided as soon as the outcome is certain.
    async fn round(
        self: &Arc<Self>,
        spec: &LockSpec,
        token: &str,
        give_backs: &mut GiveBacks,
        held: Option<&Held>,
    ) -> Result<RoundEnd> {
        self.check_distinct()?;
        let n = self.masters.len();
        let sent_at = Instant::now();
        let all: Vec<PendingVote> = (0..n)
            .map(|i| {
                let before = give_backs.get_mut(i).and_then(Option::take);
                self.clone()
                    .vote(i, spec.clone(), token.to_string(), before, held.cloned())
                    .boxed()
                    .shared()
            })
            .collect();
        let mut votes: FuturesUnordered<_> = all.iter().cloned().collect();
        let mut reported = vec![false; n];
        let mut tally = Tally::new(n);
        let mut grants: Vec<(usize, i64)> = Vec::new();
        let mut busy = vec![false; n];
        let mut errors = Vec::new();
        while !tally.settled() {
            let Some((i, vote, error)) = votes.next().await else {
                break;
            };
            if let Some(seen) = reported.get_mut(i) {
                *seen = true;
            }
            match vote {
                Vote::Granted { fence } | Vote::Discounted { fence, .. } => grants.push((i, fence)),
                Vote::Busy { .. } => {
                    if let Some(b) = busy.get_mut(i) {
                        *b = true;
                    }
                }
                Vote::Failed => errors.extend(error),
            }
            tally.add(vote);
        }
        let outcome = tally.outcome();
        drop(votes);
        let distinct = self.check_distinct();
        let mut still_out: Vec<Option<PendingVote>> = vec![None; n];
        if outcome == Outcome::Won && distinct.is_ok() {
            // Votes still out go on in the background: the more masters hold the lease, the
            // better it survives a master failing; a late grant is ours and goes with the hold.
            // The release (or a give-back below) on their master waits for them to settle, so
            // a vote that is sent again (NOSCRIPT) cannot land after it.
            let late: Vec<(usize, PendingVote)> = all
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !reported.get(*i).copied().unwrap_or(true))
                .collect();
            for (i, vote) in &late {
                if let Some(slot) = still_out.get_mut(*i) {
                    *slot = Some(vote.clone());
                }
            }
            self.keep_pending(token, late);
            if let Some(granted) = self.settle_win(spec, sent_at, &grants).await {
                return Ok(RoundEnd::Won(granted));
            }
        } else if held.is_some() {
            // A token the caller chose: only a vote that granted may be given back (see `Held`),
            // so the give-back waits for the votes still out to learn which did.
            for (i, vote) in all.into_iter().enumerate() {
                if !reported.get(i).copied().unwrap_or(true) {
                    if let Some(slot) = still_out.get_mut(i) {
                        *slot = Some(vote);
                    }
                }
            }
        } else {
            // Dropped (every copy): a request already sent runs before the give-back below
            // (same connection, in order); one not yet sent never will be.
            drop(all);
        }
        // Not won: give back everywhere we may hold (all but the masters that said "busy").
        for (i, slot) in give_backs.iter_mut().enumerate() {
            if busy.get(i).copied().unwrap_or(false) {
                continue;
            }
            let me = self.clone();
            let keys = spec.keys.clone();
            let token = token.to_string();
            let late = still_out.get_mut(i).and_then(Option::take);
            let held = held.cloned();
            *slot = runtime::handle().ok().map(|h| {
                h.spawn(async move {
                    if let Some(vote) = late {
                        vote.await;
                    }
                    if let Some(held) = &held {
                        if !is_held(held, i) {
                            return;
                        }
                        set_held(held, i, false);
                    }
                    if let Some(m) = me.masters.get(i) {
                        let _ = m
                            .shared
                            .node
                            .invoke(&scripts::release(&keys, &token), Retry::Once)
                            .await;
                    }
                })
            });
        }
        distinct?;
        match outcome {
            Outcome::NoQuorum { answered } => Err(self.quorum_error(answered, &errors)),
            Outcome::Busy { retry_ms, split } => Ok(RoundEnd::Busy { retry_ms, split }),
            // Won, but too late for the lease or without an agreed fence: try again.
            Outcome::Won => Ok(RoundEnd::Busy {
                retry_ms: -1,
                split: true,
            }),
        }
    }

    /// A majority granted: agree on the fence (writing it back where it lags) and check that the
    /// lease is still valid. None when either fails.
    async fn settle_win(
        &self,
        spec: &LockSpec,
        sent_at: Instant,
        grants: &[(usize, i64)],
    ) -> Option<Granted> {
        let (fence, behind) = quorum::agreed_fence(grants)?;
        // Every master that did not grant in this count (busy, failed, or its vote still out:
        // late or slow after a restart) has its counter raised too, in the background: after
        // further failures, a majority without the granting masters must not count from below
        // this fence. A vote still out runs before or after the raise; either way the counter
        // ends at or above the fence.
        for (i, master) in self.masters.iter().enumerate() {
            if grants.iter().any(|&(g, _)| g == i) {
                continue;
            }
            let shared = master.shared.clone();
            let inv = scripts::raise_fence(&spec.keys, fence);
            runtime::spawn(async move {
                let _ = shared.node.invoke(&inv, Retry::Once).await;
            });
        }
        let mut at_fence = grants.len() - behind.len();
        if !behind.is_empty() {
            let raises = behind.iter().filter_map(|&i| self.masters.get(i)).map(|m| {
                let inv = scripts::raise_fence(&spec.keys, fence);
                async move {
                    let reply = m.shared.node.invoke(&inv, Retry::Once).await.ok()?;
                    parse_int(&reply).ok()
                }
            });
            at_fence += join_all(raises)
                .await
                .into_iter()
                .filter(|raised| raised.is_some_and(|v| v >= fence))
                .count();
        }
        if at_fence < self.quorum() {
            return None;
        }
        quorum::validity(sent_at, spec.lease, Instant::now())?;
        Some(Granted {
            fence,
            sent_at: quorum::lease_start(sent_at, spec.lease),
            lease: spec.lease,
        })
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
        self.release_by(token, &lock::release(keys, token)).await
    }

    /// Runs the release step of `token`'s hold on every master; `Ok(false)` when a majority
    /// says it is not ours.
    pub async fn release_by(&self, token: &str, step: &Step<bool>) -> Result<bool> {
        let answers = self
            .on_all(|i, s| {
                // A vote of this token still out on this master settles first: sent again
                // after a NOSCRIPT, it would otherwise land after the release.
                let earlier = self.pending_on(token, i);
                async move {
                    join_all(earlier).await;
                    executor::send_identified(&s.node, step).await
                }
            })
            .await?;
        self.by_majority(answers, |v| step.parse(v.clone()).ok())
    }

    /// `release` of a token the caller chose: when this client won the hold, only on the masters
    /// where its own votes set the token (a token on any other master belongs to another call
    /// with the same identifier, and deleting it could let a third call in beside that one);
    /// otherwise (released by another client) on every master.
    pub async fn release_chosen(&self, keys: &Keys, token: &str) -> Result<bool> {
        let hold = self
            .holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(keys.lock(), token.to_string()));
        let Some(held) = hold else {
            return self.release(keys, token).await;
        };
        self.check_distinct()?;
        let releases = self.masters.iter().map(|m| {
            let earlier = self.pending_on(token, m.index);
            let held = &held;
            async move {
                // Votes of the won round still out settle first (they mark `held` themselves).
                join_all(earlier).await;
                if !is_held(held, m.index) {
                    return Answer {
                        value: Ok(redis::Value::Int(0)),
                        counted: true,
                    };
                }
                set_held(held, m.index, false);
                let inv = scripts::release(keys, token);
                match m.shared.node.invoke(&inv, Retry::Once).await {
                    Ok(value) => Answer {
                        value: Ok(value),
                        counted: true,
                    },
                    Err(err) => Answer {
                        value: Err(Error::Connection(Self::labelled(m, &err))),
                        counted: false,
                    },
                }
            }
        });
        let answers = join_all(releases).await;
        self.by_majority(answers, |v| parse_flag(v).ok())
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
        self.extend_by(&lock::extend(keys, token, lease_for), lease_for)
            .await
    }

    /// Runs an extend step (to `lease_for`) on every master; see `extend`.
    pub async fn extend_by(
        &self,
        step: &Step<bool>,
        lease_for: Duration,
    ) -> Result<Option<Instant>> {
        self.note_lease(lease_for);
        let sent_at = Instant::now();
        let answers = self
            .on_all(|_, s| executor::send_identified(&s.node, step))
            .await?;
        if !self.by_majority(answers, |v| step.parse(v.clone()).ok())? {
            return Ok(None);
        }
        Ok(Some(quorum::lease_start(sent_at, lease_for)))
    }

    /// Whether `token` holds the lock on a majority of the masters.
    pub async fn owned(&self, keys: &Keys, token: &str) -> Result<bool> {
        self.owned_by(&lock::owned(keys, token)).await
    }

    /// Whether an ownership step says yes on a majority of the masters.
    pub async fn owned_by(&self, step: &Step<bool>) -> Result<bool> {
        let answers = self
            .on_all(|_, s| executor::send_identified(&s.node, step))
            .await?;
        self.by_majority(answers, |v| step.parse(v.clone()).ok())
    }

    /// Whether some owner holds the lock on a majority of the masters.
    pub async fn locked(&self, keys: &Keys) -> Result<bool> {
        let answers = self.owners(keys).await?;
        let n = self.masters.len();
        let mut counts: Vec<(Vec<u8>, usize)> = Vec::new();
        let mut unanswered = 0;
        let mut errors = Vec::new();
        for answer in answers {
            match (answer.value, answer.counted) {
                (Ok(Some(owner)), true) => match counts.iter_mut().find(|(o, _)| *o == owner) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((owner, 1)),
                },
                (Ok(None), true) => {}
                (Ok(_), false) => unanswered += 1,
                (Err(err), _) => {
                    unanswered += 1;
                    errors.push(err.to_string());
                }
            }
        }
        let best = counts.iter().map(|(_, c)| *c).max().unwrap_or(0);
        match quorum::majority(n, best, n - best - unanswered) {
            Majority::Yes => Ok(true),
            Majority::No => Ok(false),
            Majority::Unknown => Err(self.quorum_error(n - unanswered, &errors)),
        }
    }

    async fn owners(&self, keys: &Keys) -> Result<Vec<Answer<Option<Vec<u8>>>>> {
        let key = keys.lock();
        self.on_all(|_, s| {
            let key = key.clone();
            async move {
                s.node
                    .query_identified(redis::cmd("GET").arg(key), Retry::Once)
                    .await
            }
        })
        .await
    }

    /// Yes / no by majority of the counted answers; too few answers is a quorum error.
    fn by_majority<T>(
        &self,
        answers: Vec<Answer<T>>,
        yes: impl Fn(&T) -> Option<bool>,
    ) -> Result<bool> {
        let (mut confirmed, mut denied, mut errors) = (0, 0, Vec::new());
        for answer in &answers {
            match (&answer.value, answer.counted) {
                (Ok(v), true) => match yes(v) {
                    Some(true) => confirmed += 1,
                    Some(false) => denied += 1,
                    None => errors.push("unexpected reply".to_string()),
                },
                (Ok(_), false) => {}
                (Err(err), _) => errors.push(err.to_string()),
            }
        }
        match quorum::majority(self.masters.len(), confirmed, denied) {
            Majority::Yes => Ok(true),
            Majority::No => Ok(false),
            Majority::Unknown => Err(self.quorum_error(confirmed + denied, &errors)),
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

/// Gives the lock back on every master if dropped while armed (an acquire cancelled mid-way);
/// for a token the caller chose, only where this acquire's own vote set it (see `Held`).
struct Cleanup {
    redlock: Arc<Redlock>,
    keys: Keys,
    token: String,
    held: Option<Held>,
    armed: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let redlock = self.redlock.clone();
        let keys = self.keys.clone();
        let token = std::mem::take(&mut self.token);
        let Some(held) = self.held.take() else {
            runtime::spawn(async move {
                let _ = redlock.release(&keys, &token).await;
            });
            return;
        };
        runtime::spawn(async move {
            let releases = redlock.masters.iter().map(|m| {
                // Votes of a won round still out settle first (they mark `held` themselves).
                let earlier = redlock.pending_on(&token, m.index);
                let (held, keys, token) = (&held, &keys, &token);
                async move {
                    join_all(earlier).await;
                    if is_held(held, m.index) {
                        set_held(held, m.index, false);
                        let inv = scripts::release(keys, token);
                        let _ = m.shared.node.invoke(&inv, Retry::Once).await;
                    }
                }
            });
            join_all(releases).await;
        });
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

/// Takes the lock for `token` on a majority, waiting as `wait` allows, without polling.
/// `shared_token`: the caller chose the token (the recipes' identifier), so another call may
/// hold the lock with it: a vote never counts the token found in place as a grant, and a
/// give-back deletes only what this call's own votes set (see `Held`). The recipes never ask
/// for a fair lock or replica acknowledgements, the only votes without a first-send form.
pub async fn acquire(
    redlock: &Arc<Redlock>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    shared_token: bool,
) -> Result<Option<Granted>> {
    redlock.note_lease(spec.lease);
    let held: Option<Held> = (shared_token && spec.replicas == 0)
        .then(|| Arc::new(Mutex::new(vec![false; redlock.len()])));
    let mut cleanup = Cleanup {
        redlock: redlock.clone(),
        keys: spec.keys.clone(),
        token: token.to_string(),
        held: held.clone(),
        armed: true,
    };
    let mut give_backs: GiveBacks = (0..redlock.len()).map(|_| None).collect();
    let outcome = acquire_rounds(redlock, spec, token, wait, &mut give_backs, held.as_ref()).await;
    cleanup.armed = false;
    if let (Ok(Some(_)), Some(held)) = (&outcome, held) {
        redlock
            .holds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((spec.keys.lock(), token.to_string()), held);
    }
    outcome
}

async fn acquire_rounds(
    redlock: &Arc<Redlock>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    give_backs: &mut GiveBacks,
    held: Option<&Held>,
) -> Result<Option<Granted>> {
    if let RoundEnd::Won(granted) = redlock.round(spec, token, give_backs, held).await? {
        return Ok(Some(granted));
    }
    if wait.expired(Instant::now()) {
        return Ok(None);
    }
    // One competitor per name in this process; the others queue here.
    let gate = redlock.gates.get(&spec.keys.lock());
    let _turn = match wait.deadline() {
        None => gate.lock().await,
        Some(d) => match tokio::time::timeout_at(d.into(), gate.lock()).await {
            Ok(turn) => turn,
            Err(_) => return Ok(None),
        },
    };
    let channel = spec.keys.wake_channel();
    let registrations: Vec<_> = redlock
        .masters
        .iter()
        .map(|m| m.shared.hub.register(channel.clone(), None))
        .collect();
    let mut split_pause = SPLIT_PAUSE;
    loop {
        // Subscribed before looking, so a release after the look is heard.
        redlock.ready(&registrations).await?;
        let (retry_ms, split) = match redlock.round(spec, token, give_backs, held).await? {
            RoundEnd::Won(granted) => return Ok(Some(granted)),
            RoundEnd::Busy { retry_ms, split } => (retry_ms, split),
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(None);
        }
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if split {
            // The vote split: pause a random moment (longer while it keeps splitting), or
            // less when a release is heard, and then a little more, to fall out of step.
            nap = nap.min(jitter(split_pause));
            split_pause = (split_pause * 2).min(SPLIT_PAUSE_MAX);
        } else {
            split_pause = SPLIT_PAUSE;
        }
        let woken = select_all(registrations.iter().map(|r| r.notified().boxed()));
        tokio::select! {
            _ = woken => {
                if split {
                    tokio::time::sleep(jitter(SPLIT_PAUSE)).await;
                }
            }
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.masters.iter().map(|m| m.label.as_str()).collect();
        f.debug_struct("Redlock").field("masters", &labels).finish()
    }
}
