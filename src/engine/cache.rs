//! The Redis side of the stampede-safe cache. The Python layer serializes and signs values,
//! decides early refreshes (XFetch) and runs the fill; this module does the atomic steps:
//!
//! * `fetch`: look the entry up and, on a miss, claim its fill, in one script; when another
//!   caller holds the claim, wait without polling — woken when that caller stores the value (or
//!   gives the claim back), or when the claim's lease ends because its holder died — and look
//!   again. A caller that gets `Claimed` must `store` or `abandon`; a `Claim` dropped without
//!   either (a cancelled caller, or a store or give-back that failed) is given back in the
//!   background, sent again while Redis cannot be reached, so it never strands the waiters.
//! * `Claim::store`: set the value with its ttl, drop the claim, wake the waiters (token-checked).
//! * `Claim::abandon`: drop the claim and wake the waiters; the first to look again takes over.
//! * `invalidate`: drop the value and any fill in progress.
//!
//! While the claim is held, a task of the runtime extends its lease every third of it, so a fill
//! may run longer than the lease while its process lives; a process that dies stops renewing and
//! its claim ends at most one lease later.
//!
//! Within a process only one waiter per entry name looks in Redis at a time (the entry's flight
//! gate); the others queue behind it and take the value it read — all of them at once, provided
//! it was read after they started asking. A store thus costs one lookup per waiting process, not
//! one per thread, and wakes a process's waiters together rather than one after another.
//!
//! Why not `waiting::acquire`: its gate hands the *turn* to the next waiter of the process, who
//! then asks Redis itself — one round trip per waiting thread, one after another (measured: the
//! last of 32 threads got the value ~3 ms after the store). Cache waiters all want the same
//! value, so the one that reads it publishes it to everybody queued behind it (`Flight`). The
//! `Wait` type, the wake hub and the lease arithmetic are the shared ones.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::claim_lease::ClaimLease;
use super::client::Client;
use super::direct::Overdue;
use super::error::{Error, Result};
use super::executor::{self, Now};
use super::runtime::{self, pid};
use super::shared::Shared;
use super::token::new_token;
use super::waiting::{self, undo_unknown, Undo, UndoStep, Wait};
use crate::protocol::cache as steps;
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::replies::Lookup;

/// How long a waiter sleeps when Redis gives no lease to wait for (a claim without expiry,
/// which this library never writes).
const NO_HINT_LOOK: Duration = Duration::from_millis(500);

/// One cache entry: its name, keys, and the lease of its fill claim.
#[derive(Clone, Debug)]
pub struct CacheSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub claim_lease: Duration,
    /// How long a stored value lives.
    pub value_ttl: Duration,
    /// The blocking API may run a one-round-trip step on a direct connection of the caller's
    /// thread (the client is one server, reached directly).
    pub direct: bool,
}

impl CacheSpec {
    /// Fails for a name the deployment cannot hold (on a cluster, one starting with '}').
    pub fn new(
        client: &Client,
        name: &[u8],
        claim_lease: Duration,
        value_ttl: Duration,
    ) -> Result<Self> {
        client.check_lease("lock_ttl", claim_lease)?;
        Ok(CacheSpec {
            name: name.to_vec(),
            keys: client.keys_named("key", name)?,
            claim_lease,
            value_ttl,
            direct: client.supports_direct(),
        })
    }
}

/// A stored value as read: the payload, and the ms it had left when read (-1: no expiry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    pub payload: Arc<Vec<u8>>,
    pub pttl_ms: i64,
}

/// What `fetch` found.
pub enum Fetched {
    Hit(Hit),
    /// The caller holds the fill claim: it fills, then stores or abandons.
    Claimed(Claim),
    /// Another caller holds the claim and the wait allowed ended first.
    Busy,
}

/// The in-process state of one entry name: a gate that lets one waiter at a time look in Redis,
/// and the last value such a waiter read, published to those queued behind it all at once.
#[derive(Default)]
pub struct Flight {
    gate: tokio::sync::Mutex<()>,
    recent: Mutex<Option<Recent>>,
    published: Notify,
}

struct Recent {
    hit: Hit,
    /// When the lookup that read it was sent: a waiter that started asking before this may take it.
    read_at: Instant,
    skip: Option<String>,
}

