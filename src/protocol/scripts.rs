//! The Lua scripts, one per atomic step, each in its own file opening with its KEYS/ARGV/reply,
//! and the builders that bind them to keys and arguments.

use std::sync::LazyLock;

use redis::{Cmd, Script, ScriptInvocation};

use super::keys::Keys;

/// The unqueued lock's acquire: the fence preludes in front.
macro_rules! fence_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/fence_next.lua"),
            include_str!("lua/fence_current.lua"),
            include_str!($file)
        )
    };
}

/// The queued lock's acquire: the clock, fence and waitlist preludes in front.
macro_rules! fair_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/clock.lua"),
            include_str!("lua/fence_next.lua"),
            include_str!("lua/fence_current.lua"),
            include_str!("lua/waitlist.lua"),
            include_str!("lua/waitlist_head.lua"),
            include_str!($file)
        )
    };
}

/// The lock's leave: the clock and waitlist preludes, then the grant to the queue's head (which
/// issues its fence itself: see lock_grant.lua).
macro_rules! grant_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/clock.lua"),
            include_str!("lua/waitlist.lua"),
            include_str!("lua/waitlist_head.lua"),
            include_str!("lua/lock_grant.lua"),
            include_str!($file)
        )
    };
}

/// A script from its files under lua/: the preludes whose functions it calls (each after the
/// ones it calls in turn), then its own. A script takes no prelude it does not call: each
/// `local function` costs Redis a closure on every call (script_sources.rs checks every script).
macro_rules! lua {
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!("lua/", $file))),+)
    };
}

pub(crate) const LOCK_ACQUIRE_SOURCE: &str = fence_script!("lua/lock_acquire.lua");
/// The release: its compare-and-delete, and for a name nobody queues for the wake-up, come
/// before the grant preludes, so the common release returns before defining what it never uses.
pub(crate) const LOCK_RELEASE_SOURCE: &str = concat!(
    include_str!("lua/lock_release.lua"),
    include_str!("lua/clock.lua"),
    include_str!("lua/waitlist.lua"),
    include_str!("lua/waitlist_head.lua"),
    include_str!("lua/lock_grant.lua"),
    include_str!("lua/lock_release_grant.lua")
);
pub(crate) const LOCK_ACQUIRE_FAIR_SOURCE: &str = fair_script!("lua/lock_acquire_fair.lua");
pub static LOCK_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(LOCK_ACQUIRE_SOURCE));
pub static LOCK_ACQUIRE_FAIR: LazyLock<Script> =
    LazyLock::new(|| Script::new(LOCK_ACQUIRE_FAIR_SOURCE));
pub static LOCK_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(LOCK_RELEASE_SOURCE));
pub(crate) const LOCK_EXTEND_SOURCE: &str = include_str!("lua/lock_extend.lua");
pub static LOCK_EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(LOCK_EXTEND_SOURCE));
pub(crate) const LOCK_REENTER_SOURCE: &str = include_str!("lua/lock_reenter.lua");
pub static LOCK_REENTER: LazyLock<Script> = LazyLock::new(|| Script::new(LOCK_REENTER_SOURCE));
pub(crate) const LOCK_EXTEND_REENTRANT_SOURCE: &str = include_str!("lua/lock_extend_reentrant.lua");
pub static LOCK_EXTEND_REENTRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(LOCK_EXTEND_REENTRANT_SOURCE));
pub(crate) const QUEUE_LEAVE_SOURCE: &str = grant_script!("lua/queue_leave.lua");
pub static QUEUE_LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(QUEUE_LEAVE_SOURCE));
pub(crate) const FENCE_RAISE_SOURCE: &str = include_str!("lua/fence_raise.lua");
pub static FENCE_RAISE: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE_RAISE_SOURCE));

pub(crate) const SEM_ACQUIRE_SOURCE: &str = lua!(
    "clock.lua",
    "queue_prune.lua",
    "leases.lua",
    "leases_grant.lua",
    "leases_soonest.lua",
    "sem_acquire.lua"
);
pub static SEM_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(SEM_ACQUIRE_SOURCE));
pub(crate) const SEM_RELEASE_SOURCE: &str = lua!(
    "clock.lua",
    "queue_prune.lua",
    "leases.lua",
    "semaphore_wake.lua",
    "sem_release.lua"
);
pub static SEM_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(SEM_RELEASE_SOURCE));
pub(crate) const SEM_LEAVE_SOURCE: &str = lua!(
    "clock.lua",
    "queue_prune.lua",
    "leases.lua",
    "semaphore_wake.lua",
    "sem_leave.lua"
);
pub static SEM_LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(SEM_LEAVE_SOURCE));
pub(crate) const LEASE_EXTEND_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_grant.lua",
    "lease_extend.lua"
);
pub static LEASE_EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_EXTEND_SOURCE));
pub(crate) const LEASE_ALIVE_SOURCE: &str = lua!("clock.lua", "lease_alive.lua");
pub static LEASE_ALIVE: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_ALIVE_SOURCE));
pub(crate) const LEASE_COUNT_SOURCE: &str = lua!("clock.lua", "leases.lua", "lease_count.lua");
pub static LEASE_COUNT: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_COUNT_SOURCE));
pub(crate) const SEM_SLOT_ACQUIRE_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_prune.lua",
    "leases_grant.lua",
    "sem_slot_acquire.lua"
);
pub static SEM_SLOT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(SEM_SLOT_ACQUIRE_SOURCE));
pub(crate) const SEM_SLOT_RELEASE_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_prune.lua",
    "sem_slot_release.lua"
);
pub static SEM_SLOT_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(SEM_SLOT_RELEASE_SOURCE));
pub(crate) const SEM_SLOT_HELD_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_grant.lua",
    "sem_slot_held.lua"
);
pub static SEM_SLOT_HELD: LazyLock<Script> = LazyLock::new(|| Script::new(SEM_SLOT_HELD_SOURCE));
pub(crate) const RW_READ_ACQUIRE_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_grant.lua",
    "rw_read_acquire.lua"
);
pub static RW_READ_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RW_READ_ACQUIRE_SOURCE));
pub(crate) const RW_WRITE_ACQUIRE_SOURCE: &str = lua!(
    "clock.lua",
    "leases.lua",
    "leases_soonest.lua",
    "rw_write_acquire.lua"
);
pub static RW_WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RW_WRITE_ACQUIRE_SOURCE));
pub(crate) const RW_READ_RELEASE_SOURCE: &str =
    lua!("clock.lua", "leases.lua", "rw_read_release.lua");
