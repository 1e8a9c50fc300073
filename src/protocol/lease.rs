//! Time arithmetic for leases and waits. Times cross the wire as whole milliseconds.

use std::time::{Duration, Instant};

/// The largest lease or wait that PX/PEXPIRE accept without overflowing on the server side
/// (Redis adds the current time in ms to it, which must stay within a signed 64-bit integer).
pub const MAX_MS: u64 = 1 << 52;

/// Whole milliseconds for a lease, rounded up so a requested lease is never shortened.
pub fn lease_ms(lease: Duration) -> u64 {
    let ms = lease.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(MAX_MS).clamp(1, MAX_MS)
}

/// The local deadline of a lease whose request was sent at `sent_at`.
/// Measured from before the request was sent, so the holder's idea never outlives the server's.
pub fn deadline(sent_at: Instant, lease: Duration) -> Instant {
    sent_at.checked_add(lease).unwrap_or(sent_at)
}

/// Time left until `deadline`, zero once it has passed.
pub fn remaining(deadline: Instant, now: Instant) -> Duration {
    deadline.saturating_duration_since(now)
}

/// How long a waiter may sleep before looking again, given what the server told it
/// (`hint_ms`: the holder's remaining lease, or -1/-2 when the server knows of none),
/// a fallback for the unknown case, and the caller's own deadline.
pub fn next_look(
    hint_ms: i64,
    fallback: Duration,
    deadline: Option<Instant>,
    now: Instant,
) -> Duration {
    let hinted = match u64::try_from(hint_ms) {
        // +1 ms: the key expires at the end of its last millisecond, not at its start.
        Ok(ms) => Duration::from_millis(ms.saturating_add(1)),
        Err(_) => fallback,
    };
    match deadline {
        Some(d) => hinted.min(d.saturating_duration_since(now)),
        None => hinted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ms_rounds_up_and_clamps() {
        assert_eq!(lease_ms(Duration::from_micros(1500)), 2);
        assert_eq!(lease_ms(Duration::from_millis(10)), 10);
        assert_eq!(lease_ms(Duration::from_nanos(1)), 1);
        assert_eq!(lease_ms(Duration::from_secs(u64::MAX)), MAX_MS);
    }

    #[test]
    fn next_look_honours_hint_fallback_and_deadline() {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(
            next_look(250, second, None, now),
            Duration::from_millis(251)
        );
        assert_eq!(next_look(-1, second, None, now), second);
        assert_eq!(next_look(-2, second, None, now), second);
        let soon = now + Duration::from_millis(10);
        assert_eq!(
            next_look(250, second, Some(soon), now),
            Duration::from_millis(10)
        );
        assert_eq!(
            next_look(250, second, Some(now), now + second),
            Duration::ZERO
        );
    }

    #[test]
    fn remaining_is_never_negative() {
        let now = Instant::now();
        assert_eq!(remaining(now, now + Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(
            remaining(now + Duration::from_secs(2), now),
            Duration::from_secs(2)
        );
    }
}
