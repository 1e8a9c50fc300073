//! The stampede-safe cache on Redlock. Each master runs the single-server scripts
//! (`cache_get_or_claim.lua` and the rest); this module decides by majority:
//!
//! - **Lookup and claim** are one round of the quorum acquire (`redlock_lease.rs`): every master
//!   looks the entry up and, on a miss, claims its fill for this caller's token. A value held
//!   byte for byte by a majority is a hit (claims taken meanwhile are given back); claims on a
//!   majority, within the lease's validity, make this caller the one filler: the claim is a
//!   quorum lock, so of all callers that miss at once exactly one wins it. Otherwise the caller
//!   waits, woken by the filler's store (published on every master that stored) or by the
//!   claim's lease end, and looks again.
//! - **Store** writes the value on every master where the claim is this caller's (token-checked,
//!   as on one server: a claim that an invalidation dropped stores nothing there), so on a
//!   majority at least; stored when a majority confirms. Reads need a majority, so a value left
//!   on a minority (a store or an invalidation that missed a master) is never served. A store
//!   that fails gives the claim back at once (as on one server): a waiter takes the fill over.
//! - A value found on some masters but no majority, while nobody else fills, is counted as
//!   absent in the next round (by its SHA-1, as the caller's `skip`), so it is refilled once.
//!   While masters that have not answered could still confirm it, not if it was stored less than
//!   `MINORITY_GRACE_TIMEOUTS` command timeouts ago (its ms left, against this caller's ttl): its
//!   filler's store may still be on its way there. Time for a store that is merely slow, not a
//!   bound (a store may land later still); an older value on too few masters is refilled at once.
//! - **Abandon** and **invalidate** run on every master, decided by majority. The claim is
//!   extended on every master every third of its lease while the fill runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cache::{CacheSpec, Hit};
use super::claim_lease::ClaimLease;
use super::error::{Error, Result};
use super::redlock::Redlock;
use super::redlock_lease::{self, Ballot, QuorumContender};
use super::runtime::{self, pid};
use super::token::new_token;
use super::waiting::{spawn_undo, Undo, UndoStep, Wait};
use crate::protocol::cache as steps;
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::quorum;
use crate::protocol::replies::Lookup;
use crate::protocol::sha1::sha1_hex;
use crate::protocol::step::Step;

/// How many command timeouts after it was stored a value held by too few masters is waited for
/// while masters that have not answered could still confirm it: a store's call waits up to one
/// for the calls that timed out before it on a master (`Node::in_order`) and one for its answer.
const MINORITY_GRACE_TIMEOUTS: u32 = 2;

/// What `fetch` found on a majority.
pub enum Fetched {
    Hit(Hit),
    /// The caller holds the fill claim on a majority: it fills, then stores or abandons.
    Claimed(Claim),
    /// Another caller fills and the wait allowed ended first.
    Busy,
}

struct LookupQuorum<'a> {
    spec: &'a CacheSpec,
    token: &'a str,
    /// SHA-1 hex of the payload that counts as absent: the caller's, or a value found on too
    /// few masters (see `retry_now`).
    skip: Mutex<Option<String>>,
    /// The value a majority holds, once a round found one.
    hit: Mutex<Option<Hit>>,
    /// How long after it was stored a value on too few masters is waited for while others are
    /// silent.
    grace: Duration,
    /// The ttl this caller stores values with.
    value_ttl: Duration,
}

impl LookupQuorum<'_> {
    /// Whether the youngest of these copies (the ms each has left) was stored less than `grace`
    /// ago by a store with this caller's ttl: its filler's store may still be on its way to the
    /// masters that have not answered. A copy without expiry, or with more left than this
    /// caller's ttl (another caller's ttl), tells nothing: not counted.
    fn just_stored(&self, copies_left_ms: &[i64]) -> bool {
        let ttl = i64::try_from(lease::lease_ms(self.value_ttl)).unwrap_or(i64::MAX);
        let grace = i64::try_from(lease::lease_ms(self.grace)).unwrap_or(i64::MAX);
        copies_left_ms
            .iter()
            .any(|&left| (0..=ttl).contains(&left) && ttl - left < grace)
    }
}

