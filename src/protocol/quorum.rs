//! Redlock arithmetic over N independent masters, without I/O: the quorum, the validity of a
//! lease won by a majority, the tally of one round of votes, the fence that a majority agrees
//! on, and when the vote of a master that restarted (possibly empty) counts again.
//!
//! Fencing argument (why `fence` is strictly increasing whenever a majority agrees): a winner
//! takes the largest counter of the masters that granted it and, before its acquire returns,
//! raises every granting master's counter to that value, so a majority then holds a counter at
//! least as large. The next winner's majority intersects that one in at least one master, whose
//! next fence (counter + 1) therefore exceeds the previous fence. A master of that intersection
//! that lost its counter (a restart without persistence, or the counter's idle expiry) counts
//! from its own clock in µs instead, which exceeds every earlier fence unless clocks disagree;
//! for that case the winner also raises every other master that answers (in the background).

use std::time::{Duration, Instant};

/// Votes needed out of `n` masters: a strict majority.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The clock-drift allowance for a lease: 1% of it plus 2 ms (the masters expire keys with
/// millisecond resolution, and their clocks may run a little fast).
pub fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The local deadline of a lease whose requests were first sent at `sent_at`: the lease minus
/// the drift allowance, counted from before the send. None when the drift eats the whole lease.
pub fn deadline(sent_at: Instant, lease: Duration) -> Option<Instant> {
    let usable = lease.checked_sub(drift(lease))?;
    if usable.is_zero() {
        return None;
    }
    sent_at.checked_add(usable)
}

/// When a lease won by a majority counts from, for arithmetic that adds the plain lease to it:
/// the first send less the drift allowance, so that `start + lease` is the Redlock deadline.
pub fn lease_start(sent_at: Instant, lease: Duration) -> Instant {
    sent_at.checked_sub(drift(lease)).unwrap_or(sent_at)
}

/// How much of the lease is left at `now` (Redlock's validity time: ttl − elapsed − drift);
/// None when nothing is left, in which case the majority came too late to count.
pub fn validity(sent_at: Instant, lease: Duration, now: Instant) -> Option<Duration> {
    deadline(sent_at, lease)
        .map(|d| d.saturating_duration_since(now))
        .filter(|left| !left.is_zero())
}

/// One master's answer to an acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vote {
    /// The master holds the lock for us now; `fence` is its counter.
    Granted { fence: i64 },
    /// The master holds it for us, but restarted recently, so its vote does not count until
    /// `counts_in_ms` from now (it may have forgotten another owner's lease).
    Discounted { fence: i64, counts_in_ms: i64 },
    /// Another owner holds it there; its lease ends within `retry_ms` (-1: unknown).
    Busy { retry_ms: i64 },
    /// No usable answer: unreachable, timed out, or an error.
    Failed,
}

/// How a round of votes ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A majority granted (the lease's validity is checked separately).
    Won,
    /// The lock is held (or the vote split): look again within `retry_ms` at the latest
    /// (-1: no hint), sooner if woken. `split`: we won some votes but not a majority.
    Busy { retry_ms: i64, split: bool },
    /// Fewer than a majority of the masters could answer.
    NoQuorum { answered: usize },
}

/// The votes of one round, as they come in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tally {
    n: usize,
    granted: usize,
    discounted: usize,
    busy: usize,
    failed: usize,
    retry_ms: i64,
}

impl Tally {
    pub fn new(n: usize) -> Self {
        Tally {
            n,
            granted: 0,
            discounted: 0,
            busy: 0,
            failed: 0,
            retry_ms: -1,
        }
    }

    pub fn add(&mut self, vote: Vote) {
        match vote {
            Vote::Granted { .. } => self.granted += 1,
            Vote::Discounted { counts_in_ms, .. } => {
                self.discounted += 1;
                self.hint(counts_in_ms);
            }
            Vote::Busy { retry_ms } => {
                self.busy += 1;
                self.hint(retry_ms);
            }
            Vote::Failed => self.failed += 1,
        }
    }

