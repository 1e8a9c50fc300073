//! A lock write that replicas must acknowledge (Redis WAIT) before it counts.

use std::time::Duration;

use super::error::Result;
use super::node::Retry;
use super::shared::Shared;
use crate::protocol::lease;
use crate::protocol::lock::LockSpec;
use crate::protocol::replies::{parse_attempt, Attempt};
use crate::protocol::scripts::{self, Queueing};

/// With `replicas` > 0 the attempt and a WAIT go out as one pipeline on the connection kept for
/// it alone, so WAIT covers exactly this write (a WAIT sent on another connection, e.g. after a
/// reconnect, would have nothing to wait for and vouch for nothing). A grant that fewer replicas
/// acknowledged within the command timeout is given back: None.
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
        .arg(lease::lease_ms(limit));
    let (reply, acked): (redis::Value, i64) = shared
        .exclusive
        .pipeline(&pipe, limit + Duration::from_secs(1), |conn, opened| {
            shared.node.keep_overdue_conn(conn, opened)
        })
        .await?;
    let attempt = parse_attempt(&reply)?;
    if let Attempt::Granted { .. } = attempt {
        if acked < i64::from(spec.replicas) {
            let release = scripts::release(&spec.keys, token);
            shared.node.invoke(&release, Retry::Once).await?;
            return Ok(None);
        }
    }
    Ok(Some(attempt))
}
