//! What every connection shares, below the node and Sentinel code that opens them: the client's
//! timeouts, the bound of one call, and a server's address for messages.

use std::future::Future;
use std::time::Duration;

use super::error::{timed_out, Error, Result};

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

/// One server's address for messages: "host:port", or "unix socket /path".
pub fn address(info: &redis::ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Unix(path) => format!("unix socket {}", path.display()),
        tcp => tcp.to_string(),
    }
}

/// Bounds `fut` by `limit`, turning the overrun into a connection error.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Err(err)) if err.is_timeout() => Err(timed_out(limit, &format!("waiting for {what}"))),
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(timed_out(limit, &format!("waiting for {what}"))),
    }
}
