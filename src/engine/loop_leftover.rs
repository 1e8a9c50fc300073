//! What an asyncio event loop's own connection (`python/loop_conn.rs`) leaves when its loop
//! closes with requests still unanswered: an acquire that timed out (or was cancelled) may have
//! its request still on its way to Redis, and its give-back must run after that request, or the
//! request sets the names for a token nobody knows, for a whole lease. The loop can no longer
//! read the connection, so the runtime takes it over (a duplicate of its socket: the loop closes
//! its own) and runs each call's hook as that call's reply comes, the way the open connection
//! would have. Unanswered until `until`, or the connection ends, the hooks run then. Closing the
//! loop waits for none of it.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant;

use redis::Value;

use super::runtime;
use crate::protocol::resp;

/// Runs once its call is answered, or never will be.
pub type Hook = Box<dyn FnOnce() + Send>;

/// How the socket was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Tcp,
    Unix,
}

/// A loop connection's unanswered requests, for `finish`.
pub struct Leftover {
    pub socket: OwnedFd,
    pub family: Family,
    /// Bytes read already that are not yet a whole reply.
    pub read: Vec<u8>,
    /// One entry per reply still due, in order, with the hook to run when it comes.
    pub line: VecDeque<Option<Hook>>,
    /// When the replies still due are given up (their hooks run then).
    pub until: Instant,
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Stream {
    /// Made on the runtime (tokio registers the socket with its reactor).
    fn open(socket: OwnedFd, family: Family) -> io::Result<Stream> {
        Ok(match family {
            Family::Tcp => {
                let std = std::net::TcpStream::from(socket);
                std.set_nonblocking(true)?;
                Stream::Tcp(tokio::net::TcpStream::from_std(std)?)
            }
            Family::Unix => {
                let std = std::os::unix::net::UnixStream::from(socket);
                std.set_nonblocking(true)?;
                Stream::Unix(tokio::net::UnixStream::from_std(std)?)
            }
        })
    }

    /// Some bytes; 0 at the end of the stream.
    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let read = match self {
                Stream::Tcp(s) => {
                    s.readable().await?;
                    s.try_read(buf)
                }
                Stream::Unix(s) => {
                    s.readable().await?;
                    s.try_read(buf)
                }
            };
            match read {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// Reads `leftover`'s replies on the runtime and runs their hooks (see the module's doc); the
/// socket closes once no hook is left. Runs the hooks at once when there is no runtime.
pub fn finish(leftover: Leftover) {
    let Leftover {
        socket,
        family,
        read,
        line,
        until,
    } = leftover;
    let handle = match runtime::handle() {
        Ok(handle) => handle,
        Err(_) => {
            line.into_iter().flatten().for_each(|hook| hook());
            return;
        }
    };
    handle.spawn(async move {
        let mut line = line;
        if let Ok(stream) = Stream::open(socket, family) {
            let deadline = tokio::time::Instant::from_std(until);
            let _ = tokio::time::timeout_at(deadline, answer(&stream, read, &mut line)).await;
        }
        // Given up, or the connection ended: what is left may never be answered.
        line.into_iter().flatten().for_each(|hook| hook());
    });
}

/// Pops `line`'s entries as their replies come, running their hooks, until no hook is left or
/// the connection ends or sends what is not RESP.
async fn answer(stream: &Stream, mut buf: Vec<u8>, line: &mut VecDeque<Option<Hook>>) {
    let mut chunk = vec![0u8; 4096];
    loop {
        loop {
            let len = match resp::frame_len(&buf) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(_) => return,
            };
            // Pushes (RESP3) answer no request.
            let push = buf
                .get(..len)
                .map(resp::parse)
                .is_some_and(|v| matches!(v, Ok(Value::Push { .. })));
            buf.drain(..len);
            if push {
                continue;
            }
            match line.pop_front() {
                Some(hook) => hook.into_iter().for_each(|hook| hook()),
                None => return,
            }
        }
        if line.iter().all(Option::is_none) {
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(n) if n > 0 => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn counting(hits: &Arc<AtomicUsize>, at: usize) -> Hook {
        let hits = hits.clone();
        Box::new(move || {
            hits.fetch_add(at, Ordering::SeqCst);
        })
    }

    fn wait_for(hits: &AtomicUsize, value: usize) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if hits.load(Ordering::SeqCst) == value {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn each_hook_runs_when_its_reply_comes() -> io::Result<()> {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let hits = Arc::new(AtomicUsize::new(0));
        finish(Leftover {
            socket: OwnedFd::from(theirs),
            family: Family::Unix,
            // Half of the first reply was read by the loop already.
            read: b":1".to_vec(),
            line: VecDeque::from([None, Some(counting(&hits, 1)), Some(counting(&hits, 10))]),
            until: Instant::now() + Duration::from_secs(10),
        });
        ours.write_all(b"\r\n")?;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(hits.load(Ordering::SeqCst), 0, "ran before its reply");
        ours.write_all(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n:0\r\n")?;
        assert!(wait_for(&hits, 1), "the second reply's hook did not run");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(hits.load(Ordering::SeqCst), 1, "a push counted as a reply");
        ours.write_all(b"*2\r\n:1\r\n:2\r\n")?;
        assert!(wait_for(&hits, 11), "the third reply's hook did not run");
        Ok(())
    }

    #[test]
    fn hooks_run_when_the_connection_ends_or_at_the_deadline() -> io::Result<()> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let hits = Arc::new(AtomicUsize::new(0));
        finish(Leftover {
            socket: OwnedFd::from(theirs),
            family: Family::Unix,
            read: Vec::new(),
            line: VecDeque::from([Some(counting(&hits, 1))]),
            until: Instant::now() + Duration::from_secs(10),
        });
        drop(ours);
        assert!(
            wait_for(&hits, 1),
            "the connection ended, the hook did not run"
        );

        let (_ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let started = Instant::now();
        finish(Leftover {
            socket: OwnedFd::from(theirs),
            family: Family::Unix,
            read: Vec::new(),
            line: VecDeque::from([Some(counting(&hits, 10))]),
            until: Instant::now() + Duration::from_millis(200),
        });
        assert!(
            wait_for(&hits, 11),
            "the deadline passed, the hook did not run"
        );
        assert!(started.elapsed() >= Duration::from_millis(190));
        Ok(())
    }
}
