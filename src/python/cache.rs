//! The Redis steps of the stampede-safe cache for `redmutex/_cache.py`, which serializes, signs,
//! decides early refreshes and runs the fill: `CacheStore.fetch` (look up, or claim the fill, or
//! wait for another caller's fill without polling), `FillClaim.store`/`abandon`, `invalidate`.
//! What a lookup found reaches Python typed: a `CacheHit`, the `FillClaim`, or None (busy).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::IntoPyObjectExt;

use super::args;
use super::awaitable::{self, OnCancel};
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::{value_error, About, Named};
use crate::engine::cache::{self, CacheSpec, Claim, Fetched};
use crate::engine::claim_lease::ClaimLease;
use crate::engine::redlock_cache;
use crate::engine::waiting::Wait;
use crate::engine::{Backend, Client, Error};

/// A stored value, as `fetch` or `try_claim` found it.
#[pyclass(frozen, module = "redmutex._core", name = "CacheHit")]
pub struct PyCacheHit {
    payload: Py<PyBytes>,
    pttl_ms: i64,
}

#[pymethods]
impl PyCacheHit {
    /// The stored payload.
    #[getter]
    fn payload(&self, py: Python<'_>) -> Py<PyBytes> {
        self.payload.clone_ref(py)
    }

    /// The ms the value had left when read (Redis's clock); -1: no expiry.
    #[getter]
    fn pttl_ms(&self) -> i64 {
        self.pttl_ms
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "CacheHit(payload=<{} bytes>, pttl_ms={})",
            self.payload.bind(py).as_bytes().len(),
            self.pttl_ms
        )
    }
}

/// The cache settings that concern Redis, bound to a client; shared by every call of one
/// `get_or_fill`/`@cached`.
#[pyclass(frozen, module = "redmutex._core", name = "CacheStore")]
pub struct PyCacheStore {
    client: Py<PyClient>,
    inner: Arc<Client>,
    ttl: Duration,
    lock_ttl: Duration,
    /// How long `fetch` waits for another caller's fill by default; None: forever.
    timeout: Option<Duration>,
}

/// A one-step operation on an entry (`PyCacheStore::entry_op`).
enum EntryOp {
    /// Drop the value and any fill in progress.
    Invalidate,
    /// Whether this token holds the fill claim.
    ClaimHeldBy(String),
}

/// What an engine error of one entry's step is about: "cache entry 'key': ...", `.name` the key.
fn entry(name: &str) -> About {
    About::new("cache entry", name)
}

impl PyCacheStore {
    /// The entry's spec, and what its errors are about.
    fn spec(&self, key: &Bound<'_, PyAny>) -> PyResult<(CacheSpec, About)> {
        let name = args::name("key", key)?;
        let spec = CacheSpec::new(&self.inner, &name, self.lock_ttl, self.ttl)?;
        Ok((spec, entry(&String::from_utf8_lossy(&name))))
    }

