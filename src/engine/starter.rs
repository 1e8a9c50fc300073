//! Starts background tasks when they are due rather than when they are planned.
//!
//! A hold's renewal sleeps most of its life: a top-up of a queued grant first runs after half
//! of a lease of seconds, and most holds are released long before that. Spawning its task at
//! the acquire and aborting it at the release wakes a runtime thread twice per hold, which is a
//! measurable share of a busy hand-off. Here a planned start waits in one queue per process,
//! served by one task that sleeps until the earliest is due: filing and withdrawing a start
//! take a lock and wake nobody, unless the new one is due before that task wakes anyway (or
//! that task sleeps with nothing to wait for).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::runtime;

/// Spawns the task when it is due (None: no runtime to spawn it on).
pub type Start = Box<dyn FnOnce() -> Option<AbortHandle> + Send>;

enum Slot {
    Waiting(Start),
    Started(AbortHandle),
    Stopped,
}

type SharedSlot = Arc<Mutex<Slot>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A start filed with the starter: it runs when due unless stopped first.
pub struct Planned {
    slot: SharedSlot,
    key: (Instant, u64),
    starter: &'static Starter,
}

impl Planned {
    /// Runs the start now if it has not run yet (its task's plan changed: it must decide
    /// itself when to act).
    pub fn start_now(&self) {
        if self.inherited() {
            return;
        }
        if run(&self.slot) {
            self.starter.withdraw(self.key);
        }
    }

    /// Withdraws the start, or aborts the task it spawned.
    pub fn stop(self) {
        if self.inherited() {
            // A forked child's copy of the parent's plan: its locks may have been held by a
            // parent thread at the fork, and the parent's serving task does not run here.
            std::mem::forget(self);
            return;
        }
        let was = std::mem::replace(&mut *lock(&self.slot), Slot::Stopped);
        match was {
            Slot::Waiting(start) => {
                self.starter.withdraw(self.key);
                // Dropped outside the slot's lock: what it captured may take locks of its own.
                drop(start);
            }
            Slot::Started(task) => task.abort(),
            Slot::Stopped => {}
        }
    }

    /// Filed in another process (this one is a forked child of it).
    fn inherited(&self) -> bool {
        self.starter.lineage != runtime::lineage()
    }
}

/// Runs the slot's start if it is still waiting; true if it did.
fn run(slot: &SharedSlot) -> bool {
    let mut slot = lock(slot);
    if !matches!(&*slot, Slot::Waiting(_)) {
        return false; // started or stopped already (keeping a started task's handle)
    }
    let Slot::Waiting(start) = std::mem::replace(&mut *slot, Slot::Stopped) else {
        return false;
    };
    if let Some(task) = start() {
        *slot = Slot::Started(task);
    }
    true
}

/// Files `start` to run at `due`; gives it back when there is no runtime to serve it.
pub fn plan(due: Instant, start: Start) -> Result<Planned, Start> {
    match Starter::current() {
        Some(starter) => Ok(starter.file(due, start)),
        None => Err(start),
    }
}

struct Queue {
    planned: BTreeMap<(Instant, u64), SharedSlot>,
    next_id: u64,
    /// When the serving task wakes next by itself (None: only when told).
    wakes_at: Option<Instant>,
}

pub struct Starter {
    /// The process (and fork count) it serves: a forked child files with a starter of its own,
    /// since the parent's serving task does not run there.
    lineage: (u32, u32),
    queue: Mutex<Queue>,
    wake: Notify,
}

static CURRENT: AtomicPtr<Starter> = AtomicPtr::new(std::ptr::null_mut());

