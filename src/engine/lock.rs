//! Lock operations: acquire (waiting without polling, see `waiting`), release, extend, and the
//! lock object's hold (shared by the blocking and the asyncio bindings).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{Client, Shared};
use super::error::Result;
use super::hold::{Holder, Leased, Naming};
use super::node::Retry;
use super::waiting::{self, Contender, Detached, Outcome, Plan};
use crate::protocol::keys::Keys;
use crate::protocol::lease;
use crate::protocol::replies::{parse_attempt, parse_flag, Attempt};
use crate::protocol::scripts::{self, Queueing};

pub use super::hold::{HoldStatus, OnLost};
pub use super::waiting::{Wait, QUEUE_PLACE};

/// What identifies a lock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct LockSpec {
    pub name: Vec<u8>,
    pub keys: Keys,
    pub lease: Duration,
    pub fair: bool,
    /// Replicas that must acknowledge the lock write (Redis WAIT) before a grant counts.
    pub replicas: u32,
}

/// A successful acquire: the fence, and when the winning request was sent (the lease's start).
#[derive(Clone, Copy, Debug)]
pub struct Granted {
    pub fence: i64,
    pub sent_at: Instant,
}

/// With `replicas` > 0, a grant counts only once that many replicas acknowledged it (WAIT on
/// the connection that wrote it, at most the command timeout); otherwise it is given back.
async fn confirmed(shared: &Shared, spec: &LockSpec, token: &str) -> Result<bool> {
    if spec.replicas == 0 {
        return Ok(true);
    }
    let node = shared.node_for(spec.replicas);
    let limit = node.timeouts().command;
    let wait_ms = lease::lease_ms(limit);
    let acked: i64 = node
        .query_within(
            redis::cmd("WAIT").arg(spec.replicas).arg(wait_ms),
            limit + Duration::from_secs(1),
        )
        .await?;
    if acked >= i64::from(spec.replicas) {
        return Ok(true);
    }
    node.invoke(&scripts::release(&spec.keys, token), Retry::Once)
        .await?;
    Ok(false)
}

/// One waiter's attempts on a lock.
struct LockContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a LockSpec,
    token: &'a str,
}

impl Contender for LockContender<'_> {
    type Grant = Granted;

    async fn attempt(&self, join: bool) -> Result<Outcome<Granted>> {
        let queueing = if join {
            Queueing::Join {
                place_ms: lease::lease_ms(QUEUE_PLACE),
            }
        } else {
            Queueing::TryOnly
        };
        let fair = self.spec.fair.then_some(queueing);
        let inv = scripts::acquire(
            &self.spec.keys,
            self.token,
            lease::lease_ms(self.spec.lease),
            fair,
        );
        let sent_at = Instant::now();
        let reply = self
            .shared
            .node_for(self.spec.replicas)
            .invoke(&inv, Retry::Once)
            .await?;
        match parse_attempt(&reply)? {
            Attempt::Busy { retry_ms } => Ok(Outcome::Busy { retry_ms }),
            Attempt::Granted { fence } => {
                if confirmed(self.shared, self.spec, self.token).await? {
                    Ok(Outcome::Granted(Granted { fence, sent_at }))
                } else {
                    Ok(Outcome::Refused)
                }
            }
        }
    }

    async fn leave(&self) -> Result<()> {
        self.shared
            .node
            .invoke(
                &scripts::leave_queue(&self.spec.keys, self.token),
                Retry::Once,
            )
            .await?;
        Ok(())
    }

    fn undo(&self) -> Detached {
        let shared = self.shared.clone();
        let keys = self.spec.keys.clone();
        let token = self.token.to_string();
        Box::pin(async move {
            let _ = shared
                .node
                .invoke(&scripts::release(&keys, &token), Retry::Once)
                .await;
            let _ = shared
                .node
                .invoke(&scripts::leave_queue(&keys, &token), Retry::Once)
                .await;
        })
    }
}

/// Tries to take the lock for `token`, waiting as `wait` allows. Waiting never polls: it sleeps
/// until a release is published or the holder's lease ends, whichever comes first.
pub async fn acquire(
    shared: &Arc<Shared>,
    spec: &LockSpec,
    token: &str,
    wait: Wait,
) -> Result<Option<Granted>> {
    let contender = LockContender {
        shared,
        spec,
        token,
    };
    // Unfair: one competitor per name in this process; the others queue here, in FIFO order.
    // Fair: every waiter takes its own place in the Redis queue, which orders them all.
    let plan = Plan {
        shared,
        channel: spec.keys.wake_channel(),
        wake_token: spec.fair.then_some(token),
        gate: (!spec.fair).then_some(spec.name.as_slice()),
        queued: spec.fair,
    };
    waiting::acquire(&contender, &plan, wait).await
}

