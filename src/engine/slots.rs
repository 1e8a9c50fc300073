//! The primaries of a Redis Cluster by slot, as the cluster client (redis-rs `cluster_async`)
//! last saw them: it tells every topology it learns to its read-routing strategy, which here
//! only records it. The direct path (`direct.rs`) routes by this table.

use std::sync::{Arc, RwLock};

use redis::cluster_read_routing::{
    ClusterTopology, ReadCandidates, ReadRoutingStrategy, ReadRoutingStrategyFactory,
};

/// The primaries of a cluster by slot, as the cluster client last saw them: it tells every
/// topology it discovers or refreshes (on connect, MOVED, failover) to `SlotWatch`. The direct
/// path only reads it; a stale entry costs a redirect (`direct::Miss::Elsewhere`), never a wrong
/// answer.
#[derive(Default)]
pub struct SlotTable {
    ranges: RwLock<Option<Arc<[SlotRange]>>>,
}

/// (first slot, last slot, host, port) of one range; a table's are sorted by first slot.
type SlotRange = (u16, u16, String, u16);

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

    fn set(&self, topology: &ClusterTopology) {
        let mut ranges: Vec<SlotRange> = topology
            .shards()
            .flat_map(|shard| {
                let primary = shard.primary();
                shard.slot_ranges().iter().map(move |(start, end)| {
                    (*start, *end, primary.host().to_string(), primary.port())
                })
            })
            .collect();
        ranges.sort_unstable_by_key(|(start, _, _, _)| *start);
        *self.ranges.write().unwrap_or_else(|p| p.into_inner()) = Some(ranges.into());
    }
}

/// Given to the cluster client as its read routing strategy, only to hear of every topology
/// (`SlotTable`): reads still go to the primaries, as without one.
pub struct SlotWatch(pub Arc<SlotTable>);

impl ReadRoutingStrategy for SlotWatch {
    fn on_topology_changed(&self, topology: ClusterTopology) {
        self.0.set(&topology);
    }

    fn route_read<'a>(&self, candidates: &ReadCandidates<'a>) -> &'a redis::cluster::NodeAddress {
        match candidates {
            ReadCandidates::AnyNode(c) => c.primary(),
            // Only asked for when a command requires a replica, which redmutex never sends.
            ReadCandidates::ReplicasOnly(c) => c.replicas().first(),
        }
    }
}

impl ReadRoutingStrategyFactory for SlotWatch {
    fn create_strategy(&self) -> Box<dyn ReadRoutingStrategy> {
        Box::new(SlotWatch(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use redis::cluster::NodeAddress;
    use redis::cluster_read_routing::Shard;

    use super::*;

    #[test]
    fn the_slot_table_names_the_primary_of_a_slot() {
        let table = SlotTable::default();
        assert_eq!(table.primary(0), None);
        let shard = |ranges: Vec<(u16, u16)>, port: u16| {
            Shard::new(ranges, NodeAddress::new("127.0.0.1", port), Vec::new())
        };
        table.set(&ClusterTopology::from_shards(vec![
            shard(vec![(0, 99), (200, 299)], 7000),
            shard(vec![(100, 199)], 7001),
        ]));
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