pub static RW_READ_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RW_READ_RELEASE_SOURCE));
pub(crate) const RW_WRITE_RELEASE_SOURCE: &str = lua!("rw_write_release.lua");
pub static RW_WRITE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RW_WRITE_RELEASE_SOURCE));
pub(crate) const RW_WRITER_LEAVE_SOURCE: &str =
    lua!("clock.lua", "leases.lua", "rw_writer_leave.lua");
pub static RW_WRITER_LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(RW_WRITER_LEAVE_SOURCE));
pub(crate) const RW_STATE_SOURCE: &str = lua!("clock.lua", "leases.lua", "rw_state.lua");
pub static RW_STATE: LazyLock<Script> = LazyLock::new(|| Script::new(RW_STATE_SOURCE));

pub(crate) const CACHE_GET_OR_CLAIM_SOURCE: &str = include_str!("lua/cache_get_or_claim.lua");
pub static CACHE_GET_OR_CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(CACHE_GET_OR_CLAIM_SOURCE));
pub(crate) const CACHE_STORE_SOURCE: &str = include_str!("lua/cache_store.lua");
pub static CACHE_STORE: LazyLock<Script> = LazyLock::new(|| Script::new(CACHE_STORE_SOURCE));
pub(crate) const CACHE_ABANDON_SOURCE: &str = include_str!("lua/cache_abandon.lua");
pub static CACHE_ABANDON: LazyLock<Script> = LazyLock::new(|| Script::new(CACHE_ABANDON_SOURCE));
pub(crate) const CACHE_INVALIDATE_SOURCE: &str = include_str!("lua/cache_invalidate.lua");
pub static CACHE_INVALIDATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(CACHE_INVALIDATE_SOURCE));

/// How a fair waiter treats the queue on an attempt that is not granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queueing {
    /// Try once; never take a place in the queue.
    TryOnly,
    /// Take (or keep) a place that lapses `place_ms` after this attempt unless refreshed.
    Join { place_ms: u64 },
    /// The first attempt of an unfair lock's waiter: take a free lock past the queue (like an
    /// attempt without queue), and only when it is taken, join as `Join` does. (Primitives
    /// without such waiters treat it as `Join`.)
    BargeOrJoin { place_ms: u64 },
}

/// One acquire attempt for `token` with a lease of `lease_ms`; `fair` selects the FIFO script.
/// `inbox`: where a fair release tells this waiter it was granted the lock (hex id, or '' for
/// the wake channel; see `Keys::wake_inbox`).
pub fn acquire(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    fair: Option<Queueing>,
    inbox: &str,
) -> ScriptInvocation<'static> {
    acquire_call(keys, token, lease_ms, fair, inbox).invocation()
}

/// A non-fair acquire attempt, as the first send of a token the caller chose (the recipes'
/// identifier, which two calls may share): a token found already in place may belong to another
/// call, so it is never counted as this one's. A resend after a dropped connection goes in this
/// form too: it cannot tell a token its lost first send set from one in place before it.
pub fn acquire_first_send(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'static> {
    let mut inv = acquire_call(keys, token, lease_ms, None, "").invocation();
    inv.arg(FIRST_SEND);
    inv
}

/// The last argument of `acquire_first_send` (read as `ARGV[#ARGV]` by `lock_acquire.lua`).
const FIRST_SEND: &str = "first";

/// The pieces of one acquire attempt, from which both wire forms are made.
pub fn acquire_call(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    fair: Option<Queueing>,
    inbox: &str,
) -> Call {
    match fair {
        None => Call {
            script: &LOCK_ACQUIRE,
            source: LOCK_ACQUIRE_SOURCE,
            keys: vec![keys.lock(), keys.fence()],
            args: vec![
                token.as_bytes().to_vec(),
                lease_ms.to_string().into_bytes(),
                keys.fence_ttl_ms().to_string().into_bytes(),
            ],
        },
        Some(queueing) => {
            let (place_ms, join) = match queueing {
                Queueing::TryOnly => (0, "0"),
                Queueing::Join { place_ms } => (place_ms, "1"),
                Queueing::BargeOrJoin { place_ms } => (place_ms, "b"),
            };
            Call {
                script: &LOCK_ACQUIRE_FAIR,
                source: LOCK_ACQUIRE_FAIR_SOURCE,
                keys: vec![keys.lock(), keys.fence(), keys.queue()],
                args: vec![
                    token.as_bytes().to_vec(),
                    lease_ms.to_string().into_bytes(),
                    place_ms.to_string().into_bytes(),
                    join.as_bytes().to_vec(),
                    inbox.as_bytes().to_vec(),
                    keys.fence_ttl_ms().to_string().into_bytes(),
                    keys.wake_channel(),
                ],
            }
        }
    }
}

