//! The quorum acquire of every primitive on Redlock (the Lock, a semaphore slot, a read or write
//! lock, a cache lookup): one round for any per-master attempt that grants or says busy.
//!
//! - One round sends the same attempt to every master at once and is won when a majority grants
//!   within the lease's validity (ttl − elapsed − drift) and, for the Lock, agrees on a fence
//!   (`QuorumContender::agree`); votes still out on a won round go on in the background and
//!   become part of the hold (their master's release waits for them).
//! - A round not won gives its grants back on every master that did not say busy; the next vote
//!   on a master waits for that give-back, so it can never delete a later grant of the token.
//!   For a token the caller chose (`Held`), only where this call's own votes set it.
//! - A master that restarted is discounted (`Redlock::discounted`).
//! - `QuorumError` when no majority can answer; otherwise the waiter subscribes on every master
//!   and is woken by a release heard on any of them (or by the soonest lease end it was told).
//! - Release, extend and `owned` are the primitive's own steps, run on every master by majority
//!   (`hold.rs`), so they come with the hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, select_all, BoxFuture, Shared as SharedFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

use super::error::{Error, Result};
use super::node::{Identity, Retry};
use super::redlock::{
    jitter, Held, PendingVote, Redlock, Releasing, Whose, NO_HINT_LOOK, SPLIT_PAUSE,
    SPLIT_PAUSE_MAX,
};
use super::runtime;
use super::waiting::{self, undo_unknown, Undo, Wait};
use crate::protocol::lease;
use crate::protocol::quorum::{self, Outcome, Tally, Vote};
use crate::protocol::step::Step;

/// Rounds an acquire makes back to back, before waiting, while each names something free.
const AT_ONCE: usize = 4;

/// What one master's reply to an attempt means.
pub(super) enum Ballot {
    /// Granted here; `fence`: the master's fencing counter (0 for a primitive without fences).
    Granted { fence: i64 },
    /// Held by others here; look again within `retry_ms` (-1: no hint).
    Busy { retry_ms: i64 },
    /// No vote for this round's request, though the token holds something else here (an
    /// earlier round's grant whose give-back did not land): counted as busy, but a round not
    /// won gives back here too.
    Stale { retry_ms: i64 },
    /// Refused for good (a semaphore of another limit): nothing was written.
    Refused(Error),
}

/// One master's reply to an attempt, and the identity of the server that gave it.
pub(super) type Sent<R> = BoxFuture<'static, Result<(R, Option<Arc<Identity>>)>>;

/// What one quorum acquire asks of every master, round after round.
pub(super) trait QuorumContender: Send + Sync {
    type Reply: Clone + Send + Sync + 'static;
    /// This round's attempt, the same for every master; `join`: a round after the first (a
    /// writer then marks itself waiting).
    fn attempt(&self, join: bool) -> Step<Self::Reply>;
    /// Sends this round's attempt to master `index` (run only when polled, after the master's
    /// earlier give-back). Default: `send_step`.
    fn send(
        &self,
        redlock: &Arc<Redlock>,
        index: usize,
        step: &Arc<Step<Self::Reply>>,
    ) -> Sent<Self::Reply> {
        send_step(redlock.clone(), index, step.clone()).boxed()
    }
    fn ballot(&self, reply: &Self::Reply) -> Ballot;
    /// A majority granted, with these `(master, fence)`: the fence the hold gets, None when the
    /// masters cannot agree on one (the round is then not won). Default: 0, nothing to agree.
    fn agree<'a>(
        &'a self,
        _redlock: &'a Redlock,
        _grants: &'a [(usize, i64)],
    ) -> BoxFuture<'a, Option<i64>> {
        futures_util::future::ready(Some(0)).boxed()
    }
    /// Gives a grant of the token back on one master (the primitive's release step).
    fn give_back(&self) -> Step<bool>;
    /// `give_back` that wakes nobody (see `round`).
    fn give_back_quietly(&self) -> Step<bool>;
    /// For a token the caller chose: where this call's own votes set it (`Held`; `send` marks
    /// it), the only masters that a give-back or a cancelled acquire may release.
    fn held(&self) -> Option<Held> {
        None
    }
    /// Run on every master when the acquire ends without a hold (a writer gives up its place).
    fn leave(&self) -> Option<Step<()>> {
        None
    }
    /// After a round not won, with the replies of the masters that answered: true when the next
    /// round may win at once (a semaphore slot free on a majority), so it goes without waiting.
    fn retry_now(&self, _n: usize, _replies: &[Self::Reply]) -> bool {
        false
    }
    /// While a round that cannot be won any more still has `out` answers to come: true to wait
    /// for them too (the cache waits while a value may yet be confirmed by a majority).
    fn more(&self, _n: usize, _replies: &[Self::Reply], _out: usize) -> bool {
        false
    }
    /// After a round not won: true when the replies settle the acquire without a hold (the
    /// cache: a majority holds one value), which then returns None at once.
    fn done(&self, _n: usize, _replies: &[Self::Reply]) -> bool {
        false
    }
    fn lease(&self) -> Duration;
    fn channel(&self) -> Vec<u8>;
    /// The name under which contenders of this process take turns (None: each waits on its own,
    /// as readers do).
    fn gate(&self) -> Option<Vec<u8>>;
    /// After a round not won whose pause came out as nothing (a random pause of 0): true to go
    /// again at once; false to wait through it all the same, so that a release heard in that
    /// instant is taken (and, after a split vote, followed by a short random pause).
    fn skip_empty_pause(&self) -> bool {
        true
    }
}

