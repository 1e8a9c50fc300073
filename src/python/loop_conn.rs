//! The asyncio loop path: the event loop itself drives one non-blocking connection per (loop,
//! client) to the client's single server, so a one-round-trip step (a first acquire attempt,
//! release, extend, `owned`) costs no runtime thread and no wake-up of the loop from outside.
//!
//! A `LoopConn` is the asyncio protocol of that connection (`loop.create_connection`, made on
//! first use by `redmutex._aio_bridge.open_connection`; until it is ready the calls go through
//! the runtime). It is an `asyncio.BufferedProtocol` (through `_aio_bridge.LoopProtocol`): the
//! transport reads into one buffer of its own (`get_buffer`/`buffer_updated`), where a plain
//! protocol gets a new 256 KiB bytes object per read, which glibc maps and unmaps each time.
//! Requests go out with `transport.write`; replies are parsed here (`protocol::resp`) and
//! matched to their calls in order, each call's `Finish` running on the loop's thread. A script
//! answered NOSCRIPT is loaded (SCRIPT LOAD) and sent again.
//!
//! Faults: a call unanswered after the client's command timeout fails with the runtime path's
//! timeout error; its reply may still come, so it stays in line as a ghost whose `Late` hook
//! runs when it is answered or the connection ends (an acquire gives back what it may have
//! taken), and the connection takes no new calls (the runtime serves the loop meanwhile) and
//! closes once its line is empty, ghosts included: a ghost's request may still be on its way, and
//! the hook must run after it. A ghost unanswered for `OVERDUE_KEEP` is given up. A
//! connection that breaks fails every call in line with `resend` (the caller sends it again
//! through the runtime, which retries as its own calls do); the next call opens a new one.
//! Only one server reached over plain TCP or a unix socket is served here; TLS, Sentinel,
//! Cluster and Redlock keep the runtime path.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict};
use pyo3::{PyTraverseError, PyVisit};
use redis::{ConnectionAddr, Value};

use super::awaitable::RUNTIME_CALLS;
use crate::engine::client::{Client, Deployment};
use crate::engine::error::{timed_out, Error};
use crate::engine::node::OVERDUE_KEEP;
use crate::protocol::resp::{self, Packed};
use crate::protocol::url::Endpoint;

/// A call's outcome: its reply, or why it has none and whether the caller should send it again
/// through the runtime (`resend`: the connection broke, as the runtime's own calls retry).
pub type Reply = std::result::Result<Value, (Error, bool)>;

/// What a call does with its reply, on the loop's thread.
pub type Finish = Box<dyn for<'py> FnOnce(Python<'py>, Reply) + Send>;

/// Runs once a call that timed out is answered after all, or its connection ends.
pub type Late = Box<dyn FnOnce() + Send>;

/// How many calls the loop path served, for tests (see `_aio_calls`).
static LOOP_CALLS: AtomicU64 = AtomicU64::new(0);

/// A new connection is not tried again sooner than this after one failed to open.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The size of the buffer the transport reads into (replies here are a few bytes each).
const READ_BUFFER: usize = 64 * 1024;

enum Entry {
    /// A handshake command (AUTH, HELLO, SELECT): its reply must not be an error.
    Handshake,
    /// A SCRIPT LOAD sent before a call's second EVALSHA: the EVALSHA's reply tells.
    Load,
    Call(Call),
    /// A call that timed out, still to be answered: its request may still run, so the
    /// connection waits for its answer (its hook runs then) until `until` (see `OVERDUE_KEEP`).
    Ghost {
        late: Option<Late>,
        until: Instant,
    },
}

struct Call {
    sent_at: Instant,
    /// The SCRIPT LOAD and the request again, for a NOSCRIPT reply (once).
    again: Option<Packed>,
    finish: Finish,
    late: Option<Late>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Connecting,
    Handshake,
    Ready,
    /// Takes no new calls (a call timed out); closes once its line is empty.
    Draining,
    Closed,
}