/// A script call in pieces: sent as EVALSHA normally, or as EVAL where a NOSCRIPT reply could
/// not be answered by loading the script first (inside a pipeline, e.g. a write + WAIT).
pub struct Call {
    script: &'static LazyLock<Script>,
    source: &'static str,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let script: &'static Script = self.script;
        let mut inv = script.prepare_invoke();
        for key in &self.keys {
            inv.key(key.as_slice());
        }
        for arg in &self.args {
            inv.arg(arg.as_slice());
        }
        inv
    }

    pub fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.source).arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }
}

/// How much longer than its place in the queue a fair waiter may be granted the lock for (see
/// `lock_grant.lua`): a waiter that died while queued blocks the others at most this much
/// longer than its place lasts.
pub const GRANT_SLACK_MS: u64 = 3000;

/// Compare-and-delete of the lock, then the hand-off: a grant to the fair queue's first live
/// waiter, or a wake-up for all on its channel.
pub fn release<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    release_waking(keys, token, &keys.wake_channel())
}

/// A wake-up channel nobody listens on: a release or give-back that must wake nobody (a lost
/// Redlock round's, see `redlock_lease.rs`) publishes there.
pub const NOBODY: &[u8] = b"";

/// `release`, its wake-up published on `channel`.
pub fn release_waking<'a>(keys: &Keys, token: &str, channel: &[u8]) -> ScriptInvocation<'a> {
    release_fenced(keys, token, channel, &[])
}

/// `release_waking` of the hold of `token` only while the fence counter reads one of `fences`
/// (none: unfenced; see `lock_release.lua`): the resend of a release of a token the caller
/// chose, which another call may hold by then.
pub fn release_fenced<'a>(
    keys: &Keys,
    token: &str,
    channel: &[u8],
    fences: &[i64],
) -> ScriptInvocation<'a> {
    // A drop-in shim's lock (`redmutex.compat.redis_lock`): python-redis-lock's waiters wait on
    // its signal list, so every release (an undo's too) pushes it.
    if let Some((signal, expire_ms)) = keys.signal() {
        return super::compat::signal_release(keys, token, signal, expire_ms, fences);
    }
    let mut inv = LOCK_RELEASE.prepare_invoke();
    queue_hand_off(&mut inv, keys, token, channel);
    for fence in fences {
        inv.arg(fence.to_string());
    }
    inv
}

/// `release_fenced` of a token the caller chose (the recipes' identifier): it may be a
/// re-entrant lock's, so that lock's hold count goes with it too, as `release_reentrant`'s does.
pub fn release_chosen<'a>(keys: &Keys, token: &str, fences: &[i64]) -> ScriptInvocation<'a> {
    let mut inv = release_fenced(keys, token, &keys.wake_channel(), fences);
    if keys.signal().is_none() {
        inv.key(keys.lock_holds());
    }
    inv
}

/// `release` of a re-entrant lock: its hold count goes with it (see `lock_release.lua`).
pub fn release_reentrant<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    let mut inv = LOCK_RELEASE.prepare_invoke();
    queue_hand_off(&mut inv, keys, token, &keys.wake_channel());
    inv.key(keys.lock_holds());
    inv
}

/// The keys and arguments shared by the release and the leave (`lock_grant.lua`'s callers).
fn queue_hand_off(inv: &mut ScriptInvocation<'_>, keys: &Keys, token: &str, channel: &[u8]) {
    inv.key(keys.lock())
        .key(keys.fence())
        .key(keys.queue())
        .arg(token)
        .arg(channel)
        .arg(GRANT_SLACK_MS)
        .arg(keys.fence_ttl_ms());
}

/// Compare-and-pexpire: the lease ends `lease_ms` from now (waking the waiters when that cuts
/// it short).
pub fn extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_EXTEND.prepare_invoke();
    inv.key(keys.lock())
        .arg(token)
        .arg(lease_ms)
        .arg(keys.wake_channel());
    inv
}

/// A re-entrant lock's owner takes it again or gives back a nested acquire: the hold count
/// becomes `depth`; `lease_ms` > 0 (a re-entry) makes the lease last at least that long from now.
pub fn reenter<'a>(keys: &Keys, token: &str, depth: u32, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_REENTER.prepare_invoke();
    inv.key(keys.lock())
        .key(keys.lock_holds())
        .arg(token)
        .arg(depth)
        .arg(lease_ms);
    inv
}

/// Compare-and-pexpire of a re-entrant lock and its hold count: both end `lease_ms` from now.
pub fn extend_reentrant<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_EXTEND_REENTRANT.prepare_invoke();
    inv.key(keys.lock())
        .key(keys.lock_holds())
        .arg(token)
        .arg(lease_ms)
        .arg(keys.wake_channel());
    inv
}

/// A fair waiter leaves the queue (giving back a grant that came meanwhile).
pub fn leave_queue<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    let mut inv = QUEUE_LEAVE.prepare_invoke();
    queue_hand_off(&mut inv, keys, token, &keys.wake_channel());
    inv
}

// ---------------------------------------------------------------------------------- semaphore

