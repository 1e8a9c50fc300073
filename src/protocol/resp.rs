//! RESP framing for a caller that drives a non-blocking socket itself (the asyncio loop path,
//! `python/loop_conn.rs`): a step's call packed into request bytes (with the SCRIPT LOAD to send
//! when the server answers NOSCRIPT), the handshake a connection's settings ask for, and where
//! the first complete reply in a read buffer ends. No I/O.

use std::sync::{Arc, Mutex};

use redis::{
    Cmd, ConnectionLike, ErrorKind, ProtocolVersion, RedisConnectionInfo, ServerErrorKind, Value,
};

use super::step::Call;

/// A call as bytes: the request, and for a script the SCRIPT LOAD that makes a NOSCRIPT answer
/// go away (then the request is sent again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    pub request: Vec<u8>,
    pub load: Option<Arc<[u8]>>,
}

/// The SCRIPT LOAD of each script packed so far, by its SHA1 (made once: a script's body is
/// kilobytes).
static LOADS: Mutex<Vec<KnownLoad>> = Mutex::new(Vec::new());

/// A script's SHA1 and its SCRIPT LOAD request.
type KnownLoad = ([u8; 40], Arc<[u8]>);

/// The bytes of `call`: EVALSHA for a script (its SCRIPT LOAD beside it), else the command.
pub fn pack(call: &Call) -> Packed {
    match call {
        Call::Command(cmd) => Packed {
            request: cmd.get_packed_command(),
            load: None,
        },
        Call::Script(inv) => {
            // The invocation builds its EVALSHA and SCRIPT LOAD commands only to send them: a
            // connection that sends nothing collects them (told NOSCRIPT, the invocation goes on
            // to its SCRIPT LOAD).
            let mut capture = Capture {
                sent: Vec::new(),
                noscript: false,
            };
            let _ = inv.invoke::<Value>(&mut capture);
            let request = capture.sent.pop().unwrap_or_default();
            let sha = evalsha_sha(&request);
            let mut loads = LOADS.lock().unwrap_or_else(|p| p.into_inner());
            let known = sha.and_then(|sha| loads.iter().find(|(s, _)| *s == sha));
            let load = match (known, sha) {
                (Some((_, load)), _) => Some(load.clone()),
                (None, sha) => {
                    capture.noscript = true;
                    let _ = inv.invoke::<Value>(&mut capture);
                    let load: Option<Arc<[u8]>> = capture.sent.pop().map(Into::into);
                    if let (Some(sha), Some(load)) = (sha, &load) {
                        loads.push((sha, load.clone()));
                    }
                    load
                }
            };
            Packed { request, load }
        }
    }
}

/// The EVALSHA command of `inv`, and the EVAL command that makes the same call with the script's
/// source (which also loads it on the server that runs it), built from what the invocation
/// sends. None if that is not what it sends.
pub fn eval_forms(inv: &redis::ScriptInvocation<'_>) -> Option<(Cmd, Cmd)> {
    let mut capture = Capture {
        sent: Vec::new(),
        noscript: true,
    };
    let _ = inv.invoke::<Value>(&mut capture);
    let (Ok(Value::Array(call)), Ok(Value::Array(load))) =
        (parse(capture.sent.first()?), parse(capture.sent.get(1)?))
    else {
        return None;
    };
    let Some(Value::BulkString(source)) = load.get(2) else {
        return None;
    };
    let mut evalsha = redis::cmd("EVALSHA");
    let mut eval = redis::cmd("EVAL");
    eval.arg(source.as_slice());
    for (i, part) in call.iter().enumerate().skip(1) {
        let Value::BulkString(bytes) = part else {
            return None;
        };
        evalsha.arg(bytes.as_slice());
        if i >= 2 {
            eval.arg(bytes.as_slice());
        }
    }
    Some((evalsha, eval))
}

/// The SHA1 an EVALSHA request names (its second argument).
fn evalsha_sha(request: &[u8]) -> Option<[u8; 40]> {
    const HEAD: &[u8] = b"$7\r\nEVALSHA\r\n$40\r\n";
    let at = request.windows(HEAD.len()).position(|w| w == HEAD)? + HEAD.len();
    request.get(at..at + 40)?.try_into().ok()
}

/// Collects the commands handed to it; answers each with an error: NOSCRIPT when `noscript`.
struct Capture {
    sent: Vec<Vec<u8>>,
    noscript: bool,
}

impl ConnectionLike for Capture {
    fn req_packed_command(&mut self, _cmd: &[u8]) -> redis::RedisResult<Value> {
        Err((ErrorKind::Client, "not sent").into())
    }