    fn hint(&mut self, ms: i64) {
        if ms >= 0 && (self.retry_ms < 0 || ms < self.retry_ms) {
            self.retry_ms = ms;
        }
    }

    fn pending(&self) -> usize {
        self.n
            .saturating_sub(self.granted + self.discounted + self.busy + self.failed)
    }

    /// Counted grants so far.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// Masters that answered (whatever they said).
    pub fn answered(&self) -> usize {
        self.granted + self.discounted + self.busy
    }

    /// Whether the outcome is known without the votes still to come: won, or out of reach and
    /// known to be the masters' fault or not (a round lost while too many masters fail is a
    /// quorum error, not a held lock, so the votes that decide which are awaited).
    pub fn settled(&self) -> bool {
        let q = quorum(self.n);
        let failing_is_decided =
            self.failed > self.n - q || self.failed + self.pending() <= self.n - q;
        self.granted >= q || (self.granted + self.pending() < q && failing_is_decided)
    }

    /// The outcome from the votes in so far.
    pub fn outcome(&self) -> Outcome {
        let q = quorum(self.n);
        if self.granted >= q {
            return Outcome::Won;
        }
        // Only when the masters that failed alone rule a majority out is it the masters'
        // fault; otherwise somebody holds the lock (or the vote split). Votes still out when
        // a round settles early are unknown, not failed.
        if self.failed > self.n - q {
            return Outcome::NoQuorum {
                answered: self.answered(),
            };
        }
        Outcome::Busy {
            retry_ms: self.retry_ms,
            split: self.granted + self.discounted > 0,
        }
    }
}

/// The fence a won majority agrees on, and which granting masters must have their counter
/// raised to it: `(fence, indices below it)` from `(master index, counter)` pairs.
pub fn agreed_fence(grants: &[(usize, i64)]) -> Option<(i64, Vec<usize>)> {
    let fence = grants.iter().map(|&(_, f)| f).max()?;
    let behind = grants
        .iter()
        .filter(|&&(_, f)| f < fence)
        .map(|&(i, _)| i)
        .collect();
    Some((fence, behind))
}

/// How an operation checked by majority ended (release, extend, owned): `confirmed` masters
/// said yes, `denied` said "not yours", the others did not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Majority {
    Yes,
    /// Enough masters denied that no majority can say yes.
    No,
    /// Too few answered to tell.
    Unknown,
}

pub fn majority(n: usize, confirmed: usize, denied: usize) -> Majority {
    let q = quorum(n);
    if confirmed >= q {
        Majority::Yes
    } else if denied > n - q {
        Majority::No
    } else {
        Majority::Unknown
    }
}

/// Whether some owner holds a lock (`locked`), from what the masters said so far.
///
/// A master discounted after a restart may have forgotten a lease, never invented one: a copy
/// it shows is a live lease (counted for its owner), but its "none" (or another owner) denies
/// nobody. Otherwise a holder that won with that master's vote (a client that had not seen the
/// restart counts it) would be reported free, or a quorum error, while it holds.
#[derive(Clone, Debug, Default)]
pub struct Holders {
    /// Per owner: copies on any master, and copies on counted masters.
    owners: Vec<(Vec<u8>, usize, usize)>,
    /// Counted masters that answered (any owner or none).
    pub counted: usize,
    /// Discounted masters that answered.
    pub discounted: usize,
}

impl Holders {
    /// A master answered `owner` (None: free there); `counted`: its word counts now.
    pub fn add(&mut self, owner: Option<Vec<u8>>, counted: bool) {
        if counted {
            self.counted += 1;
        } else {
            self.discounted += 1;
        }
        if let Some(owner) = owner {
            match self.owners.iter_mut().find(|(o, _, _)| *o == owner) {
                Some((_, copies, on_counted)) => {
                    *copies += 1;
                    *on_counted += usize::from(counted);
                }
                None => self.owners.push((owner, 1, usize::from(counted))),
            }
        }
    }