/// One attempt to take a permit of a semaphore of `limit` for `token`, leased for `lease_ms`.
/// `queueing`: how a fair waiter treats the FIFO queue; an unfair one (`fair` false) ignores it,
/// and with `Join` keeps a place that only tells that it waits (its limit stays live).
pub fn semaphore_acquire<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    limit: u64,
    fair: bool,
    queueing: Queueing,
) -> ScriptInvocation<'a> {
    let (mode, place_ms) = match (fair, queueing) {
        (false, Queueing::TryOnly) => ("0", 0),
        (true, Queueing::TryOnly) => ("1", 0),
        (true, Queueing::Join { place_ms } | Queueing::BargeOrJoin { place_ms }) => ("2", place_ms),
        (false, Queueing::Join { place_ms } | Queueing::BargeOrJoin { place_ms }) => {
            ("3", place_ms)
        }
    };
    let mut inv = SEM_ACQUIRE.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_queue())
        .key(keys.semaphore_queue_deadlines())
        .key(keys.semaphore_limit())
        .arg(token)
        .arg(lease_ms)
        .arg(limit)
        .arg(mode)
        .arg(place_ms);
    inv
}

/// Gives back `token`'s permit and wakes the waiters that a free permit lets in.
pub fn semaphore_release<'a>(keys: &Keys, token: &str, limit: u64) -> ScriptInvocation<'a> {
    let mut inv = SEM_RELEASE.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_queue())
        .key(keys.semaphore_queue_deadlines())
        .key(keys.semaphore_limit())
        .arg(token)
        .arg(limit)
        .arg(keys.wake_channel());
    inv
}

/// A fair semaphore waiter leaves the queue.
pub fn semaphore_leave<'a>(keys: &Keys, token: &str, limit: u64) -> ScriptInvocation<'a> {
    let mut inv = SEM_LEAVE.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_queue())
        .key(keys.semaphore_queue_deadlines())
        .key(keys.semaphore_limit())
        .arg(token)
        .arg(limit)
        .arg(keys.wake_channel());
    inv
}

/// Compare-and-extend of a permit: its lease ends `lease_ms` from now (server clock); the
/// semaphore's live limit lives at least as long.
pub fn semaphore_extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = lease_extend(keys.semaphore_holders(), token, lease_ms, keys);
    inv.key(keys.semaphore_limit());
    inv
}

/// Whether `token` holds a live permit.
pub fn semaphore_owned<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    lease_alive(keys.semaphore_holders(), token)
}

/// The number of live permit holders.
pub fn semaphore_holders<'a>(keys: &Keys) -> ScriptInvocation<'a> {
    let mut inv = LEASE_COUNT.prepare_invoke();
    inv.key(keys.semaphore_holders());
    inv
}

/// Redlock: one attempt on one master to take `slot` of a semaphore of `limit` for `token`;
/// a refusal names at most `free` other slots free there.
pub fn semaphore_slot_acquire<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    limit: u64,
    slot: u64,
    free: u64,
) -> ScriptInvocation<'a> {
    let mut inv = SEM_SLOT_ACQUIRE.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_slots())
        .arg(token)
        .arg(lease_ms)
        .arg(limit)
        .arg(slot)
        .arg(free);
    inv
}

/// Redlock: gives back `token`'s slot on one master and wakes the waiters; with `won`, it counts
/// as released only when that was the slot.
pub fn semaphore_slot_release<'a>(
    keys: &Keys,
    token: &str,
    won: Option<u64>,
    channel: &[u8],
) -> ScriptInvocation<'a> {
    let mut inv = SEM_SLOT_RELEASE.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_slots())
        .arg(token)
        .arg(channel);
    if let Some(slot) = won {
        inv.arg(slot);
    }
    inv
}

/// Redlock: whether `token` holds `slot` with a live lease on one master; with `lease_ms`, its
/// lease then ends that long from now (compare-and-extend; the slots hash lives as long).
pub fn semaphore_slot_held<'a>(
    keys: &Keys,
    token: &str,
    slot: u64,
    lease_ms: Option<u64>,
) -> ScriptInvocation<'a> {
    let mut inv = SEM_SLOT_HELD.prepare_invoke();
    inv.key(keys.semaphore_holders())
        .key(keys.semaphore_slots())
        .arg(token)
        .arg(slot);
    if let Some(ms) = lease_ms {
        inv.arg(ms).arg(keys.wake_channel());
    }
    inv
}

/// Compare-and-extend of a lease in the zset `key` (waking the waiters of `keys`' primitive when
/// that cuts it short).
fn lease_extend<'a>(key: Vec<u8>, token: &str, lease_ms: u64, keys: &Keys) -> ScriptInvocation<'a> {
    let mut inv = LEASE_EXTEND.prepare_invoke();
    inv.key(key)
        .arg(token)
        .arg(lease_ms)
        .arg(keys.wake_channel());
    inv
}

fn lease_alive<'a>(key: Vec<u8>, token: &str) -> ScriptInvocation<'a> {
    let mut inv = LEASE_ALIVE.prepare_invoke();
    inv.key(key).arg(token);
    inv
}

// ---------------------------------------------------------------------------- read-write lock

/// One attempt to take a read lock. `reentrant`: the caller already holds a read lock of this
/// read-write lock, so waiting writers must not hold it back (that would deadlock).
pub fn rw_read_acquire<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    reentrant: bool,
) -> ScriptInvocation<'a> {
    let mut inv = RW_READ_ACQUIRE.prepare_invoke();
    inv.key(keys.rw_readers())
        .key(keys.rw_writer())
        .key(keys.rw_writers_waiting())
        .arg(token)
        .arg(lease_ms)
        .arg(if reentrant { "1" } else { "0" });
    inv
}

