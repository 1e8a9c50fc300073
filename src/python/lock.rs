//! `redmutex.Lock`: a lease on a name, held by this object, used as `with` or acquire/release.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args;
use super::blocking;
use super::client::{coerce_client, PyClient};
use super::errors::Named;
use super::greenlets;
use super::hold::{self, lock_like_methods, CoreRef, HoldCore, LockLike};
use crate::engine::lock::LockHandle;
use crate::engine::Client;

/// A distributed mutex on Redis: `with Lock(client, "name", ttl=5): ...`.
///
/// `ttl: float = 10.0` is the lease in seconds (never None; use `auto_renew=True` for long
/// holds). `timeout: float | None = None` is the default wait of `acquire()` and `with`: None
/// waits forever, 0 tries once. Options: `auto_renew=False`, `fair=False`, `replicas=0`,
/// `on_lost=None`, `reentrant=False`. Ownership belongs to this object; with `reentrant=True`
/// to the calling thread (under gevent's patching, the greenlet), which may acquire again
/// while it holds (one release per acquire), through this object or another re-entrant Lock
/// of the same client and name.
#[pyclass(frozen, weakref, module = "redmutex", name = "Lock")]
pub struct PyLock {
    client: Py<PyClient>,
    core: HoldCore<LockHandle>,
    /// Re-entrant: the hold of each owning thread (`core` then never holds).
    owners: Option<Owners>,
}

/// The holds of a re-entrant Lock object, one per owning thread, made as threads first use it:
/// another thread of the same object is another owner and waits like any other waiter (the
/// same thread's hold through another object is found in `ThreadHolds`).
struct Owners {
    client: Arc<Client>,
    name: Vec<u8>,
    ttl: Duration,
    fair: bool,
    replicas: u32,
    auto_renew: bool,
    by_thread: Mutex<HashMap<u64, Arc<HoldCore<LockHandle>>>>,
}

/// (the engine client's address, the name, the thread: `greenlets::context`)
type ThreadKey = (usize, Vec<u8>, u64);

/// Every re-entrant Lock object's core for each thread, by (engine client, name, thread): the
/// owner is the thread, not the object, so a thread that holds a name through one object
/// re-enters that hold through any other re-entrant Lock of the same client and name (a
/// recursive function making its own `Lock(..., reentrant=True)` on each call).
#[derive(Default)]
struct ThreadHolds {
    cores: HashMap<ThreadKey, Vec<Weak<HoldCore<LockHandle>>>>,
    /// When the map grows to this many names, those whose objects are all gone are dropped.
    sweep_at: usize,
}

fn thread_holds() -> std::sync::MutexGuard<'static, ThreadHolds> {
    static HOLDS: OnceLock<Mutex<ThreadHolds>> = OnceLock::new();
    HOLDS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The one of `cores` (still alive) that holds now.
fn holding(cores: &[Weak<HoldCore<LockHandle>>]) -> Option<Arc<HoldCore<LockHandle>>> {
    cores
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.holder().token().is_some())
}

/// Whether nobody uses `core` now (no call under way) and it holds nothing.
fn unused(core: &Arc<HoldCore<LockHandle>>) -> bool {
    Arc::strong_count(core) == 1
        && Arc::strong_count(&core.handle) == 1
        && core.holder().token().is_none()
}