impl Flight {
    fn recent(&self) -> std::sync::MutexGuard<'_, Option<Recent>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value last read, if it was read after `since` by a lookup that skipped the same
    /// unusable payload; its remaining time is counted down to now.
    fn reusable(&self, since: Instant, skip: Option<&str>) -> Option<Hit> {
        let recent = self.recent();
        let recent = recent.as_ref()?;
        if recent.read_at < since || recent.skip.as_deref() != skip {
            return None;
        }
        let mut hit = recent.hit.clone();
        if hit.pttl_ms >= 0 {
            let aged = i64::try_from(recent.read_at.elapsed().as_millis()).unwrap_or(i64::MAX);
            hit.pttl_ms = hit.pttl_ms.saturating_sub(aged).max(0);
        }
        Some(hit)
    }

    /// Hands a value read at `read_at` to every waiter queued behind the reader.
    fn publish(&self, hit: &Hit, read_at: Instant, skip: Option<&str>) {
        *self.recent() = Some(Recent {
            hit: hit.clone(),
            read_at,
            skip: skip.map(str::to_owned),
        });
        self.published.notify_waiters();
    }
}

/// The fill claim of one entry, held by this caller. Dropped without `store` or `abandon`
/// (a cancelled or failed caller), it is given back in the background.
pub struct Claim {
    shared: Arc<Shared>,
    keys: Keys,
    name: Vec<u8>,
    /// This process's waiters for the entry, handed the value when it is stored.
    flight: Option<Arc<Flight>>,
    token: String,
    lease: Duration,
    /// How long the value it stores lives.
    value_ttl: Duration,
    pid: u32,
    settled: bool,
    renewal: Option<tokio::task::AbortHandle>,
    /// Where the lease ends, kept by the renewal; tells a lapse from an invalidation.
    lease_end: Arc<ClaimLease>,
    /// Settled on a direct connection of the caller's thread by the blocking API.
    direct: bool,
}

impl Claim {
    /// A claim that may be taken by lookups carrying `token`; given back on drop unless settled.
    fn pending(shared: Arc<Shared>, spec: &CacheSpec, token: String) -> Self {
        Claim {
            shared,
            keys: spec.keys.clone(),
            name: spec.name.clone(),
            flight: None,
            token,
            lease: spec.claim_lease,
            value_ttl: spec.value_ttl,
            pid: pid(),
            settled: false,
            renewal: None,
            lease_end: Arc::new(ClaimLease::new(Instant::now(), spec.claim_lease)),
            direct: spec.direct,
        }
    }

    /// Nothing was claimed: nothing to give back.
    fn disarm(mut self) {
        self.settled = true;
    }

    /// The claim was taken by a lookup sent at `sent_at`: keep its lease alive from now on.
    fn granted(mut self, sent_at: Instant) -> Self {
        self.flight = Some(self.shared.locals.get::<Flight>(&self.name));
        self.lease_end.renewed(sent_at, self.lease);
        if let Ok(handle) = runtime::handle() {
            let task = handle.spawn(renew(
                self.shared.clone(),
                self.keys.clone(),
                self.token.clone(),
                self.lease_end.clone(),
                self.lease,
                sent_at,
            ));
            self.renewal = Some(task.abort_handle());
        }
        self
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Where the claim's lease ends; after a refused store, whether it had run out (`lapsed`).
    pub fn lease_end(&self) -> Arc<ClaimLease> {
        self.lease_end.clone()
    }

    /// Stores `payload` for the entry's value ttl and wakes the waiters. `Ok(false)`: not stored, because the
    /// claim is not ours any more (its lease ended, or the entry was invalidated meanwhile).
    pub async fn store(mut self, payload: &[u8]) -> Result<bool> {
        self.check_process()?;
        let ttl_ms = lease::lease_ms(self.value_ttl);
        let step = steps::store(&self.keys, &self.token, payload, ttl_ms);
        let sent_at = Instant::now();
        let stored = executor::run(&self.shared, &step).await?;
        self.stored(stored, payload, ttl_ms, sent_at)
    }

    /// `store` on a direct connection, blocking the calling thread for one round trip.
    pub fn store_direct(mut self, payload: &[u8]) -> Result<bool> {
        self.check_process()?;
        let ttl_ms = lease::lease_ms(self.value_ttl);
        let step = steps::store(&self.keys, &self.token, payload, ttl_ms);
        let sent_at = Instant::now();
        let stored = executor::run_direct(&self.shared, &step)?;
        self.stored(stored, payload, ttl_ms, sent_at)
    }

    /// The blocking API's `store`: on the caller's thread when the client allows it, else a
    /// future to wait on (through the runtime).
    pub fn store_blocking(
        self,
        payload: &[u8],
    ) -> Now<Result<bool>, impl Future<Output = Result<bool>> + Send + '_> {
        if self.direct {
            return Now::Done(self.store_direct(payload));
        }
        Now::Later(self.store(payload))
    }