    fn req_packed_commands(
        &mut self,
        _cmd: &[u8],
        _offset: usize,
        _count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        Err((ErrorKind::Client, "not sent").into())
    }

    fn req_command(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        self.sent.push(cmd.get_packed_command());
        if self.noscript {
            Err((ErrorKind::Server(ServerErrorKind::NoScript), "not sent").into())
        } else {
            Err((ErrorKind::Client, "not sent").into())
        }
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn check_connection(&mut self) -> bool {
        false
    }

    fn is_open(&self) -> bool {
        false
    }
}

/// The commands a new connection sends before any call, as its settings ask: HELLO 3 (with the
/// credentials) for RESP3, else AUTH when there is a password; SELECT for a database other
/// than 0. Each answers OK (or HELLO's map) unless refused.
pub fn handshake(settings: &RedisConnectionInfo) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let resp3 = settings.protocol() == ProtocolVersion::RESP3;
    if resp3 {
        let mut hello = redis::cmd("HELLO");
        hello.arg(3);
        if let Some(password) = settings.password() {
            hello
                .arg("AUTH")
                .arg(settings.username().unwrap_or("default"))
                .arg(password);
        }
        out.push(hello.get_packed_command());
    } else if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(username) = settings.username() {
            auth.arg(username);
        }
        auth.arg(password);
        out.push(auth.get_packed_command());
    }
    if settings.db() != 0 {
        let mut select = redis::cmd("SELECT");
        select.arg(settings.db());
        out.push(select.get_packed_command());
    }
    out
}

/// Bytes that are not RESP.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// The length of the first complete reply at the start of `buf`; None while it is incomplete.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    let mut pos = 0usize;
    // Values still to read (an aggregate's elements count in as its header is read).
    let mut due: u64 = 1;
    while due > 0 {
        let Some(kind) = buf.get(pos).copied() else {
            return Ok(None);
        };
        let Some(end) = find_crlf(buf, pos + 1) else {
            return Ok(None);
        };
        let head = buf.get(pos + 1..end).ok_or(Malformed)?;
        pos = end + 2;
        due -= 1;
        match kind {
            b'+' | b'-' | b':' | b',' | b'(' | b'_' | b'#' => {}
            b'$' | b'!' | b'=' => {
                let n = number(head)?;
                if n >= 0 {
                    pos += usize::try_from(n).map_err(|_| Malformed)? + 2;
                    if buf.len() < pos {
                        return Ok(None);
                    }
                }
            }
            b'*' | b'~' | b'>' => due += count(head)?,
            b'%' => due += 2 * count(head)?,
            // Attributes: their pairs, then the value they describe.
            b'|' => due += 2 * count(head)? + 1,
            _ => return Err(Malformed),
        }
    }
    Ok(Some(pos))
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    rest.windows(2).position(|w| w == b"\r\n").map(|i| from + i)
}

fn number(head: &[u8]) -> Result<i64, Malformed> {
    std::str::from_utf8(head)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Malformed)
}

/// An aggregate's element count (-1, a null, has none).
fn count(head: &[u8]) -> Result<u64, Malformed> {
    let n = number(head)?;
    Ok(u64::try_from(n.max(0)).unwrap_or(0))
}

/// The value of one complete reply (`frame_len` bytes); an error reply is a `ServerError` value.
pub fn parse(frame: &[u8]) -> Result<Value, Malformed> {
    match integers(frame) {
        Some(value) => Ok(value),
        None => redis::parse_redis_value(frame).map_err(|_| Malformed),
    }
}

/// The usual replies of the scripts, an integer or a flat array of integers, read without the
/// general parser (a sixth of the loop path's own CPU went there); None for anything else.
fn integers(frame: &[u8]) -> Option<Value> {
    let (kind, head, mut rest) = line(frame)?;
    match kind {
        b':' if rest.is_empty() => Some(Value::Int(number(head).ok()?)),
        b'*' => {
            let n = usize::try_from(number(head).ok()?).ok()?;
            let mut items = Vec::with_capacity(n.min(16));
            for _ in 0..n {
                let (kind, head, after) = line(rest)?;
                if kind != b':' {
                    return None;
                }
                items.push(Value::Int(number(head).ok()?));
                rest = after;
            }
            rest.is_empty().then_some(Value::Array(items))
        }
        _ => None,
    }
}

/// The first line of `buf`: its type byte, the rest of the line, and what follows it.
fn line(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let kind = *buf.first()?;
    let end = find_crlf(buf, 1)?;
    Some((kind, buf.get(1..end)?, buf.get(end + 2..)?))
}

