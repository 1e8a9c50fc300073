//! Connections used by one call at a time, for a write followed by WAIT: WAIT blocks its
//! connection until the replicas acknowledge (or its timeout), and must follow exactly the write
//! it vouches for. Sharing one connection would queue concurrent WAITs behind each other and
//! let a WAIT after a reconnect vouch for nothing; here each caller has its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Pipeline};

use super::connect::Restart;
use super::error::{timed_out, Error, Result};
use super::node::{Conn, Resets, Target, Timeouts, FAILOVER_PAUSE};

/// Idle connections kept for reuse.
const KEPT: usize = 8;

/// How much longer than the command timeout a pipeline with WAIT may take to answer: WAIT itself
/// waits up to the command timeout, and its answer must still arrive.
pub const WAIT_SLACK: Duration = Duration::from_secs(1);

pub struct ExclusivePool {
    target: Arc<Target>,
    timeouts: Timeouts,
    /// The node's resets (see `Resets`): each connection is kept with the count it opened at.
    resets: Resets,
    idle: Mutex<Vec<(u64, Conn)>>,
    /// A pipeline whose master cannot be reached is sent again until the command timeout (see
    /// `pipeline`); off for a Redlock master, whose failure counts at once.
    ride_failover: bool,
}

impl ExclusivePool {
    /// On a cluster each connection is a cluster connection of its own: the pipeline goes to the
    /// node of its first key, WAIT with it. Through Sentinel, each opens on the current master.
    pub fn new(target: Arc<Target>, timeouts: Timeouts, resets: Resets) -> Self {
        ExclusivePool {
            target,
            timeouts,
            resets,
            idle: Mutex::new(Vec::new()),
            ride_failover: false,
        }
    }

    /// This pool's pipelines ride out a failover (Sentinel, Cluster), as the node's calls do.
    pub fn riding_failover(self) -> Self {
        ExclusivePool {
            ride_failover: true,
            ..self
        }
    }

    /// Forgets the idle connections (the master moved).
    pub fn reset(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A connection and the resets count it was opened at.
    async fn take(&self) -> Result<(u64, Conn)> {
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let now = self.resets.count();
            idle.retain(|(opened, _)| *opened == now);
            if let Some(kept) = idle.pop() {
                return Ok(kept);
            }
        }
        let limit = self.timeouts.connect + self.timeouts.command;
        let connect = || async {
            let opened = self.resets.count();
            let reply_limit = Some(self.timeouts.command + WAIT_SLACK);
            let conn = self
                .target
                .connect_answering_within(self.timeouts, reply_limit);
            tokio::time::timeout(limit, conn)
                .await
                .map_err(|_| timed_out(limit, "waiting for the connection"))?
                .map(|conn| (opened, conn))
        };
        let (opened, conn) = connect().await?;
        // A failover announced while it opened: it may be either master's; open another.
        if opened != self.resets.count() {
            return connect().await;
        }
        Ok((opened, conn))
    }

    /// Sends `pipe` on a connection of its own, waiting at most `limit` for the replies.
    /// A connection that failed is dropped, never reused; one that timed out is given to
    /// `on_timeout` with the resets count it was opened at (its request may still run: an undo
    /// must wait for it), and the call fails. A connection that broke under the call (most often
    /// a kept one the server closed while it sat idle: its `timeout` setting, `CLIENT KILL`) is
    /// replaced and the pipeline sent once more at once. A master that died (Sentinel, Cluster)
    /// refuses or drops connections until its replica takes over: when the pool rides
    /// failovers, the pipeline is sent again on a fresh connection until the command timeout
    /// has passed, as the node's calls are; so it is when `gone_in` finds the replies show the
    /// master gone (a pipeline that ignores errors reads them as values). A resend is safe: the lock write is token-checked, and finding its
    /// own token it writes again (renews the lease), so the WAIT behind it vouches for it.
    /// One server still loading its data, whose replies `not_run` finds saying that the write
    /// did not run (LOADING), is waited out as a refused connect is, on the same connection.
    pub(crate) async fn pipeline<T: FromRedisValue + Send>(
        &self,
        pipe: &Pipeline,
        limit: Duration,
        on_timeout: impl FnOnce(Conn, u64),
        gone_in: impl Fn(&T) -> bool,
        not_run: impl Fn(&T) -> Option<Error>,
    ) -> Result<T> {
        let endpoint = || self.target.endpoint();
        let mut may_retry = true;
        let ride_until = (self.ride_failover && !matches!(*self.target, Target::Direct(_)))
            .then(|| Instant::now() + self.timeouts.command);
        let time_left = || ride_until.is_some_and(|until| Instant::now() + FAILOVER_PAUSE < until);
        // One server that refuses the connect is waited out as it restarts, as the node does.
        let direct = matches!(*self.target, Target::Direct(_));
        let mut restart = Restart::new(self.timeouts, self.ride_failover && direct);
        loop {
            let (opened, mut conn) = match self.take().await {
                Ok(found) => found,
                Err(err) if err.is_connection() && time_left() => {
                    tokio::time::sleep(FAILOVER_PAUSE).await;
                    continue;
                }
                Err(err) => {
                    if restart.wait(&err).await {
                        continue;
                    }
                    return Err(err.at(&endpoint()));
                }
            };
            let outcome = tokio::time::timeout(limit, pipe.query_async::<T>(&mut conn)).await;
            match outcome {
                // Replies read one by one (the pipeline ignores errors) that show the master
                // gone, as `master_gone` errors do: this connection is not kept.
                Ok(Ok(value)) if gone_in(&value) && time_left() => {
                    tokio::time::sleep(FAILOVER_PAUSE).await;
                }
                Ok(Ok(value)) => {
                    // One opened before a reset may be the old master's: not kept. (`Shared`
                    // resets the node, then this pool: a reset between this check and the push
                    // clears it.)
                    {
                        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                        if idle.len() < KEPT && opened == self.resets.count() {
                            idle.push((opened, conn));
                        }
                    }
                    // Nothing ran, and the connection is fine (kept just now, taken again).
                    if let Some(err) = not_run(&value) {
                        if restart.wait(&err).await {
                            continue;
                        }
                    }
                    return Ok(value);
                }
                Ok(Err(err)) if err.is_connection_dropped() && !err.is_timeout() && may_retry => {
                    // The server closed this one, and the idle ones went the same way.
                    may_retry = false;
                    self.reset();
                }
                Ok(Err(err)) if !err.is_timeout() => {
                    if master_gone(&err) && time_left() {
                        tokio::time::sleep(FAILOVER_PAUSE).await;
                        continue;
                    }
                    return Err(Error::from(err).at(&endpoint()));
                }
                Ok(Err(_)) | Err(_) => {
                    on_timeout(conn, opened);
                    return Err(timed_out(limit, "waiting for a pipeline").at(&endpoint()));
                }
            }
        }
    }
}

/// Errors of a master that died or was demoted under the pipeline: refused, dropped, no longer
/// writable (READONLY), or WAIT cut short as it turned replica (UNBLOCKED). Another master
/// takes over soon; whatever ran on this one is not vouched for.
fn master_gone(err: &redis::RedisError) -> bool {
    err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_io_error()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || err.code() == Some("UNBLOCKED")
}
