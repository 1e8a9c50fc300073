//! Wake-ups without polling: one subscriber connection per Redis node, shared by every waiter of
//! a client in this process. A release publishes on the lock's channel; the hub wakes the waiters
//! registered for that channel (all of them, or only the one whose token the message names). A
//! fair lock's release grants the lock to the first waiter and says so (`protocol::wake`): the
//! hub keeps the grant for that waiter, which takes the hold without asking Redis. Grants go to
//! the waiter's process alone: on the lock's channel with the hub's inbox id appended, which
//! the waiter names when it queues, so the other processes are not woken by every hand-off.
//! If the subscriber connection breaks, every waiter is woken to look again, and the channels are
//! subscribed anew before they wait, so a lost message never strands anybody.
//!
//! On a Redis Cluster the hub subscribes (classic SUBSCRIBE) on any one live node: a PUBLISH on
//! the node that owns a lock's slot reaches every node over the cluster bus, so wake-ups need no
//! slot routing and survive resharding untouched.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::Notify;

use super::error::{timed_out, Result};
use super::node::{within, Target, Timeouts};
use crate::protocol::wake::{meant_for, parse_wake, GrantNote, WakeMessage};

/// Channels kept subscribed after their last waiter left, before they are dropped in a batch.
const IDLE_CHANNELS_KEPT: usize = 256;
/// While anybody waits, the subscriber connection is PINGed this often: a server that hangs
/// without closing it (stopped, cut off, a cluster node failed over) would otherwise keep its
/// waiters until their lease hints, with every release elsewhere unheard.
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(1);

pub struct WakeHub {
    core: Arc<HubCore>,
    /// This hub's inbox id (hex, '' when no randomness was to be had): fair lock grants for
    /// its waiters are published on `Keys::wake_inbox(inbox)` only.
    inbox: String,
}

struct HubCore {
    target: Arc<Target>,
    timeouts: Timeouts,
    ride_failover: bool,
    state: Mutex<HubState>,
    /// Serialises connecting, subscribing and unsubscribing, so they reach Redis in order.
    subscribing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct HubState {
    generation: u64,
    sink: Option<PubSubSink>,
    /// Dropped to end the dispatch task of the current connection, and with it the connection:
    /// when the connection is given up, or with the hub (the task holds the hub only weakly, so
    /// a hub that nobody uses any more, e.g. after `Client::close`, is dropped at all).
    dispatching: Option<tokio::sync::oneshot::Sender<()>>,
    channels: HashMap<Vec<u8>, Channel>,
    next_id: u64,
}

#[derive(Default)]
struct Channel {
    /// The connection generation on which this channel is subscribed.
    subscribed_on: Option<u64>,
    waiters: Vec<Waiter>,
}

struct Waiter {
    id: u64,
    /// Only messages naming this token (or naming nobody) wake the waiter; None: every message.
    token: Option<Vec<u8>>,
    notify: Arc<Notify>,
    /// The newest grant published for the token, until the waiter takes it.
    grant: Arc<Mutex<Option<GrantNote>>>,
}

/// A waiter's place on a channel; leaving it (drop) unregisters the waiter.
pub struct Registration {
    core: Arc<HubCore>,
    channel: Vec<u8>,
    id: u64,
    notify: Arc<Notify>,
    grant: Arc<Mutex<Option<GrantNote>>>,
}

impl WakeHub {
    /// `ride_failover`: when the subscriber cannot connect (its server died), keep trying until
    /// the command timeout has passed (a replica may be taking over), instead of failing the
    /// waiters at once; off for a Redlock master.
    pub fn new(target: Arc<Target>, timeouts: Timeouts, ride_failover: bool) -> Self {
        let mut id = [0u8; 8];
        let inbox = match getrandom::fill(&mut id) {
            Ok(()) => id.iter().map(|b| format!("{b:02x}")).collect(),
            Err(_) => String::new(),
        };
        WakeHub {
            core: Arc::new(HubCore {
                target,
                timeouts,
                ride_failover,
                state: Mutex::new(HubState::default()),
                subscribing: tokio::sync::Mutex::new(()),
            }),
            inbox,
        }
    }

    /// The inbox id that fair waiters of this hub give in the queue (see `inbox`).
    pub fn inbox(&self) -> &str {
        &self.inbox
    }

    /// Drops the subscriber connection (the master moved) and wakes every waiter to look again;
    /// they subscribe anew, on the new connection, before they wait.
    pub fn reset(&self) {
        let generation = self.core.lock_state().generation;
        self.core.disconnected(generation);
    }

