//! What every connection shares, below the node and Sentinel code that opens them: the client's
//! timeouts, the bound of one call, TCP keepalive, and a server's address for messages.

use std::future::Future;
use std::time::Duration;

use redis::io::tcp::socket2::TcpKeepalive;
use redis::ConnectionInfo;

use super::error::{timed_out, Error, Result};

/// How long a connection sits idle before TCP asks the server whether it is still there: below
/// the idle timeouts of the NATs and load balancers between clients and servers (4 to 6 minutes
/// in the big clouds; Redis's own `tcp-keepalive` is 300 s), so that a connection kept for the
/// next call, or a subscriber waiting out a long hold, is not dropped silently on the way.
/// With the interval and count below, a server gone without a word (host down, cable cut) is
/// known within 45 s of idleness: the next call opens a new connection instead of waiting its
/// command timeout out on the dead one, and a listener hears its socket fail instead of nothing.
/// The same figures as redis-py's defaults (8.x), which our users' other connections have.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
#[cfg(any(target_os = "linux", target_os = "macos"))]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
#[cfg(any(target_os = "linux", target_os = "macos"))]
const KEEPALIVE_PROBES: u32 = 3;

/// The keepalive that every connection of the library has.
pub fn keepalive() -> TcpKeepalive {
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    keepalive
}

/// `info` with the keepalive of `keepalive()`, for the redis crate's connections to it.
fn with_keepalive(info: ConnectionInfo) -> ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_keepalive(keepalive());
    info.set_tcp_settings(tcp)
}

/// A redis crate client of `info` whose connections have the library's keepalive.
pub fn client(info: ConnectionInfo) -> redis::RedisResult<redis::Client> {
    redis::Client::open(with_keepalive(info))
}

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

/// `template` (a cluster seed's settings: credentials, TLS) for another node of its cluster, at
/// `host:port`; None for a Unix socket seed (its nodes are not reached that way).
pub fn node_info(template: &ConnectionInfo, host: &str, port: u16) -> Option<ConnectionInfo> {
    let addr = match template.addr() {
        redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host.to_string(), port),
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => return None,
    };
    Some(template.clone().set_addr(addr))
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
