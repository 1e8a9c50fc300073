//! `redmutex.Client`: settings of one Redis deployment; connections open lazily per process.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple, PyType};

use super::args;
use super::blocking;
use super::errors::{type_error, value_error};
use crate::engine::node::Timeouts;
use crate::engine::tls;
use crate::engine::{Client, ClientConfig, Deployment, Error};
use crate::protocol::keys::DEFAULT_FENCE_TTL_MS;
use crate::protocol::lease;
use crate::protocol::url::{self, Endpoint};

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

/// A connection to Redis for the primitives: one server, a Redlock set or a Cluster.
///
/// `Client(url="redis://127.0.0.1:6379/0", *, prefix="redmutex:", connect_timeout=5.0,
/// command_timeout=5.0, fence_ttl=86400.0)`; a list of URLs is a Redlock set,
/// `cluster=[seed, ...]` a Redis Cluster. Constructing does not connect; None for any argument
/// means its default.
#[pyclass(frozen, module = "redmutex", name = "Client")]
pub struct PyClient {
    pub inner: Arc<Client>,
    display_url: String,
    prefix: String,
}

/// A `str` argument as Rust text.
fn text(arg: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(value
        .cast::<PyString>()
        .map_err(|_| type_error(arg, "a str", value))?
        .to_str()
        .map_err(|_| value_error(arg, "must be valid Unicode"))?
        .to_string())
}

/// A non-empty list (or tuple) of URL strings.
fn url_list(arg: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = value.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(type_error(arg, "a list of URL strings", value));
    };
    if items.is_empty() {
        return Err(value_error(arg, "give at least one URL"));
    }
    items.iter().map(|item| text(arg, item)).collect()
}

/// `Client([url1, ..., urlN])`: Redlock over independent masters (servers or Sentinel URLs).
fn redlock_deployment(value: &Bound<'_, PyAny>) -> PyResult<(Deployment, String)> {
    let urls = url_list("url", value)?;
    let mut masters = Vec::with_capacity(urls.len());
    let mut seen: Vec<String> = Vec::new();
    for u in &urls {
        let endpoint = tls::parse_endpoint(u)?;
        // The same master twice would count its vote twice (another db of one server is the
        // same master too). Other names of one server are found at first contact (run_id).
        let identity = match &endpoint {
            Endpoint::Direct(info) => info.addr().to_string(),
            Endpoint::Sentinel(s) => {
                let sentinels: Vec<String> =
                    s.sentinels.iter().map(|i| i.addr().to_string()).collect();
                format!("sentinel {} {}", s.service, sentinels.join(","))
            }
        };
        if seen.contains(&identity) {
            return Err(value_error(
                "url",
                &format!(
                    "the master '{}' is listed twice (one server, whatever the db)",
                    url::redact(u)
                ),
            ));
        }
        seen.push(identity);
        masters.push((endpoint, url::redact(u)));
    }
    let display = masters
        .iter()
        .map(|(_, label)| label.clone())
        .collect::<Vec<_>>()
        .join(", ");
    Ok((Deployment::Redlock(masters), display))
}

/// `Client(cluster=[url, ...])`: a Redis Cluster through its seed nodes. Their `ssl_*`
/// settings must agree: the cluster client applies one set to every node it learns of.
fn cluster_deployment(value: &Bound<'_, PyAny>) -> PyResult<(Deployment, String)> {
    let urls = url_list("cluster", value)?;
    let mut seeds = Vec::with_capacity(urls.len());
    let mut tls_options: Option<url::TlsOptions> = None;
    for u in &urls {
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            return Err(value_error(
                "cluster",
                &format!(
                    "'{}': cluster nodes are reached over TCP: redis:// or rediss://",
                    url::redact(u)
                ),
            ));
        }
        let (_, options) =
            url::split_tls(u).map_err(|e| value_error("cluster", e.trim_start_matches("url: ")))?;
        if tls_options.get_or_insert_with(|| options.clone()) != &options {
            return Err(value_error(
                "cluster",
                &format!(
                    "'{}': every seed must have the same ssl_* options (one set serves every \
                     node)",
                    url::redact(u)
                ),
            ));
        }
        let Endpoint::Direct(info) = tls::parse_endpoint(u)
            .map_err(|e| value_error("cluster", e.to_string().trim_start_matches("url: ")))?
        else {
            return Err(value_error(
                "cluster",
                "a seed is a node's URL, not Sentinel's",
            ));
        };
        if info.redis_settings().db() != 0 {
            return Err(value_error(
                "cluster",
                &format!("'{}': Redis Cluster has only db 0", url::redact(u)),
            ));
        }
        seeds.push(info);
    }
    let display = urls
        .iter()
        .map(|u| url::redact(u))
        .collect::<Vec<_>>()
        .join(", ");
    Ok((
        Deployment::Cluster(seeds, tls_options.unwrap_or_default()),
        display,
    ))
}

