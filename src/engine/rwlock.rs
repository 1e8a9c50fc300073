//! Read-write lock operations: many readers (zset token -> lease end, server clock) or one
//! writer (string with PX); a waiting writer marks itself (zset token -> place deadline), which
//! holds back new readers, so readers arriving continuously cannot starve it. Every reader and
//! writer has a lease of its own: a dead one stops counting when its lease ends.
//!
//! Deadlock guard: the RWLock objects of one client and name remember which of their locks each
//! context (a thread, or an asyncio task: the binding says which) of this process holds. Taking
//! the write lock while the same context holds a read or the write lock of the name, or a read
//! lock while it holds the write lock, would wait for itself forever, so it raises instead. A
//! context that holds a read lock may take another one even while a writer waits (the writer
//! waits for it). The guard is shared by every RWLock object of the client and name, since a
//! function that makes its own `RWLock(client, name)` per call is the usual way to nest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::client::Client;
use super::error::{Error, Result};
use super::executor;
use super::hold::{Holder, Leased, Naming};
use super::name_map::NameMap;
use super::redlock::Redlock;
use super::redlock_rwlock;
use super::runtime::pid;
use super::shared::Shared;
use super::waiting::{self, Contender, Outcome, Plan, Undo, UndoStep, Wait, QUEUE_PLACE};
use crate::protocol::keys::Keys;
use crate::protocol::replies::{Admission, RwState};
use crate::protocol::rwlock as steps;
pub use crate::protocol::rwlock::{Mode, RwSpec};
use crate::protocol::scripts::Queueing;
use crate::protocol::step::Step;

/// A context of this process that holds locks: (pid, thread or task id).
type Context = (u32, u64);

/// Marks one hold in the registry for as long as the hold exists (it is the hold's detail).
#[derive(Debug)]
pub struct HeldMark {
    mode: Mode,
}

/// Which contexts hold which locks of one name, through any RWLock object of one client.
#[derive(Default)]
struct Registry {
    holds: Mutex<HashMap<Context, Vec<Weak<HeldMark>>>>,
}

/// The shortest place of a waiting writer (see `writer_place`): a live one refreshes it every
/// third, one script every 0.33 s at most per waiting process, no more than renewing a hold of
/// that lease costs.
pub const WRITER_PLACE_FLOOR: Duration = Duration::from_secs(1);

/// How long a silent waiting writer keeps its place, holding new readers back: its lease, so a
/// writer that died while waiting stops counting about when a dead holder would (a place of
/// `QUEUE_PLACE` kept every reader out 6 s whatever the ttl), between `WRITER_PLACE_FLOOR` and
/// `QUEUE_PLACE`.
pub fn writer_place(lease: Duration) -> Duration {
    lease.clamp(WRITER_PLACE_FLOOR, QUEUE_PLACE)
}

/// Registry entries kept before the dead ones of every context are swept.
const REGISTRY_SWEEP_AT: usize = 64;

impl Registry {
    /// The guard shared by every RWLock object of `client` and `name` alive now (keyed by the
    /// client's address: the objects keep the client alive, so no other client reuses it while
    /// the entry is live).
    fn of(client: &Arc<Client>, name: &[u8]) -> Arc<Registry> {
        static REGISTRIES: OnceLock<NameMap<Registry>> = OnceLock::new();
        let mut key = (Arc::as_ptr(client) as usize).to_ne_bytes().to_vec();
        key.extend_from_slice(name);
        REGISTRIES.get_or_init(NameMap::new).get(&key)
    }

    /// The modes `context` holds now.
    fn held_by(&self, context: Context) -> (bool, bool) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let Some(marks) = holds.get_mut(&context) else {
            return (false, false);
        };
        marks.retain(|m| m.strong_count() > 0);
        let (mut read, mut write) = (false, false);
        for mark in marks.iter().filter_map(Weak::upgrade) {
            match mark.mode {
                Mode::Read => read = true,
                Mode::Write => write = true,
            }
        }
        if marks.is_empty() {
            holds.remove(&context);
        }
        (read, write)
    }

    fn add(&self, context: Context, mode: Mode) -> Arc<HeldMark> {
        let mark = Arc::new(HeldMark { mode });
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        if holds.len() >= REGISTRY_SWEEP_AT {
            holds.retain(|_, marks| {
                marks.retain(|m| m.strong_count() > 0);
                !marks.is_empty()
            });
        }
        holds
            .entry(context)
            .or_default()
            .push(Arc::downgrade(&mark));
        mark
    }
}

