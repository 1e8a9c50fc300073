//! A client: the settings of one Redis deployment, and per process the connections to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use redis::ConnectionInfo;

use super::cache::Flight;
use super::direct::DirectPool;
use super::error::{Error, Result};
use super::exclusive::ExclusivePool;
use super::gates::Gates;
use super::node::{Node, Timeouts};
use super::runtime::pid;
use super::waiting::Gate;
use super::wake::WakeHub;
use crate::protocol::keys::Keys;

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub info: ConnectionInfo,
    pub prefix: Vec<u8>,
    pub timeouts: Timeouts,
}

/// What a process shares on one client: the command connection, the subscriber hub, and the
/// in-process gates that let only one waiter per lock name compete in Redis at a time.
pub struct Shared {
    pub node: Node,
    /// Connections used one call at a time, for writes that WAIT must follow (replicas).
    pub exclusive: ExclusivePool,
    /// Blocking connections for one-round-trip calls made from the caller's thread.
    pub direct: DirectPool,
    pub hub: WakeHub,
    gates: Mutex<HashMap<Vec<u8>, Weak<Gate>>>,
    /// The same for cache entries, each gate guarding the value its last waiter read.
    pub cache_flights: Gates<Flight>,
}

impl Shared {
    /// Moves whenever a connection broke under a call: a call that spans a move may have been
    /// sent twice, and its second answer may describe the effect of its first.
    pub fn fault_epoch(&self) -> u64 {
        self.node.drops() + self.direct.drops()
    }

    /// The gate of one lock name in this process (fair locks queue in Redis instead).
    pub fn gate(&self, name: &[u8]) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gate) = gates.get(name).and_then(Weak::upgrade) {
            return gate;
        }
        if gates.len() >= 64 {
            gates.retain(|_, gate| gate.strong_count() > 0);
        }
        let gate = Arc::new(Gate::default());
        gates.insert(name.to_vec(), Arc::downgrade(&gate));
        gate
    }
}

pub struct Client {
    config: ClientConfig,
    per_process: Mutex<Option<(u32, Arc<Shared>)>>,
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Self> {
        // Validates the settings without connecting.
        redis::Client::open(config.info.clone())
            .map_err(|e| Error::Invalid(format!("url: {e}")))?;
        Ok(Client {
            config,
            per_process: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub fn keys(&self, name: &[u8]) -> Keys {
        Keys::new(&self.config.prefix, name)
    }

    /// This process's connections, opened lazily. In a forked child the parent's are forgotten
    /// (leaked, never used or closed: closing would disturb the parent's sockets).
    pub fn shared(&self) -> Result<Arc<Shared>> {
        let mut slot = self.per_process.lock().unwrap_or_else(|p| p.into_inner());
        let me = pid();
        if let Some((owner, shared)) = slot.as_ref() {
            if *owner == me {
                return Ok(shared.clone());
            }
        }
        if let Some((_, inherited)) = slot.take() {
            std::mem::forget(inherited);
        }
        let redis_client = redis::Client::open(self.config.info.clone())
            .map_err(|e| Error::Invalid(format!("url: {e}")))?;
        let shared = Arc::new(Shared {
            node: Node::new(redis_client.clone(), self.config.timeouts),
            exclusive: ExclusivePool::new(redis_client.clone(), self.config.timeouts),
            direct: DirectPool::new(redis_client.clone(), self.config.timeouts),
            hub: WakeHub::new(redis_client, self.config.timeouts),
            gates: Mutex::new(HashMap::new()),
            cache_flights: Gates::new(),
        });
        *slot = Some((me, shared.clone()));
        Ok(shared)
    }

    /// Drops this process's connections; the next use opens new ones.
    pub fn close(&self) {
        let mut slot = self.per_process.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, shared)) = slot.take() {
            if owner != pid() {
                std::mem::forget(shared);
            }
        }
    }
}