/// One attempt to take the write lock; `Join` marks the writer as waiting, which holds back new
/// readers until it takes the lock, gives up, or stops refreshing its place.
pub fn rw_write_acquire<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    queueing: Queueing,
) -> ScriptInvocation<'a> {
    let (place_ms, join) = match queueing {
        Queueing::TryOnly => (0, "0"),
        Queueing::Join { place_ms } | Queueing::BargeOrJoin { place_ms } => (place_ms, "1"),
    };
    let mut inv = RW_WRITE_ACQUIRE.prepare_invoke();
    inv.key(keys.rw_readers())
        .key(keys.rw_writer())
        .key(keys.rw_writers_waiting())
        .arg(token)
        .arg(lease_ms)
        .arg(place_ms)
        .arg(join)
        .arg(keys.wake_channel());
    inv
}

/// Releases a read lock; the last reader out wakes the waiting writers.
pub fn rw_read_release<'a>(keys: &Keys, token: &str, channel: &[u8]) -> ScriptInvocation<'a> {
    let mut inv = RW_READ_RELEASE.prepare_invoke();
    inv.key(keys.rw_readers())
        .key(keys.rw_writers_waiting())
        .arg(token)
        .arg(channel);
    inv
}

/// Compare-and-delete of the write lock, then a wake-up for everybody.
pub fn rw_write_release<'a>(keys: &Keys, token: &str, channel: &[u8]) -> ScriptInvocation<'a> {
    let mut inv = RW_WRITE_RELEASE.prepare_invoke();
    inv.key(keys.rw_writer()).arg(token).arg(channel);
    inv
}

/// A waiting writer gives up its place.
pub fn rw_writer_leave<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    let mut inv = RW_WRITER_LEAVE.prepare_invoke();
    inv.key(keys.rw_writer())
        .key(keys.rw_writers_waiting())
        .arg(token)
        .arg(keys.wake_channel());
    inv
}

/// Compare-and-extend of a read lock.
pub fn rw_read_extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    lease_extend(keys.rw_readers(), token, lease_ms, keys)
}

/// Compare-and-pexpire of the write lock (the lock's own extend script on the writer key).
pub fn rw_write_extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_EXTEND.prepare_invoke();
    inv.key(keys.rw_writer())
        .arg(token)
        .arg(lease_ms)
        .arg(keys.wake_channel());
    inv
}

/// Whether `token` holds a live read lock.
pub fn rw_read_owned<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    lease_alive(keys.rw_readers(), token)
}

/// Whether a writer holds the lock, and how many live readers do.
pub fn rw_state<'a>(keys: &Keys) -> ScriptInvocation<'a> {
    let mut inv = RW_STATE.prepare_invoke();
    inv.key(keys.rw_readers()).key(keys.rw_writer());
    inv
}

/// Raises the fencing counter to at least `fence` (Redlock's write-back; never lowers it) and
/// refreshes its expiry.
pub fn raise_fence<'a>(keys: &Keys, fence: i64) -> ScriptInvocation<'a> {
    let mut inv = FENCE_RAISE.prepare_invoke();
    inv.key(keys.fence()).arg(fence).arg(keys.fence_ttl_ms());
    inv
}

// -------------------------------------------------------------------------------------- cache

/// Look up a cache entry or claim its fill for `token` with a lease of `lease_ms`. `skip` is the
/// SHA-1 hex of a payload the caller cannot use: a stored value with that digest counts as absent.
pub fn cache_get_or_claim<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    skip: Option<&str>,
) -> ScriptInvocation<'a> {
    let mut inv = CACHE_GET_OR_CLAIM.prepare_invoke();
    inv.key(keys.cache_value())
        .key(keys.cache_fill())
        .arg(token)
        .arg(lease_ms)
        .arg(skip.unwrap_or(""));
    inv
}

/// Store `payload` for `ttl_ms` if `token` holds the fill claim; give the claim back; wake.
pub fn cache_store<'a>(
    keys: &Keys,
    token: &str,
    payload: &[u8],
    ttl_ms: u64,
) -> ScriptInvocation<'a> {
    let mut inv = CACHE_STORE.prepare_invoke();
    inv.key(keys.cache_value())
        .key(keys.cache_fill())
        .arg(token)
        .arg(payload)
        .arg(ttl_ms)
        .arg(keys.wake_channel());
    inv
}

/// Give the fill claim of `token` back without a value, waking the waiters.
pub fn cache_abandon<'a>(keys: &Keys, token: &str, channel: &[u8]) -> ScriptInvocation<'a> {
    let mut inv = CACHE_ABANDON.prepare_invoke();
    inv.key(keys.cache_fill()).arg(token).arg(channel);
    inv
}

/// Compare-and-pexpire of the fill claim: the same atomic step as a lock's extend, on the claim.
pub fn cache_extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_EXTEND.prepare_invoke();
    inv.key(keys.cache_fill()).arg(token).arg(lease_ms);
    inv
}

