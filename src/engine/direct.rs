//! Direct calls: a small pool of plain blocking connections, used from the caller's own thread
//! for the one-round-trip steps of the blocking API (first acquire attempt, release, extend,
//! owner look-up). A call through the runtime costs two thread hand-offs on top of the network
//! round trip; here it costs none, which is what lets a lock + unlock pair approach the
//! round-trip limit. Over plain TCP or a unix socket, the connections frame RESP themselves
//! (`plain.rs`: one write and one read per call, no general parser); TLS uses the redis crate's
//! blocking connection. Waiting and everything in the background go through the runtime.
//!
//! On a single server every call is served here. Through Sentinel the calls go to the master
//! the sentinels name (looked up again after a failover), and on a Redis Cluster to the primary
//! that owns the slot of the call's first key, in the cluster's slot map (`SlotTable`, asked
//! for again when a call misses). There, whatever the runtime handles better is left to it (`Miss::Elsewhere`):
//! a redirect (MOVED, ASK), a slot being moved, a failover, an unreachable server or a
//! connection that broke under the call; the executor then sends the call through the runtime
//! (`executor::run_direct`). A call that timed out is not sent again: like on one server, it
//! fails, keeping its connection so that an undo can wait for it (`Overdue`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::{
    Cmd, ConnectionInfo, ConnectionLike, ErrorKind, FromRedisValue, ScriptInvocation,
    ServerErrorKind, Value,
};

use super::connect::Restart;
use super::error::{connect_failed, timed_out, Error, Result};
use super::listener::Listener;
use super::node::{OverdueCalls, Retry, ServerSeen, Timeouts};
use super::plain::PlainConnection;
use super::runtime;
use super::sentinel::Sentinel;
use super::slots::SlotTable;
use crate::protocol::keys::key_slot;
use crate::protocol::replies::parse_server_info;

/// Idle connections kept for reuse per server; more threads than this open and close their own.
const KEPT: usize = 16;

/// One server's blocking connections.
struct Server {
    client: redis::Client,
    /// Where the client connects, named by every connection error.
    endpoint: String,
    idle: Mutex<Vec<Conn>>,
    /// Idle subscriber connections of blocking waits (`listener.rs`), most recent last.
    listeners: Mutex<Vec<Listener>>,
    /// Whether `sweep_listeners` runs for this server.
    sweeping: AtomicBool,
}

impl Server {
    fn new(client: redis::Client) -> Self {
        Server {
            endpoint: super::node::address(client.get_connection_info()),
            client: without_delay(client),
            idle: Mutex::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            sweeping: AtomicBool::new(false),
        }
    }

    fn give_back(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < KEPT && conn.is_open() {
            idle.push(conn);
        }
    }