impl Owners {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<HoldCore<LockHandle>>>> {
        self.by_thread.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The core of the calling thread `me` (`greenlets::context`), made (and unused ones of
    /// other threads dropped) on first use.
    fn mine(
        &self,
        me: u64,
        template: &HoldCore<LockHandle>,
    ) -> PyResult<Arc<HoldCore<LockHandle>>> {
        let mut map = self.map();
        if let Some(core) = map.get(&me) {
            return Ok(core.clone());
        }
        map.retain(|_, core| !unused(core));
        let handle = LockHandle::with_reentry(
            self.client.clone(),
            &self.name,
            self.ttl,
            self.fair,
            self.replicas,
            self.auto_renew,
            true,
        )?;
        let core = Arc::new(HoldCore {
            handle: Arc::new(handle),
            name: template.name.clone(),
            about: template.about.clone(),
            ttl: template.ttl,
            default_timeout: template.default_timeout,
            on_lost: template.on_lost.clone(),
            listener: Default::default(),
        });
        map.insert(me, core.clone());
        Ok(core)
    }

    fn thread_key(&self, thread: u64) -> ThreadKey {
        (
            Arc::as_ptr(&self.client) as usize,
            self.name.clone(),
            thread,
        )
    }

    /// The calling thread's hold of this name through any re-entrant Lock object of the same
    /// client (see `ThreadHolds`), else this object's core for the thread (`mine`), which is
    /// listed there for the other objects.
    fn thread_owner(
        &self,
        me: u64,
        template: &HoldCore<LockHandle>,
    ) -> PyResult<Arc<HoldCore<LockHandle>>> {
        let own = self.mine(me, template)?;
        if own.holder().token().is_some() {
            return Ok(own);
        }
        let key = self.thread_key(me);
        let mut holds = thread_holds();
        if !holds.cores.contains_key(&key) && holds.cores.len() >= holds.sweep_at {
            holds
                .cores
                .retain(|_, cores| cores.iter().any(|c| c.strong_count() > 0));
            holds.sweep_at = (holds.cores.len() * 2).max(64);
        }
        let cores = holds.cores.entry(key).or_default();
        cores.retain(|c| c.strong_count() > 0);
        let held = holding(cores);
        if !cores
            .iter()
            .any(|c| std::ptr::eq(c.as_ptr(), Arc::as_ptr(&own)))
        {
            cores.push(Arc::downgrade(&own));
        }
        Ok(held.unwrap_or(own))
    }

    /// This object's core, of whichever thread, whose hold has `token`.
    fn holding_token(&self, token: &str) -> Option<Arc<HoldCore<LockHandle>>> {
        self.map()
            .values()
            .find(|core| core.holder().token().as_deref() == Some(token))
            .cloned()
    }

    /// The hold of this name the calling thread `me` has through another object (see
    /// `ThreadHolds`).
    fn held_elsewhere(&self, me: u64) -> Option<Arc<HoldCore<LockHandle>>> {
        holding(thread_holds().cores.get(&self.thread_key(me))?)
    }

    /// What the object's state shows to the calling thread: its own hold (or the loss of its
    /// last one), or the one it has through another object; else the hold another thread has
    /// (at most one holds at a time), else a lost one; None when there is nothing to show.
    fn shown(&self, me: u64) -> Option<Arc<HoldCore<LockHandle>>> {
        let shows = |core: &Arc<HoldCore<LockHandle>>| {
            core.holder().token().is_some() || core.holder().lost()
        };
        let own = self.map().get(&me).filter(|c| shows(c)).cloned();
        // (The map's lock is not held while the registry's is taken: `thread_owner` takes them
        // one after the other too.)
        if let Some(core) = own.or_else(|| self.held_elsewhere(me)) {
            return Some(core);
        }
        let map = self.map();
        let mut cores: Vec<_> = map.values().collect();
        cores.sort_by_key(|c| c.holder().token().is_none());
        cores.into_iter().find(|c| shows(c)).cloned()
    }
}

impl LockLike for PyLock {
    type Handle = LockHandle;
    fn core(&self) -> &HoldCore<LockHandle> {
        &self.core
    }
    fn owner_core(&self) -> PyResult<CoreRef<'_, LockHandle>> {
        Ok(match &self.owners {
            // Making a core fails only when the client cannot name the lock, which it did
            // already for the object's own core: that one is then as good as any. (Telling the
            // caller may fail, with what a signal handler raised: that is the call's outcome.)
            Some(owners) => owners
                .thread_owner(greenlets::context()?, &self.core)
                .map_or(CoreRef::Own(&self.core), CoreRef::Owner),
            None => CoreRef::Own(&self.core),
        })
    }
    /// redmutex.aio keeps one object per task (the owner): a task's calls never act on a hold
    /// of another object, even one of the same thread.
    fn task_core(&self) -> CoreRef<'_, LockHandle> {
        match &self.owners {
            Some(owners) => greenlets::context()
                .and_then(|me| owners.mine(me, &self.core))
                .map_or(CoreRef::Own(&self.core), CoreRef::Owner),
            None => CoreRef::Own(&self.core),
        }
    }
    /// The hold of the loop's thread, also when another thread closes the loop.
    fn core_holding(&self, token: &str) -> CoreRef<'_, LockHandle> {
        match self
            .owners
            .as_ref()
            .and_then(|owners| owners.holding_token(token))
        {
            Some(core) => CoreRef::Owner(core),
            None => self.task_core(),
        }
    }
    fn view(&self) -> PyResult<CoreRef<'_, LockHandle>> {
        let Some(owners) = &self.owners else {
            return Ok(CoreRef::Own(&self.core));
        };
        let me = greenlets::context()?;
        let mine = owners.mine(me, &self.core).ok();
        let shown = match mine.filter(|c| c.holder().token().is_some() || c.holder().lost()) {
            Some(core) => Some(core),
            None => owners.held_elsewhere(me).or_else(|| owners.shown(me)),
        };
        Ok(match shown {
            Some(core) => CoreRef::Owner(core),
            None => CoreRef::Own(&self.core),
        })
    }
    fn blocking_context() -> PyResult<()> {
        Ok(())
    }
}