impl Starter {
    /// This process's starter, made (and its task spawned) on first use.
    fn current() -> Option<&'static Starter> {
        let current = CURRENT.load(Ordering::Acquire);
        let lineage = runtime::lineage();
        // SAFETY: pointers stored in CURRENT come from Box::leak and are never freed.
        if let Some(starter) = unsafe { current.as_ref() } {
            if starter.lineage == lineage {
                return Some(starter);
            }
        }
        let handle = runtime::handle().ok()?;
        let fresh: &'static Starter = Box::leak(Box::new(Starter {
            lineage,
            queue: Mutex::new(Queue {
                planned: BTreeMap::new(),
                next_id: 0,
                wakes_at: None,
            }),
            wake: Notify::new(),
        }));
        let fresh_ptr = fresh as *const Starter as *mut Starter;
        match CURRENT.compare_exchange(current, fresh_ptr, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                handle.spawn(fresh.serve());
                Some(fresh)
            }
            // Another thread installed one first (ours, never served, stays leaked: a few words).
            // SAFETY: as above.
            Err(winner) => unsafe { winner.as_ref() }.filter(|s| s.lineage == lineage),
        }
    }

    fn file(&'static self, due: Instant, start: Start) -> Planned {
        let slot = Arc::new(Mutex::new(Slot::Waiting(start)));
        let mut queue = lock(&self.queue);
        let key = (due, queue.next_id);
        queue.next_id += 1;
        queue.planned.insert(key, slot.clone());
        if queue.wakes_at.map_or(true, |at| due < at) {
            queue.wakes_at = Some(due);
            self.wake.notify_one();
        }
        Planned {
            slot,
            key,
            starter: self,
        }
    }

    fn withdraw(&self, key: (Instant, u64)) {
        lock(&self.queue).planned.remove(&key);
    }

    async fn serve(&'static self) {
        loop {
            let now = Instant::now();
            let (due, next) = {
                let mut queue = lock(&self.queue);
                let later = queue.planned.split_off(&(now, u64::MAX));
                let due = std::mem::replace(&mut queue.planned, later);
                let next = queue.planned.keys().next().map(|&(at, _)| at);
                queue.wakes_at = next;
                (due, next)
            };
            for slot in due.values() {
                // One start that panics must not end the serving task: every later start
                // (a hold's renewal) would then never run.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(slot)));
            }
            drop(due);
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    fn counting(counter: &Arc<AtomicUsize>) -> Start {
        let counter = counter.clone();
        Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            None
        })
    }

    fn wait_for(counter: &AtomicUsize, count: usize, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if counter.load(Ordering::SeqCst) >= count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        counter.load(Ordering::SeqCst) >= count
    }

    #[test]
    fn runs_each_start_when_due_and_not_before() {
        let ran = Arc::new(AtomicUsize::new(0));
        let filed = Instant::now();
        let later = plan(filed + Duration::from_millis(300), counting(&ran))
            .ok()
            .unwrap();
        // Filed after a later one, due before it: the serving task must wake for it.
        let sooner = plan(filed + Duration::from_millis(60), counting(&ran))
            .ok()
            .unwrap();
        assert!(wait_for(&ran, 1, Duration::from_secs(5)));
        assert!(filed.elapsed() >= Duration::from_millis(60));
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the later start ran early");
        assert!(wait_for(&ran, 2, Duration::from_secs(5)));
        assert!(filed.elapsed() >= Duration::from_millis(300));
        later.stop();
        sooner.stop();
    }

    #[test]
    fn a_stopped_start_never_runs() {
        let ran = Arc::new(AtomicUsize::new(0));
        let control = Arc::new(AtomicUsize::new(0));
        let due = Instant::now() + Duration::from_millis(50);
        let planned = plan(due, counting(&ran)).ok().unwrap();
        planned.stop();
        let _control = plan(due + Duration::from_millis(50), counting(&control))
            .ok()
            .unwrap();
        assert!(wait_for(&control, 1, Duration::from_secs(5)));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn start_now_runs_once_and_stop_aborts_the_task() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (ran_in, finished) = (ran.clone(), Arc::new(AtomicUsize::new(0)));
        let finished_in = finished.clone();
        let start: Start = Box::new(move || {
            ran_in.fetch_add(1, Ordering::SeqCst);
            let task = runtime::handle().unwrap().spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                finished_in.fetch_add(1, Ordering::SeqCst);
            });
            Some(task.abort_handle())
        });
        let planned = plan(Instant::now() + Duration::from_millis(100), start)
            .ok()
            .unwrap();
        planned.start_now();
        planned.start_now();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        planned.stop();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the start ran again when it fell due"
        );
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "the task was not aborted"
        );
    }
}
