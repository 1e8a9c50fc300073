//! The primaries of a Redis Cluster by slot, as the cluster last told redmutex (`CLUSTER SLOTS`,
//! asked again whenever the direct path finds the map out of date). The direct path (`direct.rs`)
//! routes by this table.
//!
//! It is not learned from the cluster client (redis-rs `cluster_async`) through a read routing
//! strategy: the client sends READONLY on every connection once one is set, and a master that a
//! failover demoted then answers reads of its old slots from data the new master does not have
//! (a lost hold read as held), or has not yet received (a release read as lost).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::protocol::cluster_slots::{self, SlotRange};

/// How many nodes a refresh asks (one at a time) before it leaves the map stale for the next.
const REFRESH_TRIES: usize = 3;
/// The least time between two refreshes: while a master is down, every direct call misses.
const REFRESH_PAUSE: Duration = Duration::from_millis(100);

/// The primaries of a cluster by slot. A stale entry costs a redirect
/// (`direct::Miss::Elsewhere`, the runtime serves the call and the map is asked for again),
/// never a wrong answer.
pub struct SlotTable {
    ranges: RwLock<Option<Arc<[SlotRange]>>>,
    /// The map may be out of date: none yet, or the direct path was redirected by, or could not
    /// reach, the node it names.
    stale: AtomicBool,
    /// A refresh is running (or pausing after one).
    refreshing: AtomicBool,
}

impl Default for SlotTable {
    fn default() -> Self {
        SlotTable {
            ranges: RwLock::new(None),
            stale: AtomicBool::new(true),
            refreshing: AtomicBool::new(false),
        }
    }
}

impl SlotTable {
    /// The primary that owns `slot`, if known.
    pub fn primary(&self, slot: u16) -> Option<(String, u16)> {
        // Never waits: a table being replaced right now counts as unknown (the runtime serves).
        let ranges = self.ranges.try_read().ok()?.clone()?;
        let at = ranges.partition_point(|(start, _, _, _)| *start <= slot);
        let (start, end, host, port) = ranges.get(at.checked_sub(1)?)?;
        (*start <= slot && slot <= *end).then(|| (host.clone(), *port))
    }

    /// Every primary of the last map (each once), in slot order.
    pub fn primaries(&self) -> Vec<(String, u16)> {
        let ranges = self
            .ranges
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        let mut found: Vec<(String, u16)> = Vec::new();
        for (_, _, host, port) in ranges.iter() {
            if !found.iter().any(|(h, p)| h == host && p == port) {
                found.push((host.clone(), *port));
            }
        }
        found
    }

    /// The map is out of date: the next call through the runtime asks for it again.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// Asks the cluster for its map if it is stale and nobody asks already; from a task of the
    /// runtime, over `conn` (the cluster client's, which finds a node that answers).
    pub fn refresh_if_stale(self: &Arc<Self>, conn: &ClusterConnection, limit: Duration) {
        if !self.stale.load(Ordering::Acquire)
            || self
                .refreshing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        // Not on a runtime (never so on its calls' path): left stale for a call that is.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        // Cleared first: a miss while the answer is on its way asks again after it.
        self.stale.store(false, Ordering::Release);
        let table = self.clone();
        let mut conn = conn.clone();
        handle.spawn(async move {
            let mut learned = false;
            for _ in 0..REFRESH_TRIES {
                let asked = conn.route_command(
                    cluster_slots::command(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                );
                if let Ok(Ok(reply)) = tokio::time::timeout(limit, asked).await {
                    if table.set(&reply) {
                        learned = true;
                        break;
                    }
                }
            }
            if !learned {
                table.mark_stale();
            }
            tokio::time::sleep(REFRESH_PAUSE).await;
            table.refreshing.store(false, Ordering::Release);
        });
    }

    /// Takes the map of a `CLUSTER SLOTS` reply; false if it is not one.
    fn set(&self, reply: &Value) -> bool {
        let Some(ranges) = cluster_slots::parse(reply) else {
            return false;
        };
        *self.ranges.write().unwrap_or_else(|p| p.into_inner()) = Some(ranges.into());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn the_slot_table_names_the_primary_of_a_slot() {
        let table = SlotTable::default();
        assert_eq!(table.primary(0), None);
        assert!(table.stale.load(Ordering::Acquire));
        assert!(!table.set(&Value::Nil));
        assert!(table.set(&Value::Array(vec![
            range(0, 99, 7000),
            range(200, 299, 7000),
            range(100, 199, 7001),
        ])));
        assert_eq!(table.primary(0), Some(("127.0.0.1".into(), 7000)));
        assert_eq!(table.primary(99), Some(("127.0.0.1".into(), 7000)));
        assert_eq!(table.primary(100), Some(("127.0.0.1".into(), 7001)));
        assert_eq!(table.primary(250), Some(("127.0.0.1".into(), 7000)));
        // A slot no shard covers has no primary: the runtime serves it.
        assert_eq!(table.primary(300), None);
        assert_eq!(table.primary(16383), None);
        let primaries = table.primaries();
        assert_eq!(
            primaries,
            vec![("127.0.0.1".into(), 7000), ("127.0.0.1".into(), 7001)]
        );
    }
}