/// Whether a reply says the script is not loaded.
pub fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_without_the_general_parser_match_it() {
        let frames: [&[u8]; 9] = [
            b":1\r\n",
            b":-42\r\n",
            b"*2\r\n:1\r\n:1795523893554645\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"*2\r\n:1\r\n$3\r\nabc\r\n",
            b"$3\r\nabc\r\n",
            b"+OK\r\n",
            b"-ERR no\r\n",
        ];
        for frame in frames {
            let general = redis::parse_redis_value(frame).map_err(|_| Malformed);
            assert_eq!(parse(frame), general, "{}", String::from_utf8_lossy(frame));
        }
        assert!(integers(b":1\r\n").is_some());
        assert!(integers(b"*2\r\n:1\r\n:2\r\n").is_some());
        assert!(integers(b"*1\r\n+OK\r\n").is_none());
    }
    use crate::protocol::step::Step;

    #[test]
    fn a_script_call_has_an_eval_form_with_its_source() {
        let script = redis::Script::new("return KEYS[1]");
        let mut inv = script.prepare_invoke();
        inv.key("k").arg("a");
        let (evalsha, eval) = eval_forms(&inv).unwrap();
        let sha = script.get_hash();
        assert_eq!(
            evalsha.get_packed_command(),
            redis::cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg("k")
                .arg("a")
                .get_packed_command()
        );
        assert_eq!(
            eval.get_packed_command(),
            redis::cmd("EVAL")
                .arg("return KEYS[1]")
                .arg(1)
                .arg("k")
                .arg("a")
                .get_packed_command()
        );
    }

    #[test]
    fn a_reply_is_framed_only_once_complete() {
        let whole = b"*3\r\n$3\r\nabc\r\n:7\r\n*-1\r\n+OK\r\n";
        let first = whole.len() - 5;
        for cut in 0..first {
            assert_eq!(frame_len(&whole[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(frame_len(whole), Ok(Some(first)));
        assert_eq!(frame_len(&whole[first..]), Ok(Some(5)));
        assert_eq!(frame_len(b"$-1\r\n"), Ok(Some(5)));
        assert_eq!(frame_len(b"%1\r\n+a\r\n:1\r\n"), Ok(Some(12)));
        assert_eq!(frame_len(b"?x\r\n"), Err(Malformed));
        assert_eq!(frame_len(b"$x\r\n"), Err(Malformed));
    }

    #[test]
    fn replies_parse_and_noscript_is_told() {
        assert_eq!(parse(b":5\r\n"), Ok(Value::Int(5)));
        let err = parse(b"-NOSCRIPT No matching script.\r\n");
        assert!(err.as_ref().is_ok_and(is_noscript));
        let other = parse(b"-ERR nope\r\n");
        assert!(other.as_ref().is_ok_and(|v| !is_noscript(v)));
        assert!(matches!(other, Ok(Value::ServerError(_))));
    }

    #[test]
    fn a_script_packs_as_evalsha_with_its_load() {
        let script: &'static redis::Script =
            Box::leak(Box::new(redis::Script::new("return KEYS[1]")));
        let mut inv = script.prepare_invoke();
        inv.key("k").arg("a");
        let step = Step::script(inv, |_| Ok(()));
        let packed = pack(step.call());
        let sha = script.get_hash();
        let request =
            format!("*5\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\na\r\n");
        assert_eq!(packed.request, request.as_bytes());
        let load = "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$14\r\nreturn KEYS[1]\r\n";
        assert_eq!(packed.load.as_deref(), Some(load.as_bytes()));
        // Packed again, the SCRIPT LOAD comes from what the first packing kept.
        assert_eq!(pack(step.call()), packed);
        let mut get = redis::cmd("GET");
        get.arg("k");
        let plain = pack(Step::command(get, |_| Ok(())).call());
        assert_eq!(plain.request, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        assert_eq!(plain.load, None);
    }

    #[test]
    fn the_handshake_follows_the_settings() {
        let info = |url: &str| {
            use redis::IntoConnectionInfo;
            url.into_connection_info()
                .map(|i| i.redis_settings().clone())
        };
        let plain = info("redis://127.0.0.1:6379").ok();
        assert_eq!(plain.map(|s| handshake(&s)), Some(vec![]));
        let auth = info("redis://u:p@127.0.0.1:6379/2").ok();
        let expected = vec![
            b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n".to_vec(),
            b"*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n".to_vec(),
        ];
        assert_eq!(auth.map(|s| handshake(&s)), Some(expected));
        let resp3 = info("redis://:p@127.0.0.1:6379?protocol=resp3").ok();
        let hello = resp3.map(|s| handshake(&s)).unwrap_or_default();
        assert_eq!(hello.len(), 1);
        assert!(hello[0].starts_with(b"*5\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n"));
    }
}
