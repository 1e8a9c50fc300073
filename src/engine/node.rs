//! One Redis deployment used as one node: a lazily opened multiplexed connection (to a server,
//! to the master that Sentinel names, or across a Redis Cluster) shared by every thread and
//! task, reopened after it fails, with every call bounded by the client's timeouts.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisFuture, ScriptInvocation, Value};

use super::connect::{self, node_info, Restart};
pub use super::connect::{address, within, Timeouts};
use super::error::{connect_failed, timed_out, Error, Result};
use super::sentinel::Sentinel;
use super::slots::SlotTable;
use crate::protocol::replies::parse_server_info;

/// Whether a call may be sent again after the connection dropped under it. Every script of
/// redmutex is checked by owner token, so a repeat is safe; that is what makes retrying right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    Once,
    Never,
}

/// What a node connects to.
// One per client, behind an Arc: the size of `Direct` (a client with TLS settings) is no cost.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    /// One server.
    Direct(redis::Client),
    /// Whichever master the sentinels name, looked up again on every reconnect.
    Sentinel(Arc<Sentinel>),
    /// A Redis Cluster. The cluster client routes every command by its first key (all keys of a
    /// primitive share one slot) and follows MOVED/ASK; `seeds` serve the subscriber, which may
    /// sit on any node since a classic PUBLISH reaches every node of a cluster.
    Cluster {
        client: Box<ClusterClient>,
        seeds: Vec<redis::Client>,
        next_seed: AtomicUsize,
        /// The primaries by slot, as the cluster last told (the direct path's map).
        slots: Arc<SlotTable>,
    },
}

impl Target {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster { .. })
    }

    /// Where this target is, for error messages (never with a password): "host:port",
    /// "unix socket /path", the sentinels and the service, or the cluster's seed nodes.
    pub fn endpoint(&self) -> String {
        match self {
            Target::Direct(client) => address(client.get_connection_info()),
            Target::Sentinel(sentinel) => sentinel.endpoint(),
            Target::Cluster { seeds, .. } => {
                let nodes: Vec<String> = seeds
                    .iter()
                    .map(|seed| address(seed.get_connection_info()))
                    .collect();
                format!("cluster [{}]", nodes.join(", "))
            }
        }
    }

    /// A new connection. Replies are bounded by the callers' own deadlines.
    pub(crate) async fn connect(&self, timeouts: Timeouts) -> Result<Conn> {
        self.connect_answering_within(timeouts, None).await
    }

    /// `connect`; on a cluster, `reply_limit` (if given) replaces the cluster client's own
    /// response timeout (the command timeout), for a call that may rightly take longer: a WAIT
    /// blocks its connection for the whole command timeout before it answers.
    pub(crate) async fn connect_answering_within(
        &self,
        timeouts: Timeouts,
        reply_limit: Option<Duration>,
    ) -> Result<Conn> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(None);
        match self {
            Target::Direct(client) => within_connect(
                timeouts,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            .map(Conn::Plain),
            Target::Sentinel(sentinel) => sentinel
                .master(timeouts)
                .await
                .map(|(_, conn)| Conn::Plain(conn)),
            Target::Cluster { client, .. } => {
                let opening = async {
                    match reply_limit {
                        Some(limit) => {
                            let config = redis::cluster::ClusterConfig::new()
                                .set_connection_timeout(timeouts.connect)
                                .set_response_timeout(limit);
                            client.get_async_connection_with_config(config).await
                        }
                        None => client.get_async_connection().await,
                    }
                };
                within_connect(timeouts, opening)
                    .await
                    .map(|conn| Conn::Cluster(Box::new(conn)))
            }
        }
    }

    /// A subscriber connection: to the server, to the current master, or to the first
    /// reachable cluster node (starting after the one that served last).
    pub async fn pubsub(&self, timeouts: Timeouts) -> Result<PubSub> {
        let limit = timeouts.connect + timeouts.command;
        match self {
            Target::Direct(client) => {
                within(
                    limit,
                    "the subscriber connection",
                    client.get_async_pubsub(),
                )
                .await
            }
            Target::Sentinel(sentinel) => {
                let (client, _) = sentinel.master(timeouts).await?;
                within(
                    limit,
                    "the subscriber connection",
                    client.get_async_pubsub(),
                )
                .await
            }
            Target::Cluster {
                seeds,
                next_seed,
                slots,
                ..
            } => {
                let start = next_seed.load(Ordering::Relaxed);
                let mut last = Error::Connection("no cluster node to subscribe on".into());
                for i in 0..seeds.len() {
                    let index = (start + i) % seeds.len();
                    let Some(seed) = seeds.get(index) else {
                        continue;
                    };
                    match within(limit, "the subscriber connection", seed.get_async_pubsub()).await
                    {
                        Ok(pubsub) => {
                            // Next time, start after this node: if it failed, another one serves.
                            next_seed.store(index + 1, Ordering::Relaxed);
                            return Ok(pubsub);
                        }
                        Err(err) => last = err,
                    }
                }
                // Every seed is gone (one is enough to start, and nodes come and go): the
                // primaries the cluster client has learned of since serve as well.
                let Some(template) = seeds.first().map(|s| s.get_connection_info().clone()) else {
                    return Err(last);
                };
                let seeded = |host: &str, port: u16| {
                    seeds.iter().any(|s| {
                        matches!(s.get_connection_info().addr(),
                            redis::ConnectionAddr::Tcp(h, p)
                            | redis::ConnectionAddr::TcpTls { host: h, port: p, .. }
                            if h == host && *p == port)
                    })
                };
                for (host, port) in slots.primaries() {
                    if seeded(&host, port) {
                        continue;
                    }
                    let Some(node) = node_info(&template, &host, port)
                        .and_then(|info| connect::client(info).ok())
                    else {
                        continue;
                    };
                    match within(limit, "the subscriber connection", node.get_async_pubsub()).await
                    {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(err) => last = err,
                    }
                }
                Err(last)
            }
        }
    }
}

