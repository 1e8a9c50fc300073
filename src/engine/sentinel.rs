//! Following a Sentinel-managed master: the sentinels are asked which master serves the
//! service, the master must confirm its role (ROLE), and `+switch-master` announcements move
//! every connection to the new master as soon as a failover is announced (a demoted master may
//! keep accepting writes for a while before Sentinel reconfigures it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use super::connect::{self, address, within, Timeouts};
use super::error::{connect_failed, timed_out, Error, Result};
use super::tls::Tls;
use crate::protocol::url::SentinelUrl;

/// The channel on which sentinels announce a failover: "name old-ip old-port new-ip new-port".
const SWITCH_CHANNEL: &str = "+switch-master";
/// `step`, or a timeout error once `limit` has passed.
async fn within_or<T>(
    limit: Duration,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, step)
        .await
        .unwrap_or_else(|_| Err(timed_out(limit, "waiting for Sentinel")))
}

/// `info` with the URL's `ssl_*` settings, if it has any.
fn with_tls(tls: &Option<Tls>, info: redis::ConnectionInfo) -> Result<redis::ConnectionInfo> {
    match tls {
        Some(tls) => tls.apply(info),
        None => Ok(info),
    }
}

/// How long the preferred sentinel has to answer before the others are asked too.
const PREFERRED_GRACE: Duration = Duration::from_millis(200);

/// How long the watcher waits before it tries the sentinels again after losing them all.
const WATCH_RETRY: Duration = Duration::from_millis(500);

pub struct Sentinel {
    url: SentinelUrl,
    /// The URL's `ssl_*` settings (None: the defaults), for each master's connection.
    tls: Option<Tls>,
    sentinels: Vec<redis::Client>,
    /// The sentinel that answered last is asked first.
    preferred: AtomicUsize,
}

impl Sentinel {
    pub fn new(url: SentinelUrl) -> Result<Self> {
        let tls = match url.tls_options.is_default() {
            true => None,
            false => Some(Tls::read(&url.tls_options)?),
        };
        let sentinels = url
            .sentinels
            .iter()
            .map(|info| {
                let info = with_tls(&tls, info.clone())?;
                connect::client(info).map_err(|e| Error::Invalid(format!("url: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sentinel {
            url,
            tls,
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
    /// The preferred sentinel (the one that answered last, or announced the last failover: see
    /// `watch`) is asked first, and its answer is taken when it comes: right after a failover
    /// the others may still name the old master. Once it failed, or has not answered within
    /// `PREFERRED_GRACE`, the others are asked too, all at once (one that hangs must not hold
    /// up the rest), and the first master named that confirms its role is taken.
    pub async fn master(
        &self,
        timeouts: Timeouts,
    ) -> Result<(redis::Client, MultiplexedConnection)> {
        let start = self.preferred.load(Ordering::Relaxed);
        let count = self.sentinels.len();
        let mut asked = FuturesUnordered::new();
        asked.push(self.looked_up(start % count.max(1), timeouts));
        let mut others = (1..count).map(|i| (start + i) % count);
        let mut everyone = count <= 1;
        let grace = tokio::time::sleep(PREFERRED_GRACE);
        tokio::pin!(grace);
        let mut last = Error::Connection("no sentinel configured".into());
        loop {
            let next = if everyone {
                asked.next().await
            } else {
                tokio::select! {
                    next = asked.next() => next,
                    _ = &mut grace => None,
                }
            };
            match next {
                Some((index, Ok(found))) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(found);
                }
                Some((_, Err(err))) => last = err,
                None if everyone => return Err(last),
                None => {}
            }
            if !everyone {
                everyone = true;
                for index in others.by_ref() {
                    asked.push(self.looked_up(index, timeouts));
                }
            }
        }
    }

    /// The master sentinel `index` names, confirmed (see `master`), each step bounded.
    fn looked_up(
        &self,
        index: usize,
        timeouts: Timeouts,
    ) -> BoxFuture<'_, (usize, Result<(redis::Client, MultiplexedConnection)>)> {
        let limit = timeouts.connect + timeouts.command;
        async move {
            let Some(sentinel) = self.sentinels.get(index) else {
                let err = Error::Connection("no sentinel configured".into());
                return (index, Err(err));
            };
            let found = match within_or(limit, self.named_by(sentinel, timeouts)).await {
                Ok((host, port)) => within_or(limit, self.confirmed(&host, port, timeouts)).await,
                Err(err) => Err(err),
            };
            (index, found)
        }
        .boxed()
    }

    /// The master `sentinel` names for the service.
    async fn named_by(
        &self,
        sentinel: &redis::Client,
        timeouts: Timeouts,
    ) -> Result<(String, u16)> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.command));
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| match e.is_timeout() {
                true => timed_out(timeouts.connect, "connecting to Sentinel"),
                false => Error::Connection(format!("Sentinel unreachable: {e}")),
            })?;
        let named: Option<(String, u16)> = within(
            timeouts.command,
            "Sentinel's answer",
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.url.service)
                .query_async(&mut conn),
        )
        .await?;
        named.ok_or_else(|| {
            Error::Connection(format!(
                "Sentinel knows no master named '{}'",
                self.url.service
            ))
        })
    }

    /// A client for the server at `host:port` and a connection on which it confirmed that it
    /// is a master.
    async fn confirmed(
        &self,
        host: &str,
        port: u16,
        timeouts: Timeouts,
    ) -> Result<(redis::Client, MultiplexedConnection)> {
        let info = self.url.master_info(host, port).map_err(Error::Invalid)?;
        let info = with_tls(&self.tls, info)?;
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