impl QuorumContender for LookupQuorum<'_> {
    type Reply = Lookup;

    fn attempt(&self, _join: bool) -> Step<Lookup> {
        let skip = self.skip.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lease = self.spec.claim_lease;
        steps::get_or_claim(&self.spec.keys, self.token, lease, skip.as_deref())
    }

    /// A value held by some masters but no majority (a store or an invalidation that missed a
    /// master), while nobody else fills: it is never served, so the next round counts it as
    /// absent, claims those masters too, and refills; if the masters that did not answer could
    /// still confirm it, not while it was `just_stored` (the caller waits and looks again).
    fn retry_now(&self, n: usize, replies: &[Lookup]) -> bool {
        if replies.iter().any(|r| matches!(r, Lookup::Busy { .. })) {
            return false;
        }
        let hits: Vec<(&[u8], i64)> = hits(replies).collect();
        let Some(&(most, _)) = hits
            .iter()
            .max_by_key(|(p, _)| hits.iter().filter(|(q, _)| q == p).count())
        else {
            return false;
        };
        let copies_left_ms: Vec<i64> = hits
            .iter()
            .filter(|(p, _)| *p == most)
            .map(|&(_, left)| left)
            .collect();
        let silent = n.saturating_sub(replies.len());
        if copies_left_ms.len() + silent >= quorum::quorum(n) && self.just_stored(&copies_left_ms) {
            return false;
        }
        let digest = sha1_hex(most);
        let mut skip = self.skip.lock().unwrap_or_else(|p| p.into_inner());
        if skip.as_deref() == Some(digest.as_str()) {
            return false;
        }
        *skip = Some(digest);
        true
    }

    fn ballot(&self, reply: &Lookup) -> Ballot {
        match reply {
            Lookup::Claimed => Ballot::Granted { fence: 0 },
            Lookup::Busy { retry_ms } => Ballot::Busy {
                retry_ms: *retry_ms,
            },
            // A value here: nothing was claimed here (see `done`).
            Lookup::Hit { .. } => Ballot::Busy { retry_ms: -1 },
        }
    }

    fn give_back(&self) -> Step<bool> {
        steps::abandon(&self.spec.keys, self.token)
    }

    fn give_back_quietly(&self) -> Step<bool> {
        steps::give_back_quietly(&self.spec.keys, self.token)
    }

    fn more(&self, n: usize, replies: &[Lookup], out: usize) -> bool {
        let payloads: Vec<&[u8]> = hits(replies).map(|(p, _)| p).collect();
        let best = payloads
            .iter()
            .map(|p| payloads.iter().filter(|q| *q == p).count())
            .max()
            .unwrap_or(0);
        best < quorum::quorum(n) && best + out >= quorum::quorum(n)
    }

    fn done(&self, n: usize, replies: &[Lookup]) -> bool {
        let hits: Vec<(&[u8], i64)> = hits(replies).collect();
        let payloads: Vec<&[u8]> = hits.iter().map(|&(p, _)| p).collect();
        let Some(index) = quorum::majority_value(n, &payloads) else {
            return false;
        };
        let Some(&(payload, _)) = hits.get(index) else {
            return false;
        };
        // The least time left among the copies (-1, no expiry, only when all say so).
        let pttl_ms = hits
            .iter()
            .filter(|&&(p, _)| p == payload)
            .map(|&(_, t)| if t < 0 { i64::MAX } else { t })
            .min()
            .map_or(-1, |t| if t == i64::MAX { -1 } else { t });
        *self.hit.lock().unwrap_or_else(|p| p.into_inner()) = Some(Hit {
            payload: Arc::new(payload.to_vec()),
            pttl_ms,
        });
        true
    }

    fn lease(&self) -> Duration {
        self.spec.claim_lease
    }

    fn channel(&self) -> Vec<u8> {
        self.spec.keys.wake_channel()
    }

    fn gate(&self) -> Option<Vec<u8>> {
        // Waiters want the same value: each looks on its own when woken.
        None
    }
}

/// The values among `replies`, with the ms each copy has left.
fn hits(replies: &[Lookup]) -> impl Iterator<Item = (&[u8], i64)> {
    replies.iter().filter_map(|r| match r {
        Lookup::Hit { payload, pttl_ms } => Some((payload.as_slice(), *pttl_ms)),
        _ => None,
    })
}

/// Looks the entry up on a majority; on a miss claims its fill or, while another caller fills,
/// waits as `wait` allows. `skip`: SHA-1 hex of a payload the caller cannot use.
pub async fn fetch(
    redlock: &Arc<Redlock>,
    spec: &CacheSpec,
    wait: Wait,
    skip: Option<&str>,
) -> Result<Fetched> {
    let token = new_token()?;
    let contender = LookupQuorum {
        spec,
        token: &token,
        skip: Mutex::new(skip.map(str::to_string)),
        hit: Mutex::new(None),
        grace: redlock.command_timeout() * MINORITY_GRACE_TIMEOUTS,
        value_ttl: spec.value_ttl,
    };
    let claimed = redlock_lease::acquire(redlock, &contender, &token, wait).await?;
    if let Some(start) = claimed {
        return Ok(Fetched::Claimed(Claim::granted(
            redlock, spec, token, start,
        )));
    }
    let hit = contender
        .hit
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    Ok(hit.map_or(Fetched::Busy, Fetched::Hit))
}

/// Drops the entry and any fill in progress on every master; whether a majority had anything.
pub async fn invalidate(redlock: &Redlock, keys: &Keys) -> Result<bool> {
    redlock.owned_by(&steps::invalidate(keys), None).await
}

/// Whether `token` holds the entry's fill claim on a majority of the masters.
pub async fn claim_held_by(redlock: &Redlock, keys: &Keys, token: &str) -> Result<bool> {
    redlock
        .owned_by(&steps::claim_held_by(keys, token), Some(token))
        .await
}

