//! A client: the settings of one Redis deployment, and per process the connections to it.
//!
//! Deployments come in two shapes behind one `Backend`:
//! - `Single`: one logical keyspace reached through one `Shared` — a server, a Sentinel-managed
//!   master, or a Redis Cluster (the cluster client routes each script by its first key, and all
//!   keys of a primitive share one slot, so every script works there unchanged);
//! - `Redlock`: N independent masters, each a `Shared` of its own, with per-primitive quorum
//!   logic (`engine::redlock`). Primitives without such logic get `Error::Unsupported` there.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::ConnectionInfo;

use super::connect;
use super::error::{Error, Result};
use super::node::{Retry, Target, Timeouts};
use super::redlock::Redlock;
use super::runtime::pid;
use super::sentinel::Sentinel;
pub use super::shared::Shared;
use super::slots::SlotTable;
use super::tls::{self, Tls};
use crate::protocol::keys::{Keys, DEFAULT_FENCE_TTL_MS};
use crate::protocol::url::{Endpoint, TlsOptions};

/// The Redis deployment a client talks to.
#[derive(Clone, Debug)]
pub enum Deployment {
    /// One server, or a Sentinel-managed master.
    Single(Box<Endpoint>),
    /// A Redis Cluster, found through these seed nodes (their URLs' `ssl_*` settings applied),
    /// and those settings, for the nodes the cluster client learns of.
    Cluster(Vec<ConnectionInfo>, TlsOptions),
    /// Redlock over independent masters (each a server or a Sentinel-managed master), with a
    /// label (the redacted URL) for each, for messages.
    Redlock(Vec<(Endpoint, String)>),
}

/// The shortest lease a Redlock client takes (see `Client::check_lease`).
pub const REDLOCK_MIN_LEASE: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub deployment: Deployment,
    pub prefix: Vec<u8>,
    pub timeouts: Timeouts,
    /// How long a fencing counter lives after the last acquisition of its name, in ms.
    pub fence_ttl_ms: u64,
}

impl ClientConfig {
    /// One server (or Sentinel URL), the common case.
    pub fn single(url_text: &str, prefix: &[u8], timeouts: Timeouts) -> Result<Self> {
        Ok(ClientConfig {
            deployment: Deployment::Single(Box::new(tls::parse_endpoint(url_text)?)),
            prefix: prefix.to_vec(),
            timeouts,
            fence_ttl_ms: DEFAULT_FENCE_TTL_MS,
        })
    }
}

/// This process's connections to the deployment.
#[derive(Clone)]
pub enum Backend {
    /// One keyspace: a server, a Sentinel-managed master, or a Redis Cluster.
    Single(Arc<Shared>),
    /// Independent masters, agreeing by majority.
    Redlock(Arc<Redlock>),
}

impl Backend {
    /// One round trip to the deployment (on Redlock, to a majority of the masters).
    pub async fn ping(&self) -> Result<()> {
        match self {
            Backend::Single(shared) => {
                let reply: String = shared.node.query(&redis::cmd("PING"), Retry::Once).await?;
                if reply == "PONG" {
                    Ok(())
                } else {
                    Err(Error::Server(format!("unexpected reply to PING: {reply}")))
                }
            }
            Backend::Redlock(redlock) => redlock.ping().await,
        }
    }
}

/// Connection-free descriptions of what to connect to, made once (a forked child reuses them).
enum Plan {
    Single(Arc<Target>),
    Redlock(Vec<(Arc<Target>, String)>),
}

pub struct Client {
    config: ClientConfig,
    plan: Plan,
    per_process: Mutex<Option<(u32, Backend)>>,
}

fn endpoint_target(endpoint: &Endpoint) -> Result<Arc<Target>> {
    Ok(Arc::new(match endpoint {
        Endpoint::Direct(info) => Target::Direct(
            connect::client(info.clone()).map_err(|e| Error::Invalid(format!("url: {e}")))?,
        ),
        Endpoint::Sentinel(url) => Target::Sentinel(Arc::new(Sentinel::new(url.clone())?)),
    }))
}

