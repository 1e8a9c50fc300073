//! Parsing of script replies into typed outcomes.

use redis::Value;

/// What an acquire attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The caller holds the lock now, with this fencing token.
    Granted { fence: i64 },
    /// Somebody else is ahead; look again within `retry_ms` at the latest (-1: no hint).
    /// `fence`: the fence counter when the attempt ran (the fair script tells it), so that a
    /// grant published with a larger fence is known to have come after this attempt.
    Busy { retry_ms: i64, fence: Option<i64> },
}

/// What an attempt on a shared primitive (a semaphore permit, a read or write lock) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The caller holds it now; `count` is how many hold it (permits taken, live readers).
    Admitted { count: i64 },
    /// Not now; look again within `retry_ms` at the latest (-1: no hint).
    Busy { retry_ms: i64 },
}

/// Who holds a read-write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RwState {
    pub writer: bool,
    pub readers: i64,
}

/// What a cache lookup found (the reply of `cache_get_or_claim.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A value is stored: its payload, and the ms it has left (-1: no expiry).
    Hit { payload: Vec<u8>, pttl_ms: i64 },
    /// The caller holds the fill claim now.
    Claimed,
    /// Another caller fills; look again within `retry_ms` at the latest (when its lease ends).
    Busy { retry_ms: i64 },
}

/// A reply the protocol did not expect: a bug or a foreign value in our keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnexpectedReply(pub String);

impl std::fmt::Display for UnexpectedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unexpected reply from Redis: {}", self.0)
    }
}

pub fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// `fence` (an integer: granted), `{0, retry_ms}` or (fair) `{0, retry_ms, fence}`.
pub fn parse_attempt(value: &Value) -> Result<Attempt, UnexpectedReply> {
    if let Value::Int(fence) = value {
        return Ok(Attempt::Granted { fence: *fence });
    }
    if let Value::Array(items) = value {
        match items.as_slice() {
            [flag, n] => {
                if let (Some(0), Some(retry_ms)) = (as_int(flag), as_int(n)) {
                    return Ok(Attempt::Busy {
                        retry_ms,
                        fence: None,
                    });
                }
            }
            [flag, n, f] => {
                if let (Some(0), Some(retry_ms), Some(fence)) = (as_int(flag), as_int(n), as_int(f))
                {
                    return Ok(Attempt::Busy {
                        retry_ms,
                        fence: Some(fence),
                    });
                }
            }
            _ => {}
        }
    }
    Err(UnexpectedReply(format!("{value:?}")))
}

/// `count` (an integer: admitted; a script's table reply costs Redis more to convert than an
/// integer) or `{0, retry_ms}`.
pub fn parse_admission(value: &Value) -> Result<Admission, UnexpectedReply> {
    match value {
        Value::Int(count @ 0..) => return Ok(Admission::Admitted { count: *count }),
        Value::Array(items) => {
            if let [flag, retry_ms] = items.as_slice() {
                if let (Some(0), Some(retry_ms)) = (as_int(flag), as_int(retry_ms)) {
                    return Ok(Admission::Busy { retry_ms });
                }
            }
        }
        _ => {}
    }
    Err(UnexpectedReply(format!("{value:?}")))
}

/// `{2, live}` from a semaphore's acquire: refused because a holder or waiter of another limit
/// (`live`) remains. None for any other reply (parse it with `parse_admission`).
pub fn parse_limit_refusal(value: &Value) -> Option<i64> {
    if let Value::Array(items) = value {
        if let [flag, live] = items.as_slice() {
            if let (Some(2), Some(live)) = (as_int(flag), as_int(live)) {
                return Some(live);
            }
        }
    }
    None
}

/// A count: a non-negative integer.
pub fn parse_count(value: &Value) -> Result<i64, UnexpectedReply> {
    match as_int(value) {
        Some(n) if n >= 0 => Ok(n),
        _ => Err(UnexpectedReply(format!("{value:?}"))),
    }
}

/// WAIT's reply: how many replicas acknowledged the writes before it. A WAIT that Redis ended
/// with an `UNBLOCKED` error (`CLIENT UNBLOCK id ERROR`, or a master demoted to a replica
/// ending its blocked clients) was acknowledged by none: 0, as when its own timeout ends it.
/// None: another error, which the caller reports.
pub fn parse_wait_acks(value: &Value) -> Option<Result<i64, UnexpectedReply>> {
    match value {
        Value::ServerError(err) if err.code() == "UNBLOCKED" => Some(Ok(0)),
        Value::ServerError(_) => None,
        other => Some(parse_count(other)),
    }
}

/// `{writer (0|1), readers}`.
pub fn parse_rw_state(value: &Value) -> Result<RwState, UnexpectedReply> {
    if let Value::Array(items) = value {
        if let [writer, readers] = items.as_slice() {
            match (as_int(writer), as_int(readers)) {
                (Some(w @ (0 | 1)), Some(readers)) if readers >= 0 => {
                    return Ok(RwState {
                        writer: w == 1,
                        readers,
                    })
                }
                _ => {}
            }
        }
    }
    Err(UnexpectedReply(format!("{value:?}")))
}