    /// The copies of the likeliest owner (any master), and the counted answers that deny the
    /// owner they deny least (a counted "none" or another owner's copy).
    pub fn held_and_denied(&self) -> (usize, usize) {
        let most = self.owners.iter().map(|o| o.1).max().unwrap_or(0);
        let most_counted = self.owners.iter().map(|o| o.2).max().unwrap_or(0);
        (most, self.counted - most_counted)
    }

    /// Yes when some owner has copies on a majority; No when every owner is denied by more
    /// than a minority of counted masters.
    pub fn majority(&self, n: usize) -> Majority {
        let (held, denied) = self.held_and_denied();
        majority(n, held, denied)
    }
}

/// The resolution of INFO's `uptime_in_seconds`, by which it may exceed the real uptime.
const UPTIME_RESOLUTION: Duration = Duration::from_secs(1);

/// What a client knows of one master's incarnation (its `run_id`): a master that restarted
/// since the client last saw it may have come back empty, forgetting leases it granted, so its
/// votes are discounted until every lease it may have forgotten has ended. The restart is kept,
/// not the end of the discount: the longest lease in use is read when the votes are counted, so
/// a longer lease used after the restart was noticed (a ping or a short lease came first)
/// lengthens the discount too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Incarnation {
    run_id: Option<String>,
    /// The latest moment the last restart seen can have happened.
    restarted: Option<Instant>,
}

impl Incarnation {
    /// The master reported `run_id` and `uptime` (INFO server) at `observed_at`. A first
    /// sighting is trusted: there is nothing to compare with.
    pub fn observe(&mut self, run_id: &str, uptime: Duration, observed_at: Instant) {
        if self.run_id.as_deref() == Some(run_id) {
            return;
        }
        if self.run_id.is_some() {
            // INFO's uptime is the difference of two whole-second clock readings (now and the
            // start, each floored), so it can exceed the real uptime by almost a second: a master
            // that restarted 0.1 s ago may say 1 s. `observed_at - (uptime - 1 s)` is the latest
            // moment the restart can have happened: counting from it errs on the safe side.
            let restarted = observed_at.checked_sub(uptime.saturating_sub(UPTIME_RESOLUTION));
            self.restarted = match (self.restarted, restarted) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        self.run_id = Some(run_id.to_string());
    }

    /// None when the master's votes count at `now`, else how long until they do; `max_lease`:
    /// the longest lease in use now (every lease the restart may have forgotten is ended
    /// `max_lease` after it).
    pub fn discounted_for(&self, now: Instant, max_lease: Duration) -> Option<Duration> {
        self.restarted
            .and_then(|restarted| restarted.checked_add(max_lease))
            .map(|from| from.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }
}

/// Semaphore on Redlock: how many holders of a semaphore of `limit` could each hold a majority
/// of `n` masters if every master merely admitted up to `limit` holders (no slots). Each holder
/// occupies a place on at least `quorum(n)` masters, and the masters have `n * limit` places, so
/// at most `n * limit / quorum(n)` — which is `limit` only for `limit == 1` (then it is 1 for
/// every `n`); for `limit == 2` on 5 masters it is 3. Hence the slots: a permit on Redlock is
/// one of `limit` slots, each a mutex won by majority, so two holders of one slot would need two
/// intersecting majorities, and at most `limit` holders exist (`semaphore_slots_bound` below).
pub fn counting_bound(n: usize, limit: usize) -> usize {
    (n * limit) / quorum(n)
}

/// Semaphore on Redlock: the slot to ask for after a round that did not win, from the free slots
/// that each master that answered named. The slot named by the most masters (among equals, the
/// `pick`-th, so that contenders spread out); None when no master named any. The flag says
/// whether a majority named it, so that the next round may win at once instead of waiting.
pub fn next_slot(n: usize, named: &[Vec<u64>], pick: u64) -> Option<(u64, bool)> {
    let counts = named_counts(named);
    let best = counts.iter().map(|&(_, c)| c).max()?;
    let mut tied: Vec<u64> = counts
        .iter()
        .filter(|&&(_, c)| c == best)
        .map(|&(s, _)| s)
        .collect();
    tied.sort_unstable();
    let index = usize::try_from(pick % tied.len() as u64).unwrap_or(0);
    let slot = *tied.get(index)?;
    Some((slot, best >= quorum(n)))
}

/// Semaphore on Redlock: by how many masters the slot named most often was named free (0: none).
pub fn most_named(named: &[Vec<u64>]) -> usize {
    named_counts(named)
        .iter()
        .map(|&(_, c)| c)
        .max()
        .unwrap_or(0)
}

/// Each slot named free, with by how many masters.
fn named_counts(named: &[Vec<u64>]) -> Vec<(u64, usize)> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for free in named {
        for &slot in free {
            match counts.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, c)) => *c += 1,
                None => counts.push((slot, 1)),
            }
        }
    }
    counts
}

