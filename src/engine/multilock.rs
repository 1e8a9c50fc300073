//! The MultiLock: several lock names held together by one object, all or none, through the one
//! hold (`hold::Holder`). On one server (or a Sentinel-managed master) every attempt is one
//! atomic script over all the names, so nothing is held while waiting. On a Redis Cluster, where
//! one script cannot span slots, the names are taken run by run in one global order (sorted by
//! their bytes; see `protocol::multilock`): a waiter keeps the runs it took while it waits for the
//! next, so two MultiLocks over overlapping names never wait for each other in a circle, and it
//! gives back what it took when it stops waiting (timeout, cancellation, error).
//!
//! Waiting never polls: a waiter listens on the wake channel of every one of its names and
//! attempts again when any is released, or when the blocking holder's lease ends. On a cluster a
//! waiter that keeps runs looks again at least every third of its lease, renewing them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::Client;
use super::error::{Error, Result};
use super::executor;
use super::hold::{HeldFences, Holder, Leased, Naming};
use super::shared::Shared;
use super::waiting::{Contender, Outcome, Plan, Undo, UndoStep};
use crate::protocol::lease;
use crate::protocol::multilock::{self as steps, MultiAttempt};
pub use crate::protocol::multilock::{distinct, MultiSpec};
use crate::protocol::step::Step;

/// A granted MultiLock: the fence of each name (in the spec's name order), and when the
/// attempt that took (or renewed) the last of them was sent, from which every lease counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiGrant {
    pub fences: Vec<i64>,
    pub sent_at: Instant,
}

/// One waiter's attempts on a MultiLock.
pub struct MultiContender<'a> {
    shared: &'a Arc<Shared>,
    spec: &'a MultiSpec,
    token: &'a str,
    /// How many runs, from the first, this waiter holds while it waits for the next (only on a
    /// cluster; on one server an attempt takes every name or none).
    held: Mutex<usize>,
}

impl MultiContender<'_> {
    fn held(&self) -> std::sync::MutexGuard<'_, usize> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Releases runs `from..to` (token-checked: a run not ours is left alone).
    async fn release_runs(&self, from: usize, to: usize) -> Result<()> {
        for run in from..to {
            let keys = self.spec.run_keys(run);
            executor::run(self.shared, &steps::release(&keys, self.token)).await?;
        }
        Ok(())
    }
}