lock_like_methods! {
    PyLock;
    /// Takes the lock; False when not acquired in time (`blocking=False` tries once).
    fn acquire;
    /// Releases the hold (LockNotOwnedError when none, LockLostError when the lease was lost).
    fn release;
    /// The lease now ends `ttl` (default: the lock's ttl) from now.
    fn extend;
    /// This object holds the lock, checked against Redis.
    fn owned;
    fn _acquire_async();

    #[new]
    #[pyo3(signature = (client, name, *, ttl=10.0, timeout=None, auto_renew=None, fair=None, replicas=None, on_lost=None, reentrant=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = args::ttl)] ttl: f64,
        timeout: Option<&Bound<'_, PyAny>>,
        auto_renew: Option<&Bound<'_, PyAny>>,
        fair: Option<&Bound<'_, PyAny>>,
        replicas: Option<&Bound<'_, PyAny>>,
        on_lost: Option<&Bound<'_, PyAny>>,
        reentrant: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name_bytes = args::name("name", name)?;
        let ttl = args::seconds("ttl", ttl)?;
        let default_timeout = args::timeout("timeout", timeout)?.unwrap_or(None);
        let auto_renew = auto_renew.map_or(Ok(false), |v| args::flag("auto_renew", v))?;
        let fair = fair.map_or(Ok(false), |v| args::flag("fair", v))?;
        let replicas = replicas.map_or(Ok(0), |v| args::count("replicas", v, 0, 1_000_000))?;
        let on_lost = hold::on_lost_arg(on_lost)?;
        let reentrant = reentrant.map_or(Ok(false), |v| args::flag("reentrant", v))?;
        let client = coerce_client(client)?;
        let engine_client = client.get().inner.clone();
        let handle = LockHandle::with_reentry(
            engine_client.clone(),
            &name_bytes,
            ttl,
            fair,
            replicas as u32,
            auto_renew,
            reentrant,
        )?;
        let owners = reentrant.then(|| Owners {
            client: engine_client,
            name: name_bytes.clone(),
            ttl,
            fair,
            replicas: replicas as u32,
            auto_renew,
            by_thread: Mutex::new(HashMap::new()),
        });
        Ok(PyLock {
            core: HoldCore::new(handle, "lock", &name_bytes, ttl, default_timeout, on_lost),
            client,
            owners,
        })
    }

    /// Somebody holds the lock.
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        let (handle, about) = (&self.core.handle, &self.core.about);
        blocking::run(py, || handle.locked_blocking())?.about(py, about)
    }

    #[getter]
    fn fence(&self) -> PyResult<Option<i64>> {
        Ok(self.view()?.handle.fence())
    }

    /// Whether the lock is re-entrant (`reentrant=True`).
    #[getter]
    fn reentrant(&self) -> bool {
        self.owners.is_some()
    }

    /// How many acquires the calling thread's hold stands for (0 when it holds none; more than
    /// 1 only on a re-entrant lock).
    #[getter]
    fn _depth(&self) -> PyResult<u32> {
        Ok(self.owner_core()?.holder().depth())
    }

    #[getter]
    fn client(&self, py: Python<'_>) -> Py<PyClient> {
        self.client.clone_ref(py)
    }

    fn _locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.core.handle.clone();
        hold::query_async(py, async move { handle.locked().await }, self.core.about.clone())
    }

    fn __repr__(&self) -> PyResult<String> {
        Ok(format!(
            "Lock('{}', ttl={}, held={})",
            self.core.name,
            self.core.ttl(),
            self.view()?.held_repr()
        ))
    }
}