    /// A claim inherited by a forked child is the parent's: the child neither uses the parent's
    /// connections for it nor gives it back.
    fn check_process(&self) -> Result<()> {
        if self.pid == pid() {
            return Ok(());
        }
        Err(Error::Usage(
            "this fill claim belongs to the process that took it, not to a forked child".into(),
        ))
    }

    fn stored(
        &mut self,
        stored: bool,
        payload: &[u8],
        ttl_ms: u64,
        sent_at: Instant,
    ) -> Result<bool> {
        self.settled = true;
        if !stored {
            self.lease_end.refused(sent_at);
        }
        // Waiters of this process need not hear the wake-up and look again: this is the value
        // a lookup would find now, stored after they started asking.
        if let (true, Some(flight)) = (stored, self.flight.take()) {
            if Arc::strong_count(&flight) > 1 {
                let ttl_ms = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
                flight.publish(&hit(payload.to_vec(), ttl_ms), sent_at, None);
            }
        }
        Ok(stored)
    }

    /// Gives the claim back without a value, waking the waiters so that one takes the fill over.
    /// `Ok(false)`: it was not ours any more.
    pub async fn abandon(mut self) -> Result<bool> {
        self.check_process()?;
        let given_back = abandon(&self.shared, &self.keys, &self.token).await?;
        self.settled = true;
        Ok(given_back)
    }

    /// `abandon` on a direct connection, blocking the calling thread for one round trip.
    pub fn abandon_direct(mut self) -> Result<bool> {
        self.check_process()?;
        let step = steps::abandon(&self.keys, &self.token);
        let given_back = executor::run_direct(&self.shared, &step)?;
        self.settled = true;
        Ok(given_back)
    }

    /// The blocking API's `abandon`: on the caller's thread when the client allows it, else a
    /// future to wait on (through the runtime).
    pub fn abandon_blocking(
        self,
    ) -> Now<Result<bool>, impl Future<Output = Result<bool>> + Send + 'static> {
        if self.direct {
            return Now::Done(self.abandon_direct());
        }
        Now::Later(self.abandon())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // In a forked child the claim, its renewal task and the runtime are the parent's:
        // touch none of them.
        if self.pid != pid() {
            if let Some(renewal) = self.renewal.take() {
                std::mem::forget(renewal);
            }
            return;
        }
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if self.settled {
            return;
        }
        // A lookup that timed out may run after the first give-back: sent again once the
        // node's timed-out calls have been answered (see `waiting::undo_unknown`).
        undo_unknown(&self.shared, || self.undo());
    }
}

impl Claim {
    /// The give-back of this claim, token-checked: sent again while Redis cannot be reached (a
    /// store or give-back lost in a blip), so that the waiters are not held up for the rest of
    /// the lease, which renewal no longer extends: after one lease the claim has lapsed by
    /// itself.
    fn undo(&self) -> Undo {
        let (shared, keys, token) = (self.shared.clone(), self.keys.clone(), self.token.clone());
        let step = move || -> UndoStep {
            let (shared, keys, token) = (shared.clone(), keys.clone(), token.clone());
            Box::pin(async move { abandon(&shared, &keys, &token).await.map(|_| ()) })
        };
        Undo {
            step: Box::new(step),
            horizon: self.lease,
        }
    }

