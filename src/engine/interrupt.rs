//! A blocking caller's way out of a call that waits on the network on its own thread (a direct
//! connection's read): the binding installs a check for the duration of a blocking entry point
//! (Python's pending signals, so that Ctrl-C lands at once), and such reads wait in slices and
//! ask it between them. Without a check installed (runtime threads, tests), nothing is asked.

use std::cell::Cell;

thread_local! {
    /// The check installed on this thread, if any.
    static CHECK: Cell<Option<fn() -> bool>> = const { Cell::new(None) };
}

/// Runs `f` with `check` installed on this thread (the one installed before comes back after).
pub fn watching<R>(check: fn() -> bool, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CHECK.with(|c| c.replace(Some(check))));
    f()
}

/// Runs `f` with no check installed on this thread (the one installed before comes back
/// after): for reads that a future makes while the binding blocks on it inside the runtime,
/// where a check would run Python's signal handlers with the runtime entered (a handler's own
/// blocking call would then panic). Such a future reads in short slices and yields between
/// them instead, and the binding runs the handlers outside the runtime (`python::blocking`).
pub fn unwatched<R>(f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CHECK.with(|c| c.replace(None)));
    f()
}

/// Whether the caller asked to stop: the installed check says so (false without one).
pub fn interrupted() -> bool {
    CHECK.with(Cell::get).is_some_and(|check| check())
}

/// Puts the check back as it was when dropped (also after a panic).
struct Restore(Option<fn() -> bool>);

impl Drop for Restore {
    fn drop(&mut self) {
        CHECK.with(|c| c.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yes() -> bool {
        true
    }

    #[test]
    fn a_check_counts_only_on_its_thread_while_installed() {
        assert!(!interrupted());
        assert!(watching(yes, interrupted));
        assert!(!watching(yes, || std::thread::spawn(interrupted)
            .join()
            .unwrap()));
        assert!(!interrupted());
    }

    #[test]
    fn unwatched_hides_the_check_for_its_closure_only() {
        assert!(watching(yes, || {
            assert!(!unwatched(interrupted));
            interrupted()
        }));
    }
}