impl Contender for MultiContender<'_> {
    type Grant = MultiGrant;
    type Reply = MultiAttempt;

    /// The first run's attempt: the whole attempt on one server (the direct path serves only
    /// a single server, where there is one run).
    fn first_step(&self) -> Step<MultiAttempt> {
        steps::attempt(&self.spec.run_keys(0), self.token, self.spec.lease)
    }

    fn read(&self, reply: MultiAttempt, sent_at: Instant) -> Result<Outcome<MultiGrant>> {
        match reply {
            MultiAttempt::Granted { fences } if self.spec.runs.len() == 1 => {
                let mut grant = MultiGrant {
                    fences: vec![0; self.spec.names.len()],
                    sent_at,
                };
                place_fences(&mut grant.fences, &self.spec.runs[0], &fences);
                Ok(Outcome::Granted(grant))
            }
            MultiAttempt::Granted { .. } => Err(Error::Usage(
                "a MultiLock over several cluster slots has no single attempt".into(),
            )),
            MultiAttempt::Busy { retry_ms, .. } => Ok(Outcome::Busy { retry_ms }),
        }
    }

    /// Takes the runs in order. `join` false (a first try, after which the caller may stop
    /// without leaving): a busy run gives back the runs taken before it, so a try that fails
    /// holds nothing; true (waiting): they are kept, and given back by `leave`.
    async fn attempt(&self, join: bool) -> Result<Outcome<MultiGrant>> {
        let sent_at = Instant::now();
        let mut fences = vec![0; self.spec.names.len()];
        for (run, indices) in self.spec.runs.iter().enumerate() {
            let keys = self.spec.run_keys(run);
            let step = steps::attempt(&keys, self.token, self.spec.lease);
            match executor::run(self.shared, &step).await? {
                MultiAttempt::Granted { fences: got } => {
                    place_fences(&mut fences, indices, &got);
                    let mut held = self.held();
                    *held = (*held).max(run + 1);
                }
                MultiAttempt::Busy { retry_ms, .. } => {
                    // Runs from this one on that we took before are given back (a run before
                    // it lapsed meanwhile and was taken): we hold only runs before the one we
                    // wait for, so waits follow the global order.
                    let keep = if join { run } else { 0 };
                    let held = std::mem::replace(&mut *self.held(), keep);
                    if held > keep {
                        self.release_runs(keep, held).await?;
                    }
                    return Ok(Outcome::Busy {
                        retry_ms: self.retry_while_holding(keep, retry_ms),
                    });
                }
            }
        }
        Ok(Outcome::Granted(MultiGrant { fences, sent_at }))
    }

    async fn leave(&self) -> Result<()> {
        let held = std::mem::replace(&mut *self.held(), 0);
        self.release_runs(0, held).await
    }

    fn undo(&self) -> Undo {
        let shared = self.shared.clone();
        let spec = self.spec.clone();
        let token = self.token.to_string();
        let step = move || -> UndoStep {
            let (shared, spec, token) = (shared.clone(), spec.clone(), token.clone());
            Box::pin(async move {
                for run in 0..spec.runs.len() {
                    let keys = spec.run_keys(run);
                    executor::run(&shared, &steps::release(&keys, &token)).await?;
                }
                Ok(())
            })
        };
        Undo {
            step: Box::new(step),
            horizon: self.spec.lease,
        }
    }

    /// Every name but the first (whose channel is the plan's).
    fn other_channels(&self) -> Vec<Vec<u8>> {
        self.spec
            .keys
            .iter()
            .skip(1)
            .map(|k| k.wake_channel())
            .collect()
    }
}

impl MultiContender<'_> {
    /// How soon to look again: the server's hint, but while `kept` runs are held, at least
    /// every third of the lease (each attempt renews them).
    fn retry_while_holding(&self, kept: usize, retry_ms: i64) -> i64 {
        if kept == 0 {
            return retry_ms;
        }
        let renew = i64::try_from(lease::lease_ms(self.spec.lease) / 3)
            .unwrap_or(i64::MAX)
            .max(1);
        if retry_ms < 0 {
            renew
        } else {
            retry_ms.min(renew)
        }
    }
}

/// Puts the fences of a run (in its order) at their names' places.
fn place_fences(fences: &mut [i64], run: &[usize], got: &[i64]) {
    for (&i, &fence) in run.iter().zip(got) {
        if let Some(slot) = fences.get_mut(i) {
            *slot = fence;
        }
    }
}

/// Runs `step_of(run)` for every run, in order; `all` folds their answers.
async fn every_run<T>(
    spec: &MultiSpec,
    shared: &Shared,
    step_of: impl Fn(&[&crate::protocol::keys::Keys]) -> Step<T>,
    mut all: impl FnMut(usize, T) -> bool,
) -> Result<bool> {
    let mut ok = true;
    for run in 0..spec.runs.len() {
        let keys = spec.run_keys(run);
        let answer = executor::run(shared, &step_of(&keys)).await?;
        ok &= all(keys.len(), answer);
    }
    Ok(ok)
}

impl Leased for MultiSpec {
    type Detail = Vec<i64>;
    type Args = ();