    fn run_fetch<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        wait: Wait,
        skip: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (spec, about) = self.spec(key)?;
        if let Backend::Redlock(redlock) = self.inner.backend().about(py, &about)? {
            let fetched = blocking::wait(
                py,
                redlock_cache::fetch(&redlock, &spec, wait, skip.as_deref()),
            )?
            .about(py, &about)?;
            return found_quorum(py, fetched, about);
        }
        let shared = self.inner.shared().about(py, &about)?;
        let skip = skip.as_deref();
        let fetched = blocking::run(py, || cache::fetch_blocking(&shared, &spec, wait, skip))?
            .about(py, &about)?;
        found(py, fetched, about)
    }

    /// `op` on the entry `key`, on whichever deployment the client has, and what its errors are
    /// about.
    fn entry_op(
        &self,
        key: &Bound<'_, PyAny>,
        op: EntryOp,
    ) -> PyResult<(
        impl Future<Output = Result<bool, Error>> + Send + 'static,
        About,
    )> {
        let (spec, about) = self.spec(key)?;
        let client = self.inner.clone();
        let done = async move {
            let keys = &spec.keys;
            match (client.backend()?, &op) {
                (Backend::Redlock(r), EntryOp::Invalidate) => {
                    redlock_cache::invalidate(&r, keys).await
                }
                (Backend::Redlock(r), EntryOp::ClaimHeldBy(token)) => {
                    redlock_cache::claim_held_by(&r, keys, token).await
                }
                (Backend::Single(s), EntryOp::Invalidate) => cache::invalidate(&s, keys).await,
                (Backend::Single(s), EntryOp::ClaimHeldBy(token)) => {
                    cache::claim_held_by(&s, keys, token).await
                }
            }
        };
        Ok((done, about))
    }

    /// `fetch` as an awaitable: every step in the runtime. Cancelled, it stops waiting, and a
    /// claim its lookups took is given back (the engine's `Claim` does so when dropped).
    fn run_fetch_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        wait: Wait,
        skip: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (spec, about) = self.spec(key)?;
        let client = self.inner.clone();
        // (The engine's result is handed over whole, so that its error names the entry.)
        if client.is_redlock() {
            return awaitable::spawn(
                py,
                OnCancel::Abort,
                async move {
                    Ok(async move {
                        let Backend::Redlock(redlock) = client.backend()? else {
                            return Err(Error::Usage("a Redlock client without masters".into()));
                        };
                        redlock_cache::fetch(&redlock, &spec, wait, skip.as_deref()).await
                    }
                    .await)
                },
                move |py, fetched| found_quorum(py, fetched.about(py, &about)?, about),
            );
        }
        awaitable::spawn(
            py,
            OnCancel::Abort,
            async move {
                Ok(async move {
                    let shared = client.shared()?;
                    cache::fetch(&shared, &spec, wait, skip.as_deref()).await
                }
                .await)
            },
            move |py, fetched| found(py, fetched.about(py, &about)?, about),
        )
    }

    /// The wait of `fetch(timeout=...)`: not given (or None), the store's own timeout.
    fn fetch_wait(&self, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Wait> {
        Ok(match timeout {
            None => Wait::from_timeout(self.timeout),
            Some(t) => Wait::from_timeout(args::forever_or_duration("timeout", t, 0.0)?),
        })
    }
}

/// What a lookup found, as Python sees it: a `CacheHit`; the `FillClaim` (whose store keeps the
/// value for the entry's ttl, which the engine's claim carries); or None when another caller
/// fills and the wait allowed ended first.
fn found(py: Python<'_>, fetched: Fetched, about: About) -> PyResult<Bound<'_, PyAny>> {
    match fetched {
        Fetched::Hit(hit) => PyCacheHit {
            payload: PyBytes::new(py, &hit.payload).unbind(),
            pttl_ms: hit.pttl_ms,
        }
        .into_bound_py_any(py),
        Fetched::Claimed(claim) => PyFillClaim {
            token: claim.token().to_string(),
            lease_end: claim.lease_end(),
            claim: Mutex::new(Some(AnyClaim::Single(claim))),
            about,
        }
        .into_bound_py_any(py),
        Fetched::Busy => Ok(py.None().into_bound(py)),
    }
}

/// `found` for what a Redlock lookup found on a majority.
fn found_quorum(
    py: Python<'_>,
    fetched: redlock_cache::Fetched,
    about: About,
) -> PyResult<Bound<'_, PyAny>> {
    match fetched {
        redlock_cache::Fetched::Hit(hit) => found(py, Fetched::Hit(hit), about),
        redlock_cache::Fetched::Claimed(claim) => PyFillClaim {
            token: claim.token().to_string(),
            lease_end: claim.lease_end(),
            claim: Mutex::new(Some(AnyClaim::Quorum(claim))),
            about,
        }
        .into_bound_py_any(py),
        redlock_cache::Fetched::Busy => Ok(py.None().into_bound(py)),
    }
}

/// A fill claim on one keyspace, or on a majority of Redlock masters.
enum AnyClaim {
    Single(Claim),
    Quorum(redlock_cache::Claim),
}

impl AnyClaim {
    async fn store(self, payload: &[u8]) -> Result<bool, Error> {
        match self {
            AnyClaim::Single(claim) => claim.store(payload).await,
            AnyClaim::Quorum(claim) => claim.store(payload).await,
        }
    }