/// A won acquire: when the lease counts from, and the agreed fence (0 without fences).
#[derive(Clone, Copy, Debug)]
pub(super) struct Won {
    pub(super) start: Instant,
    pub(super) fence: i64,
}

/// One master's vote: `(master index, its reply, how long it is still discounted, error,
/// whether the error is its replicas not acknowledging the grant, given back there already)`.
type LeaseVote<R> = (usize, Option<R>, Option<Duration>, Option<String>, bool);
type SharedVote<R> = SharedFuture<BoxFuture<'static, LeaseVote<R>>>;

/// Releases of earlier rounds still under way, per master: the next vote on a master waits for
/// its give-back, so a give-back can never delete a later grant of the same token.
type GiveBacks = Vec<Option<GiveBackUnderWay>>;

struct GiveBackUnderWay {
    /// Done once sent; false when its master could not be reached (see `give_back_on`).
    handle: tokio::task::JoinHandle<bool>,
    /// It wakes nobody: if the acquire ends without a hold, a wake-up follows it (`acquire_won`).
    quiet: bool,
    /// It deletes by token (one the library drew, no `Held`), so once the acquire has ended
    /// without a hold it may be sent again until it lands (see `settle_give_backs`).
    by_token: bool,
}

/// Waits for the give-backs still under way.
async fn land(give_backs: &mut GiveBacks) {
    join_all(
        give_backs
            .iter_mut()
            .filter_map(Option::take)
            .map(|g| g.handle),
    )
    .await;
}

/// The give-back steps of a contender: the one that wakes the waiters, and the quiet one.
struct GiveBackSteps {
    waking: Arc<Step<bool>>,
    quiet: Arc<Step<bool>>,
}

enum RoundEnd<R> {
    Won(Won),
    /// Not won because too many masters' replicas did not acknowledge the write (`replicas=k`),
    /// while a majority answered: the acquire fails like a timeout, as on one server, not with
    /// a quorum error (which says that the masters did not answer).
    Unacknowledged,
    Busy {
        retry_ms: i64,
        split: bool,
        replies: Vec<R>,
    },
}