struct Inner {
    phase: Phase,
    transport: Option<Py<PyAny>>,
    buf: Vec<u8>,
    line: VecDeque<Entry>,
    timer: bool,
    /// When the connection failed to open (no new one before `RETRY_AFTER`).
    failed_at: Option<Instant>,
}

/// The asyncio protocol of one loop's connection to one client's server. Made as a
/// `redmutex._aio_bridge.LoopProtocol` (this class and `asyncio.BufferedProtocol`, so that the
/// transport reads into `get_buffer`), from a `LoopSeed`.
#[pyclass(frozen, subclass, module = "redmutex._core", name = "LoopConn")]
pub struct LoopConn {
    inner: Mutex<Inner>,
    client: Weak<Client>,
    timeout: Duration,
    endpoint: String,
    handshake: Vec<Vec<u8>>,
    /// What the transport reads into; only the loop's thread touches it.
    rbuf: Py<PyByteArray>,
}

/// A `LoopConn` to be: `LoopConn(seed)` takes it (once).
#[pyclass(frozen, module = "redmutex._core", name = "LoopSeed")]
pub struct LoopSeed(Mutex<Option<LoopConn>>);

/// The running loop's ready connection (`ready_for`), and that loop.
pub struct Ready<'py> {
    pub conn: Bound<'py, LoopConn>,
    pub event_loop: Bound<'py, PyAny>,
}

impl<'py> Ready<'py> {
    /// A new future of the loop.
    pub fn create_future(&self) -> PyResult<Bound<'py, PyAny>> {
        self.event_loop
            .call_method0(pyo3::intern!(self.event_loop.py(), "create_future"))
    }
}

/// What to do after the line's lock is let go.
enum Then {
    Finish(Finish, Reply),
    Late(Late),
}

fn run(py: Python<'_>, then: Vec<Then>) {
    for then in then {
        match then {
            Then::Finish(finish, reply) => finish(py, reply),
            Then::Late(late) => late(),
        }
    }
}

impl LoopConn {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn error(&self, err: Error) -> Error {
        err.at(&self.endpoint)
    }

    /// Sends `packed`; `finish` gets its reply. Only on a ready connection (`ready_for`).
    pub fn send(
        slf: &Bound<'_, LoopConn>,
        packed: Packed,
        finish: Finish,
        late: Option<Late>,
    ) -> PyResult<()> {
        let this = slf.get();
        let py = slf.py();
        let mut inner = this.inner();
        let Some(transport) = inner.transport.as_ref().map(|t| t.clone_ref(py)) else {
            drop(inner);
            let err = this.error(Error::Connection("connection failed: not connected".into()));
            finish(py, Err((err, true)));
            return Ok(());
        };
        LOOP_CALLS.fetch_add(1, Ordering::Relaxed);
        let bytes = PyBytes::new(py, &packed.request);
        // Kept for a NOSCRIPT answer: only a script's call may be sent again.
        let again = packed.load.is_some().then_some(packed);
        inner.line.push_back(Entry::Call(Call {
            sent_at: Instant::now(),
            again,
            finish,
            late,
        }));
        let arm = !inner.timer;
        inner.timer = true;
        drop(inner);
        if let Err(err) = transport.call_method1(py, "write", (bytes,)) {
            // Not sent: the connection is given up, and its calls (this one too) go through
            // the runtime; the next call opens a new one.
            let why = err.to_string();
            let (then, transport) = {
                let mut inner = this.inner();
                let then = this.close_line(&mut inner, &why);
                (then, inner.transport.take())
            };
            if let Some(transport) = transport {
                let _ = transport.call_method0(py, "abort");
            }
            run(py, then);
            return Ok(());
        }
        if arm {
            this.arm(slf, this.timeout)?;
        }
        Ok(())
    }

    fn arm(&self, slf: &Bound<'_, LoopConn>, after: Duration) -> PyResult<()> {
        let event_loop = running_loop(slf.py())?;
        let callback = slf.getattr("_on_timer")?;
        event_loop.call_method1("call_later", (after.as_secs_f64(), callback))?;
        Ok(())
    }

