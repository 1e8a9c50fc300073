//! The key layout, fixed by the contract: every key of the primitive named N starts with
//! `prefix + "{" + N + "}"`, so all of them share one cluster hash slot. This is the only place
//! where keys and channel names are built.

use std::io::Write;

/// How long a fencing counter lives after the last acquisition, unless the client says
/// otherwise (`Client(fence_ttl=...)`): a day, in ms.
pub const DEFAULT_FENCE_TTL_MS: u64 = 86_400_000;

/// The keys and channels of one named primitive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    base: Vec<u8>,
    fence_ttl_ms: u64,
    /// The drop-in shims (`redmutex.compat`): the lock key of another library, used as it is.
    lock_key: Option<Vec<u8>>,
    /// python-redis-lock's signal list and its expiry in ms, pushed by every release.
    signal: Option<(Vec<u8>, u64)>,
}

impl Keys {
    /// `prefix{name}`; the name is taken byte for byte (it may hold NUL or braces).
    pub fn new(prefix: &[u8], name: &[u8]) -> Self {
        let mut base = Vec::with_capacity(prefix.len() + name.len() + 2);
        base.extend_from_slice(prefix);
        base.push(b'{');
        base.extend_from_slice(name);
        base.push(b'}');
        Keys {
            base,
            fence_ttl_ms: DEFAULT_FENCE_TTL_MS,
            lock_key: None,
            signal: None,
        }
    }

    /// The same keys, whose lock key is exactly `key` (another library's, for the drop-in shims
    /// of `redmutex.compat`): the other keys and channels keep the `prefix{name}` layout.
    pub fn with_lock_key(mut self, key: &[u8]) -> Self {
        self.lock_key = Some(key.to_vec());
        self
    }

    /// The same keys, whose releases also push python-redis-lock's signal list `key` (which
    /// then expires after `expire_ms`), so that library's waiters (BLPOP) wake on them.
    pub fn with_signal(mut self, key: &[u8], expire_ms: u64) -> Self {
        self.signal = Some((key.to_vec(), expire_ms.max(1)));
        self
    }

    /// The signal list releases push, and its expiry in ms (`with_signal`).
    pub fn signal(&self) -> Option<(&[u8], u64)> {
        self.signal.as_ref().map(|(key, ms)| (key.as_slice(), *ms))
    }

    /// The same keys, whose fencing counter expires `ms` after the last acquisition (at least 1).
    pub fn with_fence_ttl(mut self, ms: u64) -> Self {
        self.fence_ttl_ms = ms.max(1);
        self
    }

    /// How long the fencing counter lives after the last acquisition, in ms (every script that
    /// issues a fence refreshes its expiry to this).
    pub fn fence_ttl_ms(&self) -> u64 {
        self.fence_ttl_ms
    }