/// Sends `step` to master `index` and parses the reply, sent once more on a fresh connection
/// when the master had closed the connection (idle `timeout`, CLIENT KILL) or it broke under
/// the call (`Retry::Once`; not after a timeout). A resend is safe:
/// - its reply counts only what is ours: every attempt script counts a token found in place as
///   granted only for a resend of a token this call drew (nobody else has it), and a token the
///   caller chose goes as a first send again, which never counts a token found in place;
/// - it never lands after this round's give-back or the hold's release: the vote future carries
///   the resend, a won or kept round's give-back and release wait for that future, and a lost
///   round drops it before giving back (a resend not written yet is never written; one written
///   runs first, on the connection the give-back then takes);
/// - the lease still counts from the round's `sent_at`, taken before the first send, so a
///   master's copy never ends before the hold's local deadline.
pub(super) async fn send_step<R>(
    redlock: Arc<Redlock>,
    index: usize,
    step: Arc<Step<R>>,
) -> Result<(R, Option<Arc<Identity>>)> {
    let Some(master) = redlock.masters.get(index) else {
        return Err(Error::Usage(format!("no Redlock master {index}")));
    };
    let Some(inv) = step.invocation() else {
        return Err(Error::Usage("a vote must be a script".into()));
    };
    let (reply, identity) = master
        .shared
        .node
        .invoke_identified(inv, Retry::Once)
        .await?;
    Ok((step.parse(reply)?, identity))
}

/// Master `index`'s vote: `send` once an earlier give-back there (`before`) and the releases
/// under way there when the round began (`Redlock::releases_on`) have run.
async fn vote<R: Send + 'static>(
    redlock: Arc<Redlock>,
    index: usize,
    send: Sent<R>,
    before: Option<tokio::task::JoinHandle<bool>>,
    releases: Vec<Releasing>,
) -> LeaseVote<R> {
    if let Some(give_back) = before {
        let _ = give_back.await;
    }
    join_all(releases).await;
    let Some(master) = redlock.masters.get(index) else {
        return (index, None, None, None, false);
    };
    match send.await {
        Ok((reply, identity)) => {
            let discounted = redlock.discounted(master, identity.as_deref());
            (index, Some(reply), discounted, None, false)
        }
        Err(err) => {
            // Only `with_replicas` fails a vote with a timeout (see `RoundEnd::Unacknowledged`).
            let unacknowledged = matches!(err, Error::Timeout(_));
            let error = Some(Redlock::labelled(master, &err));
            (index, None, None, error, unacknowledged)
        }
    }
}

/// Sends `step` (`quiet`: the give-back that wakes nobody) to master `index` in the
/// background, after `late` (its vote still out); for a token the caller chose, only where this
/// call's own vote set it, and resent after a broken connection only as the delete of that
/// grant (see `HeldVotes`). The task ends false when the master could not be reached (nothing
/// may have run there).
fn give_back_on(
    redlock: &Arc<Redlock>,
    index: usize,
    step: Arc<Step<bool>>,
    quiet: bool,
    late: Option<PendingVote>,
    held: Option<Held>,
    token: &str,
) -> Option<tokio::task::JoinHandle<bool>> {
    let redlock = redlock.clone();
    let token = token.to_string();
    runtime::handle().ok().map(|h| {
        h.spawn(async move {
            if let Some(vote) = late {
                vote.await;
            }
            let (Some(m), Some(inv)) = (redlock.masters.get(index), step.invocation()) else {
                return true;
            };
            let node = &m.shared.node;
            let sent = match &held {
                None => node.invoke(inv, Retry::Once).await,
                Some(held) => match held.take(index, &token, quiet) {
                    Some(resend) => node.invoke_or_resend(inv, &resend).await,
                    None => return true,
                },
            };
            !matches!(sent, Err(err) if err.is_connection())
        })
    })
}

