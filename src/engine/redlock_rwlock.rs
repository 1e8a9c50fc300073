//! The read-write lock on Redlock: each master runs the scripts of a single server, which keep
//! readers and the writer apart there; a read or write lock is held when a majority granted it.
//! A writer's majority and a reader's majority intersect in a master that would have to hold
//! both, which its script never allows, so a writer never overlaps a reader (nor another
//! writer). A waiting writer marks itself on every master it asks (after its first round), which
//! holds new readers back there, as on one server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::Result;
use super::redlock::Redlock;
use super::redlock_lease::{self, Ballot, QuorumContender};
use super::waiting::{self, Wait};
use crate::protocol::replies::Admission;
use crate::protocol::rwlock as steps;
pub use crate::protocol::rwlock::{Mode, RwSpec};
use crate::protocol::scripts::Queueing;
use crate::protocol::step::Step;

struct RwQuorum<'a> {
    spec: &'a RwSpec,
    mode: Mode,
    token: &'a str,
    reentrant: bool,
}

impl QuorumContender for RwQuorum<'_> {
    type Reply = Admission;

    fn attempt(&self, join: bool) -> Step<Admission> {
        let queueing = if join {
            waiting::queueing(true)
        } else {
            Queueing::TryOnly
        };
        steps::attempt(self.spec, self.mode, self.token, self.reentrant, queueing)
    }

    fn ballot(&self, reply: &Admission) -> Ballot {
        match reply {
            Admission::Admitted { .. } => Ballot::Granted { fence: 0 },
            Admission::Busy { retry_ms } => Ballot::Busy {
                retry_ms: *retry_ms,
            },
        }
    }

    fn give_back(&self) -> Step<bool> {
        steps::release(&self.spec.keys, self.mode, self.token)
    }

    fn give_back_quietly(&self) -> Step<bool> {
        steps::give_back_quietly(&self.spec.keys, self.mode, self.token)
    }

    fn leave(&self) -> Option<Step<()>> {
        (self.mode == Mode::Write).then(|| steps::writer_leave(&self.spec.keys, self.token))
    }

    fn lease(&self) -> Duration {
        self.spec.lease
    }

    fn channel(&self) -> Vec<u8> {
        self.spec.keys.wake_channel()
    }

    fn gate(&self) -> Option<Vec<u8>> {
        // Readers do not compete with each other; writers take turns in this process.
        (self.mode == Mode::Write).then(|| self.spec.keys.rw_writer())
    }
}

/// Takes the read or write lock for `token` on a majority; Some(when the lease counts from).
pub async fn acquire(
    redlock: &Arc<Redlock>,
    spec: &RwSpec,
    mode: Mode,
    token: &str,
    reentrant: bool,
    wait: Wait,
) -> Result<Option<Instant>> {
    let contender = RwQuorum {
        spec,
        mode,
        token,
        reentrant,
    };
    redlock_lease::acquire(redlock, &contender, token, wait).await
}