    /// The lookup that could take this claim failed on a direct connection: it is given back
    /// now, and again once that call has been answered if it timed out (it may run later than
    /// the first give-back); the error goes on.
    fn undo_failed(mut self, err: Error, overdue: Option<Overdue>) -> Error {
        self.settled = true;
        waiting::undo_failed(err, overdue, || self.undo())
    }
}

async fn abandon(shared: &Shared, keys: &Keys, token: &str) -> Result<bool> {
    executor::run(shared, &steps::abandon(keys, token)).await
}

/// Extends the claim's lease every third of it until aborted (store, abandon, drop), or until
/// the claim is found not ours (the store will then report it).
async fn renew(
    shared: Arc<Shared>,
    keys: Keys,
    token: String,
    lease_end: Arc<ClaimLease>,
    lease: Duration,
    from: Instant,
) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let retry = (period / 4).clamp(Duration::from_millis(1), Duration::from_millis(500));
    let lease_ms = lease::lease_ms(lease);
    let mut next = lease::deadline(from, period);
    loop {
        tokio::time::sleep_until(next.into()).await;
        let sent_at = Instant::now();
        let step = steps::extend(&keys, &token, lease_ms);
        match executor::send(&shared, &step).await {
            Ok(reply) => match step.parse(reply) {
                Ok(true) => {
                    lease_end.renewed(sent_at, lease);
                    next = lease::deadline(sent_at, period);
                }
                _ => return,
            },
            Err(_) if Instant::now() < lease_end.end() => next = Instant::now() + retry,
            Err(_) => return,
        }
    }
}

/// One lookup-or-claim, and when it was sent.
async fn lookup(
    shared: &Shared,
    spec: &CacheSpec,
    token: &str,
    skip: Option<&str>,
) -> Result<(Lookup, Instant)> {
    let step = steps::get_or_claim(&spec.keys, token, spec.claim_lease, skip);
    let sent_at = Instant::now();
    Ok((executor::run(shared, &step).await?, sent_at))
}

fn hit(payload: Vec<u8>, pttl_ms: i64) -> Hit {
    Hit {
        payload: Arc::new(payload),
        pttl_ms,
    }
}

/// Looks the entry up; on a miss claims its fill or, while another caller fills, waits as `wait`
/// allows for its value. `skip`: the SHA-1 hex of a payload the caller cannot use (it does not
/// decode, or it is due for an early refresh), which then counts as absent.
pub async fn fetch(
    shared: &Arc<Shared>,
    spec: &CacheSpec,
    wait: Wait,
    skip: Option<&str>,
) -> Result<Fetched> {
    let started = Instant::now();
    // Armed from before the first send: a lookup cancelled in flight may have claimed.
    let claim = Claim::pending(shared.clone(), spec, new_token()?);
    let (found, sent_at) = lookup(shared, spec, &claim.token, skip).await?;
    match first_step(claim, started, found, sent_at, wait) {
        First::Done(fetched) => Ok(fetched),
        First::Wait(pending) => pending.wait(shared, spec, wait, skip).await,
    }
}

/// The first look of a `fetch`, on a direct connection: blocks the calling thread for one
/// round trip (a hit, a claim, or a non-waiting miss ends there); the wait, if any, is `Pending`'s.
fn first_look_direct(
    shared: &Arc<Shared>,
    spec: &CacheSpec,
    wait: Wait,
    skip: Option<&str>,
) -> Result<First> {
    let started = Instant::now();
    let claim = Claim::pending(shared.clone(), spec, new_token()?);
    let step = steps::get_or_claim(&spec.keys, &claim.token, spec.claim_lease, skip);
    let sent_at = Instant::now();
    let found = match executor::invoke_direct(shared, executor::script_of(&step)?, None) {
        Ok(reply) => step.parse(reply)?,
        Err((err, overdue)) => return Err(claim.undo_failed(err, overdue)),
    };
    Ok(first_step(claim, started, found, sent_at, wait))
}