    fn naming(&self) -> Naming {
        Naming {
            object: "MultiLock",
            held: "its locks",
        }
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    // The single steps cover the first run: the whole MultiLock on one server, which is where
    // they are sent alone (the direct path). On a cluster the `*_on_node` calls run every run.

    fn release(&self, token: &str) -> Step<bool> {
        let n = self.names.len();
        steps::release(&self.run_keys(0), token).map(move |count| count == n)
    }

    fn fences_of(&self, fences: &Vec<i64>) -> Option<HeldFences> {
        Some(HeldFences::Each(fences.clone()))
    }

    /// On one server only: a cluster's runs live on nodes of their own, which one read cannot
    /// reach (their hold then counts as lost after a restart, as before).
    fn unmoved_since(&self, fences: &[i64]) -> Option<Step<bool>> {
        let one_run = self.runs.len() == 1 && fences.len() == self.keys.len();
        one_run.then(|| steps::fences_unmoved(&self.keys.iter().collect::<Vec<_>>(), fences))
    }

    fn extend(&self, token: &str, lease: Duration) -> Step<bool> {
        steps::extend(&self.run_keys(0), token, lease)
    }

    fn owned(&self, token: &str) -> Step<bool> {
        steps::owned(&self.run_keys(0), token)
    }

    /// Releases every name still ours (all runs, even after one finds a name lost); true when
    /// every name was.
    async fn release_on_node(&self, shared: &Shared, token: &str) -> Result<bool> {
        every_run(
            self,
            shared,
            |keys| steps::release(keys, token),
            |n, count| count == n,
        )
        .await
    }

    async fn extend_on_node(&self, shared: &Shared, token: &str, lease: Duration) -> Result<bool> {
        every_run(
            self,
            shared,
            |keys| steps::extend(keys, token, lease),
            |_, ok| ok,
        )
        .await
    }

    async fn owned_on_node(&self, shared: &Shared, token: &str) -> Result<bool> {
        every_run(self, shared, |keys| steps::owned(keys, token), |_, ok| ok).await
    }

    type Grant = MultiGrant;
    type Contender<'a> = MultiContender<'a>;

    fn contender<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        token: &'a str,
        _args: &(),
    ) -> Result<MultiContender<'a>> {
        Ok(MultiContender {
            shared,
            spec: self,
            token,
            held: Mutex::new(0),
        })
    }

    fn plan<'a>(&self, shared: &'a Arc<Shared>, _token: &'a str) -> Plan<'a> {
        // Every waiter competes in Redis (no in-process gate: MultiLocks over different sets
        // share names). On a cluster a waiter keeps the runs it took: it must give them back
        // when it stops waiting (`leave`), and renews them as it looks again.
        Plan {
            shared,
            channel: self
                .keys
                .first()
                .map(|k| k.wake_channel())
                .unwrap_or_default(),
            inbox: None,
            wake_token: None,
            gate: None,
            queued: self.runs.len() > 1,
        }
    }

    fn held(&self, _contender: &MultiContender<'_>, grant: MultiGrant) -> (Instant, Vec<i64>) {
        (grant.sent_at, grant.fences)
    }

    fn direct(&self) -> bool {
        self.runs.len() == 1
    }
}

/// One MultiLock object: at most one hold (of every name) at a time, owned by the object.
pub struct MultiLockHandle {
    holder: Holder<MultiSpec>,
}

impl MultiLockHandle {
    /// `names`: distinct (see `distinct`) and at least one.
    pub fn new(
        client: Arc<Client>,
        names: Vec<Vec<u8>>,
        lease: Duration,
        auto_renew: bool,
    ) -> Result<Self> {
        if names.is_empty() {
            return Err(Error::Invalid("names: give at least one name".into()));
        }
        if client.is_redlock() {
            return Err(Error::Unsupported(
                "MultiLock is not available on a Redlock client (several independent masters): \
                 it has no quorum protocol; use one Redis, Sentinel or Redis Cluster"
                    .into(),
            ));
        }
        let keys = names
            .iter()
            .map(|n| client.keys_named("names", n))
            .collect::<Result<Vec<_>>>()?;
        let spec = MultiSpec::new(names, keys, lease, client.is_cluster());
        Ok(MultiLockHandle {
            holder: Holder::new(client, spec, auto_renew),
        })
    }

    pub fn spec(&self) -> &MultiSpec {
        self.holder.primitive()
    }

    /// The object's hold: acquire, release, extend, `owned` and the hold's state.
    pub fn holder(&self) -> &Holder<MultiSpec> {
        &self.holder
    }

    /// The fence of each name (in the spec's order) of the current hold.
    pub fn fences(&self) -> Option<Vec<i64>> {
        self.holder.detail()
    }
}
