//! A blocking connection of the direct path (`direct.rs`) to a server reached over plain TCP or
//! a unix socket, framing RESP itself (`protocol::resp`): each request is one write from a
//! buffer kept across calls, each reply is read into another and parsed where it lies, the
//! usual replies of the scripts (integers, arrays of integers) without the general parser. The
//! redis crate's blocking connection reads through a general streaming parser and builds every
//! request in a new buffer: on a lock + unlock pair, which is two round trips and nothing else,
//! that was a few µs of the caller's CPU per pair. TLS keeps the crate's connection.
//!
//! It behaves as the crate's does where the direct path relies on it: socket timeouts (a read
//! that timed out leaves its reply due: it is skipped when it comes, see `skip`), a connection
//! that broke (EOF, reset) reports a dropped-connection error and is no longer open, server
//! errors are `Value::ServerError` replies, RESP3 push messages are not replies.
//!
//! A read waits in slices of at most `READ_SLICE` up to its timeout, and between slices asks
//! whether its caller wants to stop (`interrupt`: Ctrl-C): a stop ends the read as a timeout
//! does, its reply still due. A reply that comes at once costs nothing more.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, RedisResult, Value};

use super::connect::keepalive;
use super::interrupt;
use crate::protocol::resp;

/// The read buffer's size (it grows for a larger reply); a script's reply is a few bytes.
const READ_SIZE: usize = 4096;
/// The longest a read waits before it asks whether to stop (`interrupt`).
const READ_SLICE: Duration = Duration::from_millis(50);

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(dur),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(dur),
        }
    }

    fn set_write_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(dur),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(dur),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(bytes),
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(bytes),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

/// For tests that copy the socket (as a forked child holds it).
#[cfg(all(unix, test))]
impl std::os::fd::AsRawFd for PlainConnection {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match &self.stream {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

pub struct PlainConnection {
    stream: Stream,
    /// Bytes read and not yet parsed: `buf[..filled]`.
    buf: Vec<u8>,
    filled: usize,
    /// The request being sent (kept for its capacity).
    out: Vec<u8>,
    /// Replies still due for requests whose read timed out: skipped as they come, so that a
    /// late reply is never read as the answer to a later request.
    skip: usize,
    /// The read timeout asked for (None: none), waited out in `READ_SLICE`s.
    read_limit: Option<Duration>,
    open: bool,
    db: i64,
}

impl PlainConnection {
    /// A connection to the server of `info`, its handshake (AUTH or HELLO, SELECT) done within
    /// `timeout`; None when `info` is not plain TCP or a unix socket (TLS: the crate's own).
    pub fn connect(info: &ConnectionInfo, timeout: Duration) -> Option<RedisResult<Self>> {
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => connect_tcp(host, *port, timeout).map(Stream::Tcp),
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
            _ => return None,
        };
        Some(stream.map_err(Into::into).and_then(|stream| {
            let mut conn = PlainConnection {
                stream,
                buf: vec![0; READ_SIZE],
                filled: 0,
                out: Vec::new(),
                skip: 0,
                read_limit: None,
                open: true,
                db: info.redis_settings().db(),
            };
            conn.set_read_timeout(Some(timeout))?;
            conn.set_write_timeout(Some(timeout))?;
            for command in resp::handshake(info.redis_settings()) {
                conn.req_packed_command(&command)?.extract_error()?;
            }
            Ok(conn)
        }))
    }

    pub fn set_read_timeout(&mut self, dur: Option<Duration>) -> RedisResult<()> {
        let slice = dur.map_or(READ_SLICE, |limit| limit.min(READ_SLICE));
        self.stream.set_read_timeout(Some(slice))?;
        self.read_limit = dur;
        Ok(())
    }

    pub fn set_write_timeout(&self, dur: Option<Duration>) -> RedisResult<()> {
        Ok(self.stream.set_write_timeout(dur)?)
    }