/// The read or the write side of one RWLock object.
pub struct RwSide {
    spec: RwSpec,
    mode: Mode,
    registry: Arc<Registry>,
}

pub struct RwContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a RwSpec,
    mode: Mode,
    token: &'a str,
    /// The acquiring context, and whether it holds a read lock already (a read re-enters).
    context: Context,
    reentrant: bool,
}

impl RwContender<'_> {
    fn step(&self, queueing: Queueing) -> Step<Admission> {
        steps::attempt(self.spec, self.mode, self.token, self.reentrant, queueing)
    }
}

impl Contender for RwContender<'_> {
    /// When the winning request was sent: the lease's start.
    type Grant = Instant;
    type Reply = Admission;

    fn first_step(&self) -> Step<Admission> {
        self.step(Queueing::TryOnly)
    }

    fn read(&self, admission: Admission, sent_at: Instant) -> Result<Outcome<Instant>> {
        Ok(waiting::admission(admission, sent_at))
    }

    async fn attempt(&self, join: bool) -> Result<Outcome<Instant>> {
        let queueing = if join {
            waiting::join_for(self.place())
        } else {
            Queueing::TryOnly
        };
        waiting::attempt_step(self, self.shared, &self.step(queueing)).await
    }

    /// Only writers keep a place (readers never join).
    fn place(&self) -> Duration {
        writer_place(self.spec.lease)
    }

    async fn leave(&self) -> Result<()> {
        if self.mode == Mode::Write {
            executor::run(
                self.shared,
                &steps::writer_leave(&self.spec.keys, self.token),
            )
            .await?;
        }
        Ok(())
    }

    fn undo(&self) -> Undo {
        let shared = self.shared.clone();
        let keys = self.spec.keys.clone();
        let token = self.token.to_string();
        let mode = self.mode;
        let horizon = self.spec.lease.max(QUEUE_PLACE);
        let step = move || -> UndoStep {
            let (shared, keys, token) = (shared.clone(), keys.clone(), token.clone());
            Box::pin(async move {
                executor::run(&shared, &steps::release(&keys, mode, &token)).await?;
                if mode == Mode::Write {
                    executor::run(&shared, &steps::writer_leave(&keys, &token)).await?;
                }
                Ok(())
            })
        };
        Undo {
            step: Box::new(step),
            horizon,
        }
    }
}

impl RwSide {
    /// Refuses what would deadlock on this context's own holds; says whether a read re-enters.
    fn check(&self, context: Context) -> Result<bool> {
        let (reading, writing) = self.registry.held_by(context);
        match self.mode {
            Mode::Write if reading => Err(Error::Usage(
                "read->write upgrade: this thread (or task) holds a read lock of this RWLock's name \
                 (through this RWLock object or another of the client), so waiting for its \
                 write lock would deadlock; release the read lock first"
                    .into(),
            )),
            _ if writing => Err(Error::Usage(format!(
                "this thread (or task) holds the write lock of this RWLock's name (through this \
                 RWLock object or another of the client), so waiting for its {} lock would \
                 deadlock; release the write lock first",
                match self.mode {
                    Mode::Read => "read",
                    Mode::Write => "write",
                }
            ))),
            _ => Ok(reading),
        }
    }
}

impl Leased for RwSide {
    type Detail = Arc<HeldMark>;
    /// The acquiring context (thread or task id).
    type Args = u64;

    fn naming(&self) -> Naming {
        match self.mode {
            Mode::Read => Naming {
                object: "read lock",
                held: "the read lock",
            },
            Mode::Write => Naming {
                object: "write lock",
                held: "the write lock",
            },
        }
    }

    fn lease(&self) -> Duration {
        self.spec.lease
    }

    type Grant = Instant;
    type Contender<'a> = RwContender<'a>;

