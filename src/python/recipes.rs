//! The classic recipe's two steps (Redis in Action's acquire_lock/release_lock) for a
//! caller-chosen identifier; the Python functions around them live in `redmutex/_recipes.py`.

use pyo3::prelude::*;

use std::time::Instant;

use super::args;
use super::blocking;
use super::client::coerce_client;
use super::errors::{About, Named};
use super::recipe_holds::{self, OwnDelete};
use crate::engine::executor;
use crate::engine::lock::{self, LockSpec, Wait};
use crate::engine::Backend;
use crate::protocol::lease;
use crate::protocol::lock as steps;

fn spec_for(
    client: &Bound<'_, PyAny>,
    name: &Bound<'_, PyAny>,
    lease: std::time::Duration,
) -> PyResult<(std::sync::Arc<crate::engine::Client>, LockSpec)> {
    let name = args::name("lockname", name)?;
    let client = coerce_client(client)?.get().inner.clone();
    let keys = client.keys_named("lockname", &name).map_err(PyErr::from)?;
    Ok((
        client,
        LockSpec {
            name,
            keys,
            lease,
            fair: false,
            replicas: 0,
            reentrant: false,
            queued: false,
        },
    ))
}

/// Takes `lockname` for `identifier` with a lease of `ltime` s, trying for `atime` s.
/// Returns the fence, or None when not acquired in time. `drawn`: the library drew the
/// identifier (nobody else has it), so an attempt whose outcome is unknown is given back
/// (see `lock::acquire_on`).
#[pyfunction]
#[pyo3(signature = (conn, lockname, identifier, atime, ltime, *, drawn = false))]
#[allow(clippy::too_many_arguments)]
pub fn acquire_token(
    py: Python<'_>,
    conn: &Bound<'_, PyAny>,
    lockname: &Bound<'_, PyAny>,
    identifier: &Bound<'_, PyAny>,
    atime: &Bound<'_, PyAny>,
    ltime: &Bound<'_, PyAny>,
    drawn: bool,
) -> PyResult<Option<i64>> {
    let lease = args::seconds(
        "ltime",
        args::lease_seconds(
            "ltime",
            ltime,
            "for long holds use redmutex.Lock(..., auto_renew=True)",
        )?,
    )?;
    let wait = Wait::from_timeout(args::forever_or_duration("atime", atime, 0.0)?);
    let token = String::from_utf8(args::name("identifier", identifier)?).unwrap_or_default();
    let (client, spec) = spec_for(conn, lockname, lease)?;
    let about = About::new("lock", &String::from_utf8_lossy(&spec.name));
    let lock_key = spec.keys.lock();
    let (granted, backend) = blocking::wait(py, {
        let token = token.clone();
        async move {
            let backend = client.backend()?;
            let granted = lock::acquire_on(&backend, &spec, &token, wait, !drawn).await?;
            Ok((granted, backend))
        }
    })?
    .about(py, &about)?;
    if let (Some(g), Backend::Single(shared)) = (&granted, &backend) {
        recipe_holds::taken(
            shared,
            &lock_key,
            &token,
            lease::deadline(g.sent_at, g.lease),
            g.fence,
        );
    }
    Ok(granted.map(|g| g.fence))
}

/// Compare-and-delete for `identifier`; False when it did not hold the lock ("we lost it").
#[pyfunction]
pub fn release_token(
    py: Python<'_>,
    conn: &Bound<'_, PyAny>,
    lockname: &Bound<'_, PyAny>,
    identifier: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let token = String::from_utf8(args::name("identifier", identifier)?).unwrap_or_default();
    let (client, spec) = spec_for(conn, lockname, std::time::Duration::from_secs(1))?;
    let about = About::new("lock", &String::from_utf8_lossy(&spec.name));
    let lock_key = spec.keys.lock();
    // The record of holds is read and written here, with the GIL (see `holds_by_token`).
    let backend = client.backend();
    let single = match &backend {
        Ok(Backend::Single(shared)) => Some(shared.clone()),
        _ => None,
    };
    let noted = single
        .as_ref()
        .and_then(|shared| recipe_holds::noted(shared, &lock_key, &token));
    let sent_at = Instant::now();
    let outcome = blocking::wait(py, {
        let (token, noted) = (token.clone(), noted.clone());
        async move {
            let backend = backend?;
            let Backend::Single(shared) = &backend else {
                return lock::release_on(&backend, &spec.keys, &token).await;
            };
            let epoch = shared.fault_epoch();
            let fence = noted.as_ref().map(|hold| hold.fence);
            let released = lock::release_chosen(shared, &spec.keys, &token, fence).await?;
            let Some(hold) = noted.filter(|_| !released) else {
                return Ok(released);
            };
            // A "not ours" may be the work of a send of our own that deleted the token: this
            // one's first send, when the connection broke under it, or an earlier release that
            // got no answer (see `recipe_holds`).
            let faulted = shared.fault_epoch() != epoch;
            Ok(match hold.own_delete(shared, sent_at, faulted) {
                OwnDelete::No => false,
                OwnDelete::Likely => true,
                OwnDelete::AfterRestart => {
                    let read = steps::fence_unmoved(&spec.keys, hold.fence);
                    executor::run(shared, &read).await == Ok(true)
                }
            })
        }
    })?;
    if let Some(shared) = &single {
        match &outcome {
            Ok(_) => recipe_holds::forget(shared, &lock_key, &token),
            Err(err) if err.is_connection() => {
                recipe_holds::unanswered(shared, &lock_key, &token, sent_at)
            }
            // Refused (an ACL, a script error): nothing ran, the hold stands as it was.
            Err(_) => {}
        }
    }
    outcome.about(py, &about)
}
