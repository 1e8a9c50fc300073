//! The connections of one process to one Redis deployment (a server, a Sentinel-managed master
//! or a Redis Cluster; on Redlock, to one master), opened lazily: below every primitive, and
//! knowing none.

use std::sync::{Arc, Weak};

use super::direct::DirectPool;
use super::exclusive::ExclusivePool;
use super::name_map::Locals;
use super::node::{Node, ServerSeen, Target, Timeouts};
use super::runtime;
use super::wake::WakeHub;

impl Shared {
    /// Moves whenever a connection broke under a call: a call that spans a move may have been
    /// sent twice, and its second answer may describe the effect of its first.
    pub fn fault_epoch(&self) -> u64 {
        self.node.drops() + self.direct.drops()
    }

    /// The run_id of the server incarnation that the latest connection opened on, if known.
    pub fn run_id(&self) -> Option<Arc<str>> {
        self.seen.run_id()
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a process shares on one Redis deployment (or one Redlock master): the command
/// connection, the subscriber hub, and the primitives' in-process state (`locals`).
pub struct Shared {
    pub node: Node,
    /// Connections used one call at a time, for writes that WAIT must follow (replicas).
    pub exclusive: ExclusivePool,
    /// Blocking connections for one-round-trip calls made from the caller's thread: to the
    /// server, to the master Sentinel names, or to the cluster node that owns a call's slot
    /// (what it cannot serve goes through the runtime, see `executor::run_direct`).
    pub direct: DirectPool,
    pub hub: WakeHub,
    /// Per name, the in-process state of a primitive: the gate that lets one waiter per lock
    /// compete in Redis (`waiting::Gate`), a cache entry's `Flight`.
    pub locals: Locals,
    /// The run_id of the server incarnation last connected to (None on a cluster).
    seen: Arc<ServerSeen>,
    /// Sentinel: the task that moves the connections when a failover is announced.
    _watcher: Option<AbortOnDrop>,
}

impl Shared {
    /// Connections (opened lazily) to `target`; `identify` reads each server's run_id as its
    /// connection opens (Redlock masters).
    pub fn open(target: Arc<Target>, timeouts: Timeouts, identify: bool) -> Arc<Shared> {
        Arc::new_cyclic(|me: &Weak<Shared>| {
            let watcher = match &*target {
                Target::Sentinel(sentinel) => {
                    let me = me.clone();
                    let watch = sentinel
                        .clone()
                        .watch(timeouts, move || match me.upgrade() {
                            Some(shared) => {
                                shared.node.reset();
                                shared.direct.reset();
                                shared.exclusive.reset();
                                shared.hub.reset();
                                true
                            }
                            None => false,
                        });
                    runtime::handle()
                        .ok()
                        .map(|h| AbortOnDrop(h.spawn(watch).abort_handle()))
                }
                _ => None,
            };
            // Every connection to one server (or a Sentinel-managed master) reads its run_id as
            // it opens, so a restart or failover is told from a reply lost in transit (see
            // `Holder::release`); a cluster's connections span many servers: none is read.
            let seen = Arc::new(ServerSeen::default());
            let node = if identify || !target.is_cluster() {
                Node::identified_into(target.clone(), timeouts, seen.clone())
            } else {
                Node::new(target.clone(), timeouts)
            };
            // One keyspace rides out a failover; a Redlock master (`identify`) fails at once, and
            // its calls run in the order sent (a round's give-back never after the next vote).
            let node = if identify {
                node.in_order().requiring_identity()
            } else {
                node.riding_failover()
            };
            let direct = match &*target {
                Target::Direct(client) => {
                    let pool = DirectPool::identified(client.clone(), timeouts, seen.clone());
                    if identify {
                        pool
                    } else {
                        pool.riding_restarts()
                    }
                }
                Target::Sentinel(sentinel) => {
                    DirectPool::sentinel(sentinel.clone(), timeouts, seen.clone())
                }
                Target::Cluster { seeds, slots, .. } => match seeds.first() {
                    Some(seed) => DirectPool::cluster(
                        seed.get_connection_info().clone(),
                        slots.clone(),
                        timeouts,
                    ),
                    None => DirectPool::unavailable(timeouts),
                },
            };
            let exclusive = ExclusivePool::new(target.clone(), timeouts, node.resets());
            let exclusive = if identify {
                exclusive
            } else {
                exclusive.riding_failover()
            };
            Shared {
                node,
                exclusive,
                direct,
                hub: WakeHub::new(target, timeouts, !identify),
                locals: Locals::default(),
                seen,
                _watcher: watcher,
            }
        })
    }
}