/// One round: every master votes at once; decided as soon as the outcome is certain.
async fn round<C: QuorumContender>(
    redlock: &Arc<Redlock>,
    contender: &C,
    token: &str,
    join: bool,
    give_back: &GiveBackSteps,
    give_backs: &mut GiveBacks,
) -> Result<RoundEnd<C::Reply>> {
    if let Err(err) = redlock.check_distinct() {
        // Refused (by another call's answers) since the last round: its give-backs land first.
        land(give_backs).await;
        return Err(err);
    }
    let n = redlock.len();
    let step = Arc::new(contender.attempt(join));
    let held = contender.held();
    let sent_at = Instant::now();
    let all: Vec<SharedVote<C::Reply>> = (0..n)
        .map(|i| {
            let before = give_backs
                .get_mut(i)
                .and_then(Option::take)
                .map(|g| g.handle);
            vote(
                redlock.clone(),
                i,
                contender.send(redlock, i, &step),
                before,
                redlock.releases_on(i),
            )
            .boxed()
            .shared()
        })
        .collect();
    let mut votes: FuturesUnordered<_> = all.iter().cloned().collect();
    let mut reported = vec![false; n];
    let mut busy = vec![false; n];
    let mut tally = Tally::new(n);
    let mut grants: Vec<(usize, i64)> = Vec::new();
    let mut replies = Vec::new();
    let mut errors = Vec::new();
    let mut refused = None;
    let (mut failed, mut unacknowledged) = (0, 0);
    // Settled when a majority granted or cannot; a primitive may want the rest of the answers
    // that can still change its outcome (the cache: a value that a majority may yet confirm).
    let mut out = n;
    while !tally.settled() || (tally.outcome() != Outcome::Won && contender.more(n, &replies, out))
    {
        let Some((i, reply, discounted, error, unacked)) = votes.next().await else {
            break;
        };
        if let Some(seen) = reported.get_mut(i) {
            *seen = true;
        }
        out = out.saturating_sub(1);
        let vote = match reply.as_ref().map(|r| contender.ballot(r)) {
            Some(Ballot::Granted { fence }) => {
                grants.push((i, fence));
                match discounted {
                    None => Vote::Granted { fence },
                    Some(left) => Vote::Discounted {
                        fence,
                        counts_in_ms: i64::try_from(lease::lease_ms(left)).unwrap_or(i64::MAX),
                    },
                }
            }
            Some(Ballot::Busy { retry_ms }) => {
                if let Some(b) = busy.get_mut(i) {
                    *b = true;
                }
                Vote::Busy { retry_ms }
            }
            Some(Ballot::Stale { retry_ms }) => Vote::Busy { retry_ms },
            Some(Ballot::Refused(err)) => {
                if let Some(b) = busy.get_mut(i) {
                    *b = true;
                }
                refused = Some(err);
                Vote::Busy { retry_ms: -1 }
            }
            None => {
                errors.extend(error);
                failed += 1;
                unacknowledged += usize::from(unacked);
                Vote::Failed
            }
        };
        replies.extend(reply);
        tally.add(vote);
    }
    let outcome = tally.outcome();
    drop(votes);
    let distinct = redlock.check_distinct();
    // Votes still out, settled first by the give-back on their master.
    let mut still_out: Vec<Option<PendingVote>> = vec![None; n];
    let mut keep_out = |all: Vec<SharedVote<C::Reply>>| -> Vec<(usize, PendingVote)> {
        let late: Vec<(usize, PendingVote)> = all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !reported.get(*i).copied().unwrap_or(true))
            .map(|(i, v)| (i, v.map(|(i, ..)| (i, Vote::Failed, None)).boxed().shared()))
            .collect();
        for (i, vote) in &late {
            if let Some(slot) = still_out.get_mut(*i) {
                *slot = Some(vote.clone());
            }
        }
        late
    };
    if outcome == Outcome::Won && distinct.is_ok() {
        // Votes still out go on in the background: the more masters hold the lease, the better
        // it survives a master failing; a late grant is ours and goes with the hold. The release
        // (or a give-back below) on their master waits for them to settle, so a vote that is
        // sent again (NOSCRIPT) cannot land after it.
        redlock.keep_pending(token, keep_out(all));
        if let Some(fence) = contender.agree(redlock, &grants).await {
            if quorum::validity(sent_at, contender.lease(), Instant::now()).is_some() {
                let start = quorum::lease_start(sent_at, contender.lease());
                return Ok(RoundEnd::Won(Won { start, fence }));
            }
        }
    } else if held.is_some() {
        // A token the caller chose: only a vote that granted may be given back (see `Held`), so
        // the give-back waits for the votes still out to learn which did.
        keep_out(all);
    } else {
        // Dropped (every copy): a request already sent runs before the give-back below (same
        // connection, in order); one not yet sent never will be.
        drop(all);
    }
    // Not won: give back everywhere we may hold (all but the masters that said busy). With a
    // majority busy, somebody else holds (or the others split the votes and go again after a
    // pause): the give-back wakes nobody. A wake-up there would only set every waiter, this one
    // included, on another round that a minority grants and gives back, waking them again: a
    // storm of rounds for as long as the holder holds (a hunt counted 45,000 cache lookups in
    // 3 s). An acquire that ends without a hold wakes them once its give-backs landed.
    let quiet = outcome != Outcome::Won && busy.iter().filter(|b| **b).count() >= redlock.quorum();
    let step = if quiet {
        &give_back.quiet
    } else {
        &give_back.waking
    };
    for (i, slot) in give_backs.iter_mut().enumerate() {
        if busy.get(i).copied().unwrap_or(false) {
            continue;
        }
        let late = still_out.get_mut(i).and_then(Option::take);
        *slot = give_back_on(redlock, i, step.clone(), quiet, late, held.clone(), token).map(
            |handle| GiveBackUnderWay {
                handle,
                quiet,
                by_token: held.is_none(),
            },
        );
    }
    if let Err(err) = distinct {
        // Two masters are one server: refused for good, so the acquire ends here, and what
        // this round set is given back before the caller hears of it (not just after).
        land(give_backs).await;
        return Err(err);
    }
    if let Some(err) = refused {
        return Err(err);
    }
    match outcome {
        // The masters that did not answer at all leave room for a majority: it was the replicas.
        Outcome::NoQuorum { .. }
            if unacknowledged > 0 && failed - unacknowledged <= n - redlock.quorum() =>
        {
            Ok(RoundEnd::Unacknowledged)
        }
        Outcome::NoQuorum { answered } => Err(redlock.quorum_error(answered, &errors)),
        Outcome::Busy { retry_ms, split } => Ok(RoundEnd::Busy {
            retry_ms,
            split,
            replies,
        }),
        // Won, but too late for the lease or without an agreed fence: try again.
        Outcome::Won => Ok(RoundEnd::Busy {
            retry_ms: -1,
            split: true,
            replies,
        }),
    }
}