    pub fn send_packed_command(&mut self, bytes: &[u8]) -> RedisResult<()> {
        let sent = self.stream.write_all(bytes);
        self.note(sent)
    }

    /// The next reply: a timed-out request's late reply and push messages are passed over.
    pub fn recv_response(&mut self) -> RedisResult<Value> {
        loop {
            let value = match self.read_frame() {
                Ok(value) => value,
                Err(err) => {
                    // The reply waited for is still due (or never comes: the connection is then
                    // closed anyway).
                    if err.is_timeout() {
                        self.skip += 1;
                    }
                    return Err(err);
                }
            };
            if matches!(value, Value::Push { .. }) {
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            return Ok(value);
        }
    }

    /// The next frame as it comes, push messages included (what a subscribed connection reads:
    /// its frames are not replies to requests, so a timeout leaves nothing due), waiting at most
    /// `limit`, in slices that ask `interrupt` between them (a stop ends it as a timeout does).
    pub fn read_any(&mut self, limit: Duration) -> RedisResult<Value> {
        // (A socket timeout cannot be zero.)
        self.set_read_timeout(Some(limit.max(Duration::from_micros(1))))?;
        self.read_frame()
    }

    /// The next frame if it has come already (as `read_any`), without waiting: a socket timeout
    /// cannot say "no wait" (Linux rounds it up to a clock tick, milliseconds).
    pub fn read_ready(&mut self) -> RedisResult<Option<Value>> {
        self.read_limit = Some(Duration::ZERO);
        self.stream.set_nonblocking(true)?;
        let frame = self.read_frame();
        self.stream.set_nonblocking(false)?;
        match frame {
            Ok(value) => Ok(Some(value)),
            Err(err) if err.is_timeout() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// One complete reply, read as far as needed.
    fn read_frame(&mut self) -> RedisResult<Value> {
        // When the first slice of waiting began (taken when one ran out: a reply that comes
        // within a slice costs no clock reading).
        let mut waiting_since = None;
        loop {
            match resp::frame_len(&self.buf[..self.filled]) {
                Ok(Some(len)) => {
                    let value = resp::parse(&self.buf[..len]);
                    self.buf.copy_within(len..self.filled, 0);
                    self.filled -= len;
                    return value.map_err(|_| self.malformed());
                }
                Ok(None) => {}
                Err(_) => return Err(self.malformed()),
            }
            if self.filled == self.buf.len() {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
            let read = match self.stream.read(&mut self.buf[self.filled..]) {
                Ok(0) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )),
                // A signal: the socket's timeout still bounds the wait.
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) if is_timeout(&err) && self.read_on(&mut waiting_since) => continue,
                other => other,
            };
            self.filled += self.note(read)?;
        }
    }

    /// After a slice of waiting for a reply ran out: whether to wait on (the read timeout is
    /// not reached, and the caller did not ask to stop).
    fn read_on(&self, waiting_since: &mut Option<Instant>) -> bool {
        let since = *waiting_since.get_or_insert_with(|| {
            let now = Instant::now();
            now.checked_sub(READ_SLICE).unwrap_or(now)
        });
        let more_time = self
            .read_limit
            .map_or(true, |limit| since.elapsed() < limit);
        more_time && !interrupt::interrupted()
    }

    /// Bytes that are not RESP: nothing more can be read from this connection.
    fn malformed(&mut self) -> redis::RedisError {
        self.open = false;
        (ErrorKind::Parse, "the server's reply is not RESP").into()
    }

    /// An I/O outcome; an error other than a timeout leaves the connection closed.
    fn note<T>(&mut self, outcome: io::Result<T>) -> RedisResult<T> {
        outcome.map_err(|err| {
            if !is_timeout(&err) {
                self.open = false;
            }
            as_dropped(err).into()
        })
    }
}

/// A socket timeout's error (`SO_RCVTIMEO`, `SO_SNDTIMEO`): EAGAIN on unix; on Windows its own
/// timed-out error.
fn is_timeout(err: &io::Error) -> bool {
    match err.kind() {
        io::ErrorKind::WouldBlock => true,
        io::ErrorKind::TimedOut => !cfg!(unix),
        _ => false,
    }
}

/// On unix a socket's ETIMEDOUT is no socket timeout (see `is_timeout`) but the end of the
/// connection: its keepalive probes or a retransmission went unanswered. Said as a dropped
/// connection, not as the timeout the redis crate would read it as: a timeout leaves the reply
/// still due on a connection kept for it, a dropped one is given up for a new one.
fn as_dropped(err: io::Error) -> io::Error {
    if cfg!(unix) && err.kind() == io::ErrorKind::TimedOut {
        return io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the connection is dead: {err}"),
        );
    }
    err
}

fn connect_tcp(host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                redis::io::tcp::socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive())?;
                return Ok(stream);
            }
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "the host name has no address",
        )
    }))
}

