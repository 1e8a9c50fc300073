//! The cache's steps: look up or claim the fill, store, abandon, extend the claim, invalidate.

use std::time::Duration;

use super::keys::Keys;
use super::lease;
use super::lock::parse_owner;
use super::replies::{parse_flag, parse_lookup, Lookup};
use super::scripts;
use super::step::Step;

/// Look up the entry, or claim its fill for `token` (a lease of `lease`); `skip`: the SHA-1 hex
/// of a payload the caller cannot use.
pub fn get_or_claim(keys: &Keys, token: &str, lease: Duration, skip: Option<&str>) -> Step<Lookup> {
    Step::script(
        scripts::cache_get_or_claim(keys, token, lease::lease_ms(lease), skip),
        parse_lookup,
    )
}

/// Store `payload` for `ttl_ms` if `token` holds the claim; false when it did not (any more).
pub fn store(keys: &Keys, token: &str, payload: &[u8], ttl_ms: u64) -> Step<bool> {
    Step::script(scripts::cache_store(keys, token, payload, ttl_ms), |v| {
        parse_flag(&v)
    })
}

/// Give `token`'s claim back without a value; false when it was not ours (any more).
pub fn abandon(keys: &Keys, token: &str) -> Step<bool> {
    let inv = scripts::cache_abandon(keys, token, &keys.wake_channel());
    Step::script(inv, |v| parse_flag(&v))
}

/// `abandon` that wakes nobody: a lost Redlock round gives its grants back so (see
/// `redlock_lease.rs`).
pub fn give_back_quietly(keys: &Keys, token: &str) -> Step<bool> {
    let inv = scripts::cache_abandon(keys, token, scripts::NOBODY);
    Step::script(inv, |v| parse_flag(&v))
}

/// Extend `token`'s claim by `lease_ms`; false when it is not ours.
pub fn extend(keys: &Keys, token: &str, lease_ms: u64) -> Step<bool> {
    Step::script(scripts::cache_extend(keys, token, lease_ms), |v| {
        parse_flag(&v)
    })
}

/// Drop the entry and any claim on it; whether there was anything.
pub fn invalidate(keys: &Keys) -> Step<bool> {
    Step::script(scripts::cache_invalidate(keys), |v| parse_flag(&v))
}

/// Whether `token` holds the entry's fill claim: a fill asking for its own entry through
/// another client (a URL spelled otherwise) would wait for that claim, which it holds itself.
pub fn claim_held_by(keys: &Keys, token: &str) -> Step<bool> {
    let mut get = redis::cmd("GET");
    get.arg(keys.cache_fill());
    let token = token.as_bytes().to_vec();
    Step::command(get, parse_owner).map(move |owner| owner.as_deref() == Some(token.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn a_lookup_reads_hit_claim_or_busy() {
        let keys = Keys::new(b"p:", b"c");
        let step = get_or_claim(&keys, "t", Duration::from_secs(1), None);
        let hit = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"v".to_vec()),
            Value::Int(-1),
        ]);
        assert_eq!(
            step.parse(hit),
            Ok(Lookup::Hit {
                payload: b"v".to_vec(),
                pttl_ms: -1
            })
        );
        let claimed = Value::Array(vec![Value::Int(2), Value::Int(1000)]);
        assert_eq!(step.parse(claimed), Ok(Lookup::Claimed));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(30)]);
        assert_eq!(step.parse(busy), Ok(Lookup::Busy { retry_ms: 30 }));
        assert_eq!(store(&keys, "t", b"v", 10).parse(Value::Int(1)), Ok(true));
        assert_eq!(abandon(&keys, "t").parse(Value::Int(0)), Ok(false));
        assert_eq!(invalidate(&keys).parse(Value::Int(1)), Ok(true));
        let held = claim_held_by(&keys, "t");
        assert_eq!(held.parse(Value::BulkString(b"t".to_vec())), Ok(true));
        assert_eq!(held.parse(Value::BulkString(b"u".to_vec())), Ok(false));
        assert_eq!(held.parse(Value::Nil), Ok(false));
    }
}
