//! Direct calls: a small pool of plain blocking connections, used from the caller's own thread
//! for the one-round-trip steps of the blocking API (first acquire attempt, release, extend,
//! owner look-up). A call through the runtime costs two thread hand-offs on top of the network
//! round trip; here it costs none, which is what lets a lock + unlock pair approach the
//! round-trip limit. Waiting and everything in the background still go through the runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, ConnectionLike, FromRedisValue, ScriptInvocation, Value};

use super::error::{timed_out, Error, Result};
use super::node::{Retry, ServerSeen, Timeouts};
use crate::protocol::replies::parse_server_info;

/// Idle connections kept for reuse; more threads than this open and close their own.
const KEPT: usize = 16;

pub struct DirectPool {
    /// None: no direct calls on this deployment (Cluster, Sentinel); every call is refused.
    client: Option<redis::Client>,
    /// Where the client connects, named by every connection error.
    endpoint: String,
    timeouts: Timeouts,
    idle: Mutex<Vec<redis::Connection>>,
    /// How many connections broke under a call.
    drops: AtomicU64,
    /// Some: each new connection reads the server's run_id (`INFO server`) into it.
    seen: Option<Arc<ServerSeen>>,
}

impl DirectPool {
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        DirectPool {
            endpoint: super::node::address(client.get_connection_info()),
            client: Some(client),
            timeouts,
            idle: Mutex::new(Vec::new()),
            drops: AtomicU64::new(0),
            seen: None,
        }
    }

    /// A pool whose new connections record the server's run_id in `seen`.
    pub fn identified(client: redis::Client, timeouts: Timeouts, seen: Arc<ServerSeen>) -> Self {
        DirectPool {
            seen: Some(seen),
            ..DirectPool::new(client, timeouts)
        }
    }

    /// A pool that refuses every call (the deployment is not one server reached directly).
    pub fn unavailable(timeouts: Timeouts) -> Self {
        DirectPool {
            endpoint: String::new(),
            client: None,
            timeouts,
            idle: Mutex::new(Vec::new()),
            drops: AtomicU64::new(0),
            seen: None,
        }
    }

    /// How many connections broke under a call so far.
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    fn take(&self, fresh: bool) -> Result<redis::Connection> {
        if !fresh {
            if let Some(conn) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                return Ok(conn);
            }
        }
        let Some(client) = &self.client else {
            return Err(Error::Usage(
                "no direct connection to this deployment (only to a single server)".into(),
            ));
        };
        let mut conn = client
            .get_connection_with_timeout(self.timeouts.connect)
            .map_err(|err| {
                if err.is_timeout() {
                    timed_out(self.timeouts.connect, "connecting")
                } else {
                    Error::from(err)
                }
            })?;
        conn.set_read_timeout(Some(self.timeouts.command))?;
        conn.set_write_timeout(Some(self.timeouts.command))?;
        if let Some(seen) = &self.seen {
            let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
            if let Some((run_id, _)) = parse_server_info(&info) {
                seen.note(&run_id);
            }
        }
        Ok(conn)
    }

    fn give_back(&self, conn: redis::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < KEPT && conn.is_open() {
            idle.push(conn);
        }
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT), with the same retry rule as the runtime's
    /// calls: once more on a connection that broke under the call, never after a timeout.
    pub fn invoke(&self, inv: &ScriptInvocation<'_>, retry: Retry) -> Result<Value> {
        self.call(retry, |conn| inv.invoke::<Value>(conn))
            .map_err(|(err, _)| err)
    }

    pub fn query<T: FromRedisValue>(&self, cmd: &Cmd, retry: Retry) -> Result<T> {
        self.call(retry, |conn| cmd.query::<T>(conn))
            .map_err(|(err, _)| err)
    }

    /// `invoke`, keeping the connection of a call that timed out: its request may still run
    /// (it sits in the server's or the network's queue), and whatever must follow it (an
    /// undo) can wait on that connection for its reply (`Overdue::settle`).
    #[allow(clippy::result_large_err)] // a rare failure path: the connection travels along
    pub fn invoke_keeping(
        &self,
        inv: &ScriptInvocation<'_>,
        retry: Retry,
    ) -> std::result::Result<Value, (Error, Option<Overdue>)> {
        self.call(retry, |conn| inv.invoke::<Value>(conn))
    }

    /// One call (see `attempt`); its connection errors name the endpoint.
    #[allow(clippy::result_large_err)]
    fn call<T>(
        &self,
        retry: Retry,
        op: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> std::result::Result<T, (Error, Option<Overdue>)> {
        self.attempt(retry, op)
            .map_err(|(err, overdue)| (err.at(&self.endpoint), overdue))
    }

    #[allow(clippy::result_large_err)]
    fn attempt<T>(
        &self,
        retry: Retry,
        op: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> std::result::Result<T, (Error, Option<Overdue>)> {
        let mut may_retry = retry == Retry::Once;
        let mut fresh = false;
        loop {
            let mut conn = self.take(fresh).map_err(|err| (err, None))?;
            match op(&mut conn) {
                Ok(value) => {
                    self.give_back(conn);
                    return Ok(value);
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
                        self.give_back(conn);
                        return Err((err, None));
                    }
                    if overdue {
                        return Err((err, Some(Overdue { conn })));
                    }
                    if dropped {
                        self.drops.fetch_add(1, Ordering::Relaxed);
                        // The server closed this one (restart, cut): the idle ones went the
                        // same way, and a socket it closed still looks open until used.
                        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
                    }
                    if !(dropped && may_retry) {
                        return Err((err, None));
                    }
                    may_retry = false;
                    fresh = true;
                }
            }
        }
    }
}

/// The connection of a call that timed out, its reply still due; never reused for a call.
pub struct Overdue {
    conn: redis::Connection,
}

impl Overdue {
    /// Blocks until the overdue request has been answered (so it ran, and anything sent after
    /// it now runs after it) or the connection ended (it ran, or never will), at most `limit`.
    /// False when it is still unanswered after `limit`. A PING goes after it on the same
    /// connection: the connection skips the replies still due, so the PING's answer comes
    /// only once the overdue request has been answered.
    pub fn settle(mut self, limit: Duration) -> bool {
        if limit.is_zero() || self.conn.set_read_timeout(Some(limit)).is_err() {
            return false;
        }
        let ping = redis::cmd("PING").get_packed_command();
        if self.conn.send_packed_command(&ping).is_err() {
            return true;
        }
        match self.conn.recv_response() {
            Ok(_) => true,
            Err(err) => !err.is_timeout(),
        }
    }
}