impl Target {
    /// `pubsub`, tried again while the server cannot be reached, until the command timeout has
    /// passed: a master that died (Sentinel, Cluster) is replaced by its replica meanwhile. One
    /// server that refuses the connect is waited out as it restarts (`Restart`).
    pub async fn pubsub_through_failover(&self, timeouts: Timeouts) -> Result<PubSub> {
        let direct = matches!(self, Target::Direct(_));
        let until = Instant::now() + timeouts.command;
        let mut restart = Restart::new(timeouts, direct);
        loop {
            match self.pubsub(timeouts).await {
                Err(err)
                    if err.is_connection()
                        && !direct
                        && Instant::now() + FAILOVER_PAUSE < until =>
                {
                    tokio::time::sleep(FAILOVER_PAUSE).await;
                }
                Err(err) => {
                    if !restart.wait(&err).await {
                        return Err(err);
                    }
                }
                found => return found,
            }
        }
    }
}

/// Runs `inv` on `conn`: EVALSHA, loading the script on NOSCRIPT. On a cluster the script is
/// loaded by an EVAL of its source, which goes to the key's node as the call does: redis-rs
/// would send SCRIPT LOAD to every primary and fail while any one of them is down, so a name on
/// a healthy node could not be served.
async fn run_script(conn: &mut Conn, inv: &ScriptInvocation<'_>) -> redis::RedisResult<Value> {
    let forms = match conn {
        Conn::Cluster(_) => crate::protocol::resp::eval_forms(inv),
        Conn::Plain(_) => None,
    };
    let Some((evalsha, eval)) = forms else {
        return inv.invoke_async::<Value>(conn).await;
    };
    match evalsha.query_async::<Value>(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            eval.query_async::<Value>(conn).await
        }
        other => other,
    }
}

