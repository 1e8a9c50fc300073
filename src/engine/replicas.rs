//! A lock write that replicas must acknowledge (Redis WAIT) before it counts.

use super::error::{Error, Result};
use super::exclusive::WAIT_SLACK;
use super::node::Retry;
use super::shared::Shared;
use crate::protocol::lease;
use crate::protocol::lock::LockSpec;
use crate::protocol::replies::{parse_attempt, parse_wait_acks, Attempt, UnexpectedReply};
use crate::protocol::scripts::{self, Queueing};

/// With `replicas` > 0 the attempt and a WAIT go out as one pipeline on the connection kept for
/// it alone, so WAIT covers exactly this write (a WAIT sent on another connection, e.g. after a
/// reconnect, would have nothing to wait for and vouch for nothing). A grant that fewer replicas
/// acknowledged within the command timeout is given back: None. So is one whose WAIT Redis
/// ended with an `UNBLOCKED` error (`parse_wait_acks`): its replies are read one by one.
pub async fn attempt_with_replicas(
    shared: &Shared,
    spec: &LockSpec,
    fair: Option<Queueing>,
    token: &str,
) -> Result<Option<Attempt>> {
    let limit = shared.exclusive.timeouts().command;
    let call = scripts::acquire_call(
        &spec.keys,
        token,
        lease::lease_ms(spec.lease),
        fair,
        shared.hub.inbox(),
    );
    let mut pipe = redis::pipe();
    pipe.add_command(call.eval())
        .cmd("WAIT")
        .arg(spec.replicas)
        .arg(lease::lease_ms(limit))
        .ignore_errors();
    let (reply, wait): (redis::Value, redis::Value) = shared
        .exclusive
        .pipeline(
            &pipe,
            limit + WAIT_SLACK,
            |conn, opened| shared.node.keep_overdue_conn(conn, opened),
            |(reply, wait): &(redis::Value, redis::Value)| {
                server_error(reply, "READONLY") || server_error(wait, "UNBLOCKED")
            },
            |(reply, _): &(redis::Value, redis::Value)| not_run(reply),
        )
        .await?;
    let attempt = parse_attempt(&reply.extract_error()?)?;
    let acked = match parse_wait_acks(&wait) {
        Some(acked) => acked?,
        // Another error: reported as before (the undo gives back what the attempt took).
        None => {
            return Err(match wait.extract_error() {
                Err(err) => Error::from(err),
                Ok(other) => UnexpectedReply(format!("{other:?}")).into(),
            })
        }
    };
    if let Attempt::Granted { .. } = attempt {
        if acked < i64::from(spec.replicas) {
            let release = scripts::release(&spec.keys, token);
            shared.node.invoke(&release, Retry::Once).await?;
            return Ok(None);
        }
    }
    Ok(Some(attempt))
}

/// Whether `value` is a server error with `code`: on a Sentinel or Cluster master, the signs
/// that it was demoted under the pipeline (its write refused, its WAIT cut short), after which
/// the pool sends it again to the new master while the command timeout allows; else (one
/// server, or no time left) READONLY is reported and UNBLOCKED counts as no acknowledgement.
fn server_error(value: &redis::Value, code: &str) -> bool {
    matches!(value, redis::Value::ServerError(err) if err.code() == code)
}

/// The error of a lock write that did not run because its server is still loading its data
/// (LOADING; see `Error::is_restarting`). Whatever the WAIT behind it answered then vouches for
/// nothing of ours (once the load ends between the two, it answers at once), and the resent
/// pair's WAIT vouches for the resent write. The reverse, a write that ran and a WAIT answered
/// LOADING, needs the server to start loading again between them (DEBUG RELOAD): not retried,
/// reported as another error of the WAIT is.
fn not_run(reply: &redis::Value) -> Option<Error> {
    let redis::Value::ServerError(err) = reply else {
        return None;
    };
    Some(Error::from(redis::RedisError::from(err.clone()))).filter(Error::is_restarting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::resp;

    #[test]
    fn only_a_loading_write_did_not_run() {
        let reply = |wire: &[u8]| resp::parse(wire).unwrap();
        let loading = reply(b"-LOADING Redis is loading the dataset in memory\r\n");
        assert!(not_run(&loading).is_some_and(|err| err.is_restarting()));
        for other in [
            reply(b"-READONLY You can't write against a read only replica.\r\n"),
            reply(b"-NOSCRIPT No matching script.\r\n"),
            reply(b":1\r\n"),
            reply(b"*2\r\n:0\r\n:5\r\n"),
        ] {
            assert!(not_run(&other).is_none(), "{other:?}");
        }
    }
}
