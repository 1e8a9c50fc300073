//! What every connection shares, below the node and Sentinel code that opens them: the client's
//! timeouts, the bound of one call, TCP keepalive, and a server's address for messages.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::io::tcp::socket2::TcpKeepalive;
use redis::ConnectionInfo;

use super::error::{timed_out, Error, Result};
use super::interrupt;

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

/// The first pause before a single server that refused a connect (or answered LOADING) is tried
/// again; each pause after it is twice as long, up to `RESTART_PAUSE_MAX`.
const RESTART_PAUSE_FIRST: Duration = Duration::from_millis(10);
const RESTART_PAUSE_MAX: Duration = Duration::from_millis(160);

/// Rides out the restart of a single server (plain TCP, TLS or a unix socket): a call whose
/// connect is refused, or whose server answers LOADING, tries again after a short pause growing
/// from 10 ms to 160 ms, until the connect timeout has passed since the first refusal; then the
/// refusal is the call's error, as it would have been at once. Nothing ran on such a server, and
/// every script is token-checked, so sending a step again is safe. Off (`off`) for a Redlock
/// master (its failure counts at once, the majority decides) and for Sentinel and Cluster
/// targets, which have failover logic of their own.
///
/// One such state per call, made where the call begins (`DirectPool::attempt`, `Node::attempt`,
/// the hub's and the listener's subscriber connects) and asked after each failure, so that the
/// refusals of one call share one window however many connections it opens; the protocol
/// layers decide, the binding knows nothing of it. Until a failure it is a few words on the
/// stack: a connect that succeeds costs no clock read, no allocation.
#[derive(Debug)]
pub struct Restart {
    window: Option<Duration>,
    /// When the connect timeout has passed since the first refusal (None: none yet).
    until: Option<Instant>,
    pause: Duration,
}

impl Restart {
    /// Waits out restarts for `timeouts.connect`, if `on`.
    pub fn new(timeouts: Timeouts, on: bool) -> Self {
        Restart {
            window: on.then_some(timeouts.connect),
            until: None,
            pause: RESTART_PAUSE_FIRST,
        }
    }

    /// Never waits.
    pub fn off() -> Self {
        Restart {
            window: None,
            until: None,
            pause: RESTART_PAUSE_FIRST,
        }
    }

    /// How long to pause before trying again after `err`; None when it is not a restart (see
    /// `Error::is_restarting`), or the window has passed: the call fails with `err`.
    pub fn pause_after(&mut self, err: &Error) -> Option<Duration> {
        let window = self.window?;
        if !err.is_restarting() {
            return None;
        }
        let now = Instant::now();
        let until = *self.until.get_or_insert(now + window);
        let left = until.checked_duration_since(now).filter(|d| !d.is_zero())?;
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(RESTART_PAUSE_MAX);
        Some(pause)
    }

    /// `pause_after`, sleeping the pause on this thread: true to try again. A caller who asked
    /// to stop (Ctrl-C: `interrupt`) is not kept waiting: false, before and after the pause.
    pub fn wait_blocking(&mut self, err: &Error) -> bool {
        if interrupt::interrupted() {
            return false;
        }
        match self.pause_after(err) {
            Some(pause) => {
                std::thread::sleep(pause);
                !interrupt::interrupted()
            }
            None => false,
        }
    }

    /// `pause_after`, sleeping the pause on the runtime: true to try again.
    pub async fn wait(&mut self, err: &Error) -> bool {
        match self.pause_after(err) {
            Some(pause) => {
                tokio::time::sleep(pause).await;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Error {
        Error::from(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }

    #[test]
    fn a_refused_connect_is_tried_again_within_the_connect_timeout() {
        let timeouts = Timeouts {
            connect: Duration::from_millis(300),
            command: Duration::from_secs(1),
        };
        let mut restart = Restart::new(timeouts, true);
        let started = Instant::now();
        let mut pauses = Vec::new();
        while restart.wait_blocking(&refused()) {
            pauses.push(restart.pause);
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(600), "{took:?}");
        assert!(pauses.len() >= 4, "{pauses:?}");
        assert_eq!(pauses.last(), Some(&RESTART_PAUSE_MAX));
        // Off, or another error: no pause.
        assert_eq!(Restart::off().pause_after(&refused()), None);
        assert_eq!(Restart::new(timeouts, false).pause_after(&refused()), None);
        let mut restart = Restart::new(timeouts, true);
        let timeout = timed_out(Duration::from_secs(1), "connecting");
        assert_eq!(restart.pause_after(&timeout), None);
    }

    #[test]
    fn only_refusals_and_loading_are_restarts() {
        let from = |err: redis::RedisError| Error::from(err);
        assert!(refused().is_restarting());
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(
            from(missing.into()).is_restarting(),
            "unix socket file missing"
        );
        let loading = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "An error was signalled by the server",
            "Redis is loading the dataset in memory".to_string(),
        ));
        assert!(from(loading).is_restarting());
        let wrongpass = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "WRONGPASS invalid username-password pair".to_string(),
        ));
        assert!(!from(wrongpass).is_restarting());
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert!(!from(timeout.into()).is_restarting());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!from(reset.into()).is_restarting());
        // Once told where, still one.
        assert!(refused().at("127.0.0.1:6379").is_restarting());
        assert!(refused().at("unix socket /tmp/r.sock").is_restarting());
    }
}
