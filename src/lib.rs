//! redmutex: distributed locks, semaphores and a stampede-safe cache on Redis.
//!
//! Three strata, dependencies pointing down only: `python` (the pyo3 binding, feature
//! "python") → `engine` (I/O: runtime, connections, waiting, renewal) → `protocol` (sans-I/O:
//! keys, Lua scripts, replies, time arithmetic).

pub mod engine;
pub mod protocol;

#[cfg(feature = "python")]
mod python;
