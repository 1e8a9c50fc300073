//! A blocking caller's own subscriber connection: a wait that the caller's thread drives
//! (`executor::on_caller_thread`) on one server listens for its wake-ups here and reads them
//! itself, instead of through the hub (`wake.rs`), whose runtime thread would read the message
//! and then wake the caller's thread: one thread wake-up per hand-off instead of two.
//!
//! A listener subscribes to the wait's channels before the waiter looks. It keeps them when the
//! wait ends, so that the next wait on the same name (the common case: a lock taken over and
//! over) subscribes nothing: it drops what came meanwhile (stale: before its look) and looks.
//! A listener left idle that long is made to give them up (`quiet`, see `direct.rs`), so that
//! it never piles up messages that nobody reads (Redis would drop it at its output-buffer
//! limit).

use std::time::{Duration, Instant};

use redis::{ConnectionInfo, Value};

use super::connect::Timeouts;
use super::error::{connect_failed, timed_out, Error, Result};
use super::plain::PlainConnection;
use crate::protocol::pubsub::{frame, Frame};

pub struct Listener {
    conn: PlainConnection,
    timeouts: Timeouts,
    /// The channels subscribed (confirmed by the server), in the order asked.
    channels: Vec<Vec<u8>>,
    /// When its last wait ended (None while one waits, or when subscribed to nothing).
    idle_since: Option<Instant>,
    /// Whether a SUBSCRIBE was sent since the last UNSUBSCRIBE (confirmed or not).
    subscribing: bool,
}

