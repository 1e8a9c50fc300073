//! The MultiLock: several lock names held together, all or none. Its names are `Lock` names
//! (the same keys), so a MultiLock and single Locks on the same names exclude each other. This
//! file holds what identifies one (the names, their keys, the one global order and how it is cut
//! into runs that one script may take) and its steps: the all-or-none acquire attempt of a run,
//! release (with the hand-off of every name), extend and `owned`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::keys::Keys;
use super::lease;
use super::replies::{parse_count, parse_flag, UnexpectedReply};
use super::scripts::GRANT_SLACK_MS;
use super::step::Step;

pub(crate) const MULTI_ACQUIRE_SOURCE: &str = concat!(
    include_str!("lua/clock.lua"),
    include_str!("lua/fence_next.lua"),
    include_str!("lua/fence_current.lua"),
    include_str!("lua/waitlist.lua"),
    include_str!("lua/multi_acquire.lua")
);
static MULTI_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(MULTI_ACQUIRE_SOURCE));
pub(crate) const MULTI_RELEASE_SOURCE: &str = concat!(
    include_str!("lua/clock.lua"),
    include_str!("lua/waitlist.lua"),
    include_str!("lua/waitlist_head.lua"),
    include_str!("lua/lock_grant.lua"),
    include_str!("lua/multi_release.lua")
);
static MULTI_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(MULTI_RELEASE_SOURCE));
pub(crate) const MULTI_EXTEND_SOURCE: &str = include_str!("lua/multi_extend.lua");
static MULTI_EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(MULTI_EXTEND_SOURCE));

/// What identifies a MultiLock in Redis and how it is leased.
#[derive(Clone, Debug)]
pub struct MultiSpec {
    /// The names, each once, in the order the caller gave them.
    pub names: Vec<Vec<u8>>,
    /// `keys[i]`: the keys of `names[i]`.
    pub keys: Vec<Keys>,
    /// The one global order (indices into `names`, sorted by the names' bytes), cut into runs
    /// that one script takes at once: a single run on one server; on a Redis Cluster, where one
    /// script cannot span slots, each run is consecutive names that share a hash slot.
    pub runs: Vec<Vec<usize>>,
    pub lease: Duration,
}

impl MultiSpec {
    /// `names` must be distinct (see `distinct`) and `keys` theirs, in the same order.
    /// `by_slot`: the keys live on a Redis Cluster, so a run may not span hash slots.
    pub fn new(names: Vec<Vec<u8>>, keys: Vec<Keys>, lease: Duration, by_slot: bool) -> Self {
        let runs = runs(&names, &keys, by_slot);
        MultiSpec {
            names,
            keys,
            runs,
            lease,
        }
    }

    /// The keys of run `run`, in its order.
    pub fn run_keys(&self, run: usize) -> Vec<&Keys> {
        self.runs
            .get(run)
            .map(|r| r.iter().filter_map(|&i| self.keys.get(i)).collect())
            .unwrap_or_default()
    }
}

/// The names without repeats (the first of each kept, in order): a MultiLock over "a", "a"
/// holds "a".
pub fn distinct(names: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .collect()
}

/// The global order (indices sorted by name bytes: every MultiLock takes shared names in the
/// same order, so two of them never wait for each other in a circle), cut into runs.
fn runs(names: &[Vec<u8>], keys: &[Keys], by_slot: bool) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| names[a].cmp(&names[b]));
    if !by_slot {
        return vec![order];
    }
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let slot = keys[i].slot();
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|&j| keys[j].slot() == slot) => run.push(i),
            _ => runs.push(vec![i]),
        }
    }
    runs
}

/// What an attempt on one run found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiAttempt {
    /// The caller holds every name of the run now, with these fences (in the run's order).
    Granted { fences: Vec<i64> },
    /// Name `blocker` (its index in the run) is busy and nothing was taken; look again within
    /// `retry_ms` at the latest (-1: no hint).
    Busy { retry_ms: i64, blocker: usize },
}

/// One all-or-none acquire attempt on `keys` (a run) for `token`, leased for `lease`.
pub fn attempt(keys: &[&Keys], token: &str, lease: Duration) -> Step<MultiAttempt> {
    let mut inv = MULTI_ACQUIRE.prepare_invoke();
    for k in keys {
        inv.key(k.lock()).key(k.fence()).key(k.queue());
    }
    let fence_ttl = keys.first().map_or(0, |k| k.fence_ttl_ms());
    inv.arg(token).arg(lease::lease_ms(lease)).arg(fence_ttl);
    let n = keys.len();
    Step::script(inv, move |v| parse_attempt(&v, n))
}