/// Compare-and-delete; `Ok(false)` when the lock was not ours (any more).
pub async fn release(shared: &Shared, keys: &Keys, token: &str) -> Result<bool> {
    let reply = shared
        .node
        .invoke(&scripts::release(keys, token), Retry::Once)
        .await?;
    Ok(parse_flag(&reply)?)
}

/// Compare-and-pexpire; `Ok(Some(sent_at))` when extended, `Ok(None)` when not ours.
pub async fn extend(
    shared: &Shared,
    keys: &Keys,
    token: &str,
    lease: Duration,
) -> Result<Option<Instant>> {
    let inv = scripts::extend(keys, token, lease::lease_ms(lease));
    let sent_at = Instant::now();
    let reply = shared.node.invoke(&inv, Retry::Once).await?;
    Ok(parse_flag(&reply)?.then_some(sent_at))
}

/// The current owner token of a lock, if anybody holds it.
pub async fn owner(shared: &Shared, keys: &Keys) -> Result<Option<Vec<u8>>> {
    shared
        .node
        .query(redis::cmd("GET").arg(keys.lock()), Retry::Once)
        .await
}

impl Leased for LockSpec {
    type Detail = i64;
    type Args = ();

    fn naming(&self) -> Naming {
        Naming {
            object: "Lock",
            held: "the lock",
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    async fn acquire(
        &self,
        shared: &Arc<Shared>,
        token: &str,
        wait: Wait,
        _args: &(),
    ) -> Result<Option<(Instant, i64)>> {
        let granted = acquire(shared, self, token, wait).await?;
        Ok(granted.map(|g| (g.sent_at, g.fence)))
    }

    async fn release(&self, shared: &Shared, token: &str) -> Result<bool> {
        release(shared, &self.keys, token).await
    }

    async fn extend(
        &self,
        shared: &Shared,
        token: &str,
        lease: Duration,
    ) -> Result<Option<Instant>> {
        extend(shared, &self.keys, token, lease).await
    }

    async fn owned(&self, shared: &Shared, token: &str) -> Result<bool> {
        Ok(owner(shared, &self.keys).await?.as_deref() == Some(token.as_bytes()))
    }
}

/// One lock object: at most one hold at a time, owned by the object (not by a thread).
pub struct LockHandle {
    holder: Holder<LockSpec>,
}

impl LockHandle {
    pub fn new(
        client: Arc<Client>,
        name: &[u8],
        lease: Duration,
        fair: bool,
        replicas: u32,
        auto_renew: bool,
    ) -> Self {
        let spec = LockSpec {
            name: name.to_vec(),
            keys: client.keys(name),
            lease,
            fair,
            replicas,
        };
        LockHandle {
            holder: Holder::new(client, spec, auto_renew),
        }
    }

    pub fn auto_renew(&self) -> bool {
        self.holder.auto_renew()
    }

    pub fn spec(&self) -> &LockSpec {
        self.holder.primitive()
    }

    pub fn client(&self) -> &Arc<Client> {
        self.holder.client()
    }

    /// Takes the lock for this object; `listener` hears from auto-renewal, if it is on.
    pub async fn acquire(&self, wait: Wait, listener: Option<OnLost>) -> Result<bool> {
        self.holder.acquire(wait, listener, &()).await
    }

    pub async fn release(&self) -> Result<()> {
        self.holder.release().await
    }

    pub async fn extend(&self, lease: Option<Duration>) -> Result<()> {
        self.holder.extend(lease).await
    }

    pub async fn owned(&self) -> Result<bool> {
        self.holder.owned().await
    }

    pub async fn locked(&self) -> Result<bool> {
        let shared = self.holder.client().shared()?;
        Ok(owner(&shared, &self.spec().keys).await?.is_some())
    }

    pub fn token(&self) -> Option<String> {
        self.holder.token()
    }

    pub fn fence(&self) -> Option<i64> {
        self.holder.detail()
    }

    pub fn lost(&self) -> bool {
        self.holder.lost()
    }

    pub fn remaining(&self) -> Option<Duration> {
        self.holder.remaining()
    }
}