    async fn abandon(self) -> Result<bool, Error> {
        match self {
            AnyClaim::Single(claim) => claim.abandon().await,
            AnyClaim::Quorum(claim) => claim.abandon().await,
        }
    }
}

fn digest(arg: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match value {
        Some(v) if !v.is_none() => {
            let text: String = v.extract()?;
            if text.len() != 40 || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(value_error(
                    arg,
                    "must be the SHA-1 hex digest of a payload",
                ));
            }
            Ok(Some(text.to_ascii_lowercase()))
        }
        _ => Ok(None),
    }
}

#[pymethods]
impl PyCacheStore {
    #[new]
    #[pyo3(signature = (client, *, ttl, lock_ttl=10.0, timeout=None))]
    fn new(
        client: &Bound<'_, PyAny>,
        ttl: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::lock_ttl)] lock_ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ttl = args::duration("ttl", ttl, 0.001)?;
        let lock_ttl = args::seconds("lock_ttl", lock_ttl)?;
        let timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let client = coerce_client(client)?;
        let inner = client.get().inner.clone();
        Ok(PyCacheStore {
            client,
            inner,
            ttl,
            lock_ttl,
            timeout,
        })
    }

    /// Looks `key` up; on a miss claims its fill, or waits for another caller's fill (at most
    /// `timeout` seconds: the store's own timeout when not given or None, inf for forever, 0 to
    /// not wait). `skip`: SHA-1 hex of a payload the caller cannot use, which counts as absent.
    /// Returns a CacheHit, the FillClaim, or None when the wait ended first.
    #[pyo3(signature = (key, skip=None, *, timeout=None))]
    fn fetch<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        skip: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let skip = digest("skip", skip)?;
        let wait = self.fetch_wait(timeout)?;
        self.run_fetch(py, key, wait, skip)
    }

    /// `fetch` as an awaitable resolving to the same.
    #[pyo3(signature = (key, skip=None, *, timeout=None))]
    fn _fetch_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        skip: Option<&Bound<'py, PyAny>>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let skip = digest("skip", skip)?;
        let wait = self.fetch_wait(timeout)?;
        self.run_fetch_async(py, key, wait, skip)
    }

    /// The early-refresh claim, never waiting: the FillClaim when the value whose payload has
    /// the SHA-1 hex `seen` is still the stored one (or none is) and nobody fills; a CacheHit
    /// with the newer value when another caller already replaced it; None when another caller
    /// is filling.
    fn try_claim<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        seen: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let skip = digest("seen", Some(seen))?;
        self.run_fetch(py, key, Wait::Once, skip)
    }

    /// `try_claim` as an awaitable resolving to the same.
    fn _try_claim_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        seen: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let skip = digest("seen", Some(seen))?;
        self.run_fetch_async(py, key, Wait::Once, skip)
    }

    /// Drops `key`'s value and any fill in progress; True when a value was dropped.
    fn invalidate(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (invalidated, about) = self.entry_op(key, EntryOp::Invalidate)?;
        blocking::wait(py, invalidated)?.about(py, &about)
    }

    /// `invalidate` as an awaitable (runs to its end even if the awaiting task is cancelled).
    fn _invalidate_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (invalidated, about) = self.entry_op(key, EntryOp::Invalidate)?;
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(invalidated.await) },
            move |py, dropped| dropped.about(py, &about)?.into_bound_py_any(py),
        )
    }

    /// Whether the fill claim of `key` is held with `token` (a FillClaim's): a fill's guard
    /// against waiting for its own claim through another client of the same server.
    fn holds_claim(&self, py: Python<'_>, key: &Bound<'_, PyAny>, token: &str) -> PyResult<bool> {
        let (held, about) = self.entry_op(key, EntryOp::ClaimHeldBy(token.to_string()))?;
        blocking::wait(py, held)?.about(py, &about)
    }

    /// `holds_claim` as an awaitable resolving to the same.
    fn _holds_claim_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        token: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (held, about) = self.entry_op(key, EntryOp::ClaimHeldBy(token.to_string()))?;
        awaitable::spawn(
            py,
            OnCancel::Abort,
            async move { Ok(held.await) },
            move |py, held| held.about(py, &about)?.into_bound_py_any(py),
        )
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    #[getter]
    fn ttl(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    #[getter]
    fn lock_ttl(&self) -> f64 {
        self.lock_ttl.as_secs_f64()
    }

    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.timeout.map(|t| t.as_secs_f64())
    }

    fn __repr__(&self) -> String {
        format!(
            "CacheStore(ttl={}, lock_ttl={}, timeout={})",
            self.ttl.as_secs_f64(),
            self.lock_ttl.as_secs_f64(),
            self.timeout
                .map_or("None".to_string(), |t| t.as_secs_f64().to_string())
        )
    }
}