    fn forget_idle(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// `client`, its TCP connections sending each request at once (`TCP_NODELAY`): a call is one
/// small write followed by a wait for the answer, which Nagle's algorithm could only delay.
fn without_delay(client: redis::Client) -> redis::Client {
    let info = client.get_connection_info().clone();
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    redis::Client::open(info.set_tcp_settings(tcp)).unwrap_or(client)
}

/// Which server a direct call goes to.
enum Route {
    /// None: no direct calls (a Redlock master's pool is never used this way); every call is
    /// refused.
    Unavailable,
    /// One server.
    Server(Arc<Server>),
    /// The master that the sentinels name, looked up on the runtime (`Sentinel::master`, which
    /// has it confirm its role) when none is known, and forgotten on a failover announcement
    /// (`DirectPool::reset`), a `READONLY` reply or a broken connection.
    Sentinel {
        sentinel: Arc<Sentinel>,
        master: Mutex<Master>,
    },
    /// The primary that owns the slot of the call's first key, in the cluster client's slot map
    /// (`SlotTable`); a connection per node, made like the seed's (credentials, TLS).
    Cluster {
        slots: Arc<SlotTable>,
        template: Box<ConnectionInfo>,
        nodes: Mutex<HashMap<(String, u16), Arc<Server>>>,
    },
}

#[derive(Default)]
struct Master {
    /// Moves on every reset: a look-up that began before one is not kept.
    generation: u64,
    server: Option<Arc<Server>>,
}

/// Why a direct call did not settle: it failed (and how), or it belongs on the runtime path.
pub enum Miss {
    /// The call failed; `Some(Overdue)` when it timed out and may still run.
    Failed(Error, Option<Overdue>),
    /// Not served here, and safe to send through the runtime: no server known for it yet, the
    /// server redirected or refused it before running it (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
    /// LOADING, READONLY), could not be reached, or the connection broke under it (every step of
    /// redmutex is token-checked, so a resend is safe, like `Retry::Once`). Only on Cluster and
    /// Sentinel: the runtime follows redirects, slot migrations and failovers.
    Elsewhere,
}

impl Miss {
    fn failed(err: Error) -> Self {
        Miss::Failed(err, None)
    }
}

pub struct DirectPool {
    route: Route,
    timeouts: Timeouts,
    /// How many connections broke under a call.
    drops: AtomicU64,
    /// Some: each new connection reads the server's run_id (`INFO server`) into it.
    seen: Option<Arc<ServerSeen>>,
    /// One server's restart is waited out (`Restart`): not on a Redlock master's pool.
    rides_restarts: bool,
}

impl DirectPool {
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        DirectPool {
            route: Route::Server(Arc::new(Server::new(client))),
            timeouts,
            drops: AtomicU64::new(0),
            seen: None,
            rides_restarts: false,
        }
    }

    /// A pool whose new connections record the server's run_id in `seen`.
    pub fn identified(client: redis::Client, timeouts: Timeouts, seen: Arc<ServerSeen>) -> Self {
        DirectPool {
            seen: Some(seen),
            ..DirectPool::new(client, timeouts)
        }
    }

    /// This pool's calls to its one server wait out a restart (`Restart`); a Redlock master's
    /// pool does not (its failure counts at once), nor do Sentinel and Cluster routes (their
    /// calls go to the runtime, which follows failovers).
    pub fn riding_restarts(self) -> Self {
        DirectPool {
            rides_restarts: true,
            ..self
        }
    }

    /// A pool that refuses every call.
    pub fn unavailable(timeouts: Timeouts) -> Self {
        DirectPool {
            route: Route::Unavailable,
            timeouts,
            drops: AtomicU64::new(0),
            seen: None,
            rides_restarts: false,
        }
    }

    /// A pool on the master that `sentinel` names; its connections record the run_id in `seen`.
    pub fn sentinel(sentinel: Arc<Sentinel>, timeouts: Timeouts, seen: Arc<ServerSeen>) -> Self {
        DirectPool {
            route: Route::Sentinel {
                sentinel,
                master: Mutex::default(),
            },
            timeouts,
            drops: AtomicU64::new(0),
            seen: Some(seen),
            rides_restarts: false,
        }
    }

    /// A pool on the primaries of a cluster, routed by `slots`; `template` (a seed's settings)
    /// gives every node connection its credentials and TLS settings.
    pub fn cluster(template: ConnectionInfo, slots: Arc<SlotTable>, timeouts: Timeouts) -> Self {
        DirectPool {
            route: Route::Cluster {
                slots,
                template: Box::new(template),
                nodes: Mutex::default(),
            },
            timeouts,
            drops: AtomicU64::new(0),
            seen: None,
            rides_restarts: false,
        }
    }

    /// A subscriber connection for a wait that the caller's thread drives (`listener.rs`): on
    /// one server only (through Sentinel or on a cluster, the hub follows the deployment), over
    /// plain TCP or a unix socket; None where the hub serves the wait.
    /// `fresh`: a new connection, the idle ones forgotten (one of them failed: the server
    /// closed them, restarting or cut off).
    pub fn listener(&self, fresh: bool) -> Option<Result<Listener>> {
        let Route::Server(server) = &self.route else {
            return None;
        };
        let (idle, _forgotten) = {
            let mut idle = server.listeners.lock().unwrap_or_else(|p| p.into_inner());
            // (Dropped after the lock is let go: each may write its UNSUBSCRIBE.)
            let forgotten = if fresh {
                std::mem::take(&mut *idle)
            } else {
                Vec::new()
            };
            (idle.pop(), forgotten)
        };
        if let Some(listener) = idle {
            return Some(Ok(listener));
        }
        let mut restart = Restart::new(self.timeouts, self.rides_restarts);
        loop {
            match Listener::connect(server.client.get_connection_info(), self.timeouts)? {
                Err(err) if restart.wait_blocking(&err) => {}
                made => return Some(made.map_err(|err| err.at(&server.endpoint))),
            }
        }
    }

    /// An idle listener subscribed to `channels` already (an earlier wait's on the same name),
    /// if any.
    pub fn idle_listener_on(&self, channels: &[Vec<u8>]) -> Option<Listener> {
        let Route::Server(server) = &self.route else {
            return None;
        };
        let mut idle = server.listeners.lock().unwrap_or_else(|p| p.into_inner());
        let at = idle.iter().rposition(|l| l.channels() == channels)?;
        Some(idle.remove(at))
    }

    /// Takes back a listener whose wait ended, subscribed still (the next wait on the same name
    /// needs no SUBSCRIBE): kept if it is open and fewer than `KEPT` are idle. One left idle
    /// for `IDLE_LISTENING` gives its channels up (`sweep_listeners`).
    pub fn give_back_listener(&self, mut listener: Listener) {
        let Route::Server(server) = &self.route else {
            return;
        };
        if !listener.is_open() {
            return;
        }
        listener.idle();
        let sweep = {
            let mut idle = server.listeners.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() >= KEPT {
                return;
            }
            idle.push(listener);
            !server.sweeping.swap(true, Ordering::AcqRel)
        };
        if sweep {
            runtime::spawn(sweep_listeners(Arc::downgrade(server)));
        }
    }

    /// How many connections broke under a call so far.
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    /// Forgets the master and its connections (Sentinel announced a failover): the next call
    /// looks the master up again.
    pub fn reset(&self) {
        if let Route::Sentinel { master, .. } = &self.route {
            let mut master = master.lock().unwrap_or_else(|p| p.into_inner());
            master.generation += 1;
            master.server = None;
        }
    }

    /// Forgets `server` as the master, unless another one has replaced it already; on a
    /// cluster, the slot map that named it is asked for again.
    fn forget_master(&self, server: &Arc<Server>) {
        if let Route::Cluster { slots, .. } = &self.route {
            slots.mark_stale();
        }
        if let Route::Sentinel { master, .. } = &self.route {
            let mut master = master.lock().unwrap_or_else(|p| p.into_inner());
            if master
                .server
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, server))
            {
                master.generation += 1;
                master.server = None;
            }
        }
    }

    /// The server for a call whose first key is `key`, and whether that server was routed to
    /// (Sentinel, Cluster: its misses go to the runtime). None: no server known for it now.
    fn server_for(&self, key: Option<&[u8]>) -> std::result::Result<(Arc<Server>, bool), Miss> {
        match &self.route {
            Route::Unavailable => Err(Miss::failed(Error::Usage(
                "no direct connection to this deployment".into(),
            ))),
            Route::Server(server) => Ok((server.clone(), false)),
            Route::Sentinel { sentinel, master } => {
                self.master(sentinel, master).map(|server| (server, true))
            }
            Route::Cluster {
                slots,
                template,
                nodes,
            } => {
                let slot = key_slot(key.ok_or(Miss::Elsewhere)?);
                let (host, port) = slots.primary(slot).ok_or_else(|| {
                    slots.mark_stale();
                    Miss::Elsewhere
                })?;
                let mut nodes = nodes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(server) = nodes.get(&(host.clone(), port)) {
                    return Ok((server.clone(), true));
                }
                let info =
                    super::connect::node_info(template, &host, port).ok_or(Miss::Elsewhere)?;
                let client = super::connect::client(info).map_err(|_| Miss::Elsewhere)?;
                let server = Arc::new(Server::new(client));
                nodes.insert((host, port), server.clone());
                Ok((server, true))
            }
        }
    }

    /// The current master, looked up through the runtime when none is known (not from a
    /// runtime thread, which must not block: `Miss::Elsewhere` there, and the call goes through
    /// the runtime). A lookup that fails, or outlasts connect + command timeout, fails the
    /// call: the runtime would only look it up once more.
    fn master(
        &self,
        sentinel: &Arc<Sentinel>,
        master: &Mutex<Master>,
    ) -> std::result::Result<Arc<Server>, Miss> {
        let generation = {
            let master = master.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(server) = &master.server {
                return Ok(server.clone());
            }
            master.generation
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Miss::Elsewhere);
        }
        let handle = runtime::handle().map_err(|_| Miss::Elsewhere)?;
        let limit = self.timeouts.connect + self.timeouts.command;
        let looked_up = handle.block_on(async {
            tokio::time::timeout(limit, sentinel.master(self.timeouts))
                .await
                .unwrap_or_else(|_| Err(timed_out(limit, "waiting for the connection")))
        });
        let (client, _) = looked_up.map_err(|err| Miss::failed(err.at(&sentinel.endpoint())))?;
        let mut master = master.lock().unwrap_or_else(|p| p.into_inner());
        if master.generation != generation {
            return Err(Miss::Elsewhere);
        }
        let server = master
            .server
            .get_or_insert_with(|| Arc::new(Server::new(client)));
        Ok(server.clone())
    }

    /// An idle connection (unless `fresh`), else a new one: a refused connect is tried again
    /// while `restart` allows.
    fn take(&self, server: &Server, fresh: bool, restart: &mut Restart) -> Result<Conn> {
        if !fresh {
            if let Some(conn) = server.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                return Ok(conn);
            }
        }
        loop {
            match self.open(server) {
                Err(err) if restart.wait_blocking(&err) => {}
                opened => return opened,
            }
        }
    }

    /// A new connection to `server`, its run_id read when the pool records it.
    fn open(&self, server: &Server) -> Result<Conn> {
        let connect = self.timeouts.connect;
        let info = server.client.get_connection_info();
        let conn = match PlainConnection::connect(info, connect) {
            Some(plain) => plain.map(Conn::Plain),
            None => server
                .client
                .get_connection_with_timeout(connect)
                .map(Conn::Crate),
        };
        let mut conn = conn.map_err(|err| {
            if err.is_timeout() {
                timed_out(connect, "connecting")
            } else {
                connect_failed(err)
            }
        })?;
        conn.set_read_timeout(Some(self.timeouts.command))?;
        conn.set_write_timeout(Some(self.timeouts.command))?;
        if let Some(seen) = &self.seen {
            let command = self.timeouts.command;
            let info = redis::cmd("INFO")
                .arg("server")
                .query::<String>(&mut conn)
                .map_err(|err| {
                    if err.is_timeout() {
                        timed_out(command, "waiting for an answer")
                    } else {
                        Error::from(err)
                    }
                });
            match info {
                Ok(info) => {
                    if let Some((run_id, _)) = parse_server_info(&info) {
                        seen.note(&run_id);
                    }
                }
                // A user without INFO: the run_id stays unknown, as on the runtime's node.
                Err(err) if err.is_no_permission() => {}
                Err(err) => return Err(err),
            }
        }
        Ok(conn)
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT), with the same retry rule as the runtime's
    /// calls: once more on a connection that broke under the call, never after a timeout. A
    /// call that timed out keeps its connection in `Miss::Failed` (see `Overdue`).
    pub fn invoke(
        &self,
        inv: &ScriptInvocation<'_>,
        retry: Retry,
    ) -> std::result::Result<Value, Miss> {
        let key = self.routed().then(|| script_key(inv)).flatten();
        self.call(key.as_deref(), retry, |conn| inv.invoke::<Value>(conn))
    }

    /// `invoke` with `Retry::Once`, except that a resend after a broken connection sends
    /// `resend` instead of `first` (as `Node::invoke_or_resend`).
    pub fn invoke_or_resend(
        &self,
        first: &ScriptInvocation<'_>,
        resend: &ScriptInvocation<'_>,
    ) -> std::result::Result<Value, Miss> {
        let key = self.routed().then(|| script_key(first)).flatten();
        let sent = std::cell::Cell::new(false);
        self.call(key.as_deref(), Retry::Once, |conn| {
            let inv = if sent.replace(true) { resend } else { first };
            inv.invoke::<Value>(conn)
        })
    }

    pub fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        retry: Retry,
    ) -> std::result::Result<T, Miss> {
        let key = self.routed().then(|| command_key(cmd)).flatten();
        self.call(key.as_deref(), retry, |conn| cmd.query::<T>(conn))
    }

    /// Whether calls are routed (by key or to a master that moves).
    fn routed(&self) -> bool {
        matches!(self.route, Route::Sentinel { .. } | Route::Cluster { .. })
    }

    /// One call (see `attempt`); its connection errors name the endpoint.
    fn call<T>(
        &self,
        key: Option<&[u8]>,
        retry: Retry,
        op: impl Fn(&mut Conn) -> redis::RedisResult<T>,
    ) -> std::result::Result<T, Miss> {
        let (server, routed) = self.server_for(key)?;
        self.attempt(&server, routed, retry, op)
            .map_err(|miss| match miss {
                Miss::Failed(err, overdue) => Miss::Failed(err.at(&server.endpoint), overdue),
                Miss::Elsewhere => Miss::Elsewhere,
            })
    }

    fn attempt<T>(
        &self,
        server: &Arc<Server>,
        routed: bool,
        retry: Retry,
        op: impl Fn(&mut Conn) -> redis::RedisResult<T>,
    ) -> std::result::Result<T, Miss> {
        let mut may_retry = retry == Retry::Once && !routed;
        let mut fresh = false;
        // One server that is restarting is waited out here, on the caller's thread (the runtime
        // is not asked: it would only wait the same way, at the cost of two thread hand-offs).
        let mut restart = Restart::new(self.timeouts, self.rides_restarts && !routed);
        loop {
            let mut conn = match self.take(server, fresh, &mut restart) {
                Ok(conn) => conn,
                // Nothing was sent: the runtime finds the server now in charge.
                Err(err) if routed && err.is_connection() => {
                    self.forget_master(server);
                    return Err(Miss::Elsewhere);
                }
                Err(err) => return Err(Miss::failed(err)),
            };
            match op(&mut conn) {
                Ok(value) => {
                    server.give_back(conn);
                    return Ok(value);
                }
                Err(err) if routed && not_run_here(&err) => {
                    // Refused before it ran: the connection is fine, the route is not.
                    if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
                        self.forget_master(server);
                    } else {
                        if slot_moved(&err) {
                            self.forget_master(server);
                        }
                        server.give_back(conn);
                    }
                    return Err(Miss::Elsewhere);
                }
                Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::BusyLoading) => {
                    // A restarted server reading its data back: nothing ran, the connection is
                    // fine. Sent again on it once the server serves, within the window.
                    server.give_back(conn);
                    fresh = false;
                    let err = Error::from(err);
                    if !restart.wait_blocking(&err) {
                        return Err(Miss::failed(err));
                    }
                }
                Err(err) => {
                    let overdue = err.is_timeout();
                    let dropped = err.is_connection_dropped() && !overdue;
                    let err = if overdue {
                        timed_out(self.timeouts.command, "waiting for an answer")
                    } else {
                        Error::from(err)
                    };
                    // A connection that failed is closed (dropped), never reused: a late reply
                    // would otherwise be read as the answer to the next call.
                    if !err.is_connection() {
                        server.give_back(conn);
                        return Err(Miss::failed(err));
                    }
                    if overdue {
                        return Err(Miss::Failed(err, Some(Overdue::Direct(Box::new(conn)))));
                    }
                    if dropped {
                        self.drops.fetch_add(1, Ordering::Relaxed);
                        // The server closed this one (restart, cut): the idle ones went the
                        // same way, and a socket it closed still looks open until used.
                        server.forget_idle();
                        if routed {
                            self.forget_master(server);
                            return Err(Miss::Elsewhere);
                        }
                    }
                    if !(dropped && may_retry) {
                        return Err(Miss::failed(err));
                    }
                    may_retry = false;
                    fresh = true;
                }
            }
        }
    }
}