/// The blocking API's `fetch`: the first look on a direct connection of the caller's thread
/// when the client allows it (the hot path: one round trip, no hand-off to the runtime), so that
/// only a wait for another's fill is left to the runtime; else all of it through the runtime (a
/// cluster routes by slot and a Sentinel master moves).
pub fn fetch_blocking<'a>(
    shared: &'a Arc<Shared>,
    spec: &'a CacheSpec,
    wait: Wait,
    skip: Option<&'a str>,
) -> Now<Result<Fetched>, impl Future<Output = Result<Fetched>> + Send + 'a> {
    let pending = if spec.direct {
        match first_look_direct(shared, spec, wait, skip) {
            Ok(First::Done(fetched)) => return Now::Done(Ok(fetched)),
            Ok(First::Wait(pending)) => Some(pending),
            Err(err) => return Now::Done(Err(err)),
        }
    } else {
        None
    };
    Now::Later(async move {
        match pending {
            Some(pending) => pending.wait(shared, spec, wait, skip).await,
            None => fetch(shared, spec, wait, skip).await,
        }
    })
}

/// What the first look of a fetch came to.
pub enum First {
    Done(Fetched),
    /// Another caller fills and the caller may wait: `Pending::wait` does.
    Wait(Pending),
}

/// A fetch whose first look found another caller filling. Dropped (cancelled), it gives back
/// any claim its lookups may have taken.
pub struct Pending {
    claim: Claim,
    started: Instant,
}

fn first_step(
    claim: Claim,
    started: Instant,
    found: Lookup,
    sent_at: Instant,
    wait: Wait,
) -> First {
    match found {
        Lookup::Hit { payload, pttl_ms } => {
            claim.disarm();
            First::Done(Fetched::Hit(hit(payload, pttl_ms)))
        }
        Lookup::Claimed => First::Done(Fetched::Claimed(claim.granted(sent_at))),
        Lookup::Busy { .. } if wait.expired(Instant::now()) => {
            claim.disarm();
            First::Done(Fetched::Busy)
        }
        Lookup::Busy { .. } => First::Wait(Pending { claim, started }),
    }
}

impl Pending {
    /// Waits as `wait` allows (counted from the fetch's start) for the value or the claim.
    pub async fn wait(
        self,
        shared: &Arc<Shared>,
        spec: &CacheSpec,
        wait: Wait,
        skip: Option<&str>,
    ) -> Result<Fetched> {
        let Pending { claim, started } = self;
        match wait_for_value(shared, spec, &claim.token, wait, skip, started).await? {
            Waited::Hit(found) => {
                claim.disarm();
                Ok(Fetched::Hit(found))
            }
            Waited::Claimed(sent_at) => Ok(Fetched::Claimed(claim.granted(sent_at))),
            Waited::Busy => {
                claim.disarm();
                Ok(Fetched::Busy)
            }
        }
    }
}

