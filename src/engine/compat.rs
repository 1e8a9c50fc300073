//! The drop-in shims (`redmutex.compat`): a lock whose key and token are another library's
//! (redis-py's `name` and token, python-redis-lock's `lock:NAME` and id), run by the lock's own
//! attempts, release, renewal and wake-ups. Two things differ from `Lock`: the token is the
//! caller's (those libraries keep it per thread or per object, not per hold), and a waiter looks
//! again at least every `poll` (a holder on the original library publishes nothing, so its
//! release is noticed by looking, no later than the original's own waiters would notice it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::ScriptInvocation;

use super::client::Client;
use super::error::{Error, Result};
use super::executor::{self, Now};
use super::hold::{Leased, OnLost};
use super::hold_status::HoldStatus;
use super::lock::LockContender;
use super::node::{gave_up_at_deadline, Retry};
use super::renew::{self, Renewal, Schedule};
use super::shared::Shared;
use super::waiting::{self, spawn_undo, Contender, Outcome, Undo, UndoStep, Wait};
use crate::protocol::compat::{self as steps, Extended};
use crate::protocol::keys::key_slot;
use crate::protocol::lock::{self as lock_steps, Granted, LockSpec};
use crate::protocol::replies::Attempt;
use crate::protocol::scripts;
use crate::protocol::step::Step;
use crate::protocol::wake::GrantNote;

/// The current owner's token, if anybody holds the lock.
pub type Owner = Option<Vec<u8>>;

/// A lock on another library's key.
pub struct CompatLock {
    client: Arc<Client>,
    spec: LockSpec,
}

/// One hold taken through `CompatLock::acquire`: its fence, and its renewal if it has one.
pub struct CompatHold {
    pub fence: i64,
    status: Arc<HoldStatus>,
    renewal: std::sync::Mutex<Option<Renewal>>,
}

impl CompatHold {
    /// Whether renewal found the lease gone.
    pub fn lost(&self) -> bool {
        self.status.is_lost()
    }

    /// The hold's status (its deadline, whether it was found lost), shared with its renewal.
    pub fn status(&self) -> Arc<HoldStatus> {
        self.status.clone()
    }

    /// Stops renewal for good (before a release, or when the hold is given up).
    pub fn stop(&self) {
        self.status.set_releasing();
        let renewal = self
            .renewal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(renewal) = renewal {
            renewal.stop();
        }
    }
}

impl Drop for CompatHold {
    fn drop(&mut self) {
        self.stop();
    }
}

impl CompatLock {
    /// `name` names the redmutex keys beside the lock (fence, wake-up channel); `lock_key` is
    /// the other library's key; `signal`: python-redis-lock's signal list and its expiry in ms.
    pub fn new(
        client: Arc<Client>,
        name: &[u8],
        lock_key: &[u8],
        signal: Option<(&[u8], u64)>,
    ) -> Result<Self> {
        if client.is_redlock() {
            return Err(Error::Unsupported(
                "redmutex.compat needs one Redis server (a redis-py client), not a Redlock \
                 client"
                    .into(),
            ));
        }
        let mut keys = client.keys(name)?.with_lock_key(lock_key);
        if let Some((signal, expire_ms)) = signal {
            keys = keys.with_signal(signal, expire_ms);
        }
        if client.is_cluster() {
            let slot = keys.slot();
            let apart = key_slot(lock_key) != slot
                || keys.signal().is_some_and(|(s, _)| key_slot(s) != slot);
            if apart {
                return Err(Error::Unsupported(
                    "redmutex.compat on Redis Cluster: the original library's key and \
                     redmutex's keys of this name fall in different hash slots"
                        .into(),
                ));
            }
        }
        Ok(CompatLock {
            client,
            spec: LockSpec {
                name: name.to_vec(),
                keys,
                lease: Duration::from_secs(10),
                fair: false,
                replicas: 0,
                reentrant: false,
                queued: false,
            },
        })
    }

