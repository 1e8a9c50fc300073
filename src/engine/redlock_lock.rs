//! The Lock on Redlock: the quorum round of every primitive (`redlock_lease.rs`), with what is
//! the Lock's own: its fence, agreed by the granting masters and written back where it lags
//! (see `protocol::quorum` for why fences then grow strictly per name whenever a majority
//! agrees); votes that replicas must acknowledge (Redis WAIT); and, for a token the caller chose
//! (the recipes' identifier), first-send votes whose grants alone are given back (`Held`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use futures_util::FutureExt;

use super::error::{Error, Result};
use super::node::Retry;
use super::redlock::{self, Held, RecipeHold, Redlock};
use super::redlock_held::HeldVotes;
use super::redlock_lease::{self, send_step, Ballot, QuorumContender, Sent};
use super::replicas::attempt_with_replicas;
use super::runtime;
use super::waiting::Wait;
use crate::protocol::lease;
use crate::protocol::lock::{self, Granted, LockSpec};
use crate::protocol::quorum;
use crate::protocol::replies::{parse_attempt, parse_int, Attempt};
use crate::protocol::scripts;
use crate::protocol::step::Step;

struct LockQuorum<'a> {
    spec: &'a LockSpec,
    token: &'a str,
    held: Option<Held>,
}

impl QuorumContender for LockQuorum<'_> {
    type Reply = Attempt;

    fn attempt(&self, _join: bool) -> Step<Attempt> {
        let lease_ms = lease::lease_ms(self.spec.lease);
        // A token the caller chose may be in place for another call: a first send refuses it.
        // A vote resent after its connection broke goes as a first send too: it may then find
        // its own first send's grant and call it busy (that copy lapses with its lease), but
        // never counts another call's.
        let inv = match self.held {
            Some(_) => scripts::acquire_first_send(&self.spec.keys, self.token, lease_ms),
            None => scripts::acquire(&self.spec.keys, self.token, lease_ms, None, ""),
        };
        Step::script(inv, |v| parse_attempt(&v))
    }

    fn send(
        &self,
        redlock: &Arc<Redlock>,
        index: usize,
        step: &Arc<Step<Attempt>>,
    ) -> Sent<Attempt> {
        let sent = if self.spec.replicas == 0 {
            send_step(redlock.clone(), index, step.clone()).boxed()
        } else {
            with_replicas(
                redlock.clone(),
                index,
                self.spec.clone(),
                self.token.to_string(),
            )
            .boxed()
        };
        let held = self.held.clone();
        async move {
            let (attempt, identity) = sent.await?;
            if let (Attempt::Granted { fence }, Some(held)) = (attempt, &held) {
                held.granted(index, fence);
            }
            Ok((attempt, identity))
        }
        .boxed()
    }

    fn ballot(&self, reply: &Attempt) -> Ballot {
        match *reply {
            Attempt::Granted { fence } => Ballot::Granted { fence },
            Attempt::Busy { retry_ms, .. } => Ballot::Busy { retry_ms },
        }
    }

    /// The largest counter among the granting masters, once a majority is at it (the ones
    /// behind are raised first).
    fn agree<'a>(
        &'a self,
        redlock: &'a Redlock,
        grants: &'a [(usize, i64)],
    ) -> BoxFuture<'a, Option<i64>> {
        agree_fence(redlock, &self.spec.keys, grants).boxed()
    }

    fn give_back(&self) -> Step<bool> {
        lock::release(&self.spec.keys, self.token)
    }

    fn give_back_quietly(&self) -> Step<bool> {
        lock::give_back_quietly(&self.spec.keys, self.token)
    }

    fn held(&self) -> Option<Held> {
        self.held.clone()
    }

    fn lease(&self) -> Duration {
        self.spec.lease
    }

    fn channel(&self) -> Vec<u8> {
        self.spec.keys.wake_channel()
    }

    fn gate(&self) -> Option<Vec<u8>> {
        // One competitor per name in this process; the others queue.
        Some(self.spec.keys.lock())
    }

    fn skip_empty_pause(&self) -> bool {
        false
    }
}

