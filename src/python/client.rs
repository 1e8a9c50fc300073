//! `redmutex.Client`: settings of one Redis deployment; connections open lazily per process.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple, PyType};

use super::args;
use super::blocking;
use super::errors::type_error;
use crate::engine::node::{Retry, Timeouts};
use crate::engine::{Client, ClientConfig, Error};
use crate::protocol::url;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

#[pyclass(frozen, module = "redmutex", name = "Client")]
pub struct PyClient {
    pub inner: Arc<Client>,
    display_url: String,
    prefix: String,
}

fn seconds_or(arg: &str, value: Option<&Bound<'_, PyAny>>, default: f64) -> PyResult<Duration> {
    match value {
        Some(v) if !v.is_none() => args::duration(arg, v, 0.001),
        _ => Ok(Duration::from_secs_f64(default)),
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (url=None, *, prefix=None, connect_timeout=None, command_timeout=None, cluster=None))]
    fn new(
        url: Option<&Bound<'_, PyAny>>,
        prefix: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
        command_timeout: Option<&Bound<'_, PyAny>>,
        cluster: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if cluster.is_some_and(|c| !c.is_none()) {
            return Err(PyNotImplementedError::new_err(
                "cluster: Redis Cluster support is not built yet",
            ));
        }
        let url_text = match url {
            None => DEFAULT_URL.to_string(),
            Some(u) if u.is_none() => DEFAULT_URL.to_string(),
            Some(u) if u.is_instance_of::<PyList>() || u.is_instance_of::<PyTuple>() => {
                let urls: Vec<Bound<'_, PyAny>> = u.try_iter()?.collect::<PyResult<_>>()?;
                if urls.is_empty() {
                    return Err(super::errors::value_error(
                        "url",
                        "the list of masters is empty",
                    ));
                }
                for item in &urls {
                    if !item.is_instance_of::<PyString>() {
                        return Err(type_error("url", "a str or a list of str", item));
                    }
                }
                return Err(PyNotImplementedError::new_err(
                    "url: Redlock over several masters is not built yet",
                ));
            }
            Some(u) => u
                .cast::<PyString>()
                .map_err(|_| type_error("url", "a str", u))?
                .to_str()
                .map_err(|_| super::errors::value_error("url", "must be valid Unicode"))?
                .to_string(),
        };
        let prefix = match prefix {
            Some(p) if !p.is_none() => p
                .cast::<PyString>()
                .map_err(|_| type_error("prefix", "a str", p))?
                .to_str()
                .map_err(|_| super::errors::value_error("prefix", "must be valid Unicode"))?
                .to_string(),
            _ => "redmutex:".to_string(),
        };
        let timeouts = Timeouts {
            connect: seconds_or("connect_timeout", connect_timeout, 5.0)?,
            command: seconds_or("command_timeout", command_timeout, 5.0)?,
        };
        let info = url::parse(&url_text).map_err(Error::Invalid)?;
        let config = ClientConfig {
            info,
            prefix: prefix.as_bytes().to_vec(),
            timeouts,
        };
        Ok(PyClient {
            inner: Arc::new(Client::new(config)?),
            display_url: url::redact(&url_text),
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
        let reply = blocking::wait(py, async move {
            let shared = client.shared()?;
            shared
                .node
                .query::<String>(&redis::cmd("PING"), Retry::Once)
                .await
        })??;
        Ok(reply == "PONG")
    }

    /// Closes this process's connections; a later use opens new ones.
    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL with any password redacted.
    #[getter]
    fn url(&self) -> &str {
        &self.display_url
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.inner.close();
        false
    }

    fn __repr__(&self) -> String {
        format!("Client('{}', prefix='{}')", self.display_url, self.prefix)
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