    fn write(&self, py: Python<'_>, transport: &Py<PyAny>, bytes: &[u8]) -> PyResult<()> {
        transport.call_method1(py, "write", (PyBytes::new(py, bytes),))?;
        Ok(())
    }

    /// Answers the calls whose replies are in `inner.buf`.
    fn received(
        &self,
        py: Python<'_>,
        mut inner: std::sync::MutexGuard<'_, Inner>,
    ) -> PyResult<()> {
        let mut then = Vec::new();
        let mut start = 0;
        let mut broken = None;
        while start < inner.buf.len() {
            let frame = match inner.buf.get(start..).map(resp::frame_len) {
                Some(Ok(Some(len))) => {
                    let frame = inner.buf.get(start..start + len).map(resp::parse);
                    start += len;
                    frame
                }
                Some(Ok(None)) => break,
                Some(Err(_)) | None => None,
            };
            let value = match frame {
                Some(Ok(Value::Push { .. })) => continue,
                Some(Ok(value)) => value,
                _ => {
                    broken = Some("the server sent a reply that is not RESP");
                    break;
                }
            };
            let Some(entry) = inner.line.pop_front() else {
                broken = Some("the server sent a reply to no request");
                break;
            };
            match entry {
                Entry::Handshake => {
                    if let Value::ServerError(err) = &value {
                        let err = Error::from(redis::RedisError::from(err.clone()));
                        crate::python::log::warning(
                            py,
                            &format!(
                                "redmutex.aio: the event loop's own connection could not be set \
                                 up ({}); the runtime serves this loop",
                                self.error(err)
                            ),
                        );
                        inner.failed_at = Some(Instant::now());
                        broken = Some("refused the handshake");
                        break;
                    }
                    if !inner.line.iter().any(|e| matches!(e, Entry::Handshake))
                        && inner.phase == Phase::Handshake
                    {
                        inner.phase = Phase::Ready;
                    }
                }
                Entry::Load => {}
                Entry::Ghost { late, .. } => then.extend(late.map(Then::Late)),
                Entry::Call(mut call) => {
                    if resp::is_noscript(&value) {
                        if let (Some(again), Some(transport)) =
                            (call.again.take(), inner.transport.as_ref())
                        {
                            let transport = transport.clone_ref(py);
                            if let Some(load) = &again.load {
                                self.write(py, &transport, load)?;
                                inner.line.push_back(Entry::Load);
                            }
                            self.write(py, &transport, &again.request)?;
                            inner.line.push_back(Entry::Call(call));
                            continue;
                        }
                    }
                    let reply = match value {
                        Value::ServerError(err) => {
                            // LOADING (a restarted server reading its data back): nothing ran;
                            // sent again through the runtime, which waits the load out
                            // (`connect::Restart`) as it does for every single-server call, and
                            // judged as a first send (`loop_hold::one_step`).
                            let err = Error::from(redis::RedisError::from(err));
                            let resend = err.is_restarting();
                            Err((err, resend))
                        }
                        value => Ok(value),
                    };
                    then.push(Then::Finish(call.finish, reply));
                }
            }
        }
        let used = start.min(inner.buf.len());
        inner.buf.drain(..used);
        let mut close = None;
        if let Some(why) = broken {
            then.extend(self.close_line(&mut inner, why));
            close = inner.transport.take();
        } else if inner.phase == Phase::Draining && inner.line.is_empty() {
            inner.phase = Phase::Closed;
            close = inner.transport.take();
        }
        drop(inner);
        if let Some(transport) = close {
            transport.call_method0(py, "close")?;
        }
        run(py, then);
        Ok(())
    }

    /// Ends the connection now (see `close_line`) and closes its transport.
    fn shut(&self, py: Python<'_>, mut inner: MutexGuard<'_, Inner>, why: &str) -> PyResult<()> {
        let then = self.close_line(&mut inner, why);
        let transport = inner.transport.take();
        drop(inner);
        if let Some(transport) = transport {
            transport.call_method0(py, "close")?;
        }
        run(py, then);
        Ok(())
    }