/// Cache on Redlock: the value a majority of `n` masters hold, byte for byte (the index of one
/// of its copies in `values`); None when no payload is held by a majority.
pub fn majority_value(n: usize, values: &[&[u8]]) -> Option<usize> {
    values.iter().enumerate().find_map(|(i, v)| {
        let copies = values.iter().filter(|w| *w == v).count();
        (copies >= quorum(n)).then_some(i)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(6), 4);
    }

    #[test]
    fn validity_is_lease_minus_elapsed_minus_drift() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        assert_eq!(drift(lease), 102 * MS);
        assert_eq!(deadline(t0, lease), Some(t0 + 9898 * MS));
        assert_eq!(
            validity(t0, lease, t0 + 898 * MS),
            Some(Duration::from_secs(9))
        );
        assert_eq!(validity(t0, lease, t0 + 9898 * MS), None);
        assert_eq!(validity(t0, lease, t0 + Duration::from_secs(11)), None);
        // A lease shorter than its drift allowance can never be valid.
        assert_eq!(deadline(t0, 2 * MS), None);
        assert_eq!(validity(t0, MS, t0), None);
        assert!(deadline(t0, 3 * MS).is_some());
        let later = t0 + Duration::from_secs(1);
        assert_eq!(lease_start(later, lease) + lease, later + 9898 * MS);
    }

    fn tally(n: usize, votes: &[Vote]) -> Tally {
        let mut t = Tally::new(n);
        for v in votes {
            t.add(*v);
        }
        t
    }

    const G: Vote = Vote::Granted { fence: 1 };
    const F: Vote = Vote::Failed;
    fn busy(ms: i64) -> Vote {
        Vote::Busy { retry_ms: ms }
    }

    #[test]
    fn a_majority_wins_and_settles_early() {
        let t = tally(5, &[G, G]);
        assert!(!t.settled());
        let t = tally(5, &[G, G, G]);
        assert!(t.settled());
        assert_eq!(t.outcome(), Outcome::Won);
        assert_eq!(tally(5, &[G, F, G, F, G]).outcome(), Outcome::Won);
        assert_eq!(tally(1, &[G]).outcome(), Outcome::Won);
    }

    #[test]
    fn unreachable_masters_are_a_quorum_error_held_locks_are_not() {
        // 3 of 5 down: no majority can ever answer.
        let t = tally(5, &[G, G, F, F, F]);
        assert_eq!(t.outcome(), Outcome::NoQuorum { answered: 2 });
        let t = tally(5, &[F, F, F]);
        assert!(t.settled());
        assert_eq!(t.outcome(), Outcome::NoQuorum { answered: 0 });
        // 2 of 5 down and the rest busy: simply held.
        let t = tally(5, &[busy(300), busy(200), F, F, busy(-1)]);
        assert_eq!(
            t.outcome(),
            Outcome::Busy {
                retry_ms: 200,
                split: false
            }
        );
        // Two down and one busy: out of reach, but held or a quorum error only the votes
        // still out tell (API.md: a quorum error when no majority answered).
        let t = tally(5, &[busy(40), F, F]);
        assert!(!t.settled());
        assert!(!tally(5, &[busy(40), F, F, busy(30)]).settled());
        let t = tally(5, &[busy(40), F, F, busy(30), busy(50)]);
        assert!(t.settled());
        assert_eq!(
            t.outcome(),
            Outcome::Busy {
                retry_ms: 30,
                split: false
            }
        );
        // One down: held once a majority answered, whatever the last vote says.
        assert!(!tally(5, &[busy(40), F, busy(30)]).settled());
        assert!(tally(5, &[busy(40), F, busy(30), busy(20)]).settled());
        let t = tally(5, &[busy(40), F, F, F]);
        assert!(t.settled());
        assert_eq!(t.outcome(), Outcome::NoQuorum { answered: 1 });
        // Three masters, one down, one busy: the third decides.
        assert!(!tally(3, &[busy(40), F]).settled());
        assert_eq!(
            tally(3, &[busy(40), F, F]).outcome(),
            Outcome::NoQuorum { answered: 1 }
        );
        // Settled as soon as a majority is out of reach.
        let t = tally(5, &[busy(5), busy(5), busy(5)]);
        assert!(t.settled());
        assert_eq!(
            t.outcome(),
            Outcome::Busy {
                retry_ms: 5,
                split: false
            }
        );
    }

    #[test]
    fn split_votes_and_discounted_grants() {
        let t = tally(5, &[G, G, busy(7), busy(9), busy(-1)]);
        assert_eq!(
            t.outcome(),
            Outcome::Busy {
                retry_ms: 7,
                split: true
            }
        );
        let d = Vote::Discounted {
            fence: 1,
            counts_in_ms: 3,
        };
        let t = tally(5, &[G, G, d, busy(50), busy(50)]);
        assert_eq!(t.granted(), 2);
        assert_eq!(t.answered(), 5);
        assert_eq!(
            t.outcome(),
            Outcome::Busy {
                retry_ms: 3,
                split: true
            }
        );
    }

    #[test]
    fn the_fence_is_the_largest_and_laggards_are_raised() {
        assert_eq!(agreed_fence(&[]), None);
        assert_eq!(agreed_fence(&[(0, 4), (2, 4), (3, 4)]), Some((4, vec![])));
        assert_eq!(
            agreed_fence(&[(0, 4), (2, 9), (3, 1)]),
            Some((9, vec![0, 3]))
        );
    }

    #[test]
    fn fences_increase_across_any_sequence_of_majorities() {
        // Simulate N masters' counters; every acquisition INCRs on some majority, takes the max
        // and raises the laggards. Fences must strictly increase whatever the majorities are.
        for n in 1..=6usize {
            let q = quorum(n);
            let mut counters = vec![0i64; n];
            let mut last = 0;
            // Every majority, as a bit mask, in a scrambled order, three times over.
            let masks: Vec<u32> = (0u32..(1 << n))
                .filter(|m| m.count_ones() as usize >= q)
                .collect();
            for round in 0..3 * masks.len() {
                let mask = masks[(round * 7 + 3) % masks.len()];
                let members: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
                let grants: Vec<(usize, i64)> = members
                    .iter()
                    .map(|&i| {
                        counters[i] += 1;
                        (i, counters[i])
                    })
                    .collect();
                let (fence, behind) = agreed_fence(&grants).unwrap();
                for i in behind {
                    counters[i] = counters[i].max(fence);
                }
                assert!(fence > last, "n={n} mask={mask:b}: {fence} after {last}");
                last = fence;
            }
        }
    }

    #[test]
    fn majority_of_confirmations() {
        assert_eq!(majority(5, 3, 0), Majority::Yes);
        assert_eq!(majority(5, 2, 3), Majority::No);
        assert_eq!(majority(5, 2, 2), Majority::Unknown);
        assert_eq!(majority(5, 0, 2), Majority::Unknown);
        assert_eq!(majority(3, 1, 2), Majority::No);
    }

    #[test]
    fn a_discounted_master_shows_a_holder_but_denies_nobody() {
        let x = || Some(b"x".to_vec());
        // 3 masters: the holder's copies on a discounted master and one more; the third free.
        let mut h = Holders::default();
        h.add(None, true);
        assert_eq!(h.majority(3), Majority::Unknown);
        h.add(x(), false);
        assert_eq!(h.majority(3), Majority::Unknown);
        h.add(x(), true);
        assert_eq!(h.majority(3), Majority::Yes);
        // A discounted master's "none" is no denial: 5 masters, 2 counted free, 2 discounted free.
        let mut h = Holders::default();
        for counted in [true, true, false, false] {
            h.add(None, counted);
        }
        assert_eq!(h.majority(5), Majority::Unknown);
        h.add(None, true);
        assert_eq!(h.majority(5), Majority::No);
        // Another owner's copy on a discounted master denies x nothing; on a counted one it does.
        let mut h = Holders::default();
        h.add(x(), true);
        h.add(Some(b"y".to_vec()), false);
        h.add(Some(b"y".to_vec()), false);
        assert_eq!(h.held_and_denied(), (2, 0));
        h.add(None, true);
        h.add(None, true);
        // x may hold on its copy and both discounted masters (which may have forgotten it).
        assert_eq!(h.held_and_denied(), (2, 2));
        assert_eq!(h.majority(5), Majority::Unknown);
        // Three counted answers deny every owner: free by majority.
        let mut h = Holders::default();
        for _ in 0..3 {
            h.add(None, true);
        }
        assert_eq!(h.majority(5), Majority::No);
    }

    #[test]
    fn a_restarted_master_is_discounted_until_the_longest_lease_passed() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        let mut inc = Incarnation::default();
        inc.observe("a", Duration::from_secs(100), t0);
        assert_eq!(
            inc.discounted_for(t0, lease),
            None,
            "first sighting is trusted"
        );
        inc.observe("a", Duration::from_secs(101), t0 + Duration::from_secs(1));
        assert_eq!(inc.discounted_for(t0, lease), None);
        // Said 2 s of uptime: restarted more than 1 s before we noticed (the uptime may be a
        // second too high), so discounted for at most the remaining 9 s.
        let seen = t0 + Duration::from_secs(5);
        inc.observe("b", Duration::from_secs(2), seen);
        assert_eq!(
            inc.discounted_for(seen, lease),
            Some(Duration::from_secs(9))
        );
        assert_eq!(
            inc.discounted_for(seen + Duration::from_secs(9), lease),
            None
        );
        // Same incarnation seen again: nothing changes.
        inc.observe("b", Duration::from_secs(3), seen + Duration::from_secs(1));
        assert_eq!(
            inc.discounted_for(seen, lease),
            Some(Duration::from_secs(9))
        );
        // A restart long ago does not discount at all.
        let later = seen + Duration::from_secs(60);
        inc.observe("c", Duration::from_secs(30), later);
        assert_eq!(inc.discounted_for(later, lease), None);
    }

    #[test]
    fn a_longer_lease_used_after_the_restart_was_seen_lengthens_the_discount() {
        // The restart was noticed while no lease (or a short one) was in use: a lease of 3 s
        // used afterwards must still find the master discounted until 3 s after the restart.
        let t0 = Instant::now();
        let mut inc = Incarnation::default();
        inc.observe("a", Duration::from_secs(50), t0);
        let seen = t0 + Duration::from_secs(2);
        inc.observe("b", Duration::from_secs(1), seen);
        assert_eq!(inc.discounted_for(seen, Duration::ZERO), None);
        let short = Duration::from_millis(200);
        assert_eq!(inc.discounted_for(seen + short, short), None);
        let lease = Duration::from_secs(3);
        assert_eq!(inc.discounted_for(seen + short, lease), Some(lease - short));
    }

    #[test]
    fn an_uptime_of_one_second_may_be_a_restart_just_now() {
        // INFO's uptime is `floor(now) - floor(start)` in seconds: a server started at x.95 s
        // and asked at (x+1).05 s says 1 s after 0.1 s. Its votes must not count before a whole
        // lease from the moment it was seen (the restart may have been just before).
        let t0 = Instant::now();
        let lease = Duration::from_secs(3);
        let mut inc = Incarnation::default();
        inc.observe("a", Duration::from_secs(50), t0);
        let seen = t0 + Duration::from_secs(1);
        inc.observe("b", Duration::from_secs(1), seen);
        assert_eq!(inc.discounted_for(seen, lease), Some(lease));
        let mut inc = Incarnation::default();
        inc.observe("a", Duration::from_secs(50), t0);
        inc.observe("b", Duration::ZERO, seen);
        assert_eq!(inc.discounted_for(seen, lease), Some(lease));
    }
    /// The most holders that can each hold a majority of `n` masters when every master admits
    /// at most `capacity` of them: exhaustive over multisets of minimal majorities.
    fn most_majority_holders(n: usize, capacity: usize) -> usize {
        let q = quorum(n);
        let majorities: Vec<u32> = (0u32..(1 << n))
            .filter(|m| m.count_ones() as usize == q)
            .collect();
        fn grow(from: usize, load: &mut Vec<usize>, maj: &[u32], cap: usize, k: usize) -> usize {
            let mut best = k;
            for (i, &m) in maj.iter().enumerate().skip(from) {
                let fits = (0..load.len()).all(|b| m & (1 << b) == 0 || load[b] < cap);
                if !fits {
                    continue;
                }
                (0..load.len())
                    .filter(|b| m & (1 << b) != 0)
                    .for_each(|b| load[b] += 1);
                best = best.max(grow(i, load, maj, cap, k + 1));
                (0..load.len())
                    .filter(|b| m & (1 << b) != 0)
                    .for_each(|b| load[b] -= 1);
            }
            best
        }
        grow(0, &mut vec![0; n], &majorities, capacity, 0)
    }

    #[test]
    fn counting_admissions_bounds_majority_holders_by_n_limit_over_quorum_only() {
        for n in [3, 4, 5] {
            for limit in 1..=3 {
                assert_eq!(
                    most_majority_holders(n, limit),
                    counting_bound(n, limit),
                    "n={n} limit={limit}"
                );
            }
            // One permit: any two majorities share a master, so one holder at most.
            assert_eq!(counting_bound(n, 1), 1);
        }
        // Two permits on five masters: three holders could each hold a majority.
        assert_eq!(counting_bound(5, 2), 3);
    }

    #[test]
    fn semaphore_slots_bound() {
        // A slot is a mutex per master (capacity 1): at most one majority holder per slot, so
        // `limit` slots admit at most `limit` holders, for every n.
        for n in 1..=6 {
            assert_eq!(most_majority_holders(n, 1), 1, "n={n}");
        }
    }

    #[test]
    fn the_next_slot_is_the_one_most_masters_named() {
        let named = vec![vec![3, 4], vec![4, 1], vec![4], vec![]];
        assert_eq!(next_slot(5, &named, 0), Some((4, true)));
        assert_eq!(next_slot(5, &named[..2], 7), Some((4, false)));
        // Ties spread by `pick`.
        let tied = vec![vec![1, 2], vec![2, 1]];
        assert_eq!(next_slot(3, &tied, 0), Some((1, true)));
        assert_eq!(next_slot(3, &tied, 1), Some((2, true)));
        assert_eq!(next_slot(3, &[vec![], vec![]], 5), None);
        assert_eq!(most_named(&named), 3);
        assert_eq!(most_named(&named[..2]), 2);
        assert_eq!(most_named(&[vec![], vec![]]), 0);
    }

    #[test]
    fn a_cached_value_counts_when_a_majority_holds_it_byte_for_byte() {
        let (a, b): (&[u8], &[u8]) = (b"new", b"old");
        assert_eq!(majority_value(5, &[a, b, a, a]), Some(0));
        assert_eq!(majority_value(5, &[b, a, a, b]), None);
        assert_eq!(majority_value(5, &[b, a, b, b]), Some(0));
        assert_eq!(majority_value(3, &[a, a]), Some(0));
        assert_eq!(majority_value(3, &[]), None);
    }
}