/// The fill claim, held on a majority. Exactly one of `store` or `abandon` settles it; dropped
/// unsettled, it is given back in the background (sent again while no majority answers).
pub struct Claim {
    redlock: Arc<Redlock>,
    keys: Keys,
    token: String,
    value_ttl: Duration,
    pid: u32,
    settled: bool,
    renewal: Option<tokio::task::AbortHandle>,
    /// Where the lease ends, kept by the renewal; tells a lapse from an invalidation.
    lease_end: Arc<ClaimLease>,
}

impl Claim {
    fn granted(redlock: &Arc<Redlock>, spec: &CacheSpec, token: String, start: Instant) -> Self {
        let lease_end = Arc::new(ClaimLease::new(start, spec.claim_lease));
        let renewal = runtime::handle().ok().map(|h| {
            h.spawn(renew(
                redlock.clone(),
                spec.keys.clone(),
                token.clone(),
                lease_end.clone(),
                spec.claim_lease,
                start,
            ))
            .abort_handle()
        });
        Claim {
            redlock: redlock.clone(),
            keys: spec.keys.clone(),
            token,
            value_ttl: spec.value_ttl,
            pid: pid(),
            settled: false,
            renewal,
            lease_end,
        }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Where the claim's lease ends; after a refused store, whether it had run out (`lapsed`).
    pub fn lease_end(&self) -> Arc<ClaimLease> {
        self.lease_end.clone()
    }

    fn check_process(&self) -> Result<()> {
        if self.pid == pid() {
            return Ok(());
        }
        Err(Error::Usage(
            "this fill claim belongs to the process that took it, not to a forked child".into(),
        ))
    }

    fn stop_renewal(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
    }

    /// Stores `payload` on every master where the claim is ours and wakes the waiters;
    /// `Ok(false)` when a majority says the claim is not ours any more. A store that fails
    /// (refused by the masters, e.g. a value over `proto-max-bulk-len`, or too few answers)
    /// leaves the claim unsettled, so dropping it gives it back at once, as on one server: a
    /// waiter takes the fill over instead of waiting for the claim's lease to end.
    pub async fn store(mut self, payload: &[u8]) -> Result<bool> {
        self.check_process()?;
        self.stop_renewal();
        let step = steps::store(
            &self.keys,
            &self.token,
            payload,
            lease::lease_ms(self.value_ttl),
        );
        let sent_at = Instant::now();
        let stored = self.redlock.release_by(&self.token, Arc::new(step)).await?;
        self.settled = true;
        if !stored {
            self.lease_end.refused(sent_at);
        }
        Ok(stored)
    }

    /// Gives the claim back on every master, waking the waiters (one takes the fill over). When
    /// too few masters answer, dropping the claim tries once more in the background.
    pub async fn abandon(mut self) -> Result<bool> {
        self.check_process()?;
        self.stop_renewal();
        let step = steps::abandon(&self.keys, &self.token);
        let given_back = self.redlock.release_by(&self.token, Arc::new(step)).await?;
        self.settled = true;
        Ok(given_back)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.pid != pid() {
            if let Some(renewal) = self.renewal.take() {
                std::mem::forget(renewal);
            }
            return;
        }
        self.stop_renewal();
        if self.settled {
            return;
        }
        // Sent again while no majority answers (see `cache::Claim`'s drop).
        let (redlock, keys) = (self.redlock.clone(), self.keys.clone());
        let token = std::mem::take(&mut self.token);
        let step = move || -> UndoStep {
            let (redlock, keys, token) = (redlock.clone(), keys.clone(), token.clone());
            Box::pin(async move {
                let abandon = Arc::new(steps::abandon(&keys, &token));
                redlock.release_by(&token, abandon).await.map(|_| ())
            })
        };
        // Renewal has stopped: the claim lapses where its lease last ended.
        let horizon = self
            .lease_end
            .end()
            .saturating_duration_since(Instant::now());
        spawn_undo(Undo {
            step: Box::new(step),
            horizon,
        });
    }
}

/// Extends the claim on every master every third of its lease until aborted, or until a
/// majority says it is not ours (the store then reports it), or it could not be extended
/// before its lease ended.
async fn renew(
    redlock: Arc<Redlock>,
    keys: Keys,
    token: String,
    lease_end: Arc<ClaimLease>,
    lease: Duration,
    from: Instant,
) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let retry = (period / 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let lease_ms = lease::lease_ms(lease);
    let mut next = from + period;
    loop {
        tokio::time::sleep_until(next.into()).await;
        let step = steps::extend(&keys, &token, lease_ms);
        match redlock.extend_by(Arc::new(step), lease, Some(&token)).await {
            Ok(Some(start)) => {
                lease_end.renewed(start, lease);
                next = start + period;
            }
            Ok(None) => return,
            Err(_) if Instant::now() < lease_end.end() => next = Instant::now() + retry,
            Err(_) => return,
        }
    }
}