/// How long an idle listener keeps the channels of its last wait: long enough for the next wait
/// on a name taken over and over, short enough that the messages it does not read stay few.
const IDLE_LISTENING: Duration = Duration::from_secs(1);

/// While idle listeners keep channels, makes those idle for `IDLE_LISTENING` give them up
/// (one UNSUBSCRIBE each, written on a blocking thread); ends when none keeps any.
async fn sweep_listeners(server: Weak<Server>) {
    loop {
        tokio::time::sleep(IDLE_LISTENING / 2).await;
        let Some(server) = server.upgrade() else {
            return;
        };
        let swept = tokio::task::spawn_blocking(move || {
            let mut idle = server.listeners.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain_mut(|l| !l.idle_longer_than(IDLE_LISTENING) || l.quiet());
            let more = idle.iter().any(Listener::idle_subscribed);
            if !more {
                server.sweeping.store(false, Ordering::Release);
            }
            more
        })
        .await;
        if !matches!(swept, Ok(true)) {
            return;
        }
    }
}

/// Replies of a server that did not run the command, and that the runtime handles: a cluster
/// redirecting it or busy moving its slot, failing over or loading; a demoted master.
fn not_run_here(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
        )
    )
}

/// Replies that say the slot map is out of date: the slot has another owner now (MOVED), or
/// its owner is down (CLUSTERDOWN), not a slot in migration (ASK, TRYAGAIN).
fn slot_moved(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::ClusterDown)
    )
}