/// Gives back (and leaves) everywhere if dropped while armed: an acquire cancelled mid-way; for
/// a token the caller chose, only where this acquire's own votes set it (see `Held`).
struct Cleanup {
    redlock: Arc<Redlock>,
    token: String,
    give_back: Arc<Step<bool>>,
    held: Option<Held>,
    leave: Option<Arc<Step<()>>>,
    lease: Duration,
    armed: bool,
}

impl Cleanup {
    /// The writer's place (if any) is given up on every master, in the background. On each
    /// master after the won round's vote still out there (`Redlock::pending_on`): one queued
    /// behind a give-back, or sent again after NOSCRIPT, would mark the writer again after the
    /// leave, holding new readers back for a whole place.
    fn leave(&mut self) {
        let Some(leave) = self.leave.take() else {
            return;
        };
        let redlock = self.redlock.clone();
        let earlier: Vec<Vec<PendingVote>> = (0..redlock.len())
            .map(|i| redlock.pending_on(&self.token, i))
            .collect();
        runtime::spawn(async move {
            let Some(inv) = leave.invocation() else {
                return;
            };
            let sends = redlock
                .masters
                .iter()
                .zip(earlier)
                .map(|(m, earlier)| async move {
                    join_all(earlier).await;
                    m.shared.node.invoke(inv, Retry::Once).await
                });
            join_all(sends).await;
        });
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.leave(); // (reads the token's votes still out: before the token is taken)
        let redlock = self.redlock.clone();
        let token = std::mem::take(&mut self.token);
        let give_back = self.give_back.clone();
        let held = self.held.take();
        let lease = self.lease;
        runtime::spawn(async move {
            let drawn = held.is_none();
            let whose = held.map_or(Whose::Drawn, |held| Whose::Chosen(Some(held)));
            let released = redlock
                .release_where(&token, give_back.clone(), whose, None)
                .await;
            if !drawn {
                return;
            }
            // A drawn token, as when the acquire ends without a hold (`settle_give_backs`,
            // `give_back_after_late_votes`): no vote of it follows, so its give-back is sent
            // again until it lands where too few masters could be reached, and once more
            // after the calls that timed out have been answered.
            if released.is_err() {
                for index in 0..redlock.len() {
                    waiting::spawn_undo(give_back_again(
                        redlock.clone(),
                        index,
                        give_back.clone(),
                        lease,
                    ));
                }
            }
            give_back_after_late_votes(&redlock, &give_back, lease);
        });
    }
}