/// A live connection of either kind; both pipeline concurrent callers over few sockets.
#[derive(Clone)]
pub(crate) enum Conn {
    Plain(MultiplexedConnection),
    Cluster(Box<ClusterConnection>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Plain(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Plain(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Plain(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Which incarnation of a server a connection talks to (`INFO server`, read when it opened):
/// a connection never outlives a server restart, so this holds for every reply it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub run_id: String,
    pub uptime: Duration,
    pub observed_at: Instant,
}

/// The run_id of the server incarnation that the latest connection of a deployment opened on
/// (shared by its runtime node and its direct pool): a release resent after a fault compares
/// it with the one its hold was granted on, to tell a restart or failover (everything lost)
/// from a reply lost in transit.
#[derive(Debug, Default)]
pub struct ServerSeen {
    run_id: Mutex<Option<Arc<str>>>,
}

impl ServerSeen {
    pub fn run_id(&self) -> Option<Arc<str>> {
        self.run_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn note(&self, run_id: &str) {
        let mut seen = self.run_id.lock().unwrap_or_else(|p| p.into_inner());
        if seen.as_deref() != Some(run_id) {
            *seen = Some(Arc::from(run_id));
        }
    }
}

#[derive(Clone)]
struct Live {
    conn: Conn,
    identity: Option<Arc<Identity>>,
}

pub struct Node {
    target: Arc<Target>,
    /// `target.endpoint()`: every connection error of this node names it.
    endpoint: String,
    timeouts: Timeouts,
    /// Read the server's identity on every new connection (Redlock masters).
    identify: bool,
    /// A connection whose identity cannot be read (the user may not run INFO) is refused
    /// rather than used without it (Redlock masters).
    identity_required: bool,
    /// The current connection and its generation; the lock is never held across a call.
    current: Mutex<(u64, Option<Live>)>,
    /// Serialises (re)connecting so a burst of callers opens one connection, not many.
    connecting: tokio::sync::Mutex<()>,
    /// How many connects ended, and the last one's error if it failed (see `connection`).
    connects: Mutex<(u64, Option<Error>)>,
    drops: std::sync::atomic::AtomicU64,
    /// Where an `identified` node records the run_id of each connection it opens.
    seen: Arc<ServerSeen>,
    /// Connections on which a call timed out, kept open (never used for a call again) for
    /// `OVERDUE_KEEP`: their requests may still run, and an undo must run after them.
    overdue: Arc<Mutex<Vec<OverdueEntry>>>,
    /// Stamps each `keep` (see `OverdueEntry::stamp`).
    stamps: std::sync::atomic::AtomicU64,
    /// Numbers the connections handed in by `keep_overdue_conn` (see `Kept::Handed`).
    handed: std::sync::atomic::AtomicU64,
    /// The last generation of the master before the latest `reset` (0: none): a call on one of
    /// its connections that times out afterwards is not kept (it cannot order the new master's).
    /// Written and read under the `overdue` lock.
    reset_generation: std::sync::atomic::AtomicU64,
    /// How many times the node was reset; bumped under the `overdue` lock.
    resets: Resets,
    /// Calls to a Sentinel-managed master that cannot be reached are tried again until the
    /// command timeout (its replica may be taking over); off for a Redlock master.
    ride_failover: bool,
    /// Every call waits for the calls that timed out before it (`wait_for_overdue`), so that
    /// calls run in the order they were sent across reconnects: on a Redlock master a round's
    /// give-back must never run after the same token's next vote, nor a vote after the release.
    /// Within `OVERDUE_KEEP` of the timeout: a request the network holds back longer than that
    /// is forgotten and may still land out of turn (Redlock assumes delays shorter than leases).
    in_order: bool,
}

/// How long a connection whose call timed out is kept for `Node::overdue_calls`: the undo of a
/// timed-out attempt takes its snapshot at once, and its own copy keeps the connection open.
pub(crate) const OVERDUE_KEEP: Duration = Duration::from_secs(10);
/// At most this many such connections are kept per node (the oldest closes first).
const OVERDUE_KEPT: usize = 8;

/// How many times a node was reset (its master moved). The exclusive pool tags each connection
/// it opens with the count, so that one of an old master is neither reused nor waited for.
#[derive(Clone, Default)]
pub struct Resets(Arc<ResetCount>);

#[derive(Default)]
pub struct ResetCount {
    count: std::sync::atomic::AtomicU64,
    /// Told of every reset (see `moved_from`).
    moved: tokio::sync::Notify,
}

impl Resets {
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::SeqCst)
    }

    fn bump(&self) {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }

    /// Resolves once the count is no longer `seen` (the master moved since).
    async fn moved_from(&self, seen: u64) {
        loop {
            let notified = self.0.moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() != seen {
                return;
            }
            notified.await;
        }
    }
}

/// A connection on which a call timed out. `stamp` is fresh on every call that timed out on it,
/// so that its timer, or a wait that settled the calls before it, never forgets a later one.
struct OverdueEntry {
    kept: Kept,
    stamp: u64,
    conn: MultiplexedConnection,
}

/// Which connection an overdue entry is: the node's own of that generation, or one handed in
/// from outside (a connection of the exclusive pool), numbered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kept {
    Generation(u64),
    Handed { serial: u64, opened: u64 },
}

/// The calls that had timed out on a node's connections when this was taken, still due.
pub struct OverdueCalls {
    conns: Vec<MultiplexedConnection>,
}

impl OverdueCalls {
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Waits until every overdue call has been answered (so it ran, and whatever is sent now on
    /// any connection runs after it) or its connection ended (it ran, or never will), at most
    /// `limit`; false when one is still unanswered then. A PING sent behind them on the same
    /// connection is answered only after them.
    pub async fn settle(self, limit: Duration) -> bool {
        let until = tokio::time::Instant::now() + limit;
        let mut settled = true;
        for mut conn in self.conns {
            let ping = redis::cmd("PING");
            let answered = tokio::time::timeout_at(until, ping.query_async::<Value>(&mut conn));
            settled &= answered.await.is_ok();
        }
        settled
    }
}

/// The pause between two tries of a call that a cluster refused for the moment.
const CLUSTER_PAUSE: Duration = Duration::from_millis(20);

/// When the calls of an acquire stop retrying what a cluster refuses (see `giving_up_at`).
#[derive(Clone, Copy, Debug)]
pub struct GiveUp {
    at: Instant,
    /// A try-once's: only a slot in migration (TRYAGAIN, ASK: its keys are moving) is given
    /// up; a cluster that cannot serve the slot at all (CLUSTERDOWN, a dead master) is tried
    /// until the command timeout, then a ConnectionError, not "somebody holds it".
    migrating_only: bool,
}

impl GiveUp {
    /// An acquire with a timeout: at its deadline.
    pub fn at(deadline: Instant) -> Self {
        GiveUp {
            at: deadline,
            migrating_only: false,
        }
    }

    /// A try-once: a slot in migration after `within`.
    pub fn once(within: Duration) -> Self {
        GiveUp {
            at: Instant::now() + within,
            migrating_only: true,
        }
    }

    fn due(&self, err: &redis::RedisError, pause: Duration) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        let migrating = matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::Ask)
        );
        (migrating || !self.migrating_only) && Instant::now() + pause >= self.at
    }
}