    /// Registers a waiter on `channel`; call `ready()` before looking at the lock, so that any
    /// release after that look is heard.
    pub fn register(&self, channel: Vec<u8>, token: Option<&str>) -> Registration {
        let notify = Arc::new(Notify::new());
        let grant = Arc::new(Mutex::new(None));
        let mut state = self.core.lock_state();
        state.next_id += 1;
        let id = state.next_id;
        state
            .channels
            .entry(channel.clone())
            .or_default()
            .waiters
            .push(Waiter {
                id,
                token: token.map(|t| t.as_bytes().to_vec()),
                notify: notify.clone(),
                grant: grant.clone(),
            });
        Registration {
            core: self.core.clone(),
            channel,
            id,
            notify,
            grant,
        }
    }
}

impl HubCore {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_subscribed(&self, channel: &[u8]) -> bool {
        let state = self.lock_state();
        state.sink.is_some()
            && state
                .channels
                .get(channel)
                .is_some_and(|c| c.subscribed_on == Some(state.generation))
    }

    async fn ensure_subscribed(self: &Arc<Self>, channel: &[u8]) -> Result<()> {
        if self.is_subscribed(channel) {
            return Ok(());
        }
        let limit = self.timeouts.connect + self.timeouts.command;
        let _serial = tokio::time::timeout(limit, self.subscribing.lock())
            .await
            .map_err(|_| timed_out(limit, "waiting to subscribe"))?;
        if self.is_subscribed(channel) {
            return Ok(());
        }
        // A connection whose server stopped answering is dropped and one new connection tried
        // (on a cluster, another node: see `Target::pubsub`).
        let mut attempts = 2;
        loop {
            attempts -= 1;
            let (generation, mut sink) = self.connected().await?;
            let missing: Vec<Vec<u8>> = {
                let state = self.lock_state();
                state
                    .channels
                    .iter()
                    .filter(|(_, c)| c.subscribed_on != Some(generation))
                    .map(|(name, _)| name.clone())
                    .collect()
            };
            if missing.is_empty() {
                return Ok(());
            }
            let subscribed =
                within(self.timeouts.command, "SUBSCRIBE", sink.subscribe(&missing)).await;
            if let Err(err) = subscribed {
                self.disconnected(generation);
                if attempts == 0 {
                    return Err(err);
                }
                continue;
            }
            let mut state = self.lock_state();
            for name in &missing {
                if let Some(c) = state.channels.get_mut(name) {
                    c.subscribed_on = Some(generation);
                }
            }
            return Ok(());
        }
    }

    /// The live subscriber connection, opened if there is none. Call with `subscribing` held.
    async fn connected(self: &Arc<Self>) -> Result<(u64, PubSubSink)> {
        {
            let state = self.lock_state();
            if let Some(sink) = &state.sink {
                return Ok((state.generation, sink.clone()));
            }
        }
        let pubsub = if self.ride_failover {
            self.target.pubsub_through_failover(self.timeouts).await?
        } else {
            self.target.pubsub(self.timeouts).await?
        };
        let (sink, stream) = pubsub.split();
        let (dispatching, given_up) = tokio::sync::oneshot::channel();
        let generation = {
            let mut state = self.lock_state();
            state.generation += 1;
            state.sink = Some(sink.clone());
            state.dispatching = Some(dispatching);
            for channel in state.channels.values_mut() {
                channel.subscribed_on = None;
            }
            state.generation
        };
        tokio::spawn(Self::dispatch(
            Arc::downgrade(self),
            stream,
            generation,
            given_up,
        ));
        tokio::spawn(Self::keep_alive(
            Arc::downgrade(self),
            sink.clone(),
            generation,
        ));
        Ok((generation, sink))
    }

    /// PINGs the connection of `generation` every `KEEPALIVE` while anybody waits; one that
    /// does not answer within twice that (or the command timeout, if shorter) is dropped: its
    /// waiters look again and subscribe anew (a false alarm costs each one look). Ends with the
    /// connection (or the hub).
    async fn keep_alive(hub: std::sync::Weak<Self>, mut sink: PubSubSink, generation: u64) {
        loop {
            tokio::time::sleep(KEEPALIVE).await;
            let Some(core) = hub.upgrade() else {
                return;
            };
            {
                let state = core.lock_state();
                if state.generation != generation || state.sink.is_none() {
                    return;
                }
                if state.channels.values().all(|c| c.waiters.is_empty()) {
                    continue;
                }
            }
            let patience = core.timeouts.command.min(KEEPALIVE * 2);
            let answered = within(patience, "PING", sink.ping::<redis::Value>()).await;
            if answered.is_err() {
                core.disconnected(generation);
                return;
            }
        }
    }

