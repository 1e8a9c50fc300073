//! The asyncio bridge: runs an engine future on the tokio runtime and resolves an asyncio
//! future on the caller's event loop when it ends. The loop never blocks; cancelling the asyncio
//! future aborts the tokio task (whose drop guards clean up in Redis).

use std::future::Future;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::engine::{runtime, Error};

/// Aborts the tokio task when the asyncio future it feeds is cancelled (a done-callback).
#[pyclass(frozen)]
struct AbortOnCancel {
    task: tokio::task::AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    #[pyo3(signature = (*args))]
    fn __call__(&self, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let cancelled = match args.get_item(0) {
            Ok(fut) => fut.call_method0("cancelled")?.is_truthy()?,
            Err(_) => false,
        };
        if cancelled {
            self.task.abort();
        }
        Ok(())
    }
}

/// Whether cancelling the awaitable stops the operation. Acquiring stops (and cleans up);
/// releasing runs to its end regardless, so a hold is given back exactly once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnCancel {
    Abort,
    Finish,
}

/// An awaitable for `fut`, whose output is turned into a Python object by `convert`.
pub fn spawn<'py, F, T, C>(
    py: Python<'py>,
    on_cancel: OnCancel,
    fut: F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let py_future = event_loop.call_method0("create_future")?;
    let resolve = py.import("redmutex._aio_bridge")?.getattr("resolve")?;
    let target = py_future.clone().unbind();
    let loop_ref = event_loop.unbind();
    let resolve_ref = resolve.unbind();
    let handle = runtime::handle()?;
    let task = handle.spawn(async move {
        let outcome = fut.await;
        Python::attach(|py| {
            let (value, error) = match outcome.map_err(PyErr::from).and_then(|v| convert(py, v)) {
                Ok(value) => (value, py.None().into_bound(py)),
                Err(err) => (
                    py.None().into_bound(py),
                    err.into_value(py).into_bound(py).into_any(),
                ),
            };
            // The loop may be closed by now; then nobody is waiting for the answer.
            let _ = loop_ref.bind(py).call_method1(
                "call_soon_threadsafe",
                (resolve_ref.bind(py), target.bind(py), value, error),
            );
        });
    });
    if on_cancel == OnCancel::Abort {
        let canceller = AbortOnCancel {
            task: task.abort_handle(),
        };
        py_future.call_method1("add_done_callback", (canceller,))?;
    }
    Ok(py_future)
}