    fn with_suffix(&self, suffix: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.base.len() + suffix.len());
        key.extend_from_slice(&self.base);
        key.extend_from_slice(suffix);
        key
    }

    /// The common start of every key of this primitive.
    pub fn base(&self) -> &[u8] {
        &self.base
    }

    /// String holding the current owner's token, with the lease as its expiry.
    pub fn lock(&self) -> Vec<u8> {
        match &self.lock_key {
            Some(key) => key.clone(),
            None => self.with_suffix(b":lock"),
        }
    }

    /// Re-entrant lock: the hold count of its owner while it is 2 or more, as
    /// `'<token> <count>'`, expiring with the lock's lease (`lock_reenter.lua`).
    pub fn lock_holds(&self) -> Vec<u8> {
        self.with_suffix(b":lock:holds")
    }

    /// Fencing counter: the only key that outlives a release. It expires `fence_ttl_ms` after
    /// the last acquisition; a counter created afresh starts from the server's clock in µs
    /// (`fence_next.lua`), so fences of a name keep increasing across its expiry.
    pub fn fence(&self) -> Vec<u8> {
        self.with_suffix(b":fence")
    }

    /// The lock's queue (its fair waiters, and an unfair lock's waiters that wait): a hash of
    /// token -> '<seq> <place deadline ms> <lease ms> <inbox>' (its turn, until when its place
    /// holds, what a release grants the waiter, where it is told; `waitlist.lua`). Not the
    /// `:queue` list of 0.1.0 (its queue was three keys), so the two never meet in one key.
    pub fn queue(&self) -> Vec<u8> {
        self.with_suffix(b":lock:queue")
    }

    /// Semaphore: zset of holder token -> lease end (ms, server clock from `TIME`).
    pub fn semaphore_holders(&self) -> Vec<u8> {
        self.with_suffix(b":sem:holders")
    }

    /// Semaphore: the id of the in-process gate its unfair waiters of `limit` queue at
    /// (`waiting::Plan::gate`), not a Redis key: the holders' key and the limit, so that a
    /// waiter of another limit never queues behind them and hears at once that its limit
    /// differs.
    pub fn semaphore_gate(&self, limit: u64) -> Vec<u8> {
        const SUFFIX: &[u8] = b":sem:holders#";
        let mut gate = Vec::with_capacity(self.base.len() + SUFFIX.len() + 20);
        gate.extend_from_slice(&self.base);
        gate.extend_from_slice(SUFFIX);
        // Writing to a Vec cannot fail (and needs no allocation of its own).
        let _ = write!(gate, "{limit}");
        gate
    }

    /// Semaphore: the limit its holders and waiters use (string), expiring with the holders and
    /// the queue; an acquire with another limit is refused while any of them remains.
    pub fn semaphore_limit(&self) -> Vec<u8> {
        self.with_suffix(b":sem:limit")
    }

    /// Semaphore on Redlock: hash of slot -> holder token, token -> slot, and the live limit,
    /// living as long as the holders (see `sem_slot_acquire.lua`).
    pub fn semaphore_slots(&self) -> Vec<u8> {
        self.with_suffix(b":sem:slots")
    }

    /// Fair semaphore: list of waiting tokens in arrival order.
    pub fn semaphore_queue(&self) -> Vec<u8> {
        self.with_suffix(b":sem:queue")
    }

    /// Fair semaphore: zset of waiting token -> deadline (server ms) of the waiter's place.
    pub fn semaphore_queue_deadlines(&self) -> Vec<u8> {
        self.with_suffix(b":sem:queue:deadlines")
    }

    /// Read-write lock: zset of reader token -> lease end (ms, server clock from `TIME`).
    pub fn rw_readers(&self) -> Vec<u8> {
        self.with_suffix(b":rw:readers")
    }

    /// Read-write lock: string holding the writer's token, with the lease as its expiry.
    pub fn rw_writer(&self) -> Vec<u8> {
        self.with_suffix(b":rw:writer")
    }

    /// Read-write lock: zset of waiting writer token -> deadline (server ms) of its place.
    /// While it is not empty, new readers are held back (no writer starvation).
    pub fn rw_writers_waiting(&self) -> Vec<u8> {
        self.with_suffix(b":rw:writers_waiting")
    }

    /// Cache entry: the stored payload, expiring (PX) with the entry's ttl.
    pub fn cache_value(&self) -> Vec<u8> {
        self.with_suffix(b":value")
    }

    /// Cache entry: the fill claim (owner token, expiring with the claim's lease), held by the
    /// one caller that fills or refreshes the entry.
    pub fn cache_fill(&self) -> Vec<u8> {
        self.with_suffix(b":fill")
    }

    /// Pub/sub channel on which releases wake waiters (a channel, not a key).
    pub fn wake_channel(&self) -> Vec<u8> {
        self.with_suffix(b":wake")
    }

    /// Pub/sub channel on which a fair lock's release tells one process's waiter it was
    /// granted the lock: the wake channel, ':' and the process's inbox id (`lock_grant.lua`).
    pub fn wake_inbox(&self, inbox: &str) -> Vec<u8> {
        let mut channel = self.wake_channel();
        channel.push(b':');
        channel.extend_from_slice(inbox.as_bytes());
        channel
    }

    /// Whether every key built from this base lands in one cluster hash slot whatever its
    /// suffix: true unless the hash tag (the bytes between the first `{` and the first `}` after
    /// it) is empty, which happens only for a name starting with `}` (or a prefix holding `{}`).
    pub fn single_slot(&self) -> bool {
        hash_tag(&self.base).is_some()
    }

    /// The cluster hash slot of every key of this primitive (meaningful when `single_slot`).
    pub fn slot(&self) -> u16 {
        key_slot(&self.base)
    }
}

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash tag of a key as Redis Cluster reads it: the bytes between the first `{` and the
/// first `}` after it, if that is non-empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_starts_with_prefix_and_braced_name() {
        let keys = Keys::new(b"redmutex:", b"acct:1");
        for key in [
            keys.lock(),
            keys.lock_holds(),
            keys.fence(),
            keys.queue(),
            keys.semaphore_holders(),
            keys.semaphore_limit(),
            keys.semaphore_queue(),
            keys.semaphore_queue_deadlines(),
            keys.rw_readers(),
            keys.rw_writer(),
            keys.rw_writers_waiting(),
            keys.cache_value(),
            keys.cache_fill(),
            keys.wake_channel(),
        ] {
            assert!(key.starts_with(b"redmutex:{acct:1}"), "{key:?}");
        }
        assert_eq!(keys.lock(), b"redmutex:{acct:1}:lock");
        assert_eq!(keys.fence(), b"redmutex:{acct:1}:fence");
        assert_eq!(keys.lock_holds(), b"redmutex:{acct:1}:lock:holds");
        assert_eq!(keys.queue(), b"redmutex:{acct:1}:lock:queue");
        assert_eq!(keys.cache_value(), b"redmutex:{acct:1}:value");
        assert_eq!(keys.cache_fill(), b"redmutex:{acct:1}:fill");
        assert_eq!(keys.semaphore_holders(), b"redmutex:{acct:1}:sem:holders");
        assert_eq!(keys.semaphore_limit(), b"redmutex:{acct:1}:sem:limit");
        assert_eq!(keys.rw_readers(), b"redmutex:{acct:1}:rw:readers");
        assert_eq!(keys.rw_writer(), b"redmutex:{acct:1}:rw:writer");
        assert_eq!(
            keys.rw_writers_waiting(),
            b"redmutex:{acct:1}:rw:writers_waiting"
        );
    }

    #[test]
    fn keys_of_different_primitives_never_collide() {
        let keys = Keys::new(b"p:", b"n");
        let all = [
            keys.lock(),
            keys.lock_holds(),
            keys.fence(),
            keys.queue(),
            keys.semaphore_holders(),
            keys.semaphore_limit(),
            keys.semaphore_queue(),
            keys.semaphore_queue_deadlines(),
            keys.rw_readers(),
            keys.rw_writer(),
            keys.rw_writers_waiting(),
            keys.cache_value(),
            keys.cache_fill(),
        ];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Reference values: CLUSTER KEYSLOT on a real server, and the CRC16 check value.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), None);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), Some(&b"{bar"[..]));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), Some(&b"bar"[..]));
    }

    #[test]
    fn every_key_of_a_name_shares_one_slot() {
        for name in [&b"a"[..], b"acct:1", b"a{b}c", b"{x}", b"a\0b", b"x}"] {
            let keys = Keys::new(b"redmutex:", name);
            assert!(keys.single_slot(), "{name:?}");
            let slot = keys.slot();
            for key in [
                keys.lock(),
                keys.fence(),
                keys.queue(),
                keys.semaphore_holders(),
                keys.semaphore_queue(),
                keys.semaphore_queue_deadlines(),
                keys.rw_readers(),
                keys.rw_writer(),
                keys.rw_writers_waiting(),
                keys.wake_channel(),
            ] {
                assert_eq!(key_slot(&key), slot, "{key:?}");
            }
        }
        // A name starting with '}' leaves the tag empty: its keys would spread over slots.
        assert!(!Keys::new(b"redmutex:", b"}a").single_slot());
        assert!(!Keys::new(b"p{}", b"a").single_slot());
        assert!(Keys::new(b"p{", b"}a").single_slot());
    }

    #[test]
    fn inboxes_extend_the_wake_channel() {
        let keys = Keys::new(b"p:", b"n");
        assert_eq!(keys.wake_inbox("00ff"), b"p:{n}:wake:00ff");
    }

    #[test]
    fn an_exact_lock_key_leaves_the_other_keys_alone() {
        let keys = Keys::new(b"p:", b"job").with_lock_key(b"lock:job");
        assert_eq!(keys.lock(), b"lock:job");
        assert_eq!(keys.fence(), b"p:{job}:fence");
        assert_eq!(keys.wake_channel(), b"p:{job}:wake");
        assert_eq!(keys.signal(), None);
        let keys = keys.with_signal(b"lock-signal:job", 0);
        assert_eq!(keys.signal(), Some((&b"lock-signal:job"[..], 1)));
    }

    #[test]
    fn names_are_binary_safe() {
        let keys = Keys::new(b"p:", b"a\0{b}");
        assert_eq!(keys.lock(), b"p:{a\0{b}}:lock");
    }
}