/// The write and its WAIT on a connection of their own; the master's incarnation is the one its
/// command connection knows (looked up if it has none yet). Too few acknowledgements (the grant
/// given back there) is `Error::Timeout`, which the round tells from a master that did not
/// answer (`RoundEnd::Unacknowledged`).
async fn with_replicas(
    redlock: Arc<Redlock>,
    index: usize,
    spec: LockSpec,
    token: String,
) -> Result<(Attempt, Option<Arc<super::node::Identity>>)> {
    let Some(master) = redlock.masters.get(index) else {
        return Err(Error::Usage(format!("no Redlock master {index}")));
    };
    let Some(attempt) = attempt_with_replicas(&master.shared, &spec, None, &token).await? else {
        let why = format!("fewer than {} replicas acknowledged", spec.replicas);
        return Err(Error::Timeout(why));
    };
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
    Ok((attempt, identity))
}

/// A majority granted: the fence is the largest counter among `grants`, written back where it
/// lags; None when fewer than a majority end at it.
async fn agree_fence(
    redlock: &Redlock,
    keys: &crate::protocol::keys::Keys,
    grants: &[(usize, i64)],
) -> Option<i64> {
    let (fence, behind) = quorum::agreed_fence(grants)?;
    // Every master that did not grant in this count (busy, failed, or its vote still out: late
    // or slow after a restart) has its counter raised too, in the background: after further
    // failures, a majority without the granting masters must not count from below this fence.
    // A vote still out runs before or after the raise; either way the counter ends at or above
    // the fence.
    for (i, master) in redlock.masters.iter().enumerate() {
        if grants.iter().any(|&(g, _)| g == i) {
            continue;
        }
        let shared = master.shared.clone();
        let inv = scripts::raise_fence(keys, fence);
        runtime::spawn(async move {
            let _ = shared.node.invoke(&inv, Retry::Once).await;
        });
    }
    let mut at_fence = grants.len() - behind.len();
    if !behind.is_empty() {
        let raises = behind
            .iter()
            .filter_map(|&i| redlock.masters.get(i))
            .map(|m| {
                let inv = scripts::raise_fence(keys, fence);
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
    (at_fence >= redlock.quorum()).then_some(fence)
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
    let held: Option<Held> = (shared_token && spec.replicas == 0)
        .then(|| Arc::new(HeldVotes::new(&spec.keys, redlock.len())));
    let contender = LockQuorum {
        spec,
        token,
        held: held.clone(),
    };
    let won = redlock_lease::acquire_won(redlock, &contender, token, wait).await?;
    if let (Some(won), Some(held)) = (&won, held) {
        held.agreed(won.fence, lease::deadline(won.start, spec.lease));
        redlock.keep_hold(
            spec.keys.lock(),
            token,
            RecipeHold::Chosen(held),
            spec.lease,
        );
    }
    Ok(won.map(|won| Granted {
        fence: won.fence,
        sent_at: won.start,
        lease: spec.lease,
    }))
}

/// A recipe's acquire (`acquire_lock`) of `token`; `chosen`: the caller chose it (`acquire`'s
/// `shared_token`). One the library drew is nobody else's, so it goes as a Lock's token: a vote
/// resent after a broken connection that finds it in place counts its own first send's grant,
/// and a round not won (or an acquire cancelled) gives it back by token on every master that
/// did not say busy, those whose vote was lost or late included, where a chosen one's votes can
/// only be given back where their grant was heard. Either hold won is kept for `release_lock`
/// (`RecipeHold`).
pub async fn acquire_recipe(
    redlock: &Arc<Redlock>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
    chosen: bool,
) -> Result<Option<Granted>> {
    let granted = acquire(redlock, spec, token, wait, chosen).await?;
    if let (false, Some(g)) = (chosen, &granted) {
        let hold = redlock::Granted {
            deadline: lease::deadline(g.sent_at, g.lease),
            run_ids: redlock.run_ids(),
        };
        redlock.keep_hold(
            spec.keys.lock(),
            token,
            RecipeHold::Drawn(Arc::new(hold)),
            spec.lease,
        );
    }
    Ok(granted)
}