    /// Delivers messages until the connection ends, then wakes everybody to look again; ends
    /// at once, dropping the connection, when it is given up or the hub is gone (`given_up`).
    async fn dispatch(
        hub: std::sync::Weak<Self>,
        mut stream: PubSubStream,
        generation: u64,
        mut given_up: tokio::sync::oneshot::Receiver<()>,
    ) {
        loop {
            let msg = tokio::select! {
                msg = stream.next() => msg,
                _ = &mut given_up => return,
            };
            let Some(msg) = msg else { break };
            let Some(core) = hub.upgrade() else {
                return;
            };
            let Ok(channel) = msg.get_channel::<Vec<u8>>() else {
                continue;
            };
            let message = parse_wake(msg.get_payload_bytes());
            let state = core.lock_state();
            if let Some(c) = state.channels.get(&channel) {
                for waiter in &c.waiters {
                    let token = waiter.token.as_deref();
                    if !meant_for(message, token) {
                        continue;
                    }
                    if let (Some(_), WakeMessage::Grant { note, .. }) = (token, message) {
                        let mut slot = lock_grant(&waiter.grant);
                        if !matches!(*slot, Some(kept) if kept.fence >= note.fence) {
                            *slot = Some(note);
                        }
                    }
                    waiter.notify.notify_one();
                }
            }
        }
        if let Some(core) = hub.upgrade() {
            core.disconnected(generation);
        }
    }

    fn disconnected(&self, generation: u64) {
        let mut state = self.lock_state();
        if state.generation != generation {
            return;
        }
        state.sink = None;
        state.dispatching = None;
        for channel in state.channels.values_mut() {
            channel.subscribed_on = None;
            for waiter in &channel.waiters {
                waiter.notify.notify_one();
            }
        }
    }

    fn unregister(self: &Arc<Self>, channel: &[u8], id: u64) {
        let idle = {
            let mut state = self.lock_state();
            if let Some(c) = state.channels.get_mut(channel) {
                c.waiters.retain(|w| w.id != id);
            }
            state
                .channels
                .values()
                .filter(|c| c.waiters.is_empty())
                .count()
        };
        if idle > IDLE_CHANNELS_KEPT {
            let core = self.clone();
            super::runtime::spawn(async move { core.drop_idle_channels().await });
        }
    }

    async fn drop_idle_channels(self: Arc<Self>) {
        let _serial = self.subscribing.lock().await;
        let (idle, sink) = {
            let mut state = self.lock_state();
            let idle: Vec<Vec<u8>> = state
                .channels
                .iter()
                .filter(|(_, c)| c.waiters.is_empty())
                .map(|(name, _)| name.clone())
                .collect();
            for name in &idle {
                state.channels.remove(name);
            }
            (idle, state.sink.clone())
        };
        if let (Some(mut sink), false) = (sink, idle.is_empty()) {
            let _ = within(
                self.timeouts.command,
                "UNSUBSCRIBE",
                sink.unsubscribe(&idle),
            )
            .await;
        }
    }
}

impl Registration {
    /// Makes sure the channel is subscribed on a live connection.
    pub async fn ready(&self) -> Result<()> {
        self.core
            .ensure_subscribed(&self.channel)
            .await
            .map_err(|err| err.at(&self.core.target.endpoint()))
    }

    /// Whether the channel is subscribed on the live connection now (no I/O): a message
    /// published from now on reaches this waiter (or, if the connection breaks, it is woken).
    pub fn is_ready(&self) -> bool {
        self.core.is_subscribed(&self.channel)
    }

    /// Resolves on the next wake-up meant for this waiter (or at once if one came since the last).
    pub async fn notified(&self) {
        self.notify.notified().await
    }

    /// The newest grant published for this waiter's token since the last call, if any.
    pub fn take_grant(&self) -> Option<GrantNote> {
        lock_grant(&self.grant).take()
    }
}

fn lock_grant(slot: &Mutex<Option<GrantNote>>) -> std::sync::MutexGuard<'_, Option<GrantNote>> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.core.unregister(&self.channel, self.id);
    }
}
