//! Owner tokens: 128 random bits from the OS, written as 32 lowercase hex characters.
//!
//! The bits are read from the OS (`getrandom`) a batch at a time into a buffer of the calling
//! thread, so that a lock + unlock pair does not pay a system call for its token: each token
//! still takes 16 bytes the OS gave and nobody else took, and every byte is wiped once used.
//! A buffer filled in another process (a forked child inherits its parent's memory) is thrown
//! away unused, so a child never repeats a token of its parent.

use std::cell::RefCell;

use super::error::{Error, Result};
use super::runtime::lineage;

const TOKEN_BYTES: usize = 16;
/// Tokens per read from the OS.
const BATCH: usize = 16;

struct Pool {
    /// The process that filled `bytes` (its pid and forks, see `runtime::lineage`); 0 before
    /// the first fill.
    filled_by: (u32, u32),
    bytes: [u8; TOKEN_BYTES * BATCH],
    /// Where the next unused token starts (`bytes.len()`: none left).
    next: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = const {
        RefCell::new(Pool {
            filled_by: (0, 0),
            bytes: [0; TOKEN_BYTES * BATCH],
            next: TOKEN_BYTES * BATCH,
        })
    };
}

impl Pool {
    fn take(&mut self, out: &mut [u8; TOKEN_BYTES]) -> Result<()> {
        let me = lineage();
        if self.filled_by != me || self.next >= self.bytes.len() {
            self.bytes.fill(0);
            self.next = self.bytes.len();
            getrandom::fill(&mut self.bytes)
                .map_err(|e| Error::Usage(format!("no randomness for a lock token: {e}")))?;
            self.filled_by = me;
            self.next = 0;
        }
        let used = &mut self.bytes[self.next..self.next + TOKEN_BYTES];
        out.copy_from_slice(used);
        used.fill(0);
        self.next += TOKEN_BYTES;
        Ok(())
    }
}

pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    POOL.try_with(|pool| pool.borrow_mut().take(&mut bytes))
        // The thread is exiting (its buffer is gone): straight from the OS.
        .unwrap_or_else(|_| {
            getrandom::fill(&mut bytes)
                .map_err(|e| Error::Usage(format!("no randomness for a lock token: {e}")))
        })?;
    Ok(uuid::Uuid::from_bytes(bytes).simple().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_and_distinct() {
        let a = new_token().unwrap_or_default();
        let b = new_token().unwrap_or_default();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_stay_distinct_across_batches_and_threads() {
        let mine: Vec<String> = (0..5 * BATCH)
            .map(|_| new_token().unwrap_or_default())
            .collect();
        let theirs = std::thread::spawn(|| {
            (0..5 * BATCH)
                .map(|_| new_token().unwrap_or_default())
                .collect::<Vec<String>>()
        })
        .join()
        .unwrap_or_default();
        let mut all: Vec<&String> = mine.iter().chain(theirs.iter()).collect();
        assert_eq!(all.len(), 10 * BATCH);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10 * BATCH);
        assert!(all.iter().all(|t| t.len() == 32));
    }
}
