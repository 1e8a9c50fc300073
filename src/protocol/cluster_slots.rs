//! `CLUSTER SLOTS`: the command and its reply, read into the primary of each slot range.

use redis::Value;

/// (first slot, last slot, host, port) of the primary that serves one range of slots.
pub type SlotRange = (u16, u16, String, u16);

/// The command that asks a node for the cluster's slot map.
pub fn command() -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    cmd
}

/// The primary of every range in a `CLUSTER SLOTS` reply, sorted by first slot. A range whose
/// primary has no usable endpoint ("" or "?": the node does not know it) is left out, so that
/// its slots stay unknown rather than wrong. None: not a `CLUSTER SLOTS` reply.
pub fn parse(reply: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut found = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let [start, end, primary, ..] = fields.as_slice() else {
            return None;
        };
        let Value::Array(primary) = primary else {
            return None;
        };
        let [host, port, ..] = primary.as_slice() else {
            return None;
        };
        let host = match host {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
            Value::SimpleString(text) => text.clone(),
            Value::Nil => continue,
            _ => return None,
        };
        if host.is_empty() || host == "?" {
            continue;
        }
        found.push((slot(start)?, slot(end)?, host, slot(port)?));
    }
    found.sort_unstable_by_key(|(start, _, _, _)| *start);
    Some(found)
}

fn slot(value: &Value) -> Option<u16> {
    match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"0123abcd".to_vec()),
            Value::Array(vec![]),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut fields = vec![Value::Int(start), Value::Int(end)];
        fields.extend(nodes);
        Value::Array(fields)
    }

    #[test]
    fn the_primary_of_each_range_in_slot_order() {
        let reply = Value::Array(vec![
            range(
                5461,
                10922,
                vec![node("127.0.0.1", 7001), node("127.0.0.1", 7004)],
            ),
            range(0, 5460, vec![node("127.0.0.1", 7000)]),
            range(10923, 16383, vec![node("10.0.0.3", 7002)]),
        ]);
        assert_eq!(
            parse(&reply),
            Some(vec![
                (0, 5460, "127.0.0.1".into(), 7000),
                (5461, 10922, "127.0.0.1".into(), 7001),
                (10923, 16383, "10.0.0.3".into(), 7002),
            ])
        );
        assert_eq!(parse(&Value::Array(vec![])), Some(vec![]));
    }

    #[test]
    fn a_primary_without_a_known_endpoint_is_left_out() {
        let reply = Value::Array(vec![
            range(0, 99, vec![node("", 7000)]),
            range(100, 199, vec![node("?", 7001)]),
            range(200, 299, vec![node("127.0.0.1", 7002)]),
        ]);
        assert_eq!(
            parse(&reply),
            Some(vec![(200, 299, "127.0.0.1".into(), 7002)])
        );
    }

    #[test]
    fn anything_else_is_not_a_slot_map() {
        assert_eq!(parse(&Value::Nil), None);
        assert_eq!(parse(&Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(parse(&Value::Array(vec![range(0, 99, vec![])])), None);
        assert_eq!(
            parse(&Value::Array(vec![range(0, 70_000, vec![node("h", 1)])])),
            None
        );
    }
}