    /// Hands a duplicate of the socket to the runtime with the hooks of the calls in line, to
    /// run as their replies come (`engine::loop_leftover`); the calls themselves still fail as
    /// the line closes. Nothing to do when no call in line has a hook.
    #[cfg(unix)]
    fn leave_to_runtime(&self, py: Python<'_>, inner: &mut Inner) -> PyResult<()> {
        use crate::engine::loop_leftover::{self, Family, Leftover};
        use std::os::fd::{BorrowedFd, RawFd};

        let hooked = inner.line.iter().any(|entry| match entry {
            Entry::Call(call) => call.late.is_some(),
            Entry::Ghost { late, .. } => late.is_some(),
            Entry::Handshake | Entry::Load => false,
        });
        let Some(transport) = inner.transport.as_ref().filter(|_| hooked) else {
            return Ok(());
        };
        let sock = transport.call_method1(py, "get_extra_info", ("socket",))?;
        let sock = sock.bind(py);
        if sock.is_none() {
            return Ok(());
        }
        let fd: RawFd = sock.call_method0("fileno")?.extract()?;
        if fd < 0 {
            return Ok(());
        }
        let family = if sock
            .getattr("family")?
            .eq(py.import("socket")?.getattr("AF_UNIX")?)?
        {
            Family::Unix
        } else {
            Family::Tcp
        };
        // SAFETY: `fd` is the open transport's socket: it stays open while this runs (the GIL
        // is held, and only the transport closes it). The duplicate is ours to close.
        let socket = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
        let now = Instant::now();
        let mut until = now;
        let line = inner
            .line
            .iter_mut()
            .map(|entry| match entry {
                Entry::Call(call) => {
                    until = until.max(call.sent_at + self.timeout + OVERDUE_KEEP);
                    call.late.take()
                }
                Entry::Ghost { late, until: kept } => {
                    until = until.max(*kept);
                    late.take()
                }
                Entry::Handshake | Entry::Load => None,
            })
            .collect();
        loop_leftover::finish(Leftover {
            socket,
            family,
            read: std::mem::take(&mut inner.buf),
            line,
            until,
        });
        Ok(())
    }

    /// Ends the connection: every call in line fails (to be sent again through the runtime),
    /// every ghost's hook runs.
    fn close_line(&self, inner: &mut Inner, why: &str) -> Vec<Then> {
        inner.phase = Phase::Closed;
        inner.buf.clear();
        let err = self.error(Error::Connection(format!("connection failed: {why}")));
        inner
            .line
            .drain(..)
            .filter_map(|entry| match entry {
                Entry::Call(call) => {
                    let mut then = vec![Then::Finish(call.finish, Err((err.clone(), true)))];
                    then.extend(call.late.map(Then::Late));
                    Some(then)
                }
                Entry::Ghost { late, .. } => late.map(|late| vec![Then::Late(late)]),
                Entry::Handshake | Entry::Load => None,
            })
            .flatten()
            .collect()
    }
}

#[pymethods]
impl LoopConn {
    /// Takes the connection `seed` holds (`ready_for` makes both).
    #[new]
    fn new(seed: &Bound<'_, LoopSeed>) -> PyResult<Self> {
        let conn = seed
            .get()
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        conn.ok_or_else(|| pyo3::exceptions::PyValueError::new_err("seed: already used"))
    }

    fn connection_made(&self, transport: Bound<'_, PyAny>) -> PyResult<()> {
        let py = transport.py();
        let mut inner = self.inner();
        let unwanted = inner.phase != Phase::Connecting;
        if unwanted {
            drop(inner);
            transport.call_method0("close")?;
            return Ok(());
        }
        let transport = transport.unbind();
        for command in &self.handshake {
            inner.line.push_back(Entry::Handshake);
            self.write(py, &transport, command)?;
        }
        inner.phase = if self.handshake.is_empty() {
            Phase::Ready
        } else {
            Phase::Handshake
        };
        inner.transport = Some(transport);
        Ok(())
    }