    /// The connections of the server the lock is on.
    pub fn shared(&self) -> Result<Arc<Shared>> {
        self.client.shared()
    }

    /// The other library's key.
    pub fn lock_key(&self) -> Vec<u8> {
        self.spec.keys.lock()
    }

    /// Takes the lock for `token` with a lease of `lease`, waiting as `wait` allows; `chosen`:
    /// the caller chose the token (another call may use it too, so one found in place is not
    /// ours); `poll`: while busy, look again at least this often (None: only when woken or a
    /// lease ends); `renew`: the lease is renewed in the background until `CompatHold::stop`.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire(
        &self,
        token: &str,
        lease: Duration,
        wait: Wait,
        chosen: bool,
        poll: Option<Duration>,
        renew: Option<Option<OnLost>>,
    ) -> Result<Option<CompatHold>> {
        let req = Request {
            lease,
            wait,
            chosen,
            poll,
        };
        self.acquire_from(token, req, renew, None).await
    }

    /// The blocking API's `acquire`: the first attempt on the caller's thread when the client
    /// allows it (and the token is the shim's own: a chosen token's first send needs the
    /// resend-aware path), the wait (if any) through the runtime.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_blocking<'a>(
        &'a self,
        token: &'a str,
        lease: Duration,
        wait: Wait,
        chosen: bool,
        poll: Option<Duration>,
        renew: Option<Option<OnLost>>,
    ) -> Now<
        Result<Option<CompatHold>>,
        impl std::future::Future<Output = Result<Option<CompatHold>>> + Send + 'a,
    > {
        let req = Request {
            lease,
            wait,
            chosen,
            poll,
        };
        if chosen || !self.client.supports_direct() {
            return Now::Later(self.acquire_from(token, req, renew, None));
        }
        let first = match self.first_direct(token, &req) {
            Ok(first) => first,
            // The deadline passed while the cluster refused it (see `node::giving_up_at`).
            Err(err) if gave_up_at_deadline(&err) => return Now::Done(Ok(None)),
            Err(err) => return Now::Done(Err(err)),
        };
        match first {
            (Outcome::Granted(granted), shared) => {
                Now::Done(Ok(Some(self.hold(&shared, token, lease, granted, renew))))
            }
            (Outcome::Busy { retry_ms }, _) if wait != Wait::Once => {
                Now::Later(self.acquire_from(token, req, renew, Some(Outcome::Busy { retry_ms })))
            }
            _ => Now::Done(Ok(None)),
        }
    }

    /// One attempt on the caller's thread (an unknown outcome is undone in the background).
    fn first_direct(&self, token: &str, req: &Request) -> Result<(Outcome<Granted>, Arc<Shared>)> {
        let shared = self.shared()?;
        let spec = self.spec_for(req.lease);
        let contender = self.contender(&shared, &spec, token, req);
        let step = contender.first_step();
        let script = executor::script_of(&step)?;
        let (reply, sent_at) =
            waiting::attempt_direct(&shared, script, req.wait, || contender.undo())?;
        let outcome = contender.read(step.parse(reply)?, sent_at)?;
        Ok((outcome, shared))
    }

    fn spec_for(&self, lease: Duration) -> LockSpec {
        LockSpec {
            lease,
            ..self.spec.clone()
        }
    }

    fn contender<'a>(
        &self,
        shared: &'a Arc<Shared>,
        spec: &'a LockSpec,
        token: &'a str,
        req: &Request,
    ) -> Polled<'a> {
        Polled {
            inner: LockContender::for_token(shared, spec, token, req.chosen),
            poll_ms: req
                .poll
                .map(|p| i64::try_from(p.as_millis()).unwrap_or(i64::MAX).max(1)),
        }
    }

    async fn acquire_from(
        &self,
        token: &str,
        req: Request,
        renew: Option<Option<OnLost>>,
        first: Option<Outcome<Granted>>,
    ) -> Result<Option<CompatHold>> {
        let shared = self.shared()?;
        let spec = self.spec_for(req.lease);
        let contender = self.contender(&shared, &spec, token, &req);
        let plan = spec.plan(&shared, token);
        let Some(granted) =
            waiting::acquire_from(&contender, &plan, req.wait, first, None, None).await?
        else {
            return Ok(None);
        };
        Ok(Some(self.hold(&shared, token, req.lease, granted, renew)))
    }

    /// The hold a grant gives, renewed in the background when asked.
    fn hold(
        &self,
        shared: &Arc<Shared>,
        token: &str,
        lease: Duration,
        granted: Granted,
        renew: Option<Option<OnLost>>,
    ) -> CompatHold {
        let status = Arc::new(HoldStatus::new(granted.sent_at + lease));
        let renewal = renew.map(|listener| {
            let (shared, keys, token) = (shared.clone(), self.spec.keys.clone(), token.to_string());
            let extend = move |lease: Duration| {
                let (shared, keys, token) = (shared.clone(), keys.clone(), token.clone());
                async move {
                    let sent_at = Instant::now();
                    let step = lock_steps::extend(&keys, &token, lease);
                    Ok(executor::run(&shared, &step).await?.then_some(sent_at))
                }
            };
            let schedule = Schedule::renewing(lease, lease);
            renew::start(extend, lease, schedule, status.clone(), listener)
        });
        CompatHold {
            fence: granted.fence,
            status,
            renewal: std::sync::Mutex::new(renewal),
        }
    }

    /// Runs `step` on the caller's thread when the client allows it, else through the runtime.
    fn now<'a, T: Send + 'a>(
        &'a self,
        step: Step<T>,
    ) -> Now<Result<T>, impl std::future::Future<Output = Result<T>> + Send + 'a> {
        if self.client.supports_direct() {
            return Now::Done(self.shared().and_then(|s| executor::run_direct(&s, &step)));
        }
        Now::Later(async move { executor::run(&*self.shared()?, &step).await })
    }

    async fn run<T>(&self, step: Step<T>) -> Result<T> {
        executor::run(&*self.shared()?, &step).await
    }

    /// The delete of the hold of `token` granted `fence` alone: a release's resend after its
    /// connection broke. The token may be the caller's (redis-py's `token=`, python-redis-lock's
    /// `id=`): if the first send ran, another call may have taken the lock under it since, and
    /// its grant issued a larger fence (see `lock_release.lua`).
    fn resend(&self, token: &str, fence: i64) -> ScriptInvocation<'static> {
        let keys = &self.spec.keys;
        scripts::release_fenced(keys, token, &keys.wake_channel(), &[fence])
    }

    /// Compare-and-delete (with the signal push when the keys have one); false when not ours.
    /// `fence`: that of the hold this process took with `token` (see `resend`); None (a hold
    /// taken elsewhere): the release is not resent after a broken connection, its error stands.
    pub fn release_blocking(
        &self,
        token: &str,
        fence: Option<i64>,
    ) -> Now<Result<bool>, impl std::future::Future<Output = Result<bool>> + Send + '_> {
        let step = lock_steps::release(&self.spec.keys, token);
        let resend = fence.map(|fence| self.resend(token, fence));
        if let (true, Some(resend)) = (self.client.supports_direct(), &resend) {
            return Now::Done(
                self.shared()
                    .and_then(|s| executor::run_direct_or_resend(&s, &step, resend)),
            );
        }
        Now::Later(async move {
            executor::run_or_resend(&*self.shared()?, &step, resend.as_ref()).await
        })
    }

    /// `release_blocking` through the runtime.
    pub async fn release(&self, token: &str, fence: Option<i64>) -> Result<bool> {
        let step = lock_steps::release(&self.spec.keys, token);
        let resend = fence.map(|fence| self.resend(token, fence));
        executor::run_or_resend(&*self.shared()?, &step, resend.as_ref()).await
    }

    /// Releases `token`'s hold (granted `fence`) from the runtime (an acquire whose caller
    /// stopped waiting got it), retrying while Redis cannot be reached, until the lease would
    /// have ended anyway. Every send after the first may follow one that ran: it deletes only
    /// the hold granted `fence` (see `resend`); with no fence known, nothing is sent again.
    pub fn give_back(self: &Arc<Self>, token: String, lease: Duration, fence: Option<i64>) {
        let lock = self.clone();
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let step = move || -> UndoStep {
            let (lock, token, sent) = (lock.clone(), token.clone(), sent.clone());
            Box::pin(async move {
                let first = !sent.swap(true, std::sync::atomic::Ordering::Relaxed);
                match (first, fence) {
                    (true, _) => lock.release(&token, fence).await.map(|_| ()),
                    (false, Some(fence)) => {
                        let resend = lock.resend(&token, fence);
                        lock.shared()?.node.invoke(&resend, Retry::Once).await?;
                        Ok(())
                    }
                    (false, None) => Ok(()),
                }
            })
        };
        spawn_undo(Undo {
            step: Box::new(step),
            horizon: lease,
        });
    }

    /// redis-py's extend (add `ms` to the lease, or `replace` it).
    pub fn extend_blocking(
        &self,
        token: &str,
        ms: i64,
        replace: bool,
    ) -> Now<Result<Extended>, impl std::future::Future<Output = Result<Extended>> + Send + '_>
    {
        self.now(steps::extend(&self.spec.keys, token, ms, replace))
    }

    pub async fn extend(&self, token: &str, ms: i64, replace: bool) -> Result<Extended> {
        self.run(steps::extend(&self.spec.keys, token, ms, replace))
            .await
    }

    /// The current owner's token, if anybody holds the lock.
    pub fn owner_blocking(
        &self,
    ) -> Now<Result<Owner>, impl std::future::Future<Output = Result<Owner>> + Send + '_> {
        self.now(lock_steps::owner(&self.spec.keys))
    }

    pub async fn owner(&self) -> Result<Option<Vec<u8>>> {
        self.run(lock_steps::owner(&self.spec.keys)).await
    }

    /// Deletes the lock whoever holds it, waking every waiter; whether a lock was deleted.
    pub fn reset_blocking(
        &self,
    ) -> Now<Result<i64>, impl std::future::Future<Output = Result<i64>> + Send + '_> {
        self.now(steps::reset(&self.spec.keys))
    }
}