/// Takes the hold for `token` on a majority of the masters, waiting as `wait` allows, woken
/// (not polling) by releases heard on any master. Some(when the lease counts from) when taken.
pub(super) async fn acquire<C: QuorumContender>(
    redlock: &Arc<Redlock>,
    contender: &C,
    token: &str,
    wait: Wait,
) -> Result<Option<Instant>> {
    Ok(acquire_won(redlock, contender, token, wait)
        .await?
        .map(|won| won.start))
}

/// `acquire`, with the agreed fence too.
pub(super) async fn acquire_won<C: QuorumContender>(
    redlock: &Arc<Redlock>,
    contender: &C,
    token: &str,
    wait: Wait,
) -> Result<Option<Won>> {
    redlock.note_lease(contender.lease());
    let give_back = GiveBackSteps {
        waking: Arc::new(contender.give_back()),
        quiet: Arc::new(contender.give_back_quietly()),
    };
    let mut cleanup = Cleanup {
        redlock: redlock.clone(),
        token: token.to_string(),
        give_back: give_back.waking.clone(),
        held: contender.held(),
        leave: contender.leave().map(Arc::new),
        lease: contender.lease(),
        armed: true,
    };
    let mut give_backs: GiveBacks = (0..redlock.len()).map(|_| None).collect();
    let mut joined = false;
    let outcome = rounds(
        redlock,
        contender,
        token,
        wait,
        &give_back,
        &mut give_backs,
        &mut joined,
    )
    .await;
    cleanup.armed = false;
    // A writer that waited marked itself on the masters it asked: the marks go whatever the
    // outcome (a master that did not grant would hold new readers back until its mark lapsed).
    if joined {
        cleanup.leave();
    }
    if !matches!(outcome, Ok(Some(_))) {
        let (channel, lease) = (contender.channel(), contender.lease());
        settle_give_backs(redlock, channel, &give_back.waking, lease, &mut give_backs);
        if cleanup.held.is_none() {
            give_back_after_late_votes(redlock, &give_back.waking, lease);
        }
    }
    outcome
}

/// An acquire of a drawn token that ended without a hold gives back once more, on every master
/// with calls that timed out, after they have been answered (`waiting::undo_unknown`, as a
/// lock on one server does). A vote that timed out may still run: the round's give-back there
/// waited at most one command timeout for it (`Node::in_order`) and was then not sent, so a
/// vote the network held back longer would otherwise hold its master for a whole lease. No
/// later vote of the token follows (the acquire is over), and the step is token-checked.
/// Not for a token the caller chose, which another call may hold (see `Held`).
fn give_back_after_late_votes(redlock: &Arc<Redlock>, step: &Arc<Step<bool>>, lease: Duration) {
    for (index, master) in redlock.masters.iter().enumerate() {
        if master.shared.node.overdue_calls().is_empty() {
            continue;
        }
        undo_unknown(&master.shared, || {
            give_back_again(redlock.clone(), index, step.clone(), lease)
        });
    }
}

/// An acquire that ends without a hold no longer competes:
/// - a give-back by token that could not reach its master (the vote's reply lost and the
///   master cut off for a moment, or the connection it opened for the give-back lost with it)
///   is sent again with backoff until `lease` has passed, as a give-back on one server is
///   (`waiting::spawn_undo`), rather than leaving the name held there for that lease. No later
///   grant can be deleted so: every later vote of the acquire has been sent, and a token the
///   library drew is never asked for again. It goes in its waking form, so whoever found that
///   master busy is woken once it lands; a chosen token's give-back is not sent again (which
///   grant it may delete is known only to its first try, see `Held`);
/// - whoever found a master busy with one of its grants given back quietly (see `round`) is
///   woken there, once the give-back landed.
fn settle_give_backs(
    redlock: &Arc<Redlock>,
    channel: Vec<u8>,
    waking: &Arc<Step<bool>>,
    lease: Duration,
    give_backs: &mut GiveBacks,
) {
    for (i, slot) in give_backs.iter_mut().enumerate() {
        let Some(under_way) = slot.take_if(|g| g.quiet || g.by_token) else {
            continue;
        };
        let (redlock, channel, waking) = (redlock.clone(), channel.clone(), waking.clone());
        runtime::spawn(async move {
            let landed = under_way.handle.await.unwrap_or(true);
            if !landed && under_way.by_token {
                waiting::spawn_undo(give_back_again(redlock, i, waking, lease));
                return;
            }
            if !under_way.quiet {
                return;
            }
            if let Some(master) = redlock.masters.get(i) {
                let publish = redis::cmd("PUBLISH").arg(channel).arg("").clone();
                let _: Result<i64> = master.shared.node.query(&publish, Retry::Once).await;
            }
        });
    }
}

