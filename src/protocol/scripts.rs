//! The Lua scripts, one per atomic step, each in its own file opening with its KEYS/ARGV/reply,
//! and the builders that bind them to keys and arguments.

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

use super::keys::Keys;

macro_rules! queue_script {
    ($file:literal) => {
        concat!(include_str!("lua/queue_prune.lua"), include_str!($file))
    };
}

pub static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_acquire.lua")));
pub static LOCK_ACQUIRE_FAIR: LazyLock<Script> =
    LazyLock::new(|| Script::new(queue_script!("lua/lock_acquire_fair.lua")));
pub static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(queue_script!("lua/lock_release.lua")));
pub static LOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lock_extend.lua")));
pub static QUEUE_LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(queue_script!("lua/queue_leave.lua")));
pub static FENCE_RAISE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/fence_raise.lua")));

/// How a fair waiter treats the queue on an attempt that is not granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queueing {
    /// Try once; never take a place in the queue.
    TryOnly,
    /// Take (or keep) a place that lapses `place_ms` after this attempt unless refreshed.
    Join { place_ms: u64 },
}

/// One acquire attempt for `token` with a lease of `lease_ms`; `fair` selects the FIFO script.
pub fn acquire<'a>(
    keys: &Keys,
    token: &str,
    lease_ms: u64,
    fair: Option<Queueing>,
) -> ScriptInvocation<'a> {
    match fair {
        None => {
            let mut inv = LOCK_ACQUIRE.prepare_invoke();
            inv.key(keys.lock())
                .key(keys.fence())
                .arg(token)
                .arg(lease_ms);
            inv
        }
        Some(queueing) => {
            let (place_ms, join) = match queueing {
                Queueing::TryOnly => (0, "0"),
                Queueing::Join { place_ms } => (place_ms, "1"),
            };
            let mut inv = LOCK_ACQUIRE_FAIR.prepare_invoke();
            inv.key(keys.lock())
                .key(keys.fence())
                .key(keys.queue())
                .key(keys.queue_deadlines())
                .arg(token)
                .arg(lease_ms)
                .arg(place_ms)
                .arg(join);
            inv
        }
    }
}

/// Compare-and-delete of the lock, then a wake-up on its channel.
pub fn release<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    let mut inv = LOCK_RELEASE.prepare_invoke();
    inv.key(keys.lock())
        .key(keys.queue())
        .key(keys.queue_deadlines())
        .arg(token)
        .arg(keys.wake_channel());
    inv
}

/// Compare-and-pexpire: the lease ends `lease_ms` from now.
pub fn extend<'a>(keys: &Keys, token: &str, lease_ms: u64) -> ScriptInvocation<'a> {
    let mut inv = LOCK_EXTEND.prepare_invoke();
    inv.key(keys.lock()).arg(token).arg(lease_ms);
    inv
}

/// A fair waiter leaves the queue.
pub fn leave_queue<'a>(keys: &Keys, token: &str) -> ScriptInvocation<'a> {
    let mut inv = QUEUE_LEAVE.prepare_invoke();
    inv.key(keys.lock())
        .key(keys.queue())
        .key(keys.queue_deadlines())
        .arg(token)
        .arg(keys.wake_channel());
    inv
}

/// Raises the fencing counter to at least `fence` (Redlock's write-back; never lowers it).
pub fn raise_fence<'a>(keys: &Keys, fence: i64) -> ScriptInvocation<'a> {
    let mut inv = FENCE_RAISE.prepare_invoke();
    inv.key(keys.fence()).arg(fence);
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
        ] {
            assert!(source.starts_with("-- "), "{source}");
            for word in ["KEYS[1]", "ARGV[1]", "Reply"] {
                assert!(source.contains(word), "{word} missing in {source}");
            }
        }
    }

    #[test]
    fn queue_scripts_carry_the_prune_prelude() {
        for script in [&*LOCK_ACQUIRE_FAIR, &*LOCK_RELEASE, &*QUEUE_LEAVE] {
            let _ = script.get_hash();
        }
        assert!(queue_script!("lua/lock_release.lua").contains("local function prune_queue"));
    }
}
