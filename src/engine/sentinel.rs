//! Following a Sentinel-managed master: the sentinels are asked which master serves the
//! service, the master must confirm its role (ROLE), and `+switch-master` announcements move
//! every connection to the new master as soon as a failover is announced (a demoted master may
//! keep accepting writes for a while before Sentinel reconfigures it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use super::connect::{self, address, within, Timeouts};
use super::error::{connect_failed, Error, Result};
use crate::protocol::url::SentinelUrl;

/// The channel on which sentinels announce a failover: "name old-ip old-port new-ip new-port".
const SWITCH_CHANNEL: &str = "+switch-master";
/// How long the watcher waits before it tries the sentinels again after losing them all.
const WATCH_RETRY: Duration = Duration::from_millis(500);

pub struct Sentinel {
    url: SentinelUrl,
    sentinels: Vec<redis::Client>,
    /// The sentinel that answered last is asked first.
    preferred: AtomicUsize,
}

impl Sentinel {
    pub fn new(url: SentinelUrl) -> Result<Self> {
        let sentinels = url
            .sentinels
            .iter()
            .map(|info| connect::client(info.clone()))
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(|e| Error::Invalid(format!("url: {e}")))?;
        Ok(Sentinel {
            url,
            sentinels,
            preferred: AtomicUsize::new(0),
        })
    }

    pub fn service(&self) -> &str {
        &self.url.service
    }

    /// "service 'name' via sentinels [host:port, ...]", for messages (no password).
    pub fn endpoint(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| address(s.get_connection_info()))
            .collect();
        format!(
            "service '{}' via sentinels [{}]",
            self.url.service,
            sentinels.join(", ")
        )
    }

    /// The current master: a client for it and a connection on which it confirmed its role.
    pub async fn master(
        &self,
        timeouts: Timeouts,
    ) -> Result<(redis::Client, MultiplexedConnection)> {
        let limit = timeouts.connect + timeouts.command;
        let start = self.preferred.load(Ordering::Relaxed);
        let mut last = Error::Connection("no sentinel configured".into());
        for i in 0..self.sentinels.len() {
            let index = (start + i) % self.sentinels.len();
            let Some(sentinel) = self.sentinels.get(index) else {
                continue;
            };
            let asked = tokio::time::timeout(limit * 2, self.ask(sentinel, timeouts)).await;
            match asked {
                Ok(Ok(found)) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(found);
                }
                Ok(Err(err)) => last = err,
                Err(_) => {
                    last = Error::Connection(format!(
                        "Sentinel did not name a master for '{}' in time",
                        self.url.service
                    ))
                }
            }
        }
        Err(last)
    }

    async fn ask(
        &self,
        sentinel: &redis::Client,
        timeouts: Timeouts,
    ) -> Result<(redis::Client, MultiplexedConnection)> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.command));
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| Error::Connection(format!("Sentinel unreachable: {e}")))?;
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.url.service)
            .query_async(&mut conn)
            .await?;
        let Some((host, port)) = named else {
            return Err(Error::Connection(format!(
                "Sentinel knows no master named '{}'",
                self.url.service
            )));
        };
        let info = self.url.master_info(&host, port).map_err(Error::Invalid)?;
        let client = connect::client(info).map_err(|e| Error::Invalid(format!("url: {e}")))?;
        // The master connection serves the callers, whose own deadlines bound every reply.
        let master_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(None);
        let mut master = client
            .get_multiplexed_async_connection_with_config(&master_config)
            .await
            .map_err(connect_failed)?;
        let role: Vec<Value> = within(
            timeouts.command,
            "ROLE",
            redis::cmd("ROLE").query_async(&mut master),
        )
        .await?;
        let is_master = matches!(role.first(), Some(Value::BulkString(r)) if r == b"master")
            || matches!(role.first(), Some(Value::SimpleString(r)) if r == "master");
        if !is_master {
            return Err(Error::Connection(format!(
                "the server Sentinel names for '{}' ({host}:{port}) is not a master (yet)",
                self.url.service
            )));
        }
        Ok((client, master))
    }

    /// Watches the sentinels for failovers of this service and calls `moved` on each one (and
    /// whenever the watch had to be re-established, since an announcement may have been
    /// missed). Every sentinel that answers is listened to, so that one that hangs without
    /// closing its connection (stopped, cut off) cannot hide a failover the others announce;
    /// the sentinel that announced it is asked first for the new master. Ends when `moved`
    /// returns false (its owner is gone).
    pub async fn watch(self: std::sync::Arc<Self>, timeouts: Timeouts, moved: impl Fn() -> bool) {
        let mut first = true;
        loop {
            let streams = self.subscribe(timeouts).await;
            if !streams.is_empty() {
                if !first && !moved() {
                    return;
                }
                first = false;
                let mut announcements = futures_util::stream::select_all(streams);
                // Each sentinel announces the same failover: it is acted on once.
                let mut last: Option<String> = None;
                while let Some((index, msg)) = announcements.next().await {
                    let payload: String = msg.get_payload().unwrap_or_default();
                    let name = payload.split(' ').next().unwrap_or_default();
                    if name != self.url.service || last.as_deref() == Some(payload.as_str()) {
                        continue;
                    }
                    last = Some(payload);
                    self.preferred.store(index, Ordering::Relaxed);
                    if !moved() {
                        return;
                    }
                }
            }
            if !first && !moved() {
                return;
            }
            tokio::time::sleep(WATCH_RETRY).await;
        }
    }

    /// A subscription to the failover announcements of every sentinel that answers in time,
    /// each message with the index of its sentinel.
    async fn subscribe(
        &self,
        timeouts: Timeouts,
    ) -> Vec<impl futures_util::Stream<Item = (usize, redis::Msg)> + Unpin> {
        let limit = timeouts.connect + timeouts.command;
        let attempts = self
            .sentinels
            .iter()
            .enumerate()
            .map(|(index, sentinel)| async move {
                let mut pubsub = within(
                    limit,
                    "the Sentinel subscriber",
                    sentinel.get_async_pubsub(),
                )
                .await
                .ok()?;
                within(limit, "SUBSCRIBE", pubsub.subscribe(SWITCH_CHANNEL))
                    .await
                    .ok()?;
                Some(pubsub.into_on_message().map(move |msg| (index, msg)))
            });
        futures_util::future::join_all(attempts)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}
