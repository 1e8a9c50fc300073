//! The engine's one error type; the binding maps each variant to one Python exception.

use std::fmt;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Redis unreachable, the connection dropped, or a reply did not come in time.
    Connection(String),
    /// Redis answered with an error, or with a reply the protocol does not expect.
    Server(String),
    /// Not acquired within the timeout.
    Timeout(String),
    /// release/extend of a hold this object does not have.
    NotOwned(String),
    /// The lease expired or another owner holds the lock.
    Lost(String),
    /// Misuse of a lock object, e.g. acquire while it already holds.
    Usage(String),
    /// A bad argument; the message names it.
    Invalid(String),
    /// Redlock: fewer than a majority of the masters answered.
    Quorum(String),
    /// The deployment cannot do this (e.g. a Semaphore on several independent masters).
    Unsupported(String),
    /// A semaphore acquire with another limit than its live holders' or waiters'.
    Limit(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connection(m)
            | Error::Server(m)
            | Error::Timeout(m)
            | Error::NotOwned(m)
            | Error::Lost(m)
            | Error::Usage(m)
            | Error::Invalid(m)
            | Error::Quorum(m)
            | Error::Unsupported(m)
            | Error::Limit(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// Whether Redis refused the command to this user (ACL: NOPERM).
    pub fn is_no_permission(&self) -> bool {
        matches!(self, Error::Server(m) if m.starts_with(NO_PERMISSION))
    }

    /// Whether the error says that a single server may be restarting, and that nothing ran:
    /// the connect was refused (nothing listens on the port, or the unix socket file is
    /// missing) or the server answered LOADING (reading its data back). Never wrong
    /// credentials, a missing permission, a TLS failure or a timeout. Told by the message
    /// `From<redis::RedisError>` gives it (after the endpoint, once `at` named it).
    pub fn is_restarting(&self) -> bool {
        let Error::Connection(m) = self else {
            return false;
        };
        let said = match m.strip_prefix(AT) {
            Some(told) => told.split_once(": ").map_or(m.as_str(), |(_, said)| said),
            None => m,
        };
        said.starts_with(REFUSED) || said.starts_with(LOADING)
    }

    /// Whether the failure concerns the connection rather than what Redis said.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_))
    }

    /// Whether the error says that the attempt which failed with it took nothing in Redis: its
    /// script answered that it wrote nothing (another semaphore limit is live), or it was never
    /// sent (bad arguments, misuse, a deployment that cannot do it). There is nothing to give
    /// back then; a background give-back could even undo a later hold of the same token.
    pub fn took_nothing(&self) -> bool {
        matches!(
            self,
            Error::Limit(_) | Error::Invalid(_) | Error::Usage(_) | Error::Unsupported(_)
        )
    }

    /// A connection error told where: "Redis at {endpoint}: {what happened}" (an endpoint
    /// never holds a password). Other errors, and one already told, stay as they are.
    pub fn at(self, endpoint: &str) -> Error {
        match self {
            Error::Connection(m) if !m.starts_with(AT) => {
                Error::Connection(format!("{AT}{endpoint}: {m}"))
            }
            other => other,
        }
    }
}

const AT: &str = "Redis at ";
/// The message of a connect that nothing answered (see `Error::is_restarting`).
const REFUSED: &str = "connection refused";
/// The message of a server still loading its dataset (see `Error::is_restarting`).
const LOADING: &str = "not ready, still loading its dataset";
const NO_PERMISSION: &str = "Redis refused the command to this user (its ACL)";
/// Said after NO_PERMISSION when the ACL refused a channel (a script's PUBLISH, a SUBSCRIBE).
const NO_CHANNELS: &str = "it may not use redmutex's pub/sub channels, which wake waiters; \
     grant them (`ACL SETUSER <user> &<prefix>*`, `&redmutex:*` for the default prefix, or \
     `allchannels`; Redis 7 gives a new user none)";

/// Whether Redis refused the command to the user's ACL inside a script: a ResponseError, not a
/// NOPERM ("The user executing the script can't ..." on Redis 7.0, "ACL failure in script: ..."
/// since 7.2). The scripts publish before they write, so nothing was changed then.
fn refused_in_script(text: &str) -> bool {
    text.contains("The user executing the script can't") || text.contains("ACL failure in script")
}

/// An error met while opening a connection (TCP, TLS, AUTH, SELECT): whatever Redis or the TLS
/// set-up said, no connection could be had, so it is a connection error (`ping()` promises
/// nothing else), not a reply to some command of the caller's.
pub fn connect_failed(err: redis::RedisError) -> Error {
    match Error::from(err) {
        Error::Server(m) => Error::Connection(format!("could not open a connection: {m}")),
        other => other,
    }
}

/// The connection error of a call that ran out of time: "timed out after N s {what}".
pub fn timed_out(limit: Duration, what: &str) -> Error {
    Error::Connection(format!("timed out after {} s {what}", limit.as_secs_f64()))
}