/// The first key of a command as Redis Cluster routes it: after `numkeys` for a script, else
/// the first argument.
fn command_key(cmd: &Cmd) -> Option<Vec<u8>> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()??;
    let script = [
        &b"EVALSHA"[..],
        b"EVAL",
        b"EVALSHA_RO",
        b"EVAL_RO",
        b"FCALL",
        b"FCALL_RO",
    ]
    .iter()
    .any(|s| name.eq_ignore_ascii_case(s));
    if script {
        let _body = args.next()?;
        let numkeys = std::str::from_utf8(args.next()??)
            .ok()?
            .parse::<u64>()
            .ok()?;
        if numkeys == 0 {
            return None;
        }
    }
    args.next()?.map(<[u8]>::to_vec)
}

/// The first key of a script invocation (its EVALSHA command, caught before it is sent).
fn script_key(inv: &ScriptInvocation<'_>) -> Option<Vec<u8>> {
    let mut probe = KeyProbe(None);
    let _ = inv.invoke::<Value>(&mut probe);
    probe.0
}

/// A connection that sends nothing: it notes the first key of the command handed to it and
/// fails it.
struct KeyProbe(Option<Vec<u8>>);

impl ConnectionLike for KeyProbe {
    fn req_packed_command(&mut self, _cmd: &[u8]) -> redis::RedisResult<Value> {
        Err((ErrorKind::Client, "not sent").into())
    }