    /// `asyncio.BufferedProtocol`: where the transport reads to.
    fn get_buffer(&self, py: Python<'_>, sizehint: isize) -> Py<PyByteArray> {
        let _ = sizehint;
        self.rbuf.clone_ref(py)
    }

    /// `asyncio.BufferedProtocol`: `nbytes` were read into the buffer.
    fn buffer_updated(&self, py: Python<'_>, nbytes: usize) -> PyResult<()> {
        let rbuf = self.rbuf.bind(py);
        let mut inner = self.inner();
        // SAFETY: the bytearray is ours and nothing else resizes or writes it while this copy
        // runs (the GIL is held, and no Python code runs until the slice is dropped).
        let read = unsafe { rbuf.as_bytes() };
        let Some(read) = read.get(..nbytes) else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "nbytes: more than the buffer holds",
            ));
        };
        inner.buf.extend_from_slice(read);
        self.received(py, inner)
    }

    /// `asyncio.Protocol` (used when the transport does not take a buffer protocol).
    fn data_received(&self, py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<()> {
        let mut inner = self.inner();
        inner.buf.extend_from_slice(data.as_bytes());
        self.received(py, inner)
    }

    fn eof_received(&self) -> bool {
        false
    }

    #[pyo3(signature = (exc=None))]
    fn connection_lost(&self, py: Python<'_>, exc: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let why = match &exc {
            Some(exc) => exc.str()?.to_string_lossy().into_owned(),
            None => "the server closed the connection".to_string(),
        };
        let then = {
            let mut inner = self.inner();
            inner.transport = None;
            self.close_line(&mut inner, &why)
        };
        run(py, then);
        Ok(())
    }

    fn pause_writing(&self) {}

    fn resume_writing(&self) {}

    /// The connection could not be opened: the runtime serves the loop for a while.
    fn _connect_failed(&self, py: Python<'_>) {
        let then = {
            let mut inner = self.inner();
            inner.failed_at = Some(Instant::now());
            inner.transport = None;
            self.close_line(&mut inner, "could not connect")
        };
        run(py, then);
    }

    /// Its client was closed or dropped: the connection takes no new calls, and closes once the
    /// calls sent on it are answered (at once when there are none). A later call of a client
    /// still alive opens a new one.
    fn _retire(&self, py: Python<'_>) -> PyResult<()> {
        let mut inner = self.inner();
        match inner.phase {
            // `connection_made` closes what it brings.
            Phase::Connecting => {
                inner.phase = Phase::Closed;
                return Ok(());
            }
            Phase::Closed | Phase::Draining => return Ok(()),
            Phase::Handshake | Phase::Ready => {}
        }
        if inner.line.iter().any(|e| matches!(e, Entry::Call(_))) {
            inner.phase = Phase::Draining;
            return Ok(());
        }
        self.shut(py, inner, "its client was closed")
    }

    /// Closes the connection (its event loop is closing). A call still unanswered whose hook
    /// gives back (an acquire that timed out, or that the closing runner cancelled) may have its
    /// request still on its way: the runtime takes the connection over and runs each hook after
    /// its call's reply (`leave_to_runtime`); the loop closes at once all the same.
    fn _close(&self, py: Python<'_>) -> PyResult<()> {
        let mut inner = self.inner();
        #[cfg(unix)]
        if let Err(err) = self.leave_to_runtime(py, &mut inner) {
            // The hooks left run as the line closes, at once, as they did before.
            crate::python::log::warning(
                py,
                &format!(
                    "redmutex.aio: the closing event loop's connection was not handed over: {err}"
                ),
            );
        }
        self.shut(py, inner, "its event loop closed")
    }

    /// The command timeout's check: calls unanswered for that long fail.
    fn _on_timer(slf: &Bound<'_, LoopConn>) -> PyResult<()> {
        let this = slf.get();
        let py = slf.py();
        let now = Instant::now();
        let mut then = Vec::new();
        let mut inner = this.inner();
        inner.timer = false;
        let mut next = None;
        let mut overdue = false;
        let mut given_up = false;
        for entry in inner.line.iter_mut() {
            let call = match entry {
                Entry::Call(call) => call,
                Entry::Ghost { until, .. } => {
                    if *until <= now {
                        given_up = true;
                    } else {
                        next = Some(next.map_or(*until, |n: Instant| n.min(*until)));
                    }
                    continue;
                }
                Entry::Handshake | Entry::Load => continue,
            };
            let due = call.sent_at + this.timeout;
            if due > now {
                next = Some(next.map_or(due, |n: Instant| n.min(due)));
                continue;
            }
            overdue = true;
            let late = call.late.take();
            let until = now + OVERDUE_KEEP;
            next = Some(next.map_or(until, |n: Instant| n.min(until)));
            if let Entry::Call(call) = std::mem::replace(entry, Entry::Ghost { late, until }) {
                let err = this.error(timed_out(this.timeout, "waiting for an answer"));
                then.push(Then::Finish(call.finish, Err((err, false))));
            }
        }
        if overdue && matches!(inner.phase, Phase::Ready | Phase::Handshake) {
            inner.phase = Phase::Draining;
        }
        let mut close = None;
        // A timed-out request may still be on its way to the server and run there: the
        // connection stays open until it is answered (`buffer_updated` runs its hook and closes
        // the drained connection then), so that what its hook sends (an acquire's give-back)
        // runs after it. Closing now would run the hook at once, before the request: an orphan
        // for a whole lease. Unanswered for `OVERDUE_KEEP`, it is given up (as the runtime's
        // nodes forget a timed-out call then), and the hooks run.
        let empty = inner.line.is_empty();
        if inner.phase == Phase::Draining && (empty || given_up) {
            then.extend(this.close_line(&mut inner, "timed out"));
            close = inner.transport.take();
            next = None;
        }
        if let Some(due) = next {
            inner.timer = true;
            drop(inner);
            this.arm(slf, due.saturating_duration_since(now))?;
        } else {
            drop(inner);
        }
        if let Some(transport) = close {
            transport.call_method0(py, "close")?;
        }
        run(py, then);
        Ok(())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(inner) = self.inner.try_lock() {
            if let Some(transport) = &inner.transport {
                visit.call(transport)?;
            }
        }
        visit.call(&self.rbuf)?;
        Ok(())
    }
}