/// The fill claim of one entry, held while the fill runs (its lease is renewed meanwhile).
/// Exactly one of `store` or `abandon` settles it (one round trip; on a direct connection where
/// the deployment allows); dropped unsettled, it is given back.
#[pyclass(frozen, weakref, module = "redmutex._core", name = "FillClaim")]
pub struct PyFillClaim {
    claim: Mutex<Option<AnyClaim>>,
    token: String,
    /// Outlives the claim's settling, for `lapsed`.
    lease_end: Arc<ClaimLease>,
    /// The entry, named by the claim's errors.
    about: About,
}

impl PyFillClaim {
    fn take(&self) -> PyResult<AnyClaim> {
        self.claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                Error::Usage("this fill claim was already stored or given back".into()).into()
            })
    }
}

#[pymethods]
impl PyFillClaim {
    /// Stores the payload for the store's ttl and wakes the waiters. False: not stored, since
    /// the claim is not ours any more (its lease ended, or the entry was invalidated meanwhile).
    fn store(&self, py: Python<'_>, payload: &[u8]) -> PyResult<bool> {
        let claim = self.take()?;
        match claim {
            AnyClaim::Single(claim) => {
                blocking::run(py, move || claim.store_blocking(payload))?.about(py, &self.about)
            }
            AnyClaim::Quorum(claim) => {
                blocking::wait(py, claim.store(payload))?.about(py, &self.about)
            }
        }
    }

    /// `store` as an awaitable; it runs to its end even if the awaiting task is cancelled.
    fn _store_async<'py>(&self, py: Python<'py>, payload: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let claim = self.take()?;
        let payload = payload.to_vec();
        let about = self.about.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(claim.store(&payload).await) },
            move |py, stored| stored.about(py, &about)?.into_bound_py_any(py),
        )
    }

    /// `abandon` as an awaitable; it runs to its end even if the awaiting task is cancelled.
    fn _abandon_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let claim = self.take()?;
        let about = self.about.clone();
        awaitable::spawn(
            py,
            OnCancel::Finish,
            async move { Ok(claim.abandon().await) },
            move |py, given_back| given_back.about(py, &about)?.into_bound_py_any(py),
        )
    }

    /// Gives the claim back without a value; one waiter takes the fill over. False: not ours.
    fn abandon(&self, py: Python<'_>) -> PyResult<bool> {
        let claim = self.take()?;
        match claim {
            AnyClaim::Single(claim) => {
                blocking::run(py, move || claim.abandon_blocking())?.about(py, &self.about)
            }
            AnyClaim::Quorum(claim) => blocking::wait(py, claim.abandon())?.about(py, &self.about),
        }
    }

    /// True until stored or given back.
    #[getter]
    fn held(&self) -> bool {
        self.claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    #[getter]
    fn token(&self) -> &str {
        &self.token
    }

    /// True after a refused store that went out once the claim's lease had run out (the fill
    /// outlived it): another caller may have claimed and filled the entry meanwhile. False for
    /// a claim that somebody ended while its lease still ran (the entry was invalidated).
    #[getter]
    fn lapsed(&self) -> bool {
        self.lease_end.lapsed()
    }

    fn __repr__(&self) -> String {
        format!("FillClaim(token='{}', held={})", self.token, self.held())
    }
}
