//! The messages published on a primitive's wake channel, as the hub reads them.
//!
//! - `''`: a release for everybody: every waiter looks again.
//! - `<token>`: only the waiter with this token looks again (it is first in a fair queue).
//! - `<token> <fence> <lease ms>`: the fair lock was granted to the waiter with this token
//!   (`lock_grant.lua`): it holds the lock now, with this fence, for at most this lease counted
//!   from when the grant ran; it takes the hold without asking Redis.

/// A grant to one fair waiter, as published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantNote {
    pub fence: i64,
    pub lease_ms: u64,
}

/// What one wake-up message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeMessage<'a> {
    Everyone,
    Token(&'a [u8]),
    Grant { token: &'a [u8], note: GrantNote },
}

/// Reads a wake-up message; anything not shaped like a grant names a token.
pub fn parse_wake(payload: &[u8]) -> WakeMessage<'_> {
    if payload.is_empty() {
        return WakeMessage::Everyone;
    }
    let mut parts = payload.splitn(3, |&b| b == b' ');
    if let (Some(token), Some(fence), Some(lease)) = (parts.next(), parts.next(), parts.next()) {
        if let (Some(fence), Some(lease_ms)) = (number::<i64>(fence), number::<u64>(lease)) {
            if !token.is_empty() && lease_ms > 0 {
                return WakeMessage::Grant {
                    token,
                    note: GrantNote { fence, lease_ms },
                };
            }
        }
    }
    WakeMessage::Token(payload)
}

/// Whether `message` wakes a waiter whose token is `token` (None: woken by every message): one
/// for everybody, or one naming its token (a wake-up or a grant).
pub fn meant_for(message: WakeMessage<'_>, token: Option<&[u8]>) -> bool {
    match (token, message) {
        (None, _) | (Some(_), WakeMessage::Everyone) => true,
        (Some(mine), WakeMessage::Token(named)) => named == mine,
        (Some(mine), WakeMessage::Grant { token, .. }) => token == mine,
    }
}

fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse() {
        assert_eq!(parse_wake(b""), WakeMessage::Everyone);
        assert_eq!(parse_wake(b"abc123"), WakeMessage::Token(b"abc123"));
        assert_eq!(
            parse_wake(b"abc123 42 7000"),
            WakeMessage::Grant {
                token: b"abc123",
                note: GrantNote {
                    fence: 42,
                    lease_ms: 7000
                }
            }
        );
    }

    #[test]
    fn a_message_wakes_everybody_or_the_token_it_names() {
        let grant = parse_wake(b"abc 42 7000");
        assert!(meant_for(grant, Some(b"abc")));
        assert!(!meant_for(grant, Some(b"xyz")));
        assert!(meant_for(grant, None));
        assert!(meant_for(parse_wake(b""), Some(b"xyz")));
        assert!(meant_for(parse_wake(b"xyz"), Some(b"xyz")));
        assert!(!meant_for(parse_wake(b"abc"), Some(b"xyz")));
    }

    #[test]
    fn malformed_grants_are_tokens() {
        for odd in [
            &b"abc 42"[..],
            b"abc 42 x",
            b"abc -1 7000",
            b"abc 42 0",
            b" 42 7000",
            b"abc 42 7000 9",
            b"abc 99999999999999999999 7000",
        ] {
            assert_eq!(parse_wake(odd), WakeMessage::Token(odd), "{odd:?}");
        }
    }
}
