//! The one error funnel: every engine error becomes the contract's Python exception here.
//! The classes live in `redmutex/errors.py` (they need multiple inheritance).

use std::sync::Arc;

use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};
use pyo3::PyTypeInfo;

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

/// How many characters of a name a message shows (a name may be megabytes long).
const SHOWN: usize = 200;

/// `name`, or its first `SHOWN` characters and "…" when longer.
pub fn shortened(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &name[..cut]).into(),
        None => name.into(),
    }
}

/// The primitive an error is about, e.g. `lock 'orders'`. The binding knows every object's name
/// (the engine does not say it): errors of its methods pass through `About::error`, which says
/// the name in the message (shortened) and gives it whole as the exception's `.name`.
#[derive(Clone)]
pub struct About {
    /// "lock", "semaphore", "read lock", "write lock".
    kind: &'static str,
    name: Arc<str>,
    /// False for a primitive of several names (a MultiLock, `name` lists them): `.name` is None.
    single: bool,
}

impl About {
    pub fn new(kind: &'static str, name: &str) -> Self {
        About {
            kind,
            name: name.into(),
            single: true,
        }
    }

    /// A primitive of several names, listed in `names` for the message; no single `.name`.
    pub fn several(kind: &'static str, names: &str) -> Self {
        About {
            single: false,
            ..About::new(kind, names)
        }
    }

    /// The same name as another kind of primitive (the read and write locks of an RWLock).
    pub fn as_kind(&self, kind: &'static str) -> Self {
        About {
            kind,
            ..self.clone()
        }
    }

    /// "lock 'orders'", the name shortened.
    pub fn label(&self) -> String {
        format!("{} '{}'", self.kind, shortened(&self.name))
    }

    /// The engine error as the contract's exception, naming the primitive.
    pub fn error(&self, py: Python<'_>, err: Error) -> PyErr {
        let class = match &err {
            Error::Connection(_) => ConnectionError::type_object(py),
            Error::Server(_) | Error::Usage(_) => LockError::type_object(py),
            Error::Timeout(_) => LockTimeoutError::type_object(py),
            Error::NotOwned(_) => LockNotOwnedError::type_object(py),
            Error::Lost(_) => LockLostError::type_object(py),
            Error::Quorum(_) => QuorumError::type_object(py),
            Error::Limit(_) => SemaphoreLimitError::type_object(py),
            Error::Invalid(_) | Error::Unsupported(_) => return err.into(),
        };
        self.raise(&class, &format!("{}: {err}", self.label()))
    }

    /// An exception of `class` (a LockError) with this message and `.name`.
    pub fn raise(&self, class: &Bound<'_, PyType>, message: &str) -> PyErr {
        let py = class.py();
        let kwargs = PyDict::new(py);
        let made = kwargs
            .set_item("name", self.single.then_some(&*self.name))
            .and_then(|()| class.call((message,), Some(&kwargs)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(err) => err,
        }
    }
}

/// `result.about(py, &about)`: an engine result whose error names the primitive.
pub trait Named<T> {
    fn about(self, py: Python<'_>, about: &About) -> PyResult<T>;
}

impl<T> Named<T> for std::result::Result<T, Error> {
    fn about(self, py: Python<'_>, about: &About) -> PyResult<T> {
        self.map_err(|err| about.error(py, err))
    }
}

/// A `TypeError` naming the argument and what it must be.
pub fn type_error(arg: &str, expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    // Qualified outside builtins: numpy's bool_ is named "bool" too.
    let got = got
        .get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{arg}: expected {expected}, not {got}"))
}

/// A `ValueError` naming the argument.
pub fn value_error(arg: &str, why: &str) -> PyErr {
    PyValueError::new_err(format!("{arg}: {why}"))
}
