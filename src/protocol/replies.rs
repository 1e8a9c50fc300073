//! Parsing of script replies into typed outcomes.

use redis::Value;

/// What an acquire attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The caller holds the lock now, with this fencing token.
    Granted { fence: i64 },
    /// Somebody else is ahead; look again within `retry_ms` at the latest (-1: no hint).
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

fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// `{1, fence}` or `{0, retry_ms}`.
pub fn parse_attempt(value: &Value) -> Result<Attempt, UnexpectedReply> {
    if let Value::Array(items) = value {
        if let [flag, n] = items.as_slice() {
            match (as_int(flag), as_int(n)) {
                (Some(1), Some(fence)) => return Ok(Attempt::Granted { fence }),
                (Some(0), Some(retry_ms)) => return Ok(Attempt::Busy { retry_ms }),
                _ => {}
            }
        }
    }
    Err(UnexpectedReply(format!("{value:?}")))
}

/// `1` (done) or `0` (not ours).
pub fn parse_flag(value: &Value) -> Result<bool, UnexpectedReply> {
    match as_int(value) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(UnexpectedReply(format!("{value:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_parse() {
        let granted = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        assert_eq!(parse_attempt(&granted), Ok(Attempt::Granted { fence: 42 }));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(-1)]);
        assert_eq!(parse_attempt(&busy), Ok(Attempt::Busy { retry_ms: -1 }));
        assert!(parse_attempt(&Value::Int(1)).is_err());
        assert!(parse_attempt(&Value::Array(vec![Value::Int(2), Value::Int(0)])).is_err());
    }

    #[test]
    fn flags_parse() {
        assert_eq!(parse_flag(&Value::Int(1)), Ok(true));
        assert_eq!(parse_flag(&Value::Int(0)), Ok(false));
        assert!(parse_flag(&Value::Nil).is_err());
    }
}
