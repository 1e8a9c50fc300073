//! The frames a subscribed connection reads (RESP2 arrays or RESP3 pushes), for a blocking
//! caller's own subscriber connection (`engine::listener`): a message, the confirmation of a
//! SUBSCRIBE, or anything else (an UNSUBSCRIBE's confirmation, a PING's answer).

use redis::Value;

/// One frame read on a subscribed connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A message published on `channel`.
    Message {
        channel: &'a [u8],
        payload: &'a [u8],
    },
    /// The server confirms that `channel` is subscribed: everything published on it from now
    /// on reaches this connection.
    Subscribed(&'a [u8]),
    Other,
}

/// What a frame read on a subscribed connection is.
pub fn frame(value: &Value) -> Frame<'_> {
    let items: &[Value] = match value {
        Value::Array(items) => items,
        Value::Push { kind, data } => {
            return match (kind, data.as_slice()) {
                (redis::PushKind::Message, [channel, payload]) => {
                    message(bytes(channel), bytes(payload))
                }
                (redis::PushKind::Subscribe, [channel, _]) => {
                    bytes(channel).map_or(Frame::Other, Frame::Subscribed)
                }
                _ => Frame::Other,
            };
        }
        _ => return Frame::Other,
    };
    match items {
        [kind, channel, payload] if bytes(kind) == Some(b"message") => {
            message(bytes(channel), bytes(payload))
        }
        [kind, channel, _] if bytes(kind) == Some(b"subscribe") => {
            bytes(channel).map_or(Frame::Other, Frame::Subscribed)
        }
        _ => Frame::Other,
    }
}

fn message<'a>(channel: Option<&'a [u8]>, payload: Option<&'a [u8]>) -> Frame<'a> {
    match (channel, payload) {
        (Some(channel), Some(payload)) => Frame::Message { channel, payload },
        _ => Frame::Other,
    }
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(b: &[u8]) -> Value {
        Value::BulkString(b.to_vec())
    }

    #[test]
    fn resp2_frames() {
        let msg = Value::Array(vec![bulk(b"message"), bulk(b"ch"), bulk(b"t 3 100")]);
        assert_eq!(
            frame(&msg),
            Frame::Message {
                channel: b"ch",
                payload: b"t 3 100"
            }
        );
        let sub = Value::Array(vec![bulk(b"subscribe"), bulk(b"ch"), Value::Int(2)]);
        assert_eq!(frame(&sub), Frame::Subscribed(b"ch"));
        let unsub = Value::Array(vec![bulk(b"unsubscribe"), bulk(b"ch"), Value::Int(0)]);
        assert_eq!(frame(&unsub), Frame::Other);
        let pong = Value::Array(vec![bulk(b"pong"), bulk(b"")]);
        assert_eq!(frame(&pong), Frame::Other);
        assert_eq!(frame(&Value::Int(1)), Frame::Other);
    }

    #[test]
    fn resp3_pushes() {
        let msg = Value::Push {
            kind: redis::PushKind::Message,
            data: vec![bulk(b"ch"), bulk(b"")],
        };
        assert_eq!(
            frame(&msg),
            Frame::Message {
                channel: b"ch",
                payload: b""
            }
        );
        let sub = Value::Push {
            kind: redis::PushKind::Subscribe,
            data: vec![bulk(b"ch"), Value::Int(1)],
        };
        assert_eq!(frame(&sub), Frame::Subscribed(b"ch"));
        let unsub = Value::Push {
            kind: redis::PushKind::Unsubscribe,
            data: vec![bulk(b"ch"), Value::Int(0)],
        };
        assert_eq!(frame(&unsub), Frame::Other);
    }
}