impl ConnectionLike for PlainConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.send_packed_command(cmd)?;
        self.recv_response()
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.send_packed_command(cmd)?;
        let mut out = Vec::with_capacity(count);
        for i in 0..offset + count {
            let value = self.recv_response()?;
            if i >= offset {
                out.push(value);
            }
        }
        Ok(out)
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        cmd.write_packed_command(&mut out);
        let sent = self.send_packed_command(&out);
        self.out = out;
        sent?;
        if cmd.is_no_response() {
            return Ok(Value::Nil);
        }
        self.recv_response()
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        self.req_packed_command(&redis::cmd("PING").get_packed_command())
            .is_ok_and(|v| !matches!(v, Value::ServerError(_)))
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::Server;
    use redis::IntoConnectionInfo;

    fn connect(url: &str) -> RedisResult<PlainConnection> {
        let info = url.into_connection_info().unwrap();
        PlainConnection::connect(&info, Duration::from_secs(2)).unwrap()
    }

    #[test]
    fn calls_scripts_and_replies_of_every_shape() {
        let server = Server::start();
        let mut conn = connect(&server.url()).unwrap();
        // A script not loaded yet: NOSCRIPT, then SCRIPT LOAD and the call again.
        let script = redis::Script::new("return {tonumber(ARGV[1]), 7}");
        let reply: Value = script.arg(5).invoke(&mut conn).unwrap();
        assert_eq!(reply, Value::Array(vec![Value::Int(5), Value::Int(7)]));
        let n: i64 = redis::cmd("INCR").arg("k").query(&mut conn).unwrap();
        assert_eq!(n, 1);
        // A reply larger than the read buffer, a bulk string, a nil, an error.
        let big = "x".repeat(3 * READ_SIZE + 17);
        redis::cmd("SET")
            .arg("big")
            .arg(&big)
            .exec(&mut conn)
            .unwrap();
        let back: String = redis::cmd("GET").arg("big").query(&mut conn).unwrap();
        assert_eq!(back, big);
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
        assert!(info.contains("run_id:"));
        let none: Option<String> = redis::cmd("GET").arg("nothing").query(&mut conn).unwrap();
        assert_eq!(none, None);
        let err = redis::cmd("INCR")
            .arg("big")
            .query::<i64>(&mut conn)
            .unwrap_err();
        assert_eq!(err.code(), Some("ERR"));
        assert!(conn.is_open() && conn.check_connection());
    }

    #[test]
    fn a_tcp_connection_has_the_librarys_keepalive() {
        let server = Server::start();
        let conn = connect(&server.url()).unwrap();
        let Stream::Tcp(stream) = &conn.stream else {
            panic!("a redis:// URL gives a TCP connection");
        };
        let socket = redis::io::tcp::socket2::SockRef::from(stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(
            socket.tcp_keepalive_time().unwrap(),
            Duration::from_secs(30)
        );
        #[cfg(target_os = "linux")]
        {
            assert_eq!(
                socket.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(5)
            );
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
        }
    }

    #[test]
    #[cfg(unix)]
    fn a_dead_connection_is_a_dropped_one_and_a_socket_timeout_a_timeout() {
        // ETIMEDOUT: what a read or write reports once keepalive gave the server up.
        let dead: redis::RedisError = as_dropped(io::Error::from(io::ErrorKind::TimedOut)).into();
        assert!(dead.is_connection_dropped() && !dead.is_timeout(), "{dead}");
        assert!(!is_timeout(&io::Error::from(io::ErrorKind::TimedOut)));
        // EAGAIN: a socket timeout, the reply still due.
        let late: redis::RedisError = as_dropped(io::Error::from(io::ErrorKind::WouldBlock)).into();
        assert!(late.is_timeout() && !late.is_connection_dropped(), "{late}");
        assert!(is_timeout(&io::Error::from(io::ErrorKind::WouldBlock)));
    }

    #[test]
    fn a_late_reply_is_skipped_and_a_closed_connection_is_told() {
        let server = Server::start();
        let mut conn = connect(&server.url()).unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        // Answered only after 0.3 s (nil), long after the read gave up.
        let err = redis::cmd("BLPOP")
            .arg("nothing")
            .arg(0.3)
            .exec(&mut conn)
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(conn.is_open());
        // The next reply read is PING's, not BLPOP's late nil.
        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let pong: String = redis::cmd("PING").arg("after").query(&mut conn).unwrap();
        assert_eq!(pong, "after");
        let n: i64 = redis::cmd("INCR").arg("n").query(&mut conn).unwrap();
        assert_eq!(n, 1);
        // The server ends the connection: a dropped connection, no longer open.
        let mut admin = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .exec(&mut admin)
            .unwrap();
        let err = redis::cmd("PING").exec(&mut conn).unwrap_err();
        assert!(err.is_connection_dropped(), "{err}");
        assert!(!conn.is_open());
    }

    #[test]
    fn the_handshake_authenticates_and_selects_the_database() {
        let server = Server::start();
        let mut admin = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("s3cret")
            .exec(&mut admin)
            .unwrap();
        let port = server.url().split(':').nth(2).unwrap().to_owned();
        let port = port.trim_end_matches("/0");
        let mut conn = connect(&format!("redis://:s3cret@127.0.0.1:{port}/3")).unwrap();
        assert_eq!(conn.get_db(), 3);
        redis::cmd("SET")
            .arg("here")
            .arg(1)
            .exec(&mut conn)
            .unwrap();
        let db: i64 = redis::cmd("EVAL")
            .arg("return redis.call('SELECT', 3) and redis.call('EXISTS', KEYS[1])")
            .arg(1)
            .arg("here")
            .query(&mut admin)
            .unwrap();
        assert_eq!(db, 1);
        let resp3 = format!("redis://:s3cret@127.0.0.1:{port}/0?protocol=resp3");
        let mut conn = connect(&resp3).unwrap();
        let n: i64 = redis::cmd("INCR").arg("r3").query(&mut conn).unwrap();
        assert_eq!(n, 1);
        let err = connect(&format!("redis://:wrong@127.0.0.1:{port}/0"))
            .err()
            .unwrap();
        assert_eq!(err.code(), Some("WRONGPASS"), "{err}");
        assert!(!err.to_string().contains("wrong@"));
        // Nobody listens: refused.
        drop(server);
        let err = connect(&format!("redis://127.0.0.1:{port}/0"))
            .err()
            .unwrap();
        assert!(err.is_connection_refusal(), "{err}");
    }

    #[test]
    fn tls_is_left_to_the_crate() {
        let info = "rediss://127.0.0.1:6380/0".into_connection_info().unwrap();
        assert!(PlainConnection::connect(&info, Duration::from_millis(10)).is_none());
    }
}
