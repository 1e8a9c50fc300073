//! What the command line (`redmutex/_cli.py`) takes from the core instead of keeping copies:
//! the key layout, URL parsing, redaction and the forced release.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::args;
use super::blocking;
use super::client::coerce_client;
use super::errors::value_error;
use crate::engine::{self, Error};
use crate::protocol::admin::{self, ForceRelease};
use crate::protocol::keys::Keys;
use crate::protocol::url;

/// A name as a str (validated as every primitive's), or as the bytes found in a key.
fn name_bytes(name: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    match name.cast::<PyBytes>() {
        Ok(raw) if raw.as_bytes().is_empty() => Err(value_error("name", "must not be empty")),
        Ok(raw) => Ok(raw.as_bytes().to_vec()),
        Err(_) => args::name("name", name),
    }
}

/// `{role: key}` of every key of `name` (str, or the bytes found in a key) under `prefix`,
/// plus `"wake_channel"`.
#[pyfunction]
pub fn _keys<'py>(
    py: Python<'py>,
    prefix: &str,
    name: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = name_bytes(name)?;
    let keys = Keys::new(prefix.as_bytes(), &name);
    let found = PyDict::new(py);
    for (role, key) in admin::keys_by_role(&keys) {
        found.set_item(role, PyBytes::new(py, &key))?;
    }
    Ok(found)
}

/// The exact source of the script `name` (its file's stem under src/protocol/lua/), preludes
/// included, as it is sent: for tests that run a script on its own.
#[pyfunction]
pub fn _script_source(name: &str) -> PyResult<&'static str> {
    crate::protocol::script_sources::source(name)
        .ok_or_else(|| value_error("name", &format!("{name:?} is no script's name")))
}

/// `(name, kind, role)` of a key of redmutex under `prefix` (the name's bytes as found), or
/// None for a key of something else.
#[pyfunction]
pub fn _split_key<'py>(
    py: Python<'py>,
    prefix: &str,
    key: &[u8],
) -> Option<(Bound<'py, PyBytes>, &'static str, &'static str)> {
    admin::split_key(prefix.as_bytes(), key)
        .map(|(name, role)| (PyBytes::new(py, name), role.kind, role.role))
}

/// The hold count of a re-entrant lock held by `owner` (its token), from the value of its
/// `lock_holds` key (None when missing): 1 unless that value counts nested acquires of `owner`.
#[pyfunction]
pub fn _hold_count(value: Option<&[u8]>, owner: &[u8]) -> u64 {
    crate::protocol::lock::hold_count(value, owner)
}

/// The kinds of primitive, in the order the command line lists them.
#[pyfunction]
pub fn _kinds() -> Vec<&'static str> {
    admin::KINDS.to_vec()
}

/// The SCAN pattern that finds every key under `prefix`.
#[pyfunction]
pub fn _scan_pattern<'py>(py: Python<'py>, prefix: &str) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &admin::scan_pattern(prefix.as_bytes()))
}

/// `url` with its password(s) replaced by `***`.
#[pyfunction]
pub fn _redact_url(url: &str) -> String {
    url::redact(url)
}

/// `text` on one line, without the passwords of `urls` (raw or decoded, wherever they appear)
/// and with every URL in it redacted.
#[pyfunction]
#[pyo3(signature = (text, urls=Vec::new()))]
pub fn _redact_text(text: &str, urls: Vec<String>) -> String {
    admin::redact_text(text, &urls)
}

/// What `url` connects to: a dict of `hosts` (`[(host, port)]`: the server, or the sentinels),
/// `socket`, `service`, `db`, `username`, `password`, `sentinel_username`,
/// `sentinel_password`, `tls`, `insecure`, and the `ssl_*` settings of the query. ValueError
/// (the URL redacted) when the URL is not one a Client accepts.
#[pyfunction]
pub fn _parse_url<'py>(py: Python<'py>, url: &str) -> PyResult<Bound<'py, PyDict>> {
    let parts = admin::url_parts(url).map_err(Error::Invalid)?;
    let found = PyDict::new(py);
    found.set_item("hosts", parts.hosts)?;
    found.set_item("socket", parts.socket)?;
    found.set_item("service", parts.service)?;
    found.set_item("db", parts.db)?;
    found.set_item("username", parts.username)?;
    found.set_item("password", parts.password)?;
    found.set_item("sentinel_username", parts.sentinel_username)?;
    found.set_item("sentinel_password", parts.sentinel_password)?;
    found.set_item("tls", parts.tls)?;
    found.set_item("insecure", parts.insecure)?;
    let tls = parts.tls_options;
    found.set_item("ssl_ca_certs", tls.ca_certs)?;
    found.set_item("ssl_certfile", tls.certfile)?;
    found.set_item("ssl_keyfile", tls.keyfile)?;
    found.set_item("ssl_verify_peer", tls.verify_peer)?;
    found.set_item("ssl_check_hostname", tls.check_hostname)?;
    Ok(found)
}

/// What `_force_release` freed: (lock holder's token, live semaphore holders, writer's token,
/// live readers, fill claim's token, live waiting writers' places), tokens as bytes or None.
type Freed<'py> = (
    Option<Bound<'py, PyBytes>>,
    i64,
    Option<Bound<'py, PyBytes>>,
    i64,
    Option<Bound<'py, PyBytes>>,
    i64,
);

/// Frees everything held under `name` on `client` (one server, Sentinel or Cluster) and wakes
/// its waiters; the lock only while `expected` still holds it (b"": whoever does). None when
/// the lock's holder was not `expected` (nothing touched).
#[pyfunction]
#[pyo3(signature = (client, name, expected=Vec::new()))]
pub fn _force_release<'py>(
    py: Python<'py>,
    client: &Bound<'py, PyAny>,
    name: &Bound<'py, PyAny>,
    expected: Vec<u8>,
) -> PyResult<Option<Freed<'py>>> {
    let name = args::name("name", name)?;
    let client = coerce_client(client)?.get().inner.clone();
    if client.is_redlock() {
        return Err(value_error(
            "client",
            "one server, Sentinel or Cluster: release a Redlock's masters one client each",
        ));
    }
    let outcome = blocking::wait(py, async move {
        engine::admin::force_release(&client, &name, &expected).await
    })??;
    let bytes = |token: Option<Vec<u8>>| token.map(|t| PyBytes::new(py, &t));
    Ok(match outcome {
        ForceRelease::HolderChanged => None,
        ForceRelease::Freed(f) => Some((
            bytes(f.lock),
            f.semaphore_holders,
            bytes(f.writer),
            f.readers,
            bytes(f.fill),
            f.writers_waiting,
        )),
    })
}

/// Registers the functions above on `_core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_keys, m)?)?;
    m.add_function(wrap_pyfunction!(_split_key, m)?)?;
    m.add_function(wrap_pyfunction!(_script_source, m)?)?;
    m.add_function(wrap_pyfunction!(_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(_hold_count, m)?)?;
    m.add_function(wrap_pyfunction!(_scan_pattern, m)?)?;
    m.add_function(wrap_pyfunction!(_redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(_redact_text, m)?)?;
    m.add_function(wrap_pyfunction!(_parse_url, m)?)?;
    m.add_function(wrap_pyfunction!(_force_release, m)?)?;
    Ok(())
}