enum Waited {
    Hit(Hit),
    Claimed(Instant),
    Busy,
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

async fn wait_for_value(
    shared: &Arc<Shared>,
    spec: &CacheSpec,
    token: &str,
    wait: Wait,
    skip: Option<&str>,
    started: Instant,
) -> Result<Waited> {
    let flight = shared.locals.get::<Flight>(&spec.name);
    // Queue for the turn to look in Redis, unless the one looking now publishes a value first.
    let timer = until(wait.deadline());
    tokio::pin!(timer);
    let _turn = loop {
        let published = flight.published.notified();
        tokio::pin!(published);
        // Listening before looking, so a value published after the look is heard.
        published.as_mut().enable();
        if let Some(found) = flight.reusable(started, skip) {
            return Ok(Waited::Hit(found));
        }
        tokio::select! {
            biased;
            _ = &mut published => {}
            turn = flight.gate.lock() => {
                // The previous turn may have ended with a value for us too.
                if let Some(found) = flight.reusable(started, skip) {
                    return Ok(Waited::Hit(found));
                }
                break turn;
            }
            _ = &mut timer => return Ok(Waited::Busy),
        }
    };
    let registration = shared.hub.register(spec.keys.wake_channel(), None);
    loop {
        // Listening before looking, so a store or give-back after the look is always heard: on
        // the channel, and (a fill of this process) on the flight.
        let published = flight.published.notified();
        tokio::pin!(published);
        published.as_mut().enable();
        registration.ready().await?;
        let (found, sent_at) = lookup(shared, spec, token, skip).await?;
        let retry_ms = match found {
            Lookup::Hit { payload, pttl_ms } => {
                let found = hit(payload, pttl_ms);
                flight.publish(&found, sent_at, skip);
                return Ok(Waited::Hit(found));
            }
            Lookup::Claimed => return Ok(Waited::Claimed(sent_at)),
            Lookup::Busy { retry_ms } => retry_ms,
        };
        let now = Instant::now();
        if wait.expired(now) {
            return Ok(Waited::Busy);
        }
        // Woken by a store or a give-back, or when the holder's lease ends (it died).
        let nap = lease::next_look(retry_ms, NO_HINT_LOOK, wait.deadline(), now);
        tokio::select! {
            _ = registration.notified() => {}
            _ = &mut published => {
                if let Some(found) = flight.reusable(started, skip) {
                    return Ok(Waited::Hit(found));
                }
            }
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// Drops the entry's value and any fill in progress (whose waiters are woken to fill anew).
/// `Ok(true)` when a value was dropped.
pub async fn invalidate(shared: &Shared, keys: &Keys) -> Result<bool> {
    executor::run(shared, &steps::invalidate(keys)).await
}

/// Whether `token` holds the entry's fill claim.
pub async fn claim_held_by(shared: &Shared, keys: &Keys, token: &str) -> Result<bool> {
    executor::run(shared, &steps::claim_held_by(keys, token)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent(read_at: Instant, pttl_ms: i64, skip: Option<&str>) -> Flight {
        let flight = Flight::default();
        flight.publish(&hit(b"v".to_vec(), pttl_ms), read_at, skip);
        flight
    }

    #[test]
    fn a_value_read_before_a_waiter_started_is_not_reused() {
        let now = Instant::now();
        let flight = recent(now, 1000, None);
        assert!(flight
            .reusable(now + Duration::from_millis(1), None)
            .is_none());
        assert!(Flight::default().reusable(now, None).is_none());
    }

    #[test]
    fn a_value_read_after_a_waiter_started_is_reused_and_aged() {
        let started = Instant::now();
        let flight = recent(started, 1000, None);
        let found = flight.reusable(started, None).map(|h| h.pttl_ms);
        assert!(
            matches!(found, Some(ms) if (0..=1000).contains(&ms)),
            "{found:?}"
        );
        let forever = recent(started, -1, None);
        assert_eq!(forever.reusable(started, None).map(|h| h.pttl_ms), Some(-1));
    }

    #[test]
    fn reuse_needs_the_same_skipped_payload() {
        let started = Instant::now();
        let flight = recent(started, 1000, Some("abc"));
        assert!(flight.reusable(started, None).is_none());
        assert!(flight.reusable(started, Some("def")).is_none());
        assert!(flight.reusable(started, Some("abc")).is_some());
    }
}

/// Against a real redis-server on a free loopback port (the engine tests' helper).
#[cfg(test)]
mod server_tests {
    use super::*;
    use crate::engine::node::Retry;
    use crate::engine::tests::{block_on, Server};

    fn spec(client: &Client, name: &str, lease_ms: u64) -> CacheSpec {
        let value_ttl = Duration::from_secs(30);
        CacheSpec::new(
            client,
            name.as_bytes(),
            Duration::from_millis(lease_ms),
            value_ttl,
        )
        .unwrap()
    }

    async fn query<T: redis::FromRedisValue + Send>(shared: &Shared, cmd: &redis::Cmd) -> T {
        shared.node.query(cmd, Retry::Once).await.unwrap()
    }

    fn claimed(fetched: Fetched) -> Claim {
        match fetched {
            Fetched::Claimed(claim) => claim,
            Fetched::Hit(_) => panic!("expected a claim, got a hit"),
            Fetched::Busy => panic!("expected a claim, got busy"),
        }
    }

    fn payload_of(fetched: Fetched) -> (Vec<u8>, i64) {
        match fetched {
            Fetched::Hit(hit) => (hit.payload.to_vec(), hit.pttl_ms),
            Fetched::Claimed(_) => panic!("expected a hit, got a claim"),
            Fetched::Busy => panic!("expected a hit, got busy"),
        }
    }

    fn until_ms(ms: u64) -> Wait {
        Wait::Until(Instant::now() + Duration::from_millis(ms))
    }

    #[test]
    fn claim_busy_store_hit() {
        let server = Server::start();
        let client = server.client("c1:");
        block_on(async {
            let shared = client.shared().unwrap();
            let s = spec(&client, "e", 10_000);
            let claim = claimed(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            let owner: Option<String> =
                query(&shared, redis::cmd("GET").arg(s.keys.cache_fill())).await;
            assert_eq!(owner.as_deref(), Some(claim.token()));
            assert!(matches!(
                fetch(&shared, &s, Wait::Once, None).await.unwrap(),
                Fetched::Busy
            ));
            assert!(claim.store(b"payload").await.unwrap());
            let (payload, pttl) = payload_of(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            assert_eq!(payload, b"payload");
            assert!((29_000..=30_000).contains(&pttl), "{pttl}");
            let fill: i64 = query(&shared, redis::cmd("EXISTS").arg(s.keys.cache_fill())).await;
            assert_eq!(fill, 0, "the claim is dropped by the store");
            // The direct first look sees the same.
            match first_look_direct(&shared, &s, Wait::Once, None).unwrap() {
                First::Done(Fetched::Hit(hit)) => assert_eq!(hit.payload.as_slice(), b"payload"),
                _ => panic!("expected a hit"),
            }
        });
    }

    #[test]
    fn waiters_are_woken_by_the_store_not_the_lease() {
        let server = Server::start();
        let filler = server.client("c2:");
        let waiter = server.client("c2:");
        block_on(async {
            let s = spec(&filler, "e", 60_000);
            let filler_shared = filler.shared().unwrap();
            let claim = claimed(fetch(&filler_shared, &s, Wait::Once, None).await.unwrap());
            let waiter_shared = waiter.shared().unwrap();
            let started = Instant::now();
            let waiting = tokio::spawn({
                let s = s.clone();
                async move { fetch(&waiter_shared, &s, until_ms(20_000), None).await }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(claim.store(b"v").await.unwrap());
            let (payload, _) = payload_of(waiting.await.unwrap().unwrap());
            assert_eq!(payload, b"v");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "woken by the store"
            );
        });
    }

    #[test]
    fn an_abandoned_or_dropped_claim_goes_to_a_waiter() {
        let server = Server::start();
        let filler = server.client("c3:");
        let waiter = server.client("c3:");
        block_on(async {
            let s = spec(&filler, "e", 60_000);
            let filler_shared = filler.shared().unwrap();
            let waiter_shared = waiter.shared().unwrap();
            for drop_it in [false, true] {
                let claim = claimed(fetch(&filler_shared, &s, Wait::Once, None).await.unwrap());
                let waiting = tokio::spawn({
                    let (s, shared) = (s.clone(), waiter_shared.clone());
                    async move { fetch(&shared, &s, until_ms(20_000), None).await }
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                if drop_it {
                    drop(claim); // a cancelled filler: given back in the background
                } else {
                    assert!(claim.abandon().await.unwrap());
                }
                let next = claimed(waiting.await.unwrap().unwrap());
                assert!(next.abandon().await.unwrap());
            }
        });
    }

    #[test]
    fn a_dead_fillers_claim_is_taken_when_its_lease_ends() {
        let server = Server::start();
        let client = server.client("c4:");
        block_on(async {
            let shared = client.shared().unwrap();
            let s = spec(&client, "e", 10_000);
            let _: () = query(
                &shared,
                redis::cmd("SET")
                    .arg(s.keys.cache_fill())
                    .arg("dead")
                    .arg("PX")
                    .arg(300),
            )
            .await;
            let started = Instant::now();
            let claim = claimed(fetch(&shared, &s, until_ms(10_000), None).await.unwrap());
            let waited = started.elapsed();
            assert!(waited >= Duration::from_millis(250), "{waited:?}");
            assert!(waited < Duration::from_secs(3), "{waited:?}");
            assert!(claim.abandon().await.unwrap());
        });
    }

    #[test]
    fn a_skipped_payload_counts_as_absent() {
        let server = Server::start();
        let client = server.client("c5:");
        block_on(async {
            let shared = client.shared().unwrap();
            let s = spec(&client, "e", 10_000);
            let _: () = query(
                &shared,
                redis::cmd("SET").arg(s.keys.cache_value()).arg("junk"),
            )
            .await;
            let digest: String = query(
                &shared,
                redis::cmd("EVAL")
                    .arg("return redis.sha1hex(ARGV[1])")
                    .arg(0)
                    .arg("junk"),
            )
            .await;
            let (payload, pttl) = payload_of(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            assert_eq!((payload.as_slice(), pttl), (&b"junk"[..], -1));
            let claim = claimed(fetch(&shared, &s, Wait::Once, Some(&digest)).await.unwrap());
            assert!(claim.store(b"clean").await.unwrap());
            // Another payload than the skipped one is a hit again.
            let (payload, _) =
                payload_of(fetch(&shared, &s, Wait::Once, Some(&digest)).await.unwrap());
            assert_eq!(payload, b"clean");
        });
    }

    #[test]
    fn invalidate_drops_value_and_claim_so_the_store_is_refused() {
        let server = Server::start();
        let client = server.client("c6:");
        block_on(async {
            let shared = client.shared().unwrap();
            let s = spec(&client, "e", 10_000);
            let claim = claimed(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            assert!(!invalidate(&shared, &s.keys).await.unwrap());
            assert!(!claim.store(b"stale").await.unwrap());
            let claim = claimed(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            assert!(claim.store(b"fresh").await.unwrap());
            assert!(invalidate(&shared, &s.keys).await.unwrap());
            let keys: Vec<Vec<u8>> = query(&shared, redis::cmd("KEYS").arg("c6:*")).await;
            assert!(keys.is_empty(), "{keys:?}");
        });
    }

    #[test]
    fn a_held_claim_is_renewed_past_its_lease() {
        let server = Server::start();
        let client = server.client("c7:");
        block_on(async {
            let shared = client.shared().unwrap();
            let s = spec(&client, "e", 600);
            let claim = claimed(fetch(&shared, &s, Wait::Once, None).await.unwrap());
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            assert!(matches!(
                fetch(&shared, &s, Wait::Once, None).await.unwrap(),
                Fetched::Busy
            ));
            assert!(claim.store(b"late").await.unwrap());
        });
    }

    #[test]
    fn one_process_sends_one_lookup_per_wake_not_one_per_waiter() {
        let server = Server::start();
        let filler = server.client("c8:");
        let waiters = server.client("c8:");
        block_on(async {
            let s = spec(&filler, "e", 60_000);
            let filler_shared = filler.shared().unwrap();
            let claim = claimed(fetch(&filler_shared, &s, Wait::Once, None).await.unwrap());
            let _: () = query(
                &filler_shared,
                &redis::cmd("CONFIG").arg("RESETSTAT").clone(),
            )
            .await;
            let shared = waiters.shared().unwrap();
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let (s, shared) = (s.clone(), shared.clone());
                    tokio::spawn(async move { fetch(&shared, &s, until_ms(20_000), None).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(claim.store(b"v").await.unwrap());
            for task in tasks {
                assert_eq!(payload_of(task.await.unwrap().unwrap()).0, b"v");
            }
            let stats: String = query(&filler_shared, redis::cmd("INFO").arg("commandstats")).await;
            let calls = |name: &str| -> u64 {
                stats
                    .lines()
                    .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
                    .and_then(|l| l.split("calls=").nth(1))
                    .and_then(|v| v.split(',').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            // 16 first looks, the leader's look before waiting and after the wake-up, the store.
            let lookups = calls("evalsha") + calls("eval");
            assert!(
                lookups <= 16 + 2 + 1 + 2,
                "{lookups} lookups for 16 waiters"
            );
        });
    }

    #[test]
    fn direct_connections_recover_from_being_killed() {
        let server = Server::start();
        let client = server.client("c9:");
        let shared = client.shared().unwrap();
        let s = spec(&client, "e", 10_000);
        let look = || match first_look_direct(&shared, &s, Wait::Once, None) {
            Ok(First::Done(Fetched::Claimed(claim))) => {
                assert!(block_on(claim.abandon()).unwrap());
            }
            Ok(_) => panic!("expected a claim"),
            Err(err) => panic!("{err}"),
        };
        look();
        block_on(async {
            let _: i64 = query(
                &shared,
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes"),
            )
            .await;
        });
        look(); // the pooled connection was killed: retried once on a fresh one
    }
}
