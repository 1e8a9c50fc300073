//! Conversion and validation of arguments: bad input becomes a ValueError or TypeError naming
//! the argument, never an OverflowError or a panic.

use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use super::errors::{type_error, value_error};
use crate::protocol::lease::MAX_MS;

/// The longest time accepted (in seconds): what the wire can carry as milliseconds.
const MAX_SECONDS: f64 = (MAX_MS / 1000) as f64;

/// `value` as a Python int: an int, or an integer of another type (numpy's, anything with
/// `__index__`, as `range()` takes); None for a bool or anything else.
fn integer<'py>(value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyInt>> {
    if value.is_instance_of::<PyBool>() {
        return None;
    }
    if let Ok(int) = value.cast::<PyInt>() {
        return Some(int.clone());
    }
    if !value.hasattr("__index__").unwrap_or(false) {
        return None;
    }
    let index = value.call_method0("__index__").ok()?;
    index.cast_into::<PyInt>().ok()
}

/// A number of seconds as f64; integers of any size and floats, not bools or anything else.
fn number(arg: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    if value.is_instance_of::<PyBool>() {
        return Err(type_error(arg, "a number of seconds", value));
    }
    if value.is_instance_of::<PyFloat>() {
        return value.extract::<f64>();
    }
    if let Some(int) = integer(value) {
        return match int.extract::<i64>() {
            Ok(n) => Ok(n as f64),
            Err(_) => Err(value_error(arg, "too large")),
        };
    }
    Err(type_error(arg, "a number of seconds", value))
}

/// A finite duration of at least `min` seconds.
pub fn duration(arg: &str, value: &Bound<'_, PyAny>, min: f64) -> PyResult<Duration> {
    match forever_or_duration(arg, value, min)? {
        Some(d) => Ok(d),
        None => Err(value_error(arg, "must be finite")),
    }
}

/// A duration of at least `min` seconds, or `None` for `math.inf` (forever).
pub fn forever_or_duration(
    arg: &str,
    value: &Bound<'_, PyAny>,
    min: f64,
) -> PyResult<Option<Duration>> {
    let seconds = number(arg, value)?;
    if seconds.is_nan() {
        return Err(value_error(arg, "must be a number, not NaN"));
    }
    if seconds == f64::INFINITY {
        return Ok(None);
    }
    if seconds < min {
        return Err(value_error(
            arg,
            // As Python writes it: 1e-300 is not 300 digits.
            &format!("must be at least {min} seconds, got {}", py_repr(value)),
        ));
    }
    if seconds > MAX_SECONDS {
        return Err(value_error(
            arg,
            &format!("too large (at most {MAX_SECONDS} seconds)"),
        ));
    }
    Ok(Some(Duration::from_secs_f64(seconds)))
}

/// A lease (`ttl`, `lock_ttl`, `ltime`), validated, as seconds: the extractor of a constructor
/// argument whose pyo3 default is a number (`#[pyo3(from_py_with = args::ttl)]`), so that
/// `ttl=None` reaches it. `None` is refused: a lease is never infinite, and redis-py users read
/// `None` as "never expires" — taking it as the default would give them a 10 s lease silently.
pub fn lease_seconds(arg: &str, value: &Bound<'_, PyAny>, hint: &str) -> PyResult<f64> {
    if value.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected a number of seconds, not None (a lease is never infinite; {hint})"
        )));
    }
    duration(arg, value, 0.001).map(|d| d.as_secs_f64())
}

/// The `ttl` of Lock, Semaphore and RWLock.
pub fn ttl(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    lease_seconds("ttl", value, "for long holds use auto_renew=True")
}

/// The `lock_ttl` of the cache's fill claim (renewed while the fill runs).
pub fn lock_ttl(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    lease_seconds(
        "lock_ttl",
        value,
        "the fill claim is renewed while the fill runs; give its lease in seconds",
    )
}

/// Seconds that `lease_seconds` (or a default) gave, as a Duration.
pub fn seconds(arg: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| value_error(arg, "out of range"))
}

/// An optional timeout: `None` passes through as "not given".
pub fn timeout(arg: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Option<Duration>>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => forever_or_duration(arg, v, 0.0).map(Some),
    }
}

/// A non-empty `str`, as the UTF-8 bytes used in keys. A lone surrogate cannot be encoded: ValueError.
pub fn name(arg: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let s = value
        .cast::<PyString>()
        .map_err(|_| type_error(arg, "a str", value))?;
    let text = s.to_str().map_err(|_| {
        value_error(
            arg,
            "must be valid Unicode (a lone surrogate cannot be stored)",
        )
    })?;
    if text.is_empty() {
        return Err(value_error(arg, "must not be empty"));
    }
    Ok(text.as_bytes().to_vec())
}

/// A whole number within `0..=max`.
pub fn count(arg: &str, value: &Bound<'_, PyAny>, min: u64, max: u64) -> PyResult<u64> {
    let Some(int) = integer(value) else {
        return Err(type_error(arg, "an int", value));
    };
    match int.extract::<i64>() {
        Ok(n) if n >= min as i64 && (n as u64) <= max => Ok(n as u64),
        _ => Err(value_error(
            arg,
            &format!("must be between {min} and {max}"),
        )),
    }
}

/// A bool (strictly: an option given as 1 is more likely a slip than a choice).
pub fn flag(arg: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    value
        .cast::<PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| type_error(arg, "a bool", value))
}

/// `acquire`'s `blocking`: a bool, or an int standing for one (`acquire(0)`, as
/// `threading.Lock.acquire` takes it).
pub fn blocking(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    match integer(value) {
        Some(int) => int.is_truthy(),
        None => flag("blocking", value),
    }
}

/// `repr(value)` for a message, or "?" when even that fails.
fn py_repr(value: &Bound<'_, PyAny>) -> String {
    value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
}