    fn req_packed_commands(
        &mut self,
        _cmd: &[u8],
        _offset: usize,
        _count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        Err((ErrorKind::Client, "not sent").into())
    }

    fn req_command(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        self.0 = command_key(cmd);
        Err((ErrorKind::Client, "not sent").into())
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn check_connection(&mut self) -> bool {
        false
    }

    fn is_open(&self) -> bool {
        false
    }
}

/// A direct connection: framed by redmutex over plain TCP or a unix socket (`plain.rs`), else
/// (TLS) the redis crate's.
pub enum Conn {
    Plain(PlainConnection),
    Crate(redis::Connection),
}

impl Conn {
    fn set_read_timeout(&mut self, dur: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Conn::Plain(c) => c.set_read_timeout(dur),
            Conn::Crate(c) => c.set_read_timeout(dur),
        }
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Conn::Plain(c) => c.set_write_timeout(dur),
            Conn::Crate(c) => c.set_write_timeout(dur),
        }
    }

    fn send_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<()> {
        match self {
            Conn::Plain(c) => c.send_packed_command(cmd),
            Conn::Crate(c) => c.send_packed_command(cmd),
        }
    }

    fn recv_response(&mut self) -> redis::RedisResult<Value> {
        match self {
            Conn::Plain(c) => c.recv_response(),
            Conn::Crate(c) => c.recv_response(),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
        match self {
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Crate(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Crate(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Plain(c) => c.req_command(cmd),
            Conn::Crate(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Plain(c) => c.get_db(),
            Conn::Crate(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Plain(c) => c.check_connection(),
            Conn::Crate(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Plain(c) => c.is_open(),
            Conn::Crate(c) => c.is_open(),
        }
    }
}

/// A call that timed out, its reply still due: the connection it went on (never reused for a
/// call), or the runtime's calls that timed out (a direct call that went through the runtime).
pub enum Overdue {
    Direct(Box<Conn>),
    Runtime(OverdueCalls),
}

impl Overdue {
    /// Blocks until the overdue request has been answered (so it ran, and anything sent after
    /// it now runs after it) or the connection ended (it ran, or never will), at most `limit`.
    /// False when it is still unanswered after `limit`. A PING goes after it on the same
    /// connection: the connection skips the replies still due, so the PING's answer comes
    /// only once the overdue request has been answered.
    pub fn settle(self, limit: Duration) -> bool {
        let mut conn = match self {
            Overdue::Direct(conn) => *conn,
            Overdue::Runtime(calls) => {
                return match runtime::handle() {
                    Ok(handle) => handle.block_on(calls.settle(limit)),
                    Err(_) => false,
                };
            }
        };
        if limit.is_zero() || conn.set_read_timeout(Some(limit)).is_err() {
            return false;
        }
        let ping = redis::cmd("PING").get_packed_command();
        if conn.send_packed_command(&ping).is_err() {
            return true;
        }
        match conn.recv_response() {
            Ok(_) => true,
            Err(err) => !err.is_timeout(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_key_is_found_as_the_cluster_routes_it() {
        let mut get = redis::cmd("GET");
        get.arg("k1");
        assert_eq!(command_key(&get).as_deref(), Some(&b"k1"[..]));
        let mut eval = redis::cmd("evalsha");
        eval.arg("abc").arg(2).arg("k1").arg("k2").arg("a");
        assert_eq!(command_key(&eval).as_deref(), Some(&b"k1"[..]));
        let mut keyless = redis::cmd("EVALSHA");
        keyless.arg("abc").arg(0).arg("a");
        assert_eq!(command_key(&keyless), None);
        assert_eq!(command_key(&redis::cmd("PING")), None);
        let script = redis::Script::new("return 1");
        let mut inv = script.prepare_invoke();
        inv.key("p{n}:lock").key("p{n}:fence").arg("token");
        assert_eq!(script_key(&inv).as_deref(), Some(&b"p{n}:lock"[..]));
    }
}