/// A message published on a channel the listener subscribed to.
pub struct Message {
    pub channel: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Listener {
    /// A listener on the server of `info`; None when it is not reached over plain TCP or a
    /// unix socket (TLS: the hub serves such waits).
    pub fn connect(info: &ConnectionInfo, timeouts: Timeouts) -> Option<Result<Listener>> {
        let conn = PlainConnection::connect(info, timeouts.connect)?;
        Some(
            conn.map(|conn| Listener {
                conn,
                timeouts,
                channels: Vec::new(),
                idle_since: None,
                subscribing: false,
            })
            .map_err(|err| connect_error(err, timeouts.connect)),
        )
    }

    pub fn is_open(&self) -> bool {
        redis::ConnectionLike::is_open(&self.conn)
    }

    /// Subscribes to exactly `channels`: from then on, every message published on them reaches
    /// this listener. Already subscribed to them, it drops the frames that came meanwhile
    /// (published before now, they are stale; one still in flight only costs a look); else it
    /// gives up the channels it had and subscribes, reading until the server confirmed every one
    /// (frames before the confirmations are stale).
    /// `within`: the wait's deadline, if it has one, which bounds the wait for the answer as
    /// the command timeout does (a dead connection would hold a short wait that long).
    pub fn listen(&mut self, channels: &[Vec<u8>], within: Option<Instant>) -> Result<()> {
        self.idle_since = None;
        if self.channels == channels {
            return self.drop_pending();
        }
        let mut packed = Vec::new();
        if self.subscribing {
            packed.extend(redis::cmd("UNSUBSCRIBE").get_packed_command());
        }
        self.channels.clear();
        let mut subscribe = redis::cmd("SUBSCRIBE");
        for channel in channels {
            subscribe.arg(channel);
        }
        packed.extend(subscribe.get_packed_command());
        self.subscribing = true;
        self.conn
            .send_packed_command(&packed)
            .map_err(|err| self.failed(err))?;
        let started = Instant::now();
        let limit = within.map_or(self.timeouts.command, |deadline| {
            self.timeouts
                .command
                .min(deadline.saturating_duration_since(started))
        });
        let mut confirmed = 0;
        while confirmed < channels.len() {
            let left = limit.saturating_sub(started.elapsed());
            let value = self
                .conn
                .read_any(left)
                .map_err(|err| self.failed_within(err, limit))?;
            if let Value::ServerError(err) = &value {
                return Err(Error::Server(format!("SUBSCRIBE: {err:?}")));
            }
            if let Frame::Subscribed(channel) = frame(&value) {
                if channels.iter().any(|c| c == channel) {
                    confirmed += 1;
                }
            }
        }
        self.channels = channels.to_vec();
        Ok(())
    }

    /// Reads and drops every frame that has come already, without waiting.
    fn drop_pending(&mut self) -> Result<()> {
        while self
            .conn
            .read_ready()
            .map_err(|err| self.failed(err))?
            .is_some()
        {}
        Ok(())
    }

    /// The next message within `limit`; None when none came (or the caller asked to stop, see
    /// `interrupt`).
    pub fn next_message(&mut self, limit: Duration) -> Result<Option<Message>> {
        loop {
            let value = match self.conn.read_any(limit) {
                Ok(value) => value,
                Err(err) if err.is_timeout() => return Ok(None),
                Err(err) => return Err(self.failed(err)),
            };
            if let Frame::Message { channel, payload } = frame(&value) {
                return Ok(Some(Message {
                    channel: channel.to_vec(),
                    payload: payload.to_vec(),
                }));
            }
        }
    }

    /// The channels it is subscribed to.
    pub fn channels(&self) -> &[Vec<u8>] {
        &self.channels
    }

    /// Marks the end of a wait: the listener keeps its channels for the next one.
    pub fn idle(&mut self) {
        if !self.channels.is_empty() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// Whether it has kept its channels, idle, since before `limit` ago.
    pub fn idle_longer_than(&self, limit: Duration) -> bool {
        self.idle_since
            .is_some_and(|since| since.elapsed() >= limit)
    }

    /// Whether it keeps channels, idle.
    pub fn idle_subscribed(&self) -> bool {
        self.idle_since.is_some()
    }

    /// Gives up every subscription, without waiting for the answer (the next `listen` reads
    /// past it); false when the connection failed.
    pub fn quiet(&mut self) -> bool {
        self.idle_since = None;
        if !self.subscribing {
            return true;
        }
        self.subscribing = false;
        self.channels.clear();
        let unsubscribe = redis::cmd("UNSUBSCRIBE").get_packed_command();
        self.conn.send_packed_command(&unsubscribe).is_ok()
    }

    fn failed(&self, err: redis::RedisError) -> Error {
        self.failed_within(err, self.timeouts.command)
    }

    fn failed_within(&self, err: redis::RedisError, limit: Duration) -> Error {
        if err.is_timeout() {
            timed_out(limit, "waiting for SUBSCRIBE's answer")
        } else {
            Error::from(err)
        }
    }
}

/// One dropped while subscribed gives its channels up first: a copy of its socket (a forked
/// child's) would keep the connection open, subscribed, and nobody would read its messages.
impl Drop for Listener {
    fn drop(&mut self) {
        if self.is_open() {
            self.quiet();
        }
    }
}

fn connect_error(err: redis::RedisError, limit: Duration) -> Error {
    if err.is_timeout() {
        timed_out(limit, "connecting")
    } else {
        connect_failed(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::Server;
    use redis::IntoConnectionInfo;

    fn listener(server: &Server) -> Listener {
        listener_at(&server.url())
    }

    fn listener_at(url: &str) -> Listener {
        let info = url.into_connection_info().unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            command: Duration::from_secs(2),
        };
        Listener::connect(&info, timeouts).unwrap().unwrap()
    }

    /// A plain connection to `server`, to publish and look from.
    fn admin(server: &Server) -> redis::Connection {
        redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The (channel, payload) of the next message `heard` reads within 2 s.
    fn next(heard: &mut Listener) -> (Vec<u8>, Vec<u8>) {
        let message = heard.next_message(Duration::from_secs(2)).unwrap().unwrap();
        (message.channel, message.payload)
    }

    fn publish(conn: &mut redis::Connection, channel: &str, payload: &str) {
        redis::cmd("PUBLISH")
            .arg(channel)
            .arg(payload)
            .exec(conn)
            .unwrap();
    }

    fn subscribers(conn: &mut redis::Connection, channel: &str) -> i64 {
        let reply: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(conn)
            .unwrap();
        reply.1
    }

    #[test]
    fn hears_what_is_published_after_it_listens_and_drops_what_came_before() {
        let server = Server::start();
        let mut admin = admin(&server);
        let mut heard = listener(&server);
        let channels = vec![b"a".to_vec(), b"b".to_vec()];
        heard.listen(&channels, None).unwrap();
        assert_eq!(heard.channels(), channels.as_slice());
        publish(&mut admin, "b", "x");
        assert_eq!(next(&mut heard), (b"b".to_vec(), b"x".to_vec()));
        // Nothing more: the read gives up after its limit.
        assert!(heard
            .next_message(Duration::from_millis(20))
            .unwrap()
            .is_none());
        // A wait ends; what is published meanwhile is stale for the next wait on the same
        // channels, which subscribes nothing again.
        heard.idle();
        assert!(heard.idle_subscribed());
        publish(&mut admin, "a", "stale");
        assert_eq!(subscribers(&mut admin, "a"), 1);
        heard.listen(&channels, None).unwrap();
        assert!(!heard.idle_subscribed());
        publish(&mut admin, "a", "fresh");
        assert_eq!(next(&mut heard).1, b"fresh".to_vec());
    }

    #[test]
    fn other_channels_replace_the_old_ones_and_quiet_gives_them_up() {
        let server = Server::start();
        let mut admin = admin(&server);
        let mut heard = listener(&server);
        heard.listen(&[b"a".to_vec()], None).unwrap();
        publish(&mut admin, "a", "old");
        heard.listen(&[b"c".to_vec()], None).unwrap();
        assert_eq!(subscribers(&mut admin, "a"), 0);
        publish(&mut admin, "c", "new");
        assert_eq!(next(&mut heard), (b"c".to_vec(), b"new".to_vec()));
        heard.idle();
        assert!(heard.quiet());
        assert!(!heard.idle_subscribed());
        // The server has dropped the subscription once it answers a later command.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while subscribers(&mut admin, "c") != 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        // Listening again reads past the UNSUBSCRIBE's answer.
        heard.listen(&[b"c".to_vec()], None).unwrap();
        publish(&mut admin, "c", "again");
        assert_eq!(next(&mut heard).1, b"again".to_vec());
    }

    #[test]
    fn resp3_pushes_are_heard_too() {
        let server = Server::start();
        let mut admin = admin(&server);
        let mut heard = listener_at(&format!("{}?protocol=resp3", server.url()));
        let channels = vec![b"a".to_vec(), b"b".to_vec()];
        heard.listen(&channels, None).unwrap();
        publish(&mut admin, "a", "x");
        assert_eq!(next(&mut heard), (b"a".to_vec(), b"x".to_vec()));
        heard.idle();
        publish(&mut admin, "b", "stale");
        heard.listen(&channels, None).unwrap();
        heard.listen(&[b"c".to_vec()], None).unwrap();
        publish(&mut admin, "c", "y");
        assert_eq!(next(&mut heard), (b"c".to_vec(), b"y".to_vec()));
    }

    #[cfg(unix)]
    #[test]
    fn one_dropped_subscribed_gives_its_channels_up_though_its_socket_lives_on() {
        use std::os::fd::{AsRawFd, BorrowedFd};
        let server = Server::start();
        let mut admin = admin(&server);
        let mut heard = listener(&server);
        heard.listen(&[b"a".to_vec()], None).unwrap();
        // A copy of its socket (as a forked child holds): dropping the listener does not close
        // the connection, which nobody reads from then on.
        let fd = heard.conn.as_raw_fd();
        let _copy = unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .unwrap();
        drop(heard);
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while subscribers(&mut admin, "a") != 0 {
            assert!(std::time::Instant::now() < deadline, "still subscribed");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn waiting_for_subscribe_ends_at_the_waits_deadline() {
        let server = Server::start();
        let mut admin = admin(&server);
        let info = server.url().into_connection_info().unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            command: Duration::from_secs(20),
        };
        let mut heard = Listener::connect(&info, timeouts).unwrap().unwrap();
        // The server answers nothing for 3 s (as a dead connection would; the pause ends by
        // itself, an UNPAUSE would wait for it too).
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(3_000)
            .arg("ALL")
            .exec(&mut admin)
            .unwrap();
        let started = std::time::Instant::now();
        let listened = heard.listen(&[b"a".to_vec()], Some(started + Duration::from_millis(200)));
        // Given up at the deadline (0.2 s), not after the answer came (3 s; the command timeout
        // is 20 s).
        assert!(listened.is_err(), "waited {:?}", started.elapsed());
    }

    #[test]
    fn a_closed_connection_is_an_error() {
        let server = Server::start();
        let mut admin = admin(&server);
        let mut heard = listener(&server);
        heard.listen(&[b"a".to_vec()], None).unwrap();
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .exec(&mut admin)
            .unwrap();
        assert!(heard.next_message(Duration::from_secs(2)).is_err());
        assert!(!heard.is_open());
    }
}