/// `{1, payload, pttl}`, `{2, lease_ms}` or `{0, pttl}`. Takes the reply by value so that the
/// payload is moved out, not copied.
pub fn parse_lookup(value: Value) -> Result<Lookup, UnexpectedReply> {
    let items = match value {
        Value::Array(items) => items,
        other => return Err(UnexpectedReply(format!("{other:?}"))),
    };
    let mut items = items.into_iter();
    let flag = items.next().as_ref().and_then(as_int);
    let lookup = match (flag, items.next(), items.next(), items.next()) {
        (Some(1), Some(Value::BulkString(payload)), Some(pttl), None) => {
            as_int(&pttl).map(|pttl_ms| Lookup::Hit { payload, pttl_ms })
        }
        (Some(2), Some(lease), None, None) => as_int(&lease).map(|_| Lookup::Claimed),
        (Some(0), Some(pttl), None, None) => {
            as_int(&pttl).map(|retry_ms| Lookup::Busy { retry_ms })
        }
        _ => None,
    };
    lookup.ok_or_else(|| UnexpectedReply("a cache lookup reply of unexpected shape".into()))
}

/// `1` (done) or `0` (not ours).
pub fn parse_flag(value: &Value) -> Result<bool, UnexpectedReply> {
    match as_int(value) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(UnexpectedReply(format!("{value:?}"))),
    }
}

/// A fenced release resend's reply (`lock_release.lua`): the key is gone while the fence counter
/// still reads one of the hold's fences. Only the caller, who knows when the lease ends, can tell
/// whether the first send deleted it or the lease ran out.
pub const GONE_AT_OWN_FENCE: i64 = 2;

/// A release's reply: `1` released, `0` not ours, `GONE_AT_OWN_FENCE` (a resend's) not released
/// by this send, which is false here; the caller that can tell reads it with `gone_at_own_fence`.
pub fn parse_released(value: &Value) -> Result<bool, UnexpectedReply> {
    match as_int(value) {
        Some(1) => Ok(true),
        Some(0 | GONE_AT_OWN_FENCE) => Ok(false),
        _ => Err(UnexpectedReply(format!("{value:?}"))),
    }
}

/// Whether a release resend's reply says `GONE_AT_OWN_FENCE`.
pub fn gone_at_own_fence(value: &Value) -> bool {
    as_int(value) == Some(GONE_AT_OWN_FENCE)
}

/// An integer reply (a counter).
pub fn parse_int(value: &Value) -> Result<i64, UnexpectedReply> {
    as_int(value).ok_or_else(|| UnexpectedReply(format!("{value:?}")))
}