fn seconds_or(arg: &str, value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<Duration> {
    match value {
        Some(v) if !v.is_none() => args::duration(arg, v, 0.001),
        _ => Ok(Duration::from_secs_f64(default)),
    }
}

/// `fence_ttl`: a finite number of seconds, at least 0.001 like every lease (`ttl`): the wire
/// counts whole ms, so anything shorter would be lengthened silently.
fn fence_ttl_seconds(value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    args::duration("fence_ttl", value, 0.001)
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (url=None, *, prefix=None, connect_timeout=None, command_timeout=None, cluster=None, fence_ttl=None))]
    fn new(
        url: Option<&Bound<'_, PyAny>>,
        prefix: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
        command_timeout: Option<&Bound<'_, PyAny>>,
        cluster: Option<&Bound<'_, PyAny>>,
        fence_ttl: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let url = url.filter(|u| !u.is_none());
        let cluster = cluster.filter(|c| !c.is_none());
        let prefix = match prefix {
            Some(p) if !p.is_none() => text("prefix", p)?,
            _ => "redmutex:".to_string(),
        };
        let timeouts = Timeouts {
            connect: seconds_or("connect_timeout", connect_timeout, 5.0)?,
            command: seconds_or("command_timeout", command_timeout, 5.0)?,
        };
        let fence_ttl = match fence_ttl {
            Some(v) if !v.is_none() => fence_ttl_seconds(v)?,
            _ => Duration::from_millis(DEFAULT_FENCE_TTL_MS),
        };
        let (deployment, display_url) = match (url, cluster) {
            (Some(_), Some(_)) => {
                return Err(value_error(
                    "url",
                    "give either url (one server, Sentinel, or a list of Redlock masters) or \
                     cluster=[...], not both",
                ))
            }
            (None, Some(seeds)) => cluster_deployment(seeds)?,
            (Some(u), None) if u.is_instance_of::<PyList>() || u.is_instance_of::<PyTuple>() => {
                redlock_deployment(u)?
            }
            (Some(u), None) => {
                let url_text = text("url", u)?;
                let endpoint = tls::parse_endpoint(&url_text)?;
                (
                    Deployment::Single(Box::new(endpoint)),
                    url::redact(&url_text),
                )
            }
            (None, None) => {
                let endpoint = url::parse_endpoint(DEFAULT_URL).map_err(Error::Invalid)?;
                (
                    Deployment::Single(Box::new(endpoint)),
                    DEFAULT_URL.to_string(),
                )
            }
        };
        let config = ClientConfig {
            deployment,
            prefix: prefix.as_bytes().to_vec(),
            timeouts,
            fence_ttl_ms: lease::lease_ms(fence_ttl),
        };
        Ok(PyClient {
            inner: Arc::new(Client::new(config)?),
            display_url,
            prefix,
        })
    }

    /// A Client on the server of a redis-py client (its host, port, db, credentials, TLS, socket).
    #[classmethod]
    fn from_redis<'py>(
        cls: &Bound<'py, PyType>,
        redis_client: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        cls.py()
            .import("redmutex._client")?
            .call_method1("from_redis", (redis_client,))
    }

    /// True, or raises `redmutex.ConnectionError`.
    fn ping(&self, py: Python<'_>) -> PyResult<bool> {
        let client = self.inner.clone();
        blocking::wait(py, async move { client.backend()?.ping().await })??;
        Ok(true)
    }

    /// Closes this process's connections; a later use opens new ones.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.close();
        super::loop_conn::retire_for(py, &self.inner)
    }

    /// How long a name's fencing counter lives after its last acquisition, in seconds.
    #[getter]
    fn fence_ttl(&self) -> f64 {
        self.inner.config().fence_ttl_ms as f64 / 1000.0
    }

    #[getter]
    fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL with any password redacted (several, comma-separated, for Redlock and Cluster).
    #[getter]
    fn url(&self) -> &str {
        &self.display_url
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let urls = || {
            self.display_url
                .split(", ")
                .map(|u| format!("'{u}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &self.inner.config().deployment {
            Deployment::Single(_) => {
                format!("Client('{}', prefix='{}')", self.display_url, self.prefix)
            }
            Deployment::Redlock(_) => format!("Client([{}], prefix='{}')", urls(), self.prefix),
            Deployment::Cluster(..) => {
                format!("Client(cluster=[{}], prefix='{}')", urls(), self.prefix)
            }
        }
    }
}

/// The `client` argument of every primitive: a Client as is; a URL or a redis-py client through
/// `redmutex._client.coerce` (which caches one Client per URL and per redis-py instance).
pub fn coerce_client(obj: &Bound<'_, PyAny>) -> PyResult<Py<PyClient>> {
    if let Ok(client) = obj.cast::<PyClient>() {
        return Ok(client.clone().unbind());
    }
    let coerced = obj
        .py()
        .import("redmutex._client")?
        .call_method1("coerce", (obj,))?;
    Ok(coerced
        .cast_into::<PyClient>()
        .map_err(PyErr::from)?
        .unbind())
}
