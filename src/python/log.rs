//! Lines on the `redmutex` logger of Python's logging (no secrets ever reach these messages).

use pyo3::prelude::*;

fn logger(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("logging")?
        .call_method1("getLogger", ("redmutex",))
}

pub fn warning(py: Python<'_>, message: &str) {
    if let Ok(logger) = logger(py) {
        let _ = logger.call_method1("warning", ("%s", message));
    }
}

/// An error line carrying a Python exception's traceback.
pub fn error_with(py: Python<'_>, message: &str, err: &PyErr) {
    if let Ok(logger) = logger(py) {
        let kwargs = pyo3::types::PyDict::new(py);
        // The (type, value, traceback) triple: the value alone may not carry its traceback.
        let exc_info = (err.get_type(py), err.value(py), err.traceback(py));
        if kwargs.set_item("exc_info", exc_info).is_ok() {
            let _ = logger.call_method("error", ("%s", message), Some(&kwargs));
        }
    }
}