tokio::task_local! {
    /// When the blocking acquire that the calls of this task serve gives up (`giving_up_at`).
    static GIVE_UP_AT: GiveUp;
}

/// Runs `fut` (an acquire with a timeout, or a try-once) so that a call it makes which a
/// cluster keeps refusing with an error that says nothing ran (TRYAGAIN while a declared key is
/// away during a slot migration, MOVED, CLUSTERDOWN...) is not tried again past `give_up`: it
/// fails with `Error::Timeout` (see `gave_up_at_deadline`), so the acquire gives up in time
/// instead of up to a command timeout late.
pub async fn giving_up_at<F: Future>(give_up: GiveUp, fut: F) -> F::Output {
    GIVE_UP_AT.scope(give_up, fut).await
}

/// Whether `err` is a call given up at its acquire's deadline (see `giving_up_at`).
pub fn gave_up_at_deadline(err: &Error) -> bool {
    matches!(err, Error::Timeout(m) if m.starts_with(GAVE_UP))
}

const GAVE_UP: &str = "gave up at the acquire's deadline";
/// The pause between two tries of a call whose server could not be reached (failing over).
pub(super) const FAILOVER_PAUSE: Duration = Duration::from_millis(100);

/// Errors of a cluster that is resharding or failing over: worth another try shortly.
fn cluster_transient(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        err.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
                    // Right after a failover: a node that is (or still was) a replica of the
                    // slot's master, or a new master whose script cache is empty while the
                    // script's load went elsewhere. Nothing ran; a fresh map finds the master.
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::NoScript
            )
    )
}

/// Opening a connection: the connect timeout bounds reaching the server, and the connect and
/// command timeouts together bound the whole (a server that accepts but never answers).
async fn within_connect<T>(
    timeouts: Timeouts,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    let limit = timeouts.connect + timeouts.command;
    let started = Instant::now();
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) if err.is_timeout() => Err(timed_out(timeouts.connect, "connecting")),
        // The cluster client wraps its nodes' timeouts in an error of its own.
        Ok(Err(err)) if started.elapsed() >= timeouts.connect => {
            Err(timed_out(timeouts.connect, &format!("connecting ({err})")))
        }
        Ok(Err(err)) => Err(connect_failed(err)),
        Err(_) => Err(timed_out(limit, "waiting for the connection")),
    }
}

impl Node {
    pub fn new(target: Arc<Target>, timeouts: Timeouts) -> Self {
        Node {
            endpoint: target.endpoint(),
            target,
            timeouts,
            identify: false,
            identity_required: false,
            current: Mutex::new((0, None)),
            connecting: tokio::sync::Mutex::new(()),
            connects: Mutex::new((0, None)),
            drops: std::sync::atomic::AtomicU64::new(0),
            seen: Arc::default(),
            overdue: Arc::default(),
            stamps: std::sync::atomic::AtomicU64::new(0),
            handed: std::sync::atomic::AtomicU64::new(0),
            reset_generation: std::sync::atomic::AtomicU64::new(0),
            resets: Resets::default(),
            ride_failover: false,
            in_order: false,
        }
    }

