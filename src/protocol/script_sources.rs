//! Every script's exact source by name (the stem of its own file under lua/), as it is sent:
//! what the tests read (Rust's here, Python's through `_core._script_source`), so that no test
//! puts a script's preludes together itself.

use super::{admin, compat, multilock, scripts};

/// (name, source) of every script.
pub const ALL: &[(&str, &str)] = &[
    ("lock_acquire", scripts::LOCK_ACQUIRE_SOURCE),
    ("lock_release", scripts::LOCK_RELEASE_SOURCE),
    ("lock_acquire_fair", scripts::LOCK_ACQUIRE_FAIR_SOURCE),
    ("lock_extend", scripts::LOCK_EXTEND_SOURCE),
    ("lock_reenter", scripts::LOCK_REENTER_SOURCE),
    (
        "lock_extend_reentrant",
        scripts::LOCK_EXTEND_REENTRANT_SOURCE,
    ),
    ("queue_leave", scripts::QUEUE_LEAVE_SOURCE),
    ("fence_raise", scripts::FENCE_RAISE_SOURCE),
    ("sem_acquire", scripts::SEM_ACQUIRE_SOURCE),
    ("sem_release", scripts::SEM_RELEASE_SOURCE),
    ("sem_leave", scripts::SEM_LEAVE_SOURCE),
    ("lease_extend", scripts::LEASE_EXTEND_SOURCE),
    ("lease_alive", scripts::LEASE_ALIVE_SOURCE),
    ("lease_count", scripts::LEASE_COUNT_SOURCE),
    ("sem_slot_acquire", scripts::SEM_SLOT_ACQUIRE_SOURCE),
    ("sem_slot_release", scripts::SEM_SLOT_RELEASE_SOURCE),
    ("sem_slot_held", scripts::SEM_SLOT_HELD_SOURCE),
    ("rw_read_acquire", scripts::RW_READ_ACQUIRE_SOURCE),
    ("rw_write_acquire", scripts::RW_WRITE_ACQUIRE_SOURCE),
    ("rw_read_release", scripts::RW_READ_RELEASE_SOURCE),
    ("rw_write_release", scripts::RW_WRITE_RELEASE_SOURCE),
    ("rw_writer_leave", scripts::RW_WRITER_LEAVE_SOURCE),
    ("rw_state", scripts::RW_STATE_SOURCE),
    ("cache_get_or_claim", scripts::CACHE_GET_OR_CLAIM_SOURCE),
    ("cache_store", scripts::CACHE_STORE_SOURCE),
    ("cache_abandon", scripts::CACHE_ABANDON_SOURCE),
    ("cache_invalidate", scripts::CACHE_INVALIDATE_SOURCE),
    ("force_release", admin::FORCE_RELEASE_SOURCE),
    (
        "compat_signal_release",
        compat::COMPAT_SIGNAL_RELEASE_SOURCE,
    ),
    ("compat_extend", compat::COMPAT_EXTEND_SOURCE),
    ("compat_reset", compat::COMPAT_RESET_SOURCE),
    ("multi_acquire", multilock::MULTI_ACQUIRE_SOURCE),
    ("multi_release", multilock::MULTI_RELEASE_SOURCE),
    ("multi_extend", multilock::MULTI_EXTEND_SOURCE),
];

/// The source of the script `name`, or None for a name that is no script's.
pub fn source(name: &str) -> Option<&'static str> {
    ALL.iter()
        .find(|(script, _)| *script == name)
        .map(|(_, source)| *source)
}

#[cfg(test)]
mod tests {
    use super::{source, ALL};
    use crate::protocol::script_check::uncalled_functions;

    #[test]
    fn every_script_defines_only_what_it_calls() {
        for (name, source) in ALL {
            assert_eq!(uncalled_functions(source), Vec::<String>::new(), "{name}");
        }
    }

    #[test]
    fn every_script_ends_with_its_own_file_and_every_file_is_used() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/protocol/lua");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("src/protocol/lua") {
            let path = entry.expect("a lua file").path();
            let text = std::fs::read_to_string(&path).expect("readable");
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("")
                .to_string();
            files.push((stem, text));
        }
        for (name, source) in ALL {
            let own = files.iter().find(|(stem, _)| stem == name);
            let (_, text) = own.unwrap_or_else(|| panic!("no lua/{name}.lua"));
            // (lock_release.lua opens its script: its grant preludes follow it, see scripts.rs)
            assert!(
                source.ends_with(text.as_str()) || source.starts_with(text.as_str()),
                "{name}"
            );
        }
        for (stem, text) in &files {
            assert!(
                ALL.iter().any(|(_, source)| source.contains(text.as_str())),
                "lua/{stem}.lua is in no script"
            );
        }
        assert_eq!(
            source("sem_acquire"),
            Some(ALL.iter().find(|s| s.0 == "sem_acquire").unwrap().1)
        );
        assert_eq!(source("no_such_script"), None);
    }
}
