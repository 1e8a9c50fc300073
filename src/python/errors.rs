//! The one error funnel: every engine error becomes the contract's Python exception here.
//! The classes live in `redmutex/errors.py` (they need multiple inheritance).

use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::engine::Error;

pyo3::import_exception!(redmutex.errors, LockError);
pyo3::import_exception!(redmutex.errors, LockTimeoutError);
pyo3::import_exception!(redmutex.errors, LockNotOwnedError);
pyo3::import_exception!(redmutex.errors, LockLostError);
pyo3::import_exception!(redmutex.errors, ConnectionError);
pyo3::import_exception!(redmutex.errors, QuorumError);
pyo3::import_exception!(redmutex.errors, SemaphoreLimitError);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Connection(m) => ConnectionError::new_err(m),
            Error::Server(m) | Error::Usage(m) => LockError::new_err(m),
            Error::Timeout(m) => LockTimeoutError::new_err(m),
            Error::NotOwned(m) => LockNotOwnedError::new_err(m),
            Error::Lost(m) => LockLostError::new_err(m),
            Error::Invalid(m) => PyValueError::new_err(m),
            Error::Quorum(m) => QuorumError::new_err(m),
            Error::Unsupported(m) => PyNotImplementedError::new_err(m),
            Error::Limit(m) => SemaphoreLimitError::new_err(m),
        }
    }
}

/// A `TypeError` naming the argument and what it must be.
pub fn type_error(arg: &str, expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    let got = got
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{arg}: expected {expected}, not {got}"))
}

/// A `ValueError` naming the argument.
pub fn value_error(arg: &str, why: &str) -> PyErr {
    PyValueError::new_err(format!("{arg}: {why}"))
}
