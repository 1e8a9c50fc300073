//! One lazily built tokio runtime per process. A forked child gets a new one: the parent's worker
//! threads do not exist there, so its runtime and everything bound to it is leaked, never used
//! nor dropped (dropping would touch the parent's epoll set, which the child shares).

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use tokio::runtime::{Builder, Handle, Runtime};

use super::error::{Error, Result};

struct ProcessRuntime {
    pid: u32,
    runtime: Runtime,
}

static CURRENT: AtomicPtr<ProcessRuntime> = AtomicPtr::new(std::ptr::null_mut());

/// This process's id as last read, 0 when not read yet or a fork has happened since (the
/// child's `fork` handler clears it): the blocking API asks for it several times per call, and
/// each `getpid` is a system call.
static PID: AtomicU32 = AtomicU32::new(0);

/// The id of this process, to tell a forked child from its parent.
pub fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => read_pid(),
        pid => pid,
    }
}

#[cfg(unix)]
fn read_pid() -> u32 {
    static WATCH_FORKS: std::sync::Once = std::sync::Once::new();
    // Registered before the first read is kept: a fork after it always clears the cache.
    WATCH_FORKS.call_once(|| {
        // SAFETY: `forget_pid` only stores to an atomic, which is async-signal-safe as a
        // `fork` child handler must be. Failure (ENOMEM) leaves the cache off.
        if unsafe { pthread_atfork(None, None, Some(forget_pid)) } != 0 {
            PID_CACHE_OFF.store(true, Ordering::Relaxed);
        }
    });
    let pid = std::process::id();
    if !PID_CACHE_OFF.load(Ordering::Relaxed) {
        PID.store(pid, Ordering::Relaxed);
    }
    pid
}

#[cfg(not(unix))]
fn read_pid() -> u32 {
    std::process::id()
}

/// Set when the fork handler could not be registered: every `pid()` then asks the system.
#[cfg(unix)]
static PID_CACHE_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How many forks this process descends from since the fork handler was registered: with the
/// pid, tells memory inherited from another process (a pid alone can be recycled).
static FORKS: AtomicU32 = AtomicU32::new(0);

/// The pid, and the forks counted since the fork handler was registered.
pub fn lineage() -> (u32, u32) {
    let pid = pid();
    (pid, FORKS.load(Ordering::Relaxed))
}

#[cfg(unix)]
extern "C" fn forget_pid() {
    PID.store(0, Ordering::Relaxed);
    FORKS.fetch_add(1, Ordering::Relaxed);
}

#[cfg(unix)]
extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> std::os::raw::c_int;
}

/// The runtime of this process, built on first use (and again after a fork).
pub fn handle() -> Result<&'static Handle> {
    let current = CURRENT.load(Ordering::Acquire);
    // SAFETY: pointers stored in CURRENT come from Box::leak and are never freed.
    if let Some(rt) = unsafe { current.as_ref() } {
        if rt.pid == pid() {
            return Ok(rt.runtime.handle());
        }
    }
    let built = build()?;
    let fresh: &'static mut ProcessRuntime = Box::leak(Box::new(built));
    match CURRENT.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(fresh.runtime.handle()),
        Err(winner) => {
            // Another thread installed one first: use it, and let ours go (it never ran a task).
            // SAFETY: `fresh` was leaked just above and is not shared; `winner` is never freed.
            drop(unsafe { Box::from_raw(fresh as *mut ProcessRuntime) });
            match unsafe { winner.as_ref() } {
                Some(rt) => Ok(rt.runtime.handle()),
                None => Err(Error::Usage("runtime vanished".into())),
            }
        }
    }
}

fn build() -> Result<ProcessRuntime> {
    // rustls needs a process-wide crypto provider for rediss:// URLs; a second install is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("redmutex")
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the I/O runtime: {e}")))?;
    Ok(ProcessRuntime {
        pid: pid(),
        runtime,
    })
}

/// Runs `fut` on the runtime in the background (cleanup that must outlive its caller).
pub fn spawn<F>(fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = handle() {
        handle.spawn(fut);
    }
}
