//! `redmutex.MultiLock`: several lock names held together by one object, all or none.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use super::args;
use super::client::{coerce_client, PyClient};
use super::errors::{type_error, value_error, About};
use super::hold::{self, lock_like_methods, Held, HoldCore, LockLike};
use crate::engine::hold::Holder;
use crate::engine::multilock::{distinct, MultiLockHandle, MultiSpec};

impl Held for MultiLockHandle {
    type Primitive = MultiSpec;
    fn holder(&self) -> &Holder<MultiSpec> {
        MultiLockHandle::holder(self)
    }
}

/// Several lock names held together, all or none: `with MultiLock(client, ["a", "b"]): ...`.
///
/// The names are `Lock` names: a MultiLock and single Locks on the same names exclude each
/// other. `ttl: float = 10.0` is the lease of every name; `timeout: float | None = None` the
/// default wait of `acquire()` and `with`. Options: `auto_renew=False`, `on_lost=None`. A name
/// given twice counts once. Two MultiLocks over overlapping names never deadlock.
#[pyclass(frozen, weakref, module = "redmutex", name = "MultiLock")]
pub struct PyMultiLock {
    client: Py<PyClient>,
    core: HoldCore<MultiLockHandle>,
    /// The distinct names, in the caller's order.
    names: Vec<String>,
}

impl LockLike for PyMultiLock {
    type Handle = MultiLockHandle;
    fn core(&self) -> &HoldCore<MultiLockHandle> {
        &self.core
    }
    fn blocking_context() -> PyResult<()> {
        Ok(())
    }
}

/// The `names` argument: an iterable of non-empty str (not a str itself), each once.
fn names_arg(names: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    if names.is_instance_of::<PyString>() || names.is_instance_of::<PyBytes>() {
        return Err(type_error(
            "names",
            "a sequence of str (a single name: use [name])",
            names,
        ));
    }
    let items = names
        .try_iter()
        .map_err(|_| type_error("names", "a sequence of str", names))?;
    let mut all = Vec::new();
    for item in items {
        let item = item?;
        if !item.is_instance_of::<PyString>() {
            return Err(type_error(
                "names",
                "a sequence of str, with an item",
                &item,
            ));
        }
        all.push(args::name("names", &item)?);
    }
    if all.is_empty() {
        return Err(value_error("names", "give at least one name"));
    }
    Ok(distinct(all))
}

lock_like_methods! {
    PyMultiLock;
    /// Takes every name, or none; False when not acquired in time (`blocking=False` tries once).
    fn acquire;
    /// Releases every name still held (LockNotOwnedError when none, LockLostError when the lease
    /// of any name was lost: the others are released all the same).
    fn release;
    /// The lease of every name now ends `ttl` (default: the MultiLock's ttl) from now.
    fn extend;
    /// This object holds every name, checked against Redis.
    fn owned;
    fn _acquire_async();

    #[new]
    #[pyo3(signature = (client, names, *, ttl=10.0, timeout=None, auto_renew=None, on_lost=None))]
    fn new(
        client: &Bound<'_, PyAny>,
        names: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::ttl)] ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let names = names_arg(names)?;
        let ttl = args::seconds("ttl", ttl)?;
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let on_lost = hold::on_lost_arg(on_lost)?;
        let client = coerce_client(client)?;
        let shown: Vec<String> = names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        let label = shown.join(", ");
        let handle =
            MultiLockHandle::new(client.get().inner.clone(), names, ttl, auto_renew)?;
        let mut core =
            HoldCore::new(handle, "multilock", label.as_bytes(), ttl, default_timeout, on_lost);
        // Its errors are about several names: the message lists them, `.name` is None.
        core.about = About::several("multilock", &label);
        Ok(PyMultiLock {
            core,
            client,
            names: shown,
        })
    }

    /// The names, each once, in the order given.
    #[getter]
    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.names)
    }

    /// The fence of each name of the current hold, None when not held.
    #[getter]
    fn fences<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(fences) = self.core.handle.fences() else {
            return Ok(None);
        };
        let dict = PyDict::new(py);
        for (name, fence) in self.names.iter().zip(fences) {
            dict.set_item(name, fence)?;
        }
        Ok(Some(dict))
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        let names: Vec<String> = self
            .names
            .iter()
            .map(|n| format!("'{}'", super::errors::shortened(n)))
            .collect();
        format!(
            "MultiLock([{}], ttl={}, held={})",
            names.join(", "),
            self.core.ttl(),
            self.core.held_repr()
        )
    }
}