/// Drop a cache entry and any fill claim on it, waking that fill's waiters.
pub fn cache_invalidate<'a>(keys: &Keys) -> ScriptInvocation<'a> {
    let mut inv = CACHE_INVALIDATE.prepare_invoke();
    inv.key(keys.cache_value())
        .key(keys.cache_fill())
        .arg(keys.wake_channel());
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_documents_its_interface() {
        for source in [
            include_str!("lua/lock_acquire.lua"),
            include_str!("lua/lock_acquire_fair.lua"),
            include_str!("lua/lock_release.lua"),
            include_str!("lua/lock_extend.lua"),
            include_str!("lua/queue_leave.lua"),
            include_str!("lua/fence_raise.lua"),
            include_str!("lua/cache_get_or_claim.lua"),
            include_str!("lua/cache_store.lua"),
            include_str!("lua/cache_abandon.lua"),
            include_str!("lua/cache_invalidate.lua"),
        ] {
            assert!(source.starts_with("-- "), "{source}");
            for word in ["KEYS[1]", "ARGV[1]", "Reply"] {
                assert!(source.contains(word), "{word} missing in {source}");
            }
        }
    }

    #[test]
    fn lease_scripts_document_their_interface() {
        for source in [
            include_str!("lua/sem_acquire.lua"),
            include_str!("lua/sem_release.lua"),
            include_str!("lua/sem_leave.lua"),
            include_str!("lua/lease_extend.lua"),
            include_str!("lua/lease_alive.lua"),
            include_str!("lua/lease_count.lua"),
            include_str!("lua/rw_read_acquire.lua"),
            include_str!("lua/rw_write_acquire.lua"),
            include_str!("lua/rw_read_release.lua"),
            include_str!("lua/rw_write_release.lua"),
            include_str!("lua/rw_writer_leave.lua"),
            include_str!("lua/rw_state.lua"),
            include_str!("lua/sem_slot_acquire.lua"),
            include_str!("lua/sem_slot_release.lua"),
            include_str!("lua/sem_slot_held.lua"),
        ] {
            assert!(source.starts_with("-- "), "{source}");
            for word in ["KEYS[1]", "ARGV", "Reply"] {
                assert!(source.contains(word), "{word} missing in {source}");
            }
        }
    }

    #[test]
    fn lease_scripts_carry_both_preludes_in_order() {
        let source = SEM_ACQUIRE_SOURCE;
        let prune = source.find("local function prune_queue");
        let leases = source.find("local function server_now_ms");
        let body = source.find("-- Take a permit of a semaphore");
        assert!(
            prune < leases && leases < body,
            "{prune:?} {leases:?} {body:?}"
        );
        for script in [
            &*SEM_ACQUIRE,
            &*SEM_RELEASE,
            &*SEM_LEAVE,
            &*LEASE_EXTEND,
            &*LEASE_ALIVE,
            &*LEASE_COUNT,
            &*RW_READ_ACQUIRE,
            &*RW_WRITE_ACQUIRE,
            &*RW_READ_RELEASE,
            &*RW_WRITE_RELEASE,
            &*RW_WRITER_LEAVE,
            &*RW_STATE,
            &*SEM_SLOT_ACQUIRE,
            &*SEM_SLOT_RELEASE,
            &*SEM_SLOT_HELD,
        ] {
            assert_eq!(script.get_hash().len(), 40);
        }
    }

    /// Records the command a script invocation sends (a canned connection, no server).
    struct Capture(Vec<Vec<u8>>);

    impl redis::ConnectionLike for Capture {
        fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
            // RESP: *N\r\n then N times $len\r\nbytes\r\n
            let mut parts = Vec::new();
            let mut rest = cmd;
            while let Some(start) = rest.iter().position(|&b| b == b'$') {
                let after = &rest[start + 1..];
                let eol = after.windows(2).position(|w| w == b"\r\n").unwrap();
                let len: usize = std::str::from_utf8(&after[..eol]).unwrap().parse().unwrap();
                parts.push(after[eol + 2..eol + 2 + len].to_vec());
                rest = &after[eol + 2 + len..];
            }
            self.0 = parts;
            Ok(redis::Value::Int(0))
        }

        fn req_packed_commands(
            &mut self,
            _cmd: &[u8],
            _offset: usize,
            _count: usize,
        ) -> redis::RedisResult<Vec<redis::Value>> {
            Ok(vec![])
        }

        fn get_db(&self) -> i64 {
            0
        }

        fn check_connection(&mut self) -> bool {
            true
        }

        fn is_open(&self) -> bool {
            true
        }
    }

    /// (keys, args) of the EVALSHA an invocation sends.
    fn sent(inv: &ScriptInvocation<'_>) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut capture = Capture(Vec::new());
        let _: redis::Value = inv.invoke(&mut capture).unwrap();
        let parts = capture.0;
        assert_eq!(parts[0], b"EVALSHA");
        let numkeys: usize = std::str::from_utf8(&parts[2]).unwrap().parse().unwrap();
        (
            parts[3..3 + numkeys].to_vec(),
            parts[3 + numkeys..].to_vec(),
        )
    }

    /// Every key a script is given lies under `prefix{name}`, so all share one cluster slot.
    #[test]
    fn builders_only_touch_keys_of_their_name() {
        let keys = Keys::new(b"p:", b"n");
        let join = Queueing::Join { place_ms: 6000 };
        let invocations = [
            semaphore_acquire(&keys, "t", 10, 5, false, Queueing::TryOnly),
            semaphore_acquire(&keys, "t", 10, 5, true, join),
            semaphore_release(&keys, "t", 5),
            semaphore_leave(&keys, "t", 5),
            semaphore_extend(&keys, "t", 10),
            semaphore_owned(&keys, "t"),
            semaphore_holders(&keys),
            reenter(&keys, "t", 2, 10),
            extend_reentrant(&keys, "t", 10),
            rw_read_acquire(&keys, "t", 10, false),
            rw_write_acquire(&keys, "t", 10, join),
            rw_read_release(&keys, "t", NOBODY),
            rw_write_release(&keys, "t", NOBODY),
            rw_writer_leave(&keys, "t"),
            rw_read_extend(&keys, "t", 10),
            rw_write_extend(&keys, "t", 10),
            rw_read_owned(&keys, "t"),
            rw_state(&keys),
        ];
        for inv in &invocations {
            let (sent_keys, _) = sent(inv);
            assert!(!sent_keys.is_empty());
            for key in &sent_keys {
                assert!(key.starts_with(b"p:{n}:"), "{key:?}");
            }
        }
    }

    /// A writer that takes the lock from its waiting place wakes the readers held back on the
    /// read-write lock's channel (see rw_write_acquire.lua).
    #[test]
    fn a_write_acquire_names_the_wake_channel() {
        let keys = Keys::new(b"p:", b"n");
        let join = Queueing::Join { place_ms: 6000 };
        let (_, args) = sent(&rw_write_acquire(&keys, "t", 10, join));
        assert_eq!(args, [&b"t"[..], b"10", b"6000", b"1", b"p:{n}:wake"]);
    }

    #[test]
    fn semaphore_modes_reach_the_script() {
        let keys = Keys::new(b"p:", b"n");
        let try_only = Queueing::TryOnly;
        let (sent_keys, args) = sent(&semaphore_acquire(&keys, "t", 10, 5, false, try_only));
        assert_eq!(
            sent_keys,
            [
                keys.semaphore_holders(),
                keys.semaphore_queue(),
                keys.semaphore_queue_deadlines(),
                keys.semaphore_limit()
            ]
        );
        assert_eq!(args, [&b"t"[..], b"10", b"5", b"0", b"0"]);
        let (sent_keys, _) = sent(&semaphore_extend(&keys, "t", 10));
        assert_eq!(
            sent_keys,
            [keys.semaphore_holders(), keys.semaphore_limit()]
        );
        let (sent_keys, _) = sent(&rw_read_extend(&keys, "t", 10));
        assert_eq!(sent_keys, [keys.rw_readers()]);
        let (_, args) = sent(&semaphore_acquire(&keys, "t", 10, 5, true, try_only));
        assert_eq!(args[3], b"1");
        let join = Queueing::Join { place_ms: 6000 };
        let (_, args) = sent(&semaphore_acquire(&keys, "t", 10, 5, true, join));
        assert_eq!(args[3..], [&b"2"[..], b"6000"]);
        let (_, args) = sent(&semaphore_acquire(&keys, "t", 10, 5, false, join));
        assert_eq!(args[3..], [&b"3"[..], b"6000"]);
        let (_, args) = sent(&semaphore_release(&keys, "t", 5));
        assert_eq!(args, [&b"t"[..], b"5", b"p:{n}:wake"]);
    }

    #[test]
    fn rwlock_flags_reach_the_scripts() {
        let keys = Keys::new(b"p:", b"n");
        let (sent_keys, args) = sent(&rw_read_acquire(&keys, "t", 10, true));
        assert_eq!(
            sent_keys,
            [
                keys.rw_readers(),
                keys.rw_writer(),
                keys.rw_writers_waiting()
            ]
        );
        assert_eq!(args, [&b"t"[..], b"10", b"1"]);
        let (_, args) = sent(&rw_write_acquire(&keys, "t", 10, Queueing::TryOnly));
        assert_eq!(args, [&b"t"[..], b"10", b"0", b"0", b"p:{n}:wake"]);
        let (sent_keys, _) = sent(&rw_write_extend(&keys, "t", 10));
        assert_eq!(sent_keys, [keys.rw_writer()]);
    }

    #[test]
    fn release_and_leave_grant_with_the_same_keys() {
        let keys = Keys::new(b"p:", b"n");
        let expected_keys = [keys.lock(), keys.fence(), keys.queue()];
        for inv in [release(&keys, "t"), leave_queue(&keys, "t")] {
            let (sent_keys, args) = sent(&inv);
            assert_eq!(sent_keys, expected_keys);
            assert_eq!(args, [&b"t"[..], b"p:{n}:wake", b"3000", b"86400000"]);
        }
        let (sent_keys, args) = sent(&acquire(
            &keys,
            "t",
            10,
            Some(Queueing::Join { place_ms: 6000 }),
            "0a1b",
        ));
        assert_eq!(sent_keys, expected_keys);
        assert_eq!(
            args,
            [
                &b"t"[..],
                b"10",
                b"6000",
                b"1",
                b"0a1b",
                b"86400000",
                b"p:{n}:wake"
            ]
        );
    }

    #[test]
    fn every_fence_carries_the_counters_ttl() {
        let keys = Keys::new(b"p:", b"n").with_fence_ttl(1500);
        let (sent_keys, args) = sent(&acquire(&keys, "t", 10, None, ""));
        assert_eq!(sent_keys, [keys.lock(), keys.fence()]);
        assert_eq!(args, [&b"t"[..], b"10", b"1500"]);
        let (_, args) = sent(&acquire(&keys, "t", 10, Some(Queueing::TryOnly), ""));
        assert_eq!(args[5], b"1500");
        for inv in [release(&keys, "t"), leave_queue(&keys, "t")] {
            assert_eq!(sent(&inv).1[3], b"1500");
        }
        let (sent_keys, args) = sent(&raise_fence(&keys, 42));
        assert_eq!(sent_keys, [keys.fence()]);
        assert_eq!(args, [&b"42"[..], b"1500"]);
        // A zero ttl would make PX fail on the server: at least 1 ms.
        assert_eq!(Keys::new(b"p:", b"n").with_fence_ttl(0).fence_ttl_ms(), 1);
    }

    #[test]
    fn fences_come_from_the_fence_prelude_or_the_grant() {
        for source in [LOCK_ACQUIRE_SOURCE, LOCK_ACQUIRE_FAIR_SOURCE] {
            let prelude = source.find("local function next_fence").unwrap();
            assert!(source[prelude..].contains("'PX', ttl_ms"));
            // A bare INCR would leave a counter without an expiry.
            assert!(!source.contains("'INCR'"), "{source}");
        }
        // A grant works its fence out by next_fence's rule before it publishes it, and writes it
        // (with the counter's expiry) only after (see lock_grant.lua).
        for source in [
            LOCK_RELEASE_SOURCE,
            grant_script!("lua/queue_leave.lua"),
            crate::protocol::multilock::MULTI_RELEASE_SOURCE,
        ] {
            assert!(!source.contains("local function next_fence"));
            assert!(!source.contains("'INCR'"), "{source}");
            let grant = &source[source.find("local function grant_head").unwrap()..];
            let fence = grant.find("math.max(counter + 1, now_us)").unwrap();
            let publish = grant.find("redis.call('PUBLISH'").unwrap();
            let write = grant.find("{'SET', lock_key").unwrap();
            assert!(fence < publish && publish < write);
            assert!(grant[write..].contains("{'SET', fence_key, fence, 'PX', fence_ttl_ms}"));
        }
    }

    /// `SET ... GET` (and `SET ... NX ... GET`) exist from Redis 7.0 on: every script sending
    /// one defines the gate before it, and keeps the read-then-write path of older servers.
    #[test]
    fn set_get_is_sent_only_behind_the_version_gate() {
        for source in [LOCK_ACQUIRE_SOURCE, LOCK_ACQUIRE_FAIR_SOURCE] {
            let gate = source
                .find("local set_get = (redis.REDIS_VERSION_NUM or 0) >= 0x070000")
                .unwrap();
            let mut rest = &source[gate..];
            let mut uses = 0;
            while let Some(at) = rest.find("'GET')") {
                // Inside the branch of the gate: no `else` or `end` since its `then`.
                let before = &rest[..at];
                let branch = before.rfind("if set_get").unwrap();
                let closed = before[branch..]
                    .lines()
                    .any(|line| matches!(line.trim(), "else" | "end"));
                assert!(!closed, "{source}");
                uses += 1;
                rest = &rest[at + 1..];
            }
            assert!(uses >= 1, "{source}");
            // The path of older servers: the counter read with a plain GET.
            assert!(source[gate..].contains("redis.call('GET', fence_key)"));
        }
        // The acquires take a free lock with one call on Redis 7, and GET + SET before it.
        for source in [LOCK_ACQUIRE_SOURCE, LOCK_ACQUIRE_FAIR_SOURCE] {
            assert!(
                source.contains("redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')")
            );
            assert!(source.contains("redis.call('GET', KEYS[1])"));
        }
        // A grant reads the counter before it publishes: a plain GET, on every server.
        for source in [LOCK_RELEASE_SOURCE, grant_script!("lua/queue_leave.lua")] {
            assert!(!source.contains("'GET')"), "{source}");
            assert!(!source.contains("set_get"), "{source}");
        }
    }

    #[test]
    fn grant_scripts_carry_both_preludes_in_order() {
        let source = grant_script!("lua/queue_leave.lua");
        let clock = source.find("local function server_clock").unwrap();
        let grant = source.find("local function grant_head").unwrap();
        let body = source.find("ARGV[3] grant slack").unwrap();
        assert!(clock < grant && grant < body);
        // The lock's scripts define only what they use: no list-queue pruning.
        assert!(!source.contains("local function prune_queue"));
    }

    /// The release without a queue returns before the preludes; with one, the grant runs
    /// after them (a call before its `local function` would find no function).
    #[test]
    fn the_release_returns_before_the_grant_preludes_without_a_queue() {
        let source = LOCK_RELEASE_SOURCE;
        let publish = source.find("redis.call('PUBLISH', ARGV[2], '')").unwrap();
        let delete = source.find("redis.call('DEL', KEYS[1])").unwrap();
        let early = source.find("return 1").unwrap();
        let clock = source.find("local function server_clock").unwrap();
        let grant = source.find("local function grant_head").unwrap();
        let waitlist = source.find("local function live_head").unwrap();
        let call = source.find("if not grant_head(").unwrap();
        // (published before the DEL: a refused PUBLISH leaves the lock as it was)
        assert!(publish < delete && delete < early && early < clock && clock < waitlist);
        assert!(waitlist < grant && grant < call);
        // With a queue, the lock key is deleted only when no grant wrote over it, after the
        // wake-up.
        let late_delete = source[call..].find("redis.call('DEL', KEYS[1])").unwrap();
        assert!(source[call..call + late_delete].contains(") then"));
        assert!(source[call..call + late_delete].contains("redis.call('PUBLISH', ARGV[2], '')"));
        assert!(source[..clock].contains("local queued = redis.call('HGETALL', KEYS[3])"));
        assert!(!source[..clock].contains("grant_head("));
    }

    #[test]
    fn queue_scripts_carry_the_clock_and_waitlist_preludes() {
        for script in [&*LOCK_ACQUIRE_FAIR, &*LOCK_RELEASE, &*QUEUE_LEAVE] {
            let _ = script.get_hash();
        }
        let fair = fair_script!("lua/lock_acquire_fair.lua");
        assert!(fair.contains("local function server_clock"));
        assert!(fair.contains("local function live_head"));
        let grant = grant_script!("lua/queue_leave.lua");
        assert!(
            grant.contains("local function live_head")
                && grant.contains("local function grant_head")
        );
    }
}
