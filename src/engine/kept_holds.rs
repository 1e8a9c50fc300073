//! Holds kept per (lock key, token) until their release, swept of the ones that are over as the
//! record grows: a hold that is never released (the recipes' caller lets the lease run out)
//! must not stay in memory for the life of the process. What "over" means is the owner's (see
//! `Redlock::keep_hold`, and the binding's record of the recipes' and shims' holds on one
//! server).

use std::collections::HashMap;

/// Kept holds below which the record is not swept.
const SWEEP_FLOOR: usize = 64;

type HoldKey = (Vec<u8>, String);

pub struct KeptHolds<H> {
    holds: HashMap<HoldKey, H>,
    /// Sweep when the record reaches this size (twice what the last sweep left, at least
    /// SWEEP_FLOOR), so that many live holds do not make every insert scan the record.
    sweep_at: usize,
}

impl<H> KeptHolds<H> {
    pub fn new() -> Self {
        KeptHolds {
            holds: HashMap::new(),
            sweep_at: SWEEP_FLOOR,
        }
    }

    /// Keeps `hold` of `token` on `key` (replacing one kept under both); when the record has
    /// grown to the sweep size, first drops every hold that `over` says is over.
    pub fn insert(&mut self, key: Vec<u8>, token: &str, hold: H, over: impl Fn(&str, &H) -> bool) {
        if self.holds.len() >= self.sweep_at {
            self.holds.retain(|(_, token), hold| !over(token, hold));
            self.sweep_at = (self.holds.len() * 2).max(SWEEP_FLOOR);
        }
        self.holds.insert((key, token.to_string()), hold);
    }

    /// Takes the hold kept for `token` on `key`, if any.
    pub fn remove(&mut self, key: Vec<u8>, token: &str) -> Option<H> {
        self.holds.remove(&(key, token.to_string()))
    }

    /// The hold kept for `token` on `key`, if any.
    pub fn get(&self, key: Vec<u8>, token: &str) -> Option<&H> {
        self.holds.get(&(key, token.to_string()))
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.holds.len()
    }

    #[cfg(test)]
    pub(super) fn contains(&self, key: &[u8], token: &str) -> bool {
        self.holds.contains_key(&(key.to_vec(), token.to_string()))
    }
}

impl<H> Default for KeptHolds<H> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_that_are_over_are_swept_and_live_ones_kept() {
        let mut kept: KeptHolds<bool> = KeptHolds::new();
        kept.insert(b"live".to_vec(), "t", false, |_, over| *over);
        for i in 0..10_000u32 {
            kept.insert(i.to_be_bytes().to_vec(), "t", true, |_, over| *over);
        }
        assert!(kept.len() <= SWEEP_FLOOR + 1, "{}", kept.len());
        assert_eq!(kept.remove(b"live".to_vec(), "t"), Some(false));
    }

    #[test]
    fn many_live_holds_cost_a_sweep_only_as_the_record_doubles() {
        let asked = std::cell::Cell::new(0usize);
        let mut kept: KeptHolds<()> = KeptHolds::new();
        for i in 0..20_000u32 {
            kept.insert(i.to_be_bytes().to_vec(), "t", (), |_, _| {
                asked.set(asked.get() + 1);
                false
            });
        }
        assert_eq!(kept.len(), 20_000);
        // Sweeps at 64, 128, ..., 16384: under twice the holds in all (a sweep on every insert
        // past a fixed size asked about 20,000 × 19,000 times).
        assert!(asked.get() < 2 * 20_000, "{}", asked.get());
    }

    #[test]
    fn many_live_holds_are_all_kept() {
        let mut kept: KeptHolds<()> = KeptHolds::new();
        for i in 0..1_000u32 {
            kept.insert(i.to_be_bytes().to_vec(), "t", (), |_, _| false);
        }
        assert_eq!(kept.len(), 1_000);
    }
}
