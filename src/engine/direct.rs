//! Direct connections: blocking connections on which the calling thread itself writes a request
//! and reads its reply, for the single-round-trip steps of callers that block anyway (the
//! blocking binding's cache lookups). The shared multiplexed connection costs two cross-thread
//! hand-offs per call (caller → runtime worker → caller), which on a busy machine more than
//! doubles a round trip; a direct connection costs none.
//!
//! Each process keeps a small pool (in its `Shared`, so a forked child starts with none and
//! `close()` drops them): a call takes an idle connection or opens one, and gives it back when
//! the call succeeded or failed with a reply from Redis; a connection that failed is dropped,
//! and so are the idle ones, which a dropped connection suggests are dead too (a restart).
//! Waiting, wake-ups and everything asynchronous stay on the runtime.

use std::sync::Mutex;

use redis::{ScriptInvocation, Value};

use super::error::{Error, Result};
use super::node::{Retry, Timeouts};

/// Idle connections kept per process; more are opened under a burst, and closed after it.
const IDLE_KEPT: usize = 64;

pub struct DirectPool {
    client: redis::Client,
    timeouts: Timeouts,
    idle: Mutex<Vec<redis::Connection>>,
}

/// Whether a failed call leaves its connection unusable (no reply, or a broken stream).
fn breaks_connection(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

impl DirectPool {
    pub fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        DirectPool {
            client,
            timeouts,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<redis::Connection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connect(&self) -> Result<redis::Connection> {
        // The runtime's start-up also installs the TLS crypto provider that rediss:// needs;
        // a direct connection may well be the first connection of the process.
        super::runtime::handle()?;
        let conn = self
            .client
            .get_connection_with_timeout(self.timeouts.connect)
            .map_err(Error::from)?;
        conn.set_read_timeout(Some(self.timeouts.command))
            .map_err(Error::from)?;
        conn.set_write_timeout(Some(self.timeouts.command))
            .map_err(Error::from)?;
        Ok(conn)
    }

    fn give_back(&self, conn: redis::Connection) {
        let mut idle = self.idle();
        if idle.len() < IDLE_KEPT {
            idle.push(conn);
        }
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT) on a direct connection, blocking the
    /// calling thread at most the connect and command timeouts; retried once on a fresh
    /// connection after a dropped one when `retry` allows (every script here is token-checked).
    pub fn invoke(&self, inv: &ScriptInvocation<'_>, retry: Retry) -> Result<Value> {
        let mut may_retry = retry == Retry::Once;
        loop {
            let pooled = self.idle().pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => self.connect()?,
            };
            let err = match inv.invoke::<Value>(&mut conn) {
                Ok(value) => {
                    self.give_back(conn);
                    return Ok(value);
                }
                Err(err) => err,
            };
            if !breaks_connection(&err) {
                self.give_back(conn);
                return Err(Error::from(err));
            }
            drop(conn);
            let dropped = err.is_connection_dropped() && !err.is_timeout();
            if dropped {
                self.idle().clear();
            }
            if !(dropped && may_retry) {
                return Err(Error::from(err));
            }
            may_retry = false;
        }
    }
}