    fn contender<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        token: &'a str,
        context: &u64,
    ) -> Result<RwContender<'a>> {
        let context = (pid(), *context);
        let reentrant = self.check(context)?;
        Ok(RwContender {
            shared,
            spec: &self.spec,
            mode: self.mode,
            token,
            context,
            reentrant,
        })
    }

    fn plan<'a>(&self, shared: &'a Arc<Shared>, token: &'a str) -> Plan<'a> {
        // Readers do not compete with each other: each waits for the writer on its own.
        // Writers: one competitor per lock in this process, its waiting mark refreshed.
        let writer = self.mode == Mode::Write;
        Plan {
            shared,
            channel: self.spec.keys.wake_channel(),
            inbox: None,
            wake_token: Some(token),
            gate: writer.then(|| self.spec.keys.rw_writer()),
            queued: writer,
        }
    }

    fn held(&self, contender: &RwContender<'_>, sent_at: Instant) -> (Instant, Arc<HeldMark>) {
        (sent_at, self.registry.add(contender.context, self.mode))
    }

    fn release(&self, token: &str) -> Step<bool> {
        steps::release(&self.spec.keys, self.mode, token)
    }

    fn extend(&self, token: &str, lease: Duration) -> Step<bool> {
        steps::extend(&self.spec.keys, self.mode, token, lease)
    }

    fn owned(&self, token: &str) -> Step<bool> {
        steps::owned(&self.spec.keys, self.mode, token)
    }

    /// Both sides' steps are one script each: the blocking API runs the first attempt,
    /// release, extend and `owned` on the caller's thread, like the lock's.
    fn direct(&self) -> bool {
        true
    }

    fn quorum(&self) -> bool {
        true
    }

    async fn acquire_quorum(
        &self,
        redlock: &Arc<Redlock>,
        token: &str,
        wait: Wait,
        context: &u64,
    ) -> Result<Option<(Instant, Arc<HeldMark>)>> {
        let context = (pid(), *context);
        let reentrant = self.check(context)?;
        let granted =
            redlock_rwlock::acquire(redlock, &self.spec, self.mode, token, reentrant, wait).await?;
        Ok(granted.map(|start| (start, self.registry.add(context, self.mode))))
    }
}

/// Who holds a read-write lock now.
pub async fn state(shared: &Shared, keys: &Keys) -> Result<RwState> {
    executor::run(shared, &steps::state(keys)).await
}

/// One RWLock object: hands out read and write lock objects that share the deadlock guard of
/// its client and name.
pub struct RwLock {
    client: Arc<Client>,
    spec: RwSpec,
    auto_renew: bool,
    registry: Arc<Registry>,
}

impl RwLock {
    pub fn new(
        client: Arc<Client>,
        name: &[u8],
        lease: Duration,
        auto_renew: bool,
    ) -> Result<Self> {
        client.check_lease("ttl", lease)?;
        let spec = RwSpec {
            name: name.to_vec(),
            keys: client.keys(name)?,
            lease,
        };
        let registry = Registry::of(&client, name);
        Ok(RwLock {
            client,
            spec,
            auto_renew,
            registry,
        })
    }

    pub fn spec(&self) -> &RwSpec {
        &self.spec
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// A new lock object for one side of this read-write lock.
    pub fn side(&self, mode: Mode) -> RwHandle {
        let side = RwSide {
            spec: self.spec.clone(),
            mode,
            registry: self.registry.clone(),
        };
        RwHandle {
            holder: Holder::new(self.client.clone(), side, self.auto_renew),
        }
    }

    /// Who holds it now (in every process).
    pub async fn state(&self) -> Result<RwState> {
        let shared = self.client.shared()?;
        state(&shared, &self.spec.keys).await
    }
}

/// A read or write lock object of an RWLock: at most one hold at a time, held by the object.
pub struct RwHandle {
    holder: Holder<RwSide>,
}

impl RwHandle {
    pub fn mode(&self) -> Mode {
        self.holder.primitive().mode
    }

    pub fn spec(&self) -> &RwSpec {
        &self.holder.primitive().spec
    }

    pub fn auto_renew(&self) -> bool {
        self.holder.auto_renew()
    }

    /// The object's hold: acquire (its `Args` is the caller's thread or task id, which the
    /// deadlock guard tells apart), release, extend, `owned` and the hold's state.
    pub fn holder(&self) -> &Holder<RwSide> {
        &self.holder
    }

    /// Somebody holds the read-write lock (a writer, or at least one live reader).
    pub async fn locked(&self) -> Result<bool> {
        let shared = self.holder.client().shared()?;
        let now = state(&shared, &self.spec().keys).await?;
        Ok(now.writer || now.readers > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writers_place_follows_its_lease_within_bounds() {
        let place = |ms| writer_place(Duration::from_millis(ms));
        assert_eq!(place(1), WRITER_PLACE_FLOOR);
        assert_eq!(place(500), WRITER_PLACE_FLOOR);
        assert_eq!(place(2_500), Duration::from_millis(2_500));
        assert_eq!(place(10_000), QUEUE_PLACE);
    }
}