/// What Redis answers a connection beyond its `maxclients`.
const MAX_CLIENTS: &str = "max number of clients reached";

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        // Messages of redis-rs name addresses and server replies, never the password.
        if err.is_timeout() {
            // A socket timeout (EAGAIN on a blocking read) says nothing of how long it waited:
            // callers that know their limit report it with `timed_out` instead.
            Error::Connection(format!("timed out: {err}"))
        } else if err.is_connection_refusal() {
            // Nothing listens there (ECONNREFUSED; for a unix socket, no socket file): nothing
            // was sent, and a server that is restarting listens again shortly (`restarting`).
            Error::Connection(format!("{REFUSED}: {err}"))
        } else if err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error() {
            Error::Connection(format!("connection failed: {err}"))
        } else if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading) {
            // A server that restarted and is reading its data back: nothing ran, and it serves
            // again shortly. Unreachable for now, as redis-py says (BusyLoadingError is one of
            // its ConnectionErrors), not an answer about the lock.
            Error::Connection(format!("{LOADING}: {err}"))
        } else if err.to_string().contains(MAX_CLIENTS) {
            // Said as a new connection opens (then closed): the server is unreachable for now.
            Error::Connection(format!("refused the connection: {err}"))
        } else if err.code() == Some("WRONGPASS") || err.code() == Some("NOAUTH") {
            Error::Connection(format!("refused the credentials: {err}"))
        } else if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            || refused_in_script(&err.to_string())
        {
            // The credentials were taken; the user's ACL forbids this command (or key, or
            // channel: a user's channels are apart from its keys, and often forgotten).
            if err.to_string().contains("channel") {
                Error::Server(format!("{NO_PERMISSION}: {NO_CHANNELS}: {err}"))
            } else {
                Error::Server(format!("{NO_PERMISSION}: {err}"))
            }
        } else {
            Error::Server(format!("Redis error: {err}"))
        }
    }
}

impl From<crate::protocol::replies::UnexpectedReply> for Error {
    fn from(err: crate::protocol::replies::UnexpectedReply) -> Self {
        Error::Server(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_at_maxclients_is_a_connection_error() {
        let err = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "max number of clients reached".to_string(),
        ));
        assert!(matches!(Error::from(err), Error::Connection(_)));
    }

    #[test]
    fn a_server_loading_its_dataset_is_a_connection_error() {
        let err = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "An error was signalled by the server",
            "Redis is loading the dataset in memory".to_string(),
        ));
        let err = Error::from(err);
        assert!(err.is_connection(), "{err}");
        assert!(err.to_string().contains("loading"), "{err}");
    }

    fn server_error(kind: redis::ServerErrorKind, detail: &str) -> Error {
        Error::from(redis::RedisError::from((
            redis::ErrorKind::Server(kind),
            "An error was signalled by the server",
            detail.to_string(),
        )))
    }

    #[test]
    fn a_refused_channel_says_what_to_grant() {
        use redis::ServerErrorKind::{NoPerm, ResponseError};
        for err in [
            // a script's PUBLISH on Redis 7.0, and since 7.2
            server_error(
                ResponseError,
                "The user executing the script can't publish to the channel mentioned in the \
                 command script: 8e2a64af, on @user_script:48.",
            ),
            server_error(
                ResponseError,
                "ACL failure in script: No permissions to access a channel",
            ),
            // SUBSCRIBE
            server_error(
                NoPerm,
                "this user has no permissions to access one of the channels used as arguments",
            ),
        ] {
            assert!(err.is_no_permission(), "{err}");
            let text = err.to_string();
            assert!(text.starts_with(NO_PERMISSION), "{text}");
            assert!(
                text.contains("&redmutex:*") && text.contains("allchannels"),
                "{text}"
            );
            // Redis's own words follow.
            assert!(text.contains("channel"), "{text}");
        }
        // Another refusal (a key, a command) says no more than Redis did.
        for err in [
            server_error(
                NoPerm,
                "this user has no permissions to run the 'info' command",
            ),
            server_error(
                ResponseError,
                "The user executing the script can't access at least one of the keys mentioned \
                 in the command",
            ),
        ] {
            assert!(err.is_no_permission(), "{err}");
            assert!(!err.to_string().contains("allchannels"), "{err}");
        }
        // Other script errors are no refusal.
        let other = server_error(
            ResponseError,
            "Error running script: attempt to compare nil",
        );
        assert!(!other.is_no_permission(), "{other}");
    }

    #[test]
    fn connection_errors_are_told_where_once() {
        let err = timed_out(Duration::from_millis(500), "waiting for an answer");
        assert_eq!(
            err.to_string(),
            "timed out after 0.5 s waiting for an answer"
        );
        let told = err.at("127.0.0.1:6379");
        assert_eq!(
            told.to_string(),
            "Redis at 127.0.0.1:6379: timed out after 0.5 s waiting for an answer"
        );
        // Told once: an outer layer does not say it again.
        assert_eq!(told.clone().at("elsewhere"), told);
        // Only connection errors name the endpoint.
        let lost = Error::Lost("lock was lost".into());
        assert_eq!(lost.clone().at("127.0.0.1:6379"), lost);
    }
}
