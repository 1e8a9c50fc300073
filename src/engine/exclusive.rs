//! Connections used by one call at a time, for a write followed by WAIT: WAIT blocks its
//! connection until the replicas acknowledge (or its timeout), and must follow exactly the write
//! it vouches for. Sharing one connection would queue concurrent WAITs behind each other and
//! let a WAIT after a reconnect vouch for nothing; here each caller has its own.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue, Pipeline};

use super::error::Result;
use super::node::{within, Timeouts};

/// Idle connections kept for reuse.
const KEPT: usize = 8;

pub struct ExclusivePool {
    client: redis::Client,
    timeouts: Timeouts,
    idle: Mutex<Vec<MultiplexedConnection>>,
}

impl ExclusivePool {
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        ExclusivePool {
            client,
            timeouts,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    async fn take(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(conn);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(None);
        within(
            self.timeouts.connect + self.timeouts.command,
            "the connection",
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
    }

    /// Sends `pipe` on a connection of its own, once, waiting at most `limit` for the replies.
    /// A connection that failed or timed out is dropped, never reused.
    pub async fn pipeline<T: FromRedisValue + Send>(
        &self,
        pipe: &Pipeline,
        limit: Duration,
    ) -> Result<T> {
        let mut conn = self.take().await?;
        let outcome = within(limit, "a pipeline", pipe.query_async::<T>(&mut conn)).await;
        if outcome.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < KEPT {
                idle.push(conn);
            }
        }
        outcome
    }
}