    /// Every call of this node runs after the ones that timed out before it (see `in_order`).
    pub fn in_order(self) -> Self {
        Node {
            in_order: true,
            ..self
        }
    }

    /// A node whose connections must tell their server's run_id (see `identity_required`).
    pub fn requiring_identity(self) -> Self {
        Node {
            identity_required: true,
            ..self
        }
    }

    /// This node's calls ride out a Sentinel failover (see `ride_failover`).
    pub fn riding_failover(self) -> Self {
        Node {
            ride_failover: true,
            ..self
        }
    }

    /// A node that reads the server's `run_id` on each new connection.
    pub fn identified(target: Arc<Target>, timeouts: Timeouts) -> Self {
        Node {
            identify: true,
            ..Node::new(target, timeouts)
        }
    }

    /// An `identified` node recording each connection's run_id in `seen`.
    pub fn identified_into(target: Arc<Target>, timeouts: Timeouts, seen: Arc<ServerSeen>) -> Self {
        Node {
            identify: true,
            seen,
            ..Node::new(target, timeouts)
        }
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// How many connections broke (or timed out) under a call so far.
    pub fn drops(&self) -> u64 {
        self.drops.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    fn cached(&self) -> Option<(u64, Live)> {
        let guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.clone().map(|live| (guard.0, live))
    }

    /// Makes sure the node has a connection (opens one, or fails as `connection` does), for a
    /// step that must not wait for one while it holds a turn others wait for.
    pub async fn connected(&self) -> Result<()> {
        self.connection()
            .await
            .map(|_| ())
            .map_err(|err| err.at(&self.endpoint))
    }

    fn connects(&self) -> std::sync::MutexGuard<'_, (u64, Option<Error>)> {
        self.connects.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn connection(&self) -> Result<(u64, Live)> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let ended_before = self.connects().0;
        let _one_at_a_time = tokio::time::timeout(self.timeouts.connect, self.connecting.lock())
            .await
            .map_err(|_| {
                timed_out(
                    self.timeouts.connect,
                    "waiting for another caller's connect",
                )
            })?;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        // A connect that ended while this caller waited for its turn failed: its error is this
        // caller's too. Opening another at once would wait the connect timeout out a second
        // time (a call that came while a background give-back was connecting to a server that
        // does not answer failed after twice its timeout).
        if let (ended, Some(err)) = &*self.connects() {
            if *ended != ended_before {
                return Err(err.clone());
            }
        }
        // Opening (and identifying) a connection takes at most connect + command timeouts.
        let limit = self.timeouts.connect + self.timeouts.command;
        let opened = tokio::time::timeout(limit, self.open())
            .await
            .map_err(|_| timed_out(limit, "waiting for the connection"))
            .and_then(|opened| opened);
        {
            let mut connects = self.connects();
            connects.0 += 1;
            connects.1 = opened.as_ref().err().cloned();
        }
        let live = opened?;
        let mut guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        guard.0 += 1;
        guard.1 = Some(live.clone());
        Ok((guard.0, live))
    }

    async fn open(&self) -> Result<Live> {
        let mut conn = self.target.connect(self.timeouts).await?;
        let identity = if self.identify {
            let info = within(
                self.timeouts.command,
                "INFO",
                redis::cmd("INFO")
                    .arg("server")
                    .query_async::<String>(&mut conn),
            )
            .await;
            let info = match info {
                // An ACL user without INFO (it is in @dangerous, which ACLs often take away): one
                // server goes on without its run_id (a restart then proves nothing: see
                // `ServerSeen`); a Redlock master cannot, its restarts must be told.
                Err(err) if err.is_no_permission() && !self.identity_required => {
                    return Ok(Live {
                        conn,
                        identity: None,
                    })
                }
                Err(err) if err.is_no_permission() => {
                    return Err(Error::Server(format!(
                        "{err} (Redlock reads each master's run_id with INFO, to tell a \
                         restarted master: give the user +info)"
                    )))
                }
                other => other?,
            };
            let (run_id, uptime) = parse_server_info(&info).ok_or_else(|| {
                Error::Server("INFO server did not report run_id and uptime".into())
            })?;
            self.seen.note(&run_id);
            Some(Arc::new(Identity {
                run_id,
                uptime: Duration::from_secs(uptime),
                observed_at: Instant::now(),
            }))
        } else {
            None
        };
        Ok(Live { conn, identity })
    }

    /// Forgets the connection of `generation` so the next call opens a fresh one.
    fn invalidate(&self, generation: u64) {
        let mut guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if guard.0 == generation && guard.1.is_some() {
            guard.1 = None;
            self.drops
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Keeps the connection of a call that timed out (see `overdue`), for `OVERDUE_KEEP`.
    fn keep_overdue(&self, generation: u64, conn: Conn) {
        self.keep(Kept::Generation(generation), conn);
    }

    /// Keeps a connection of the same server on which a call timed out (the exclusive pool's,
    /// which carries a lock attempt with its WAIT), so an undo waits for it too; `opened`: the
    /// `resets` count when it was opened (one of an old master is not kept).
    pub(crate) fn keep_overdue_conn(&self, conn: Conn, opened: u64) {
        let serial = self
            .handed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.keep(Kept::Handed { serial, opened }, conn);
    }

    /// The count of this node's resets, which the exclusive pool tags its connections with.
    pub fn resets(&self) -> Resets {
        self.resets.clone()
    }

    fn keep(&self, kept: Kept, conn: Conn) {
        // A cluster connection routes a PING to any node, not behind the request: not kept.
        let Conn::Plain(conn) = conn else {
            return;
        };
        let stamp = self
            .stamps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut overdue = self.overdue.lock().unwrap_or_else(|p| p.into_inner());
            // A connection of the master before the latest reset: its calls cannot overtake
            // the new master's.
            let old_master = match kept {
                Kept::Generation(generation) => {
                    generation <= self.reset_generation.load(Ordering::Relaxed)
                }
                Kept::Handed { opened, .. } => opened != self.resets.count(),
            };
            if old_master {
                return;
            }
            if let Some(listed) = overdue.iter_mut().find(|e| e.kept == kept) {
                listed.stamp = stamp;
            } else {
                if overdue.len() >= OVERDUE_KEPT {
                    overdue.remove(0);
                }
                overdue.push(OverdueEntry { kept, stamp, conn });
            }
        }
        let overdue = Arc::downgrade(&self.overdue);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                tokio::time::sleep(OVERDUE_KEEP).await;
                if let Some(overdue) = overdue.upgrade() {
                    let mut overdue = overdue.lock().unwrap_or_else(|p| p.into_inner());
                    overdue.retain(|e| e.kept != kept || e.stamp != stamp);
                }
            });
        }
    }

    /// The calls that timed out on this node (within `OVERDUE_KEEP`) and may still run: an undo
    /// of a timed-out attempt waits for them (`OverdueCalls::settle`) so it never runs first.
    pub fn overdue_calls(&self) -> OverdueCalls {
        let overdue = self.overdue.lock().unwrap_or_else(|p| p.into_inner());
        OverdueCalls {
            conns: overdue.iter().map(|e| e.conn.clone()).collect(),
        }
    }

    /// Waits until the calls that timed out on this node have been answered (or their
    /// connections ended), at most the command timeout, then forgets them: nothing sent after
    /// this can overtake them. An error when one is still unanswered: the caller's call is not
    /// sent (it counts as failed, like the master that has not answered yet).
    async fn wait_for_overdue(&self) -> Result<()> {
        let (calls, stamps): (Vec<MultiplexedConnection>, Vec<(Kept, u64)>) = self
            .overdue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|e| (e.conn.clone(), (e.kept, e.stamp)))
            .unzip();
        if calls.is_empty() {
            return Ok(());
        }
        let calls = OverdueCalls { conns: calls };
        if !calls.settle(self.timeouts.command).await {
            return Err(timed_out(
                self.timeouts.command,
                "waiting for an earlier call that timed out",
            ));
        }
        self.overdue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| !stamps.contains(&(e.kept, e.stamp)));
        Ok(())
    }

    /// Forgets the current connection, whichever it is (the master changed under it), and the
    /// calls that timed out on the old master: nothing sent to the new one can overtake them
    /// there, and waiting for an old master that stopped answering would only fail new calls.
    /// A call still in flight on the old master that times out later is not kept either.
    pub fn reset(&self) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.1 = None;
        let mut overdue = self.overdue.lock().unwrap_or_else(|p| p.into_inner());
        self.reset_generation.store(current.0, Ordering::Relaxed);
        self.resets.bump();
        overdue.clear();
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT), retrying once on a dropped connection
    /// when `retry` allows.
    pub async fn invoke(&self, inv: &ScriptInvocation<'_>, retry: Retry) -> Result<Value> {
        self.call(
            retry,
            |mut conn| async move { run_script(&mut conn, inv).await },
        )
        .await
        .map(|(value, _)| value)
    }

    /// `invoke` with `Retry::Once`, except that a resend after a dropped connection sends
    /// `resend` instead of `first`: for a script whose first send must be told from its repeat.
    pub async fn invoke_or_resend(
        &self,
        first: &ScriptInvocation<'_>,
        resend: &ScriptInvocation<'_>,
    ) -> Result<Value> {
        self.invoke_or_resend_identified(first, resend)
            .await
            .map(|(value, _)| value)
    }

    /// `invoke_or_resend`, also telling which server incarnation answered.
    pub async fn invoke_or_resend_identified(
        &self,
        first: &ScriptInvocation<'_>,
        resend: &ScriptInvocation<'_>,
    ) -> Result<(Value, Option<Arc<Identity>>)> {
        let sent = std::sync::atomic::AtomicBool::new(false);
        self.call(Retry::Once, |mut conn| {
            let inv = if sent.swap(true, Ordering::Relaxed) {
                resend
            } else {
                first
            };
            async move { run_script(&mut conn, inv).await }
        })
        .await
    }

    /// `invoke`, also telling which server incarnation answered (on an `identified` node).
    pub async fn invoke_identified(
        &self,
        inv: &ScriptInvocation<'_>,
        retry: Retry,
    ) -> Result<(Value, Option<Arc<Identity>>)> {
        self.call(
            retry,
            |mut conn| async move { run_script(&mut conn, inv).await },
        )
        .await
    }

    /// Runs one command, with the same retry rule.
    pub async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd, retry: Retry) -> Result<T> {
        self.call(retry, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
        .map(|(value, _)| value)
    }

    /// `query`, also telling which server incarnation answered (on an `identified` node).
    pub async fn query_identified<T: FromRedisValue + Send>(
        &self,
        cmd: &Cmd,
        retry: Retry,
    ) -> Result<(T, Option<Arc<Identity>>)> {
        self.call(retry, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
    }

    /// The identity of the current connection, if one is open (on an `identified` node).
    pub fn identity(&self) -> Option<Arc<Identity>> {
        self.cached().and_then(|(_, live)| live.identity)
    }

    /// One call (see `attempt`); its connection errors name the endpoint.
    async fn call<T, F, Fut>(&self, retry: Retry, op: F) -> Result<(T, Option<Arc<Identity>>)>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.attempt(retry, op)
            .await
            .map_err(|err| err.at(&self.endpoint))
    }

    async fn attempt<T, F, Fut>(&self, retry: Retry, op: F) -> Result<(T, Option<Arc<Identity>>)>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let mut may_retry = retry == Retry::Once;
        // A cluster in the middle of a reshard or a failover answers with transient errors that
        // the cluster client's own retries may not outlast, and a master that died (on a
        // cluster, or a Sentinel-managed one) refuses connections until its replica takes over:
        // such calls are tried again (every script is token-checked, so a repeat is safe) until
        // the command timeout has passed. Not on a Redlock master, whose failure counts at once.
        let failover_until = (retry == Retry::Once
            && (self.target.is_cluster()
                || (self.ride_failover && matches!(*self.target, Target::Sentinel(_)))))
        .then(|| Instant::now() + self.timeouts.command);
        // One server (not a Redlock master) that is restarting: a refused connect or a LOADING
        // answer is tried again until the connect timeout has passed since the first (see
        // `Restart`). Here, not in `connection`, so that no caller waits holding `connecting`.
        let mut restart = Restart::new(
            self.timeouts,
            self.ride_failover && matches!(*self.target, Target::Direct(_)),
        );
        let mut reconnected = false;
        loop {
            // Taken before the connection, which may be the old master's if a reset comes now.
            let resets_seen = self.resets.count();
            let (generation, live) = match self.connection().await {
                Ok(found) => found,
                Err(err)
                    if err.is_connection()
                        && failover_until
                            .is_some_and(|until| Instant::now() + FAILOVER_PAUSE < until) =>
                {
                    tokio::time::sleep(FAILOVER_PAUSE).await;
                    continue;
                }
                Err(err) => {
                    if restart.wait(&err).await {
                        continue;
                    }
                    return Err(err);
                }
            };
            if self.in_order {
                self.wait_for_overdue().await?;
                // A call that timed out on this connection meanwhile: go on a fresh one (once).
                if !reconnected && self.cached().map(|(g, _)| g) != Some(generation) {
                    reconnected = true;
                    continue;
                }
            }
            if let (Target::Cluster { slots, .. }, Conn::Cluster(conn)) =
                (&*self.target, &live.conn)
            {
                // The direct path routes by this map; it marked it stale when it missed.
                slots.refresh_if_stale(conn, self.timeouts.command);
            }
            let call = tokio::time::timeout(self.timeouts.command, op(live.conn.clone()));
            let answered = match failover_until {
                // A Sentinel failover announced while the call waits for the old master (which
                // may hang, stopped or cut off, until the call's timeout): sent again on the new
                // one, which a repeat cannot harm (every script is token-checked); whatever the
                // old master still runs is lost when it follows the new one.
                Some(until) if matches!(*self.target, Target::Sentinel(_)) => tokio::select! {
                    answered = call => answered,
                    _ = self.resets.moved_from(resets_seen) => {
                        // The call may run on both masters: a fault, as a dropped connection.
                        self.drops.fetch_add(1, Ordering::Relaxed);
                        if Instant::now() + FAILOVER_PAUSE < until {
                            continue;
                        }
                        let what = "waiting for an answer (the master moved meanwhile)";
                        return Err(timed_out(self.timeouts.command, what));
                    }
                },
                _ => call.await,
            };
            let err = match answered {
                Ok(Ok(value)) => return Ok((value, live.identity)),
                Ok(Err(err)) => err,
                Err(_) => {
                    // The request may still run: its connection stays open, unused, so that an
                    // undo can wait for its answer instead of overtaking it on a new one.
                    // Kept before it is forgotten, so that no call finds neither.
                    self.keep_overdue(generation, live.conn);
                    self.invalidate(generation);
                    return Err(timed_out(self.timeouts.command, "waiting for an answer"));
                }
            };
            if let Some(until) = failover_until {
                // A server that died (refused, or dropped the connection under the call): tried
                // again on a fresh connection, which finds the master in charge by then.
                let gone = !err.is_timeout()
                    && (err.is_connection_refusal()
                        || err.is_connection_dropped()
                        || err.is_io_error());
                let transient = self.target.is_cluster() && cluster_transient(&err);
                let pause = if transient {
                    CLUSTER_PAUSE
                } else {
                    FAILOVER_PAUSE
                };
                let past_deadline = GIVE_UP_AT
                    .try_with(|give_up| give_up.due(&err, pause))
                    .unwrap_or(false);
                if transient && past_deadline {
                    let what = format!("{GAVE_UP}: the cluster did not serve the key ({err})");
                    return Err(Error::Timeout(what));
                }
                if (transient || gone) && Instant::now() + pause < until {
                    let read_only =
                        err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
                    if err.kind() == redis::ErrorKind::ClusterConnectionNotFound
                        || gone
                        || read_only
                    {
                        self.invalidate(generation);
                    }
                    tokio::time::sleep(pause).await;
                    continue;
                }
                if transient
                    && !matches!(
                        err.kind(),
                        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                    )
                {
                    // The slot's node stayed unreachable (MOVED to a dead node, CLUSTERDOWN)
                    // for the whole command timeout: the server cannot be reached, as for a
                    // single server that does not answer.
                    self.invalidate(generation);
                    let what = format!("waiting for the cluster to serve the key (last: {err})");
                    return Err(timed_out(self.timeouts.command, &what));
                }
            }
            if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading) {
                // A restarted server reading its data back: nothing ran, the connection is fine.
                let err = Error::from(err);
                if restart.wait(&err).await {
                    continue;
                }
                self.invalidate(generation);
                return Err(err);
            }
            // Only a connection that broke under the call is worth one more try (a timeout
            // already used the caller's time), or one to a server that is no longer a master
            // (READONLY: failover happened; reconnecting asks Sentinel anew).
            let read_only =
                err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
            let dropped = err.is_connection_dropped() && !err.is_timeout();
            let err = if err.is_timeout() {
                timed_out(self.timeouts.command, "waiting for an answer")
            } else {
                Error::from(err)
            };
            if err.is_connection() || read_only {
                self.invalidate(generation);
            }
            if !((dropped || read_only) && may_retry) {
                return Err(err);
            }
            may_retry = false;
        }
    }
}