/// Releases those of `keys` that `token` still holds, handing each on; how many it held.
pub fn release(keys: &[&Keys], token: &str) -> Step<usize> {
    let mut inv: ScriptInvocation<'static> = MULTI_RELEASE.prepare_invoke();
    for k in keys {
        inv.key(k.lock()).key(k.fence()).key(k.queue());
    }
    let fence_ttl = keys.first().map_or(0, |k| k.fence_ttl_ms());
    inv.arg(token).arg(GRANT_SLACK_MS).arg(fence_ttl);
    for k in keys {
        inv.arg(k.wake_channel());
    }
    Step::script(inv, |v| {
        let count = parse_count(&v)?;
        usize::try_from(count).map_err(|_| UnexpectedReply(format!("{v:?}")))
    })
}

/// Compare-and-pexpire of every name of `keys`: all leases end `lease` from now (a name whose
/// lease that cuts short wakes its waiters); false (and nothing touched) when any is not
/// `token`'s.
pub fn extend(keys: &[&Keys], token: &str, lease: Duration) -> Step<bool> {
    let mut inv = MULTI_EXTEND.prepare_invoke();
    for k in keys {
        inv.key(k.lock());
    }
    inv.arg(token).arg(lease::lease_ms(lease));
    for k in keys {
        inv.arg(k.wake_channel());
    }
    Step::script(inv, |v| parse_flag(&v))
}

/// Whether `token` holds every name of `keys` (one MGET: the keys share a slot on a cluster).
pub fn owned(keys: &[&Keys], token: &str) -> Step<bool> {
    let mut mget = redis::cmd("MGET");
    for k in keys {
        mget.arg(k.lock());
    }
    let token = token.as_bytes().to_vec();
    Step::command(mget, move |v| parse_owned(&v, &token))
}

