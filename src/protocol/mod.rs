//! Sans-I/O protocol: key layout, Lua scripts, reply parsing and time arithmetic.
//! Nothing here touches a socket or Python, so all of it is testable with canned values.

pub mod admin;
pub mod cache;
pub mod cluster_slots;
pub mod compat;
pub mod keys;
pub mod lease;
pub mod lock;
pub mod multilock;
pub mod pubsub;
pub mod quorum;
pub mod replies;
pub mod resp;
pub mod rwlock;
#[cfg(test)]
mod script_check;
pub mod script_sources;
pub mod scripts;
pub mod semaphore;
pub mod sha1;
pub mod step;
pub mod url;
pub mod wake;