fn cluster_target(
    seeds: &[ConnectionInfo],
    tls: &TlsOptions,
    timeouts: Timeouts,
) -> Result<Arc<Target>> {
    let invalid = |e: redis::RedisError| Error::Invalid(format!("cluster: {e}"));
    let slots = Arc::new(SlotTable::default());
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds.to_vec());
    if !tls.is_default() {
        // The seeds have them already; the nodes the cluster client learns of take them here.
        // `certs` makes the cluster client check every certificate (TlsMode::Secure) unless a
        // mode is set: the seeds' own (`ssl_cert_reqs=none` or `#insecure`: no check at all),
        // which must then be one for all, as the client checks only when it sets none itself.
        let insecure = |info: &ConnectionInfo| {
            matches!(
                info.addr(),
                redis::ConnectionAddr::TcpTls { insecure: true, .. }
            )
        };
        let first = seeds.first().is_some_and(insecure);
        if seeds.iter().any(|seed| insecure(seed) != first) {
            return Err(Error::Invalid(
                "cluster: every seed must check certificates alike (#insecure, ssl_cert_reqs)"
                    .into(),
            ));
        }
        let tls = Tls::read(tls)?;
        builder = builder
            .tls(if first {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            })
            .certs(tls.certificates())
            .danger_accept_invalid_hostnames(!tls.check_hostname());
    }
    // No read routing strategy: with one the client sends READONLY on every connection, and a
    // demoted master would answer reads from its old data (see `slots.rs`).
    let client = builder
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.command)
        // Every call is bounded by its caller (a WAIT's connection waits longer than the
        // command timeout, see `Target::connect_answering_within`); else the client's own bound
        // would be the command timeout for every connection, whatever its response timeout.
        .overall_response_timeout(None)
        // Redirections and TRYAGAIN during resharding are retried quickly; the command timeout
        // bounds the whole call anyway.
        .retries(12)
        .min_retry_wait(5)
        .max_retry_wait(200)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_keepalive(connect::keepalive()))
        .build()
        .map_err(invalid)?;
    let seeds = seeds
        .iter()
        .map(|info| connect::client(info.clone()))
        .collect::<redis::RedisResult<Vec<_>>>()
        .map_err(invalid)?;
    Ok(Arc::new(Target::Cluster {
        client: Box::new(client),
        seeds,
        next_seed: AtomicUsize::new(0),
        slots,
    }))
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Self> {
        // Validates the settings without connecting.
        let plan = match &config.deployment {
            Deployment::Single(endpoint) => Plan::Single(endpoint_target(endpoint)?),
            Deployment::Cluster(seeds, tls) => {
                if seeds.is_empty() {
                    return Err(Error::Invalid(
                        "cluster: give at least one seed node".into(),
                    ));
                }
                if config.prefix.contains(&b'{') && !Keys::new(&config.prefix, b"x").single_slot() {
                    return Err(Error::Invalid(
                        "prefix: on Redis Cluster the prefix must not hold an empty hash tag '{}'"
                            .into(),
                    ));
                }
                Plan::Single(cluster_target(seeds, tls, config.timeouts)?)
            }
            Deployment::Redlock(masters) => {
                if masters.is_empty() {
                    return Err(Error::Invalid("url: give at least one master".into()));
                }
                Plan::Redlock(
                    masters
                        .iter()
                        .map(|(e, label)| Ok((endpoint_target(e)?, label.clone())))
                        .collect::<Result<Vec<_>>>()?,
                )
            }
        };
        Ok(Client {
            config,
            plan,
            per_process: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.config.deployment, Deployment::Cluster(..))
    }

    pub fn is_redlock(&self) -> bool {
        matches!(self.plan, Plan::Redlock(_))
    }

    /// Refuses a lease a Redlock client could never grant: the clock-drift allowance (2 ms plus
    /// 1 %) and a round on every master must fit in it, or every won round would be given back
    /// and tried again forever. `arg`: how the caller names the lease.
    pub fn check_lease(&self, arg: &str, lease: Duration) -> Result<()> {
        if self.is_redlock() && lease < REDLOCK_MIN_LEASE {
            return Err(Error::Invalid(format!(
                "{arg}: a Redlock lease must be at least {} s (the clock-drift allowance alone \
                 is 2 ms)",
                REDLOCK_MIN_LEASE.as_secs_f64()
            )));
        }
        Ok(())
    }

    /// Whether the blocking API may make one-round-trip calls on the caller's thread: on one
    /// keyspace (a server, a Sentinel-managed master, a Redis Cluster; see `direct.rs`), not on
    /// Redlock.
    pub fn supports_direct(&self) -> bool {
        matches!(&self.plan, Plan::Single(_))
    }

    /// The keys of the primitive `name` (the argument `name`; see `keys_named`).
    pub fn keys(&self, name: &[u8]) -> Result<Keys> {
        self.keys_named("name", name)
    }

    /// The keys of the primitive `name`, given as the argument `arg` (named by its error). On a
    /// cluster every key of a primitive must share one slot, which a name starting with '}'
    /// would break (its hash tag would be empty).
    pub fn keys_named(&self, arg: &str, name: &[u8]) -> Result<Keys> {
        let keys = Keys::new(&self.config.prefix, name).with_fence_ttl(self.config.fence_ttl_ms);
        if self.is_cluster() && !keys.single_slot() {
            return Err(Error::Invalid(format!(
                "{arg}: on Redis Cluster a name must not start with '}}' (its keys would not \
                 share one hash slot)"
            )));
        }
        Ok(keys)
    }

    /// This process's connections, opened lazily. In a forked child the parent's are forgotten
    /// (leaked, never used or closed: closing would disturb the parent's sockets).
    pub fn backend(&self) -> Result<Backend> {
        let mut slot = self.per_process.lock().unwrap_or_else(|p| p.into_inner());
        let me = pid();
        if let Some((owner, backend)) = slot.as_ref() {
            if *owner == me {
                return Ok(backend.clone());
            }
        }
        if let Some((_, inherited)) = slot.take() {
            std::mem::forget(inherited);
        }
        let timeouts = self.config.timeouts;
        let backend = match &self.plan {
            Plan::Single(target) => Backend::Single(Shared::open(target.clone(), timeouts, false)),
            Plan::Redlock(masters) => Backend::Redlock(Arc::new(Redlock::new(
                masters
                    .iter()
                    .map(|(target, label)| {
                        (Shared::open(target.clone(), timeouts, true), label.clone())
                    })
                    .collect(),
            ))),
        };
        *slot = Some((me, backend.clone()));
        Ok(backend)
    }

    /// The connections of a single-keyspace deployment (server, Sentinel or Cluster). Primitives
    /// without a quorum protocol use this, and get a clear error on a Redlock client.
    pub fn shared(&self) -> Result<Arc<Shared>> {
        match self.backend()? {
            Backend::Single(shared) => Ok(shared),
            Backend::Redlock(_) => Err(Error::Unsupported(
                "this is not available on a Redlock client (several independent masters): it \
                 reads one keyspace (Semaphore.holders(), the RWLock's state, redmutex.compat, \
                 the command line's admin commands); Lock, Semaphore and RWLock acquire, \
                 release, extend and owned(), and the cache, work by majority; use one Redis, \
                 Sentinel or Redis Cluster for the rest"
                    .into(),
            )),
        }
    }

    /// Drops this process's connections; the next use opens new ones.
    pub fn close(&self) {
        let mut slot = self.per_process.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, backend)) = slot.take() {
            if owner != pid() {
                std::mem::forget(backend);
            }
        }
    }
}