/// `run_id` and `uptime_in_seconds` from the text of `INFO server`.
pub fn parse_server_info(text: &str) -> Option<(String, u64)> {
    let mut run_id = None;
    let mut uptime = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("run_id:") {
            run_id = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("uptime_in_seconds:") {
            uptime = v.trim().parse().ok();
        }
    }
    Some((run_id.filter(|r| !r.is_empty())?, uptime?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_unblocked_with_an_error_counts_as_acknowledged_by_none() {
        let reply = |bytes: &[u8]| crate::protocol::resp::parse(bytes).unwrap();
        assert_eq!(parse_wait_acks(&Value::Int(2)), Some(Ok(2)));
        let unblocked = reply(b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n");
        assert_eq!(parse_wait_acks(&unblocked), Some(Ok(0)));
        let other = reply(b"-NOPERM this user has no permissions\r\n");
        assert_eq!(parse_wait_acks(&other), None);
        assert!(matches!(parse_wait_acks(&Value::Nil), Some(Err(_))));
    }

    #[test]
    fn attempts_parse() {
        assert_eq!(
            parse_attempt(&Value::Int(42)),
            Ok(Attempt::Granted { fence: 42 })
        );
        // (the table a grant was before: no longer one)
        let table = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        assert!(parse_attempt(&table).is_err());
        let busy = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            parse_attempt(&busy),
            Ok(Attempt::Busy {
                retry_ms: -1,
                fence: None
            })
        );
        let fair = Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(7)]);
        assert_eq!(
            parse_attempt(&fair),
            Ok(Attempt::Busy {
                retry_ms: 250,
                fence: Some(7)
            })
        );
        let bad = Value::Array(vec![Value::Int(1), Value::Int(250), Value::Int(7)]);
        assert!(parse_attempt(&bad).is_err());
        assert!(parse_attempt(&Value::BulkString(b"7".to_vec())).is_err());
        assert!(parse_attempt(&Value::Array(vec![Value::Int(2), Value::Int(0)])).is_err());
    }

    #[test]
    fn server_info_parses() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrun_id:4f1c2e\r\ntcp_port:6379\r\n\
                    uptime_in_seconds:42\r\nuptime_in_days:0\r\n";
        assert_eq!(parse_server_info(text), Some(("4f1c2e".to_string(), 42)));
        assert_eq!(parse_server_info("run_id:\r\nuptime_in_seconds:1"), None);
        assert_eq!(parse_server_info("uptime_in_seconds:1"), None);
        assert_eq!(parse_int(&Value::Int(7)), Ok(7));
        assert!(parse_int(&Value::Nil).is_err());
    }

    #[test]
    fn a_semaphore_limit_refusal_parses() {
        let refused = Value::Array(vec![Value::Int(2), Value::Int(5)]);
        assert_eq!(parse_limit_refusal(&refused), Some(5));
        // The refusal is no admission, and admissions are no refusal.
        assert!(parse_admission(&refused).is_err());
        for other in [
            Value::Array(vec![Value::Int(1), Value::Int(5)]),
            Value::Array(vec![Value::Int(0), Value::Int(5)]),
            Value::Array(vec![Value::Int(2)]),
            Value::Int(2),
            Value::Nil,
        ] {
            assert_eq!(parse_limit_refusal(&other), None, "{other:?}");
        }
    }

    #[test]
    fn admissions_parse() {
        assert_eq!(
            parse_admission(&Value::Int(3)),
            Ok(Admission::Admitted { count: 3 })
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(
            parse_admission(&busy),
            Ok(Admission::Busy { retry_ms: 1500 })
        );
        let no_hint = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(
            parse_admission(&no_hint),
            Ok(Admission::Busy { retry_ms: -1 })
        );
        let bulk = Value::Array(vec![
            Value::BulkString(b"0".to_vec()),
            Value::BulkString(b"20".to_vec()),
        ]);
        assert_eq!(parse_admission(&bulk), Ok(Admission::Busy { retry_ms: 20 }));
        for bad in [
            Value::Int(-1),
            Value::BulkString(b"1".to_vec()),
            Value::Nil,
            Value::Array(vec![Value::Int(1), Value::Int(3)]),
            Value::Array(vec![Value::Int(1), Value::Int(-1)]),
            Value::Array(vec![Value::Int(2), Value::Int(0)]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
            Value::Array(vec![Value::Int(1), Value::BulkString(b"x".to_vec())]),
        ] {
            assert!(parse_admission(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn counts_parse() {
        assert_eq!(parse_count(&Value::Int(5)), Ok(5));
        assert_eq!(parse_count(&Value::Int(0)), Ok(0));
        assert!(parse_count(&Value::Int(-1)).is_err());
        assert!(parse_count(&Value::Nil).is_err());
    }

    #[test]
    fn rw_states_parse() {
        let free = Value::Array(vec![Value::Int(0), Value::Int(0)]);
        assert_eq!(
            parse_rw_state(&free),
            Ok(RwState {
                writer: false,
                readers: 0
            })
        );
        let written = Value::Array(vec![Value::Int(1), Value::Int(0)]);
        assert!(parse_rw_state(&written).is_ok_and(|s| s.writer));
        let read = Value::Array(vec![Value::Int(0), Value::Int(7)]);
        assert!(parse_rw_state(&read).is_ok_and(|s| !s.writer && s.readers == 7));
        assert!(parse_rw_state(&Value::Array(vec![Value::Int(2), Value::Int(0)])).is_err());
        assert!(parse_rw_state(&Value::Int(0)).is_err());
    }

    #[test]
    fn lookups_parse() {
        let hit = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"RM\x01payload".to_vec()),
            Value::Int(950),
        ]);
        assert_eq!(
            parse_lookup(hit),
            Ok(Lookup::Hit {
                payload: b"RM\x01payload".to_vec(),
                pttl_ms: 950
            })
        );
        let forever = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(Vec::new()),
            Value::Int(-1),
        ]);
        assert_eq!(
            parse_lookup(forever),
            Ok(Lookup::Hit {
                payload: Vec::new(),
                pttl_ms: -1
            })
        );
        let claimed = Value::Array(vec![Value::Int(2), Value::Int(10_000)]);
        assert_eq!(parse_lookup(claimed), Ok(Lookup::Claimed));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(9_876)]);
        assert_eq!(parse_lookup(busy), Ok(Lookup::Busy { retry_ms: 9_876 }));
    }

    #[test]
    fn malformed_lookups_are_errors() {
        for reply in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            // A hit whose payload is not a bulk string, or without its pttl.
            Value::Array(vec![Value::Int(1), Value::Int(5), Value::Int(5)]),
            Value::Array(vec![Value::Int(1), Value::BulkString(b"x".to_vec())]),
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"x".to_vec()),
                Value::Nil,
            ]),
            // Unknown states.
            Value::Array(vec![Value::Int(3), Value::Int(0)]),
            Value::Array(vec![Value::Int(1), Value::Int(0)]),
            Value::Array(vec![Value::Int(0), Value::Nil]),
        ] {
            assert!(parse_lookup(reply.clone()).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn flags_parse() {
        assert_eq!(parse_flag(&Value::Int(1)), Ok(true));
        assert_eq!(parse_flag(&Value::Int(0)), Ok(false));
        assert!(parse_flag(&Value::Nil).is_err());
    }
}
