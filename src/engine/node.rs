//! One Redis server: a lazily opened multiplexed connection shared by every thread and task,
//! reopened after it fails, with every call bounded by the client's timeouts.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, ScriptInvocation, Value};

use super::error::{Error, Result};

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

/// Whether a call may be sent again after the connection dropped under it. Every script of
/// redmutex is checked by owner token, so a repeat is safe; that is what makes retrying right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    Once,
    Never,
}

pub struct Node {
    client: redis::Client,
    timeouts: Timeouts,
    /// The current connection and its generation; the lock is never held across a call.
    current: Mutex<(u64, Option<MultiplexedConnection>)>,
    /// Serialises (re)connecting so a burst of callers opens one connection, not many.
    connecting: tokio::sync::Mutex<()>,
    drops: std::sync::atomic::AtomicU64,
}

/// Bounds `fut` by `limit`, turning the overrun into a connection error.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::Connection(format!(
            "Redis did not answer {what} within {:.3} s",
            limit.as_secs_f64()
        ))),
    }
}

impl Node {
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        Node {
            client,
            timeouts,
            current: Mutex::new((0, None)),
            connecting: tokio::sync::Mutex::new(()),
            drops: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many connections broke (or timed out) under a call so far.
    pub fn drops(&self) -> u64 {
        self.drops.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn redis_client(&self) -> &redis::Client {
        &self.client
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        let guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        guard.1.clone().map(|conn| (guard.0, conn))
    }

    async fn connection(&self) -> Result<(u64, MultiplexedConnection)> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let _one_at_a_time = tokio::time::timeout(self.timeouts.connect, self.connecting.lock())
            .await
            .map_err(|_| Error::Connection("timed out waiting to connect to Redis".into()))?;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        // Replies are bounded by our own deadline in `call`.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(None);
        let conn = within(
            self.timeouts.connect + self.timeouts.command,
            "the connection",
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        let mut guard = self.current.lock().unwrap_or_else(|p| p.into_inner());
        guard.0 += 1;
        guard.1 = Some(conn.clone());
        Ok((guard.0, conn))
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

    /// Runs a script (EVALSHA, loading it on NOSCRIPT), retrying once on a dropped connection
    /// when `retry` allows.
    pub async fn invoke(&self, inv: &ScriptInvocation<'_>, retry: Retry) -> Result<Value> {
        self.call(retry, |mut conn| async move {
            inv.invoke_async::<Value>(&mut conn).await
        })
        .await
    }

    /// Runs one command, with the same retry rule.
    pub async fn query<T: FromRedisValue + Send>(&self, cmd: &Cmd, retry: Retry) -> Result<T> {
        self.call(retry, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
    }

    async fn call<T, F, Fut>(&self, retry: Retry, op: F) -> Result<T>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let mut may_retry = retry == Retry::Once;
        loop {
            let (generation, conn) = self.connection().await?;
            let err = match tokio::time::timeout(self.timeouts.command, op(conn)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => err,
                Err(_) => {
                    self.invalidate(generation);
                    return Err(Error::Connection(format!(
                        "Redis did not answer within {:.3} s",
                        self.timeouts.command.as_secs_f64()
                    )));
                }
            };
            // Only a connection that broke under the call is worth one more try; a timeout
            // already used the caller's time.
            let dropped = err.is_connection_dropped() && !err.is_timeout();
            let err = Error::from(err);
            if err.is_connection() {
                self.invalidate(generation);
            }
            if !(dropped && may_retry) {
                return Err(err);
            }
            may_retry = false;
        }
    }
}
