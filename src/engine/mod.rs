//! I/O without Python: the tokio runtime, connections, waiting, renewal and fork safety.

pub mod admin;
pub mod cache;
pub mod claim_lease;
pub mod client;
pub mod compat;
pub mod connect;
pub mod direct;
pub mod error;
pub mod exclusive;
pub mod executor;
pub mod hold;
pub mod hold_status;
pub mod interrupt;
pub mod kept_holds;
pub mod listener;
pub mod lock;
#[cfg(unix)]
pub mod loop_leftover;
pub mod multilock;
pub mod name_map;
pub mod node;
pub mod plain;
pub mod redlock;
pub mod redlock_cache;
mod redlock_held;
mod redlock_lease;
mod redlock_lock;
pub mod redlock_rwlock;
pub mod redlock_semaphore;
pub mod renew;
pub mod replicas;
pub mod runtime;
pub mod rwlock;
pub mod semaphore;
pub mod sentinel;
pub mod shared;
pub mod slots;
mod starter;
pub mod tls;
pub mod token;
pub mod waiting;
pub mod wake;

pub use client::{Backend, Client, ClientConfig, Deployment, Shared};
pub use error::{Error, Result};

#[cfg(test)]
mod tests;