/// One acquire's terms.
struct Request {
    lease: Duration,
    wait: Wait,
    chosen: bool,
    poll: Option<Duration>,
}

/// The lock's attempts, looking again at least every `poll_ms` while busy.
struct Polled<'a> {
    inner: LockContender<'a>,
    poll_ms: Option<i64>,
}

impl Polled<'_> {
    fn cap(&self, outcome: Outcome<Granted>) -> Outcome<Granted> {
        match (outcome, self.poll_ms) {
            (Outcome::Busy { retry_ms }, Some(poll)) if retry_ms < 0 || retry_ms > poll => {
                Outcome::Busy { retry_ms: poll }
            }
            (outcome, _) => outcome,
        }
    }
}

impl Contender for Polled<'_> {
    type Grant = Granted;
    type Reply = Attempt;

    fn first_step(&self) -> Step<Attempt> {
        self.inner.first_step()
    }

    fn read(&self, reply: Attempt, sent_at: Instant) -> Result<Outcome<Granted>> {
        Ok(self.cap(self.inner.read(reply, sent_at)?))
    }

    async fn attempt(&self, join: bool) -> Result<Outcome<Granted>> {
        Ok(self.cap(self.inner.attempt(join).await?))
    }

    fn granted(&self, note: GrantNote) -> Option<Granted> {
        self.inner.granted(note)
    }

    async fn leave(&self) -> Result<()> {
        self.inner.leave().await
    }

    fn undo(&self) -> Undo {
        self.inner.undo()
    }
}