/// Whether every fence counter of `keys` still reads the fence at the same place of `fences`
/// (one MGET: the keys share a slot on a cluster): no hold of any of the names was granted
/// since the hold granted those fences (as `lock::fence_unmoved` for one name).
pub fn fences_unmoved(keys: &[&Keys], fences: &[i64]) -> Step<bool> {
    let mut mget = redis::cmd("MGET");
    for k in keys {
        mget.arg(k.fence());
    }
    let fences: Vec<Vec<u8>> = fences.iter().map(|f| f.to_string().into_bytes()).collect();
    Step::command(mget, move |v| parse_each_is(&v, &fences))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// `{1, fence_1, ..., fence_n}` or `{0, retry_ms, i}` (i: the busy name, 1-based).
fn parse_attempt(value: &Value, n: usize) -> Result<MultiAttempt, UnexpectedReply> {
    let unexpected = || UnexpectedReply(format!("{value:?}"));
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    match items.split_first() {
        Some((flag, fences)) if int(flag) == Some(1) && fences.len() == n => {
            let fences = fences.iter().map(int).collect::<Option<Vec<i64>>>();
            fences
                .map(|fences| MultiAttempt::Granted { fences })
                .ok_or_else(unexpected)
        }
        Some((flag, [retry, index])) if int(flag) == Some(0) => {
            match (int(retry), int(index).and_then(|i| usize::try_from(i).ok())) {
                (Some(retry_ms), Some(i)) if (1..=n).contains(&i) => Ok(MultiAttempt::Busy {
                    retry_ms,
                    blocker: i - 1,
                }),
                _ => Err(unexpected()),
            }
        }
        _ => Err(unexpected()),
    }
}

/// The MGET reply: true when every value is `token`.
fn parse_owned(value: &Value, token: &[u8]) -> Result<bool, UnexpectedReply> {
    parse_each(value, |_, bytes| bytes == token)
}

/// The MGET reply: true when it has as many values as `expected` and each is the one at its
/// place.
fn parse_each_is(value: &Value, expected: &[Vec<u8>]) -> Result<bool, UnexpectedReply> {
    let same_count = matches!(value, Value::Array(items) if items.len() == expected.len());
    let each = parse_each(value, |i, bytes| {
        expected.get(i).is_some_and(|e| e.as_slice() == bytes)
    })?;
    Ok(same_count && each)
}

/// The MGET reply: true when every value is there and `is(place, value)`.
fn parse_each(value: &Value, is: impl Fn(usize, &[u8]) -> bool) -> Result<bool, UnexpectedReply> {
    let Value::Array(items) = value else {
        return Err(UnexpectedReply(format!("{value:?}")));
    };
    let mut all = true;
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::Nil => all = false,
            Value::BulkString(bytes) => all &= is(i, bytes),
            Value::SimpleString(text) => all &= is(i, text.as_bytes()),
            other => return Err(UnexpectedReply(format!("{other:?}"))),
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str], by_slot: bool) -> MultiSpec {
        let names: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
        let keys = names.iter().map(|n| Keys::new(b"p:", n)).collect();
        MultiSpec::new(names, keys, Duration::from_secs(1), by_slot)
    }

    #[test]
    fn repeats_are_dropped_keeping_the_first() {
        let names = vec![b"b".to_vec(), b"a".to_vec(), b"b".to_vec(), b"a".to_vec()];
        assert_eq!(distinct(names), vec![b"b".to_vec(), b"a".to_vec()]);
    }

    #[test]
    fn one_server_takes_every_name_in_one_run_in_byte_order() {
        let s = spec(&["b", "a", "c"], false);
        assert_eq!(s.runs, vec![vec![1, 0, 2]]);
        let keys: Vec<&[u8]> = s.run_keys(0).iter().map(|k| k.base()).collect();
        assert_eq!(keys, vec![&b"p:{a}"[..], b"p:{b}", b"p:{c}"]);
    }

    #[test]
    fn a_cluster_cuts_the_order_where_the_slot_changes() {
        // "a{x}" and "a{x}b"-style names: braces inside the name do not matter, the tag is the
        // name up to its first '}'. Names that share a tag share a slot.
        let s = spec(&["k}2", "k}1", "z", "k}3"], true);
        // Sorted: k}1, k}2, k}3, z; the three "k}" names share the tag "k".
        assert_eq!(s.runs, vec![vec![1, 0, 3], vec![2]]);
        let t = spec(&["a", "b"], true);
        assert_ne!(Keys::new(b"p:", b"a").slot(), Keys::new(b"p:", b"b").slot());
        assert_eq!(t.runs, vec![vec![0], vec![1]]);
    }

    #[test]
    fn an_attempt_reads_fences_or_the_busy_name() {
        let s = spec(&["a", "b"], false);
        let step = attempt(&s.run_keys(0), "t", s.lease);
        assert!(step.invocation().is_some());
        let granted = Value::Array(vec![Value::Int(1), Value::Int(7), Value::Int(9)]);
        assert_eq!(
            step.parse(granted),
            Ok(MultiAttempt::Granted { fences: vec![7, 9] })
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(2)]);
        assert_eq!(
            step.parse(busy),
            Ok(MultiAttempt::Busy {
                retry_ms: 250,
                blocker: 1
            })
        );
        for bad in [
            Value::Array(vec![Value::Int(1), Value::Int(7)]),
            Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(3)]),
            Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(0)]),
            Value::Int(1),
        ] {
            assert!(step.parse(bad).is_err());
        }
    }

    #[test]
    fn the_fences_read_unmoved_only_when_each_counter_reads_its_own() {
        let s = spec(&["a", "b"], false);
        let keys: Vec<&Keys> = s.keys.iter().collect();
        let read = fences_unmoved(&keys, &[7, 9]);
        assert!(read.invocation().is_none());
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            read.parse(Value::Array(vec![bulk("7"), bulk("9")])),
            Ok(true)
        );
        for moved in [
            vec![bulk("7"), bulk("10")],
            vec![bulk("9"), bulk("7")],
            vec![bulk("7"), Value::Nil],
            vec![bulk("7")],
            vec![bulk("7"), bulk("9"), bulk("9")],
        ] {
            assert_eq!(read.parse(Value::Array(moved)), Ok(false));
        }
        assert!(read.parse(Value::Int(1)).is_err());
    }

    #[test]
    fn release_counts_extend_flags_owned_compares_every_token() {
        let s = spec(&["a", "b"], false);
        let keys = s.run_keys(0);
        assert_eq!(release(&keys, "t").parse(Value::Int(2)), Ok(2));
        assert!(release(&keys, "t").parse(Value::Int(-1)).is_err());
        assert_eq!(extend(&keys, "t", s.lease).parse(Value::Int(0)), Ok(false));
        let owned = owned(&keys, "t");
        assert!(owned.invocation().is_none());
        let both = Value::Array(vec![
            Value::BulkString(b"t".to_vec()),
            Value::BulkString(b"t".to_vec()),
        ]);
        assert_eq!(owned.parse(both), Ok(true));
        let one = Value::Array(vec![Value::BulkString(b"t".to_vec()), Value::Nil]);
        assert_eq!(owned.parse(one), Ok(false));
        assert!(owned.parse(Value::Int(1)).is_err());
    }
}