/// The give-back `step` on master `index`, tried until the master answers or `horizon` ends.
fn give_back_again(
    redlock: Arc<Redlock>,
    index: usize,
    step: Arc<Step<bool>>,
    horizon: Duration,
) -> Undo {
    Undo {
        step: Box::new(move || {
            let (redlock, step) = (redlock.clone(), step.clone());
            async move {
                let (Some(m), Some(inv)) = (redlock.masters.get(index), step.invocation()) else {
                    return Ok(());
                };
                match m.shared.node.invoke(inv, Retry::Once).await {
                    Err(err) if err.is_connection() => Err(err),
                    _ => Ok(()),
                }
            }
            .boxed()
        }),
        horizon,
    }
}

async fn rounds<C: QuorumContender>(
    redlock: &Arc<Redlock>,
    contender: &C,
    token: &str,
    wait: Wait,
    give_back: &GiveBackSteps,
    give_backs: &mut GiveBacks,
    joined: &mut bool,
) -> Result<Option<Won>> {
    // A round that finds what it asked for taken while something else is free on a majority
    // (another semaphore slot) goes again at once, a few times, also for a caller that does not
    // wait: "free" must not depend on which slot the first round happened to ask for.
    for _ in 0..AT_ONCE {
        match round(redlock, contender, token, false, give_back, give_backs).await? {
            RoundEnd::Won(won) => return Ok(Some(won)),
            RoundEnd::Unacknowledged => return Ok(None),
            RoundEnd::Busy { replies, .. } => {
                if contender.done(redlock.len(), &replies) {
                    return Ok(None);
                }
                if !contender.retry_now(redlock.len(), &replies) {
                    break;
                }
            }
        }
    }
    if wait.expired(Instant::now()) {
        return Ok(None);
    }
    // One competitor per name in this process when the primitive says so; the others queue.
    let gate = contender.gate().map(|name| redlock.gates.get(&name));
    let _turn = match (&gate, wait.deadline()) {
        (None, _) => None,
        (Some(gate), None) => Some(gate.lock().await),
        (Some(gate), Some(d)) => match tokio::time::timeout_at(d.into(), gate.lock()).await {
            Ok(turn) => Some(turn),
            Err(_) => return Ok(None),
        },
    };
    let channel = contender.channel();
    let registrations: Vec<_> = redlock
        .masters
        .iter()
        .map(|m| m.shared.hub.register(channel.clone(), None))
        .collect();
    let mut split_pause = SPLIT_PAUSE;
    loop {
        // Subscribed before looking, so a release after the look is heard.
        redlock.ready(&registrations).await?;
        *joined = true;
        let again;
        let (retry_ms, split) =
            match round(redlock, contender, token, true, give_back, give_backs).await? {
                RoundEnd::Won(won) => return Ok(Some(won)),
                RoundEnd::Unacknowledged => return Ok(None),
                RoundEnd::Busy {
                    retry_ms,
                    split,
                    replies,
                } => {
                    if contender.done(redlock.len(), &replies) {
                        return Ok(None);
                    }
                    again = contender.retry_now(redlock.len(), &replies);
                    (retry_ms, split)
                }
            };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(None);
        }
        let mut nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        if again {
            // Free on a majority: go again after a moment that keeps contenders out of step.
            nap = nap.min(jitter(SPLIT_PAUSE / 5));
        } else if split {
            nap = nap.min(jitter(split_pause));
            split_pause = (split_pause * 2).min(SPLIT_PAUSE_MAX);
        } else {
            split_pause = SPLIT_PAUSE;
        }
        if nap.is_zero() && contender.skip_empty_pause() {
            continue;
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
