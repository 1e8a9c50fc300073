//! The command line's forced release, run on a client's connection (see `protocol::admin`).

use super::client::Client;
use super::error::Result;
use super::node::Retry;
use crate::protocol::admin::{self, ForceRelease};

/// Frees everything held under `name` and wakes its waiters; the lock only while `expected`
/// holds it (empty: whoever does). Not resent after a dropped connection: a second run could
/// report nothing freed for what the first one freed. On a single keyspace only (a Redlock's
/// masters are released one client each).
pub async fn force_release(client: &Client, name: &[u8], expected: &[u8]) -> Result<ForceRelease> {
    let keys = client.keys(name)?;
    let shared = client.shared()?;
    let reply = shared
        .node
        .invoke(&admin::force_release(&keys, expected), Retry::Never)
        .await?;
    Ok(admin::parse_force_release(&reply)?)
}