/// The running event loop (`asyncio.get_running_loop()`).
pub fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
    })?
    .bind(py)
    .call0()
}

/// Where the loop path connects: a TCP (host, port) or a unix socket path, and the commands of
/// the connection's handshake.
struct Target {
    tcp: Option<(String, u16)>,
    path: Option<String>,
    handshake: Vec<Vec<u8>>,
}

/// Where the loop path connects for `client`; None when it does not serve it (TLS, Sentinel,
/// Cluster, Redlock).
fn target(client: &Client) -> Option<Target> {
    let Deployment::Single(endpoint) = &client.config().deployment else {
        return None;
    };
    let Endpoint::Direct(info) = &**endpoint else {
        return None;
    };
    let handshake = resp::handshake(info.redis_settings());
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => Some(Target {
            tcp: Some((host.clone(), *port)),
            path: None,
            handshake,
        }),
        ConnectionAddr::Unix(path) => Some(Target {
            tcp: None,
            path: Some(path.to_string_lossy().into_owned()),
            handshake,
        }),
        _ => None,
    }
}

/// The running loop's ready connection to `client`'s server; None when there is none yet (the
/// first call opens it, and the runtime serves the calls until it is ready), or the loop path
/// does not serve this client.
pub fn ready_for<'py>(py: Python<'py>, client: &Arc<Client>) -> PyResult<Option<Ready<'py>>> {
    let event_loop = running_loop(py)?;
    let conns = match event_loop.getattr(intern_attr(py)) {
        Ok(conns) => conns.cast_into::<PyDict>().map_err(PyErr::from)?,
        Err(_) => {
            let conns = PyDict::new(py);
            // A loop without attributes of its own (uvloop): the runtime serves it.
            if event_loop.setattr(intern_attr(py), &conns).is_err() {
                return Ok(None);
            }
            conns
        }
    };
    let key = Arc::as_ptr(client) as usize;
    if let Some(conn) = conns.get_item(key)? {
        let conn = conn.cast_into::<LoopConn>().map_err(PyErr::from)?;
        let (same, phase, failed_at) = {
            let this = conn.get();
            let inner = this.inner();
            let same = this
                .client
                .upgrade()
                .is_some_and(|c| Arc::ptr_eq(&c, client));
            (same, inner.phase, inner.failed_at)
        };
        if same {
            match phase {
                Phase::Ready => return Ok(Some(Ready { conn, event_loop })),
                Phase::Connecting | Phase::Handshake | Phase::Draining => return Ok(None),
                Phase::Closed if failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) => {
                    return Ok(None)
                }
                Phase::Closed => {}
            }
        }
    }
    let Some(Target {
        tcp,
        path,
        handshake,
    }) = target(client)
    else {
        return Ok(None);
    };
    let timeouts = client.config().timeouts;
    let seed = LoopSeed(Mutex::new(Some(LoopConn {
        inner: Mutex::new(Inner {
            phase: Phase::Connecting,
            transport: None,
            buf: Vec::new(),
            line: VecDeque::new(),
            timer: false,
            failed_at: None,
        }),
        client: Arc::downgrade(client),
        timeout: timeouts.command,
        endpoint: match &tcp {
            Some((host, port)) => format!("{host}:{port}"),
            None => path.clone().unwrap_or_default(),
        },
        handshake,
        rbuf: PyByteArray::new(py, &vec![0u8; READ_BUFFER]).unbind(),
    })));
    let bridge = py.import("redmutex._aio_bridge")?;
    retire_orphans(&conns)?;
    let conn = bridge.getattr("LoopProtocol")?.call1((seed,))?;
    conns.set_item(key, &conn)?;
    bridge.call_method1("track_conn", (key, &event_loop, &conn))?;
    let (host, port) = tcp.map_or((None, None), |(h, p)| (Some(h), Some(p)));
    bridge.call_method1(
        "open_connection",
        (
            &event_loop,
            &conn,
            host,
            port,
            path,
            timeouts.connect.as_secs_f64(),
        ),
    )?;
    Ok(None)
}

/// Retires (see `LoopConn::_retire`) and forgets the loop's connections whose client is gone:
/// nobody else would close them while the loop runs.
fn retire_orphans(conns: &Bound<'_, PyDict>) -> PyResult<()> {
    let mut orphans = Vec::new();
    for (key, conn) in conns.iter() {
        if let Ok(conn) = conn.cast_into::<LoopConn>() {
            if conn.get().client.strong_count() == 0 {
                orphans.push((key, conn));
            }
        }
    }
    for (key, conn) in orphans {
        conns.del_item(key)?;
        conn.get()._retire(conns.py())?;
    }
    Ok(())
}

/// Retires the event loops' connections of `client` (closed: see `Client::close`). Each is
/// retired on its loop's thread; only a process that used `redmutex.aio` has any.
pub fn retire_for(py: Python<'_>, client: &Arc<Client>) -> PyResult<()> {
    let modules = py.import("sys")?.getattr("modules")?;
    let Some(bridge) = modules
        .cast_into::<PyDict>()
        .map_err(PyErr::from)?
        .get_item("redmutex._aio_bridge")?
    else {
        return Ok(());
    };
    bridge.call_method1("retire_conns", (Arc::as_ptr(client) as usize,))?;
    Ok(())
}

fn intern_attr(py: Python<'_>) -> &Bound<'_, pyo3::types::PyString> {
    pyo3::intern!(py, "_redmutex_conns")
}

/// `_aio_calls()`: (calls served by the loop path, operations run on the runtime) so far, for
/// tests that check which path served a call.
#[pyfunction]
pub fn _aio_calls() -> (u64, u64) {
    (
        LOOP_CALLS.load(Ordering::Relaxed),
        RUNTIME_CALLS.load(Ordering::Relaxed),
    )
}
