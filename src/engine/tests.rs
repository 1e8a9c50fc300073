//! Engine tests against a real redis-server started on a free loopback port (stopped by PID).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{Client, ClientConfig};
use super::executor;
use super::lock::{self, LockHandle, LockSpec, Wait};
use super::node::{Retry, Timeouts};
use super::runtime;
use crate::protocol;
use crate::protocol::replies::{parse_attempt, Attempt};
use crate::protocol::scripts::{self, Queueing};

pub(super) struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts a redis-server on a free port. The port is free when picked but may be taken by
    /// another process before the server binds it (other test binaries and pytest start servers
    /// too): a server that exits, or a port answered by a server that is not ours, is retried.
    pub(super) fn start() -> Server {
        for _ in 0..5 {
            if let Some(server) = Self::try_start() {
                return server;
            }
        }
        panic!("could not start a redis-server on a free port in 5 tries");
    }

    fn try_start() -> Option<Server> {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::try_start_on(port)
    }

    /// Stops the server and starts an empty one (a new run_id) on the same port.
    pub(super) fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(server) = Self::try_start_on(self.port) {
                *self = server;
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_start_on(port: u16) -> Option<Server> {
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make deps)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                return None; // it could not bind the port
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let server = Server { child, port };
        // The one answering must be the process we started.
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/0"))
            .unwrap()
            .get_connection()
            .unwrap();
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
        let ours = format!("process_id:{}", server.child.id());
        info.lines()
            .any(|line| line.trim() == ours)
            .then_some(server)
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub(super) fn client(&self, prefix: &str) -> Arc<Client> {
        let url = format!("redis://127.0.0.1:{}/0", self.port);
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            command: Duration::from_secs(2),
        };
        Arc::new(
            Client::new(ClientConfig::single(&url, prefix.as_bytes(), timeouts).unwrap()).unwrap(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    runtime::handle().unwrap().block_on(fut)
}

fn spec(client: &Client, name: &str, lease_ms: u64, fair: bool) -> LockSpec {
    LockSpec {
        name: name.as_bytes().to_vec(),
        keys: client.keys(name.as_bytes()).unwrap(),
        lease: Duration::from_millis(lease_ms),
        fair,
        replicas: 0,
        reentrant: false,
        queued: false,
    }
}

#[test]
fn acquire_release_extend_and_fences() {
    let server = Server::start();
    let client = server.client("t1:");
    block_on(async {
        let shared = client.shared().unwrap();
        let s = spec(&client, "a", 5_000, false);
        let first = lock::acquire(&shared, &s, "tok1", Wait::Once)
            .await
            .unwrap()
            .unwrap();
        // The same token again is the retry case: granted with the same fence, no new INCR.
        let again = lock::acquire(&shared, &s, "tok1", Wait::Once)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.fence, again.fence);
        assert!(lock::acquire(&shared, &s, "tok2", Wait::Once)
            .await
            .unwrap()
            .is_none());
        assert!(
            !lock::release(&shared, &s.keys, "tok2").await.unwrap(),
            "non-owner release"
        );
        let extend = |token| protocol::lock::extend(&s.keys, token, Duration::from_secs(9));
        assert!(executor::run(&shared, &extend("tok1")).await.unwrap());
        assert!(!executor::run(&shared, &extend("tok2")).await.unwrap());
        assert!(lock::release(&shared, &s.keys, "tok1").await.unwrap());
        let second = lock::acquire(&shared, &s, "tok2", Wait::Once)
            .await
            .unwrap()
            .unwrap();
        assert!(second.fence > first.fence);
        assert!(lock::release(&shared, &s.keys, "tok2").await.unwrap());
        let keys: Vec<Vec<u8>> = shared
            .node
            .query(redis::cmd("KEYS").arg("t1:*"), Retry::Never)
            .await
            .unwrap();
        assert_eq!(keys, vec![b"t1:{a}:fence".to_vec()]);
    });
}

#[test]
fn a_release_wakes_a_waiter_at_once() {
    let server = Server::start();
    let client = server.client("t2:");
    let handle = LockHandle::new(
        client.clone(),
        b"w",
        Duration::from_secs(10),
        false,
        0,
        false,
    )
    .unwrap();
    assert!(block_on(handle.holder().acquire(Wait::Once, None, &())).unwrap());
    let waiter_client = client.clone();
    let waiter = std::thread::spawn(move || {
        let other = LockHandle::new(
            waiter_client,
            b"w",
            Duration::from_secs(10),
            false,
            0,
            false,
        )
        .unwrap();
        let started = Instant::now();
        let got = block_on(other.holder().acquire(
            Wait::from_timeout(Some(Duration::from_secs(5))),
            None,
            &(),
        ))
        .unwrap();
        (got, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let released_at = Instant::now();
    block_on(handle.holder().release()).unwrap();
    let (got, waited) = waiter.join().unwrap();
    assert!(got);
    // Woken by the release, not by the 10 s lease: well under a second after it.
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(released_at.elapsed() < Duration::from_secs(2), "{waited:?}");
}

#[test]
fn a_lease_that_ends_without_release_is_noticed_when_it_ends() {
    let server = Server::start();
    let client = server.client("t3:");
    block_on(async {
        let shared = client.shared().unwrap();
        let s = spec(&client, "crashed", 400, false);
        assert!(lock::acquire(&shared, &s, "dead", Wait::Once)
            .await
            .unwrap()
            .is_some());
        let started = Instant::now();
        let wait = Wait::from_timeout(Some(Duration::from_secs(5)));
        let got = lock::acquire(&shared, &s, "alive", wait).await.unwrap();
        let waited = started.elapsed();
        assert!(got.is_some());
        assert!(
            waited >= Duration::from_millis(350),
            "acquired before the lease ended: {waited:?}"
        );
        assert!(waited < Duration::from_secs(3), "{waited:?}");
    });
}

#[test]
fn fair_waiters_are_served_in_arrival_order_and_leave_on_timeout() {
    let server = Server::start();
    let client = server.client("t4:");
    let holder = LockHandle::new(
        client.clone(),
        b"f",
        Duration::from_secs(10),
        true,
        0,
        false,
    )
    .unwrap();
    assert!(block_on(holder.holder().acquire(Wait::Once, None, &())).unwrap());
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..4 {
        let (client, order) = (client.clone(), order.clone());
        threads.push(std::thread::spawn(move || {
            let me =
                LockHandle::new(client, b"f", Duration::from_secs(10), true, 0, false).unwrap();
            assert!(block_on(me.holder().acquire(Wait::Forever, None, &())).unwrap());
            order.lock().unwrap().push(i);
            std::thread::sleep(Duration::from_millis(20));
            block_on(me.holder().release()).unwrap();
        }));
        std::thread::sleep(Duration::from_millis(150));
    }
    // A waiter that gives up leaves the queue at once.
    let quitter = LockHandle::new(
        client.clone(),
        b"f",
        Duration::from_secs(10),
        true,
        0,
        false,
    )
    .unwrap();
    assert!(!block_on(quitter.holder().acquire(
        Wait::from_timeout(Some(Duration::from_millis(200))),
        None,
        &()
    ))
    .unwrap());
    block_on(async {
        let shared = client.shared().unwrap();
        let queued: i64 = shared
            .node
            .query(redis::cmd("HLEN").arg(b"t4:{f}:lock:queue"), Retry::Never)
            .await
            .unwrap();
        assert_eq!(queued, 4, "the quitter is gone, the four others wait");
    });
    block_on(holder.holder().release()).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
}

#[test]
fn a_cancelled_fair_waiter_leaves_no_trace() {
    let server = Server::start();
    let client = server.client("t5:");
    block_on(async {
        let shared = client.shared().unwrap();
        let s = spec(&client, "c", 10_000, true);
        assert!(lock::acquire(&shared, &s, "holder", Wait::Once)
            .await
            .unwrap()
            .is_some());
        let waiting = lock::acquire(&shared, &s, "quitter", Wait::Forever);
        // Cancel it mid-wait by dropping the future.
        assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let queued: i64 = shared
            .node
            .query(redis::cmd("HLEN").arg(b"t5:{c}:lock:queue"), Retry::Never)
            .await
            .unwrap();
        assert_eq!(queued, 0);
    });
}

#[test]
fn the_fair_script_grants_only_the_head() {
    let server = Server::start();
    let client = server.client("t6:");
    block_on(async {
        let shared = client.shared().unwrap();
        let keys = client.keys(b"h").unwrap();
        let join = Some(Queueing::Join { place_ms: 5_000 });
        let run = |token: &'static str| {
            let inv = scripts::acquire(&keys, token, 10_000, join, "");
            let shared = shared.clone();
            async move { parse_attempt(&shared.node.invoke(&inv, Retry::Never).await.unwrap()).unwrap() }
        };
        assert!(matches!(run("a").await, Attempt::Granted { .. }));
        assert!(matches!(run("b").await, Attempt::Busy { .. }));
        assert!(matches!(run("c").await, Attempt::Busy { .. }));
        assert!(lock::release(&shared, &keys, "a").await.unwrap());
        // b is first in line: c must wait for it.
        assert!(matches!(run("c").await, Attempt::Busy { .. }));
        assert!(matches!(run("b").await, Attempt::Granted { .. }));
    });
}

#[test]
fn an_unfair_first_attempt_barges_and_joins_only_when_busy() {
    let server = Server::start();
    let client = server.client("t6u:");
    block_on(async {
        let shared = client.shared().unwrap();
        let keys = client.keys(b"u").unwrap();
        let barge = Some(Queueing::BargeOrJoin { place_ms: 2_000 });
        let join = Some(Queueing::Join { place_ms: 2_000 });
        let run = |token: &'static str, queueing: Option<Queueing>| {
            let inv = scripts::acquire(&keys, token, 10_000, queueing, "");
            let shared = shared.clone();
            async move { parse_attempt(&shared.node.invoke(&inv, Retry::Never).await.unwrap()).unwrap() }
        };
        let queued = || {
            let shared = shared.clone();
            let queue = keys.queue();
            async move {
                shared
                    .node
                    .query::<i64>(redis::cmd("HLEN").arg(queue), Retry::Never)
                    .await
                    .unwrap()
            }
        };
        // Free, no queue: taken, nothing queued.
        assert!(matches!(run("a", barge).await, Attempt::Granted { .. }));
        assert_eq!(queued().await, 0);
        // Taken: b and c join, in that order (the busy answer carries the fence seen).
        assert!(matches!(
            run("b", barge).await,
            Attempt::Busy { fence: Some(_), .. }
        ));
        assert!(matches!(run("c", barge).await, Attempt::Busy { .. }));
        assert_eq!(queued().await, 2);
        // The release grants b; the releaser's own try (the plain script) is refused.
        assert!(lock::release(&shared, &keys, "a").await.unwrap());
        assert!(matches!(run("a", None).await, Attempt::Busy { .. }));
        assert!(matches!(run("b", join).await, Attempt::Granted { .. }));
        assert_eq!(queued().await, 1);
        // A lock left free with c still queued (b's lease ended: here, deleted) is taken by a
        // barging first attempt past c, and c stays first in line.
        let mut del = redis::cmd("DEL");
        del.arg(keys.lock());
        let _: i64 = shared.node.query(&del, Retry::Never).await.unwrap();
        assert!(matches!(run("d", barge).await, Attempt::Granted { .. }));
        assert_eq!(queued().await, 1);
        assert!(lock::release(&shared, &keys, "d").await.unwrap());
        assert!(matches!(run("c", join).await, Attempt::Granted { .. }));
        assert_eq!(queued().await, 0);
    });
}

#[test]
fn a_grant_given_back_to_nobody_is_published_to_all() {
    // A waiter that gives up after a release granted it the lock, with nobody else queued:
    // the lock is free again, and the waiters that do not queue (the recipes', the shims') are
    // told so as a release tells them, not left to their lease hint.
    use futures_util::StreamExt;
    let server = Server::start();
    let client = server.client("t-gb:");
    block_on(async {
        let shared = client.shared().unwrap();
        let keys = client.keys(b"gb").unwrap();
        let mut set = redis::cmd("SET");
        set.arg(keys.lock()).arg("c").arg("PX").arg(5_000);
        let _: redis::Value = shared.node.query(&set, Retry::Never).await.unwrap();
        let listener = redis::Client::open(server.url()).unwrap();
        let mut pubsub = listener.get_async_pubsub().await.unwrap();
        pubsub.subscribe(keys.wake_channel()).await.unwrap();
        let mut messages = pubsub.into_on_message();
        shared
            .node
            .invoke(&scripts::leave_queue(&keys, "c"), Retry::Never)
            .await
            .unwrap();
        let heard = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
        let message = heard
            .expect("no wake-up within 2 s")
            .expect("subscription ended");
        assert_eq!(message.get_payload_bytes(), b"");
        let mut get = redis::cmd("GET");
        get.arg(keys.lock());
        let owner: Option<Vec<u8>> = shared.node.query(&get, Retry::Never).await.unwrap();
        assert_eq!(owner, None);
    });
}

#[test]
fn a_fair_release_grants_the_head_and_a_leave_gives_a_grant_back() {
    use redis::Value;
    let server = Server::start();
    let client = server.client("t7:");
    block_on(async {
        let shared = client.shared().unwrap();
        let keys = client.keys(b"g").unwrap();
        let join = Some(Queueing::Join { place_ms: 5_000 });
        let run = |token: &'static str, lease_ms: u64| {
            let inv = scripts::acquire(&keys, token, lease_ms, join, "");
            let shared = shared.clone();
            async move { parse_attempt(&shared.node.invoke(&inv, Retry::Never).await.unwrap()).unwrap() }
        };
        let query = |cmd: redis::Cmd| {
            let shared = shared.clone();
            async move {
                shared
                    .node
                    .query::<Value>(&cmd, Retry::Never)
                    .await
                    .unwrap()
            }
        };
        let get = |key: Vec<u8>| {
            let mut cmd = redis::cmd("GET");
            cmd.arg(key);
            query(cmd)
        };
        let Attempt::Granted { fence: first } = run("a", 10_000).await else {
            panic!("a is first");
        };
        // b waits with a lease of 60 s, c with 2 s: each is granted its own, b at most its
        // place's time left plus the slack.
        let busy = run("b", 60_000).await;
        assert!(
            matches!(busy, Attempt::Busy { fence: Some(f), .. } if f == first),
            "{busy:?}"
        );
        assert!(matches!(run("c", 2_000).await, Attempt::Busy { .. }));
        assert!(lock::release(&shared, &keys, "a").await.unwrap());
        assert_eq!(get(keys.lock()).await, Value::BulkString(b"b".to_vec()));
        let fence = |v: Value| match v {
            Value::BulkString(b) => String::from_utf8(b).unwrap().parse::<i64>().unwrap(),
            other => panic!("{other:?}"),
        };
        let granted = fence(get(keys.fence()).await);
        assert!(granted > first, "{granted} after {first}");
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(keys.lock());
        let Value::Int(left) = query(pttl.clone()).await else {
            panic!("no pttl");
        };
        let bound = 5_000 + i64::try_from(scripts::GRANT_SLACK_MS).unwrap();
        assert!(left > 4_000 && left <= bound, "{left}");
        // b's own attempt now finds the grant, and renews it to its full lease.
        assert_eq!(run("b", 60_000).await, Attempt::Granted { fence: granted });
        let Value::Int(left) = query(pttl.clone()).await else {
            panic!("no pttl");
        };
        assert!(left > bound, "{left}");
        // b releases: c is granted its own (shorter) lease; c then gives up, and the grant goes
        // back: nothing but the fence is left.
        assert!(lock::release(&shared, &keys, "b").await.unwrap());
        assert_eq!(get(keys.lock()).await, Value::BulkString(b"c".to_vec()));
        let Value::Int(left) = query(pttl).await else {
            panic!("no pttl");
        };
        assert!(left > 0 && left <= 2_000, "{left}");
        shared
            .node
            .invoke(&scripts::leave_queue(&keys, "c"), Retry::Never)
            .await
            .unwrap();
        assert_eq!(get(keys.lock()).await, Value::Nil);
        assert!(fence(get(keys.fence()).await) > granted);
        let mut scan = redis::cmd("KEYS");
        scan.arg("t7:*");
        assert_eq!(
            query(scan).await,
            Value::Array(vec![Value::BulkString(keys.fence())])
        );
    });
}

fn redlock_client(servers: &[&Server], prefix: &str) -> Arc<Client> {
    use super::client::Deployment;
    use crate::protocol::url::{parse_endpoint, Endpoint};
    let masters: Vec<(Endpoint, String)> = servers
        .iter()
        .map(|s| {
            let url = format!("redis://127.0.0.1:{}/0", s.port);
            (parse_endpoint(&url).unwrap(), url)
        })
        .collect();
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        command: Duration::from_secs(1),
    };
    Arc::new(
        Client::new(ClientConfig {
            deployment: Deployment::Redlock(masters),
            prefix: prefix.as_bytes().to_vec(),
            timeouts,
            fence_ttl_ms: crate::protocol::keys::DEFAULT_FENCE_TTL_MS,
        })
        .unwrap(),
    )
}

#[test]
fn redlock_needs_a_majority_and_raises_fences_past_every_previous_one() {
    use super::error::Error;
    let (a, b) = (Server::start(), Server::start());
    let mut c = Some(Server::start());
    let client = redlock_client(&[&a, &b, c.as_ref().unwrap()], "rl:");
    assert!(client.shared().is_err(), "no single keyspace on Redlock");
    let handle = LockHandle::new(
        client.clone(),
        b"n",
        Duration::from_secs(5),
        false,
        0,
        false,
    )
    .unwrap();
    let other = LockHandle::new(
        client.clone(),
        b"n",
        Duration::from_secs(5),
        false,
        0,
        false,
    )
    .unwrap();
    let mut fences = Vec::new();
    for _ in 0..2 {
        assert!(block_on(handle.holder().acquire(Wait::Once, None, &())).unwrap());
        assert!(!block_on(other.holder().acquire(Wait::Once, None, &())).unwrap());
        assert!(block_on(handle.holder().owned()).unwrap());
        let left = handle.holder().remaining().unwrap();
        assert!(left <= Duration::from_millis(5000 - 52), "{left:?}");
        fences.push(handle.fence().unwrap());
        block_on(handle.holder().release()).unwrap();
    }
    // One of three down: a majority is still there.
    drop(c.take());
    assert!(block_on(handle.holder().acquire(Wait::Once, None, &())).unwrap());
    fences.push(handle.fence().unwrap());
    block_on(handle.holder().release()).unwrap();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    // Two of three down: a quorum error, at once.
    drop(b);
    let t0 = Instant::now();
    let err = block_on(handle.holder().acquire(Wait::Forever, None, &())).unwrap_err();
    assert!(matches!(err, Error::Quorum(_)), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    drop(a);
}

#[test]
fn a_caller_chosen_token_in_place_is_refused_by_the_first_send_form() {
    let server = Server::start();
    let client = server.client("t-same:");
    block_on(async {
        let shared = client.shared().unwrap();
        let backend = client.backend().unwrap();
        let s = spec(&client, "same", 5_000, false);
        // The script: the first-send form refuses the token it finds in place, the plain form
        // (a token the library drew) takes it.
        let first = scripts::acquire_first_send(&s.keys, "worker-1", 5_000);
        let taken = shared.node.invoke(&first, Retry::Never).await.unwrap();
        let fence = match parse_attempt(&taken).unwrap() {
            Attempt::Granted { fence } => fence,
            other => panic!("a free lock was not granted: {other:?}"),
        };
        let again = shared.node.invoke(&first, Retry::Never).await.unwrap();
        assert!(matches!(
            parse_attempt(&again).unwrap(),
            Attempt::Busy { .. }
        ));
        let resend = scripts::acquire(&s.keys, "worker-1", 5_000, None, "");
        let resent = shared.node.invoke(&resend, Retry::Never).await.unwrap();
        assert!(matches!(
            parse_attempt(&resent).unwrap(),
            Attempt::Granted { fence: f } if f == fence
        ));
        // The recipes' entry point: a second call with the same identifier is refused.
        assert!(lock::acquire_on(&backend, &s, "worker-1", Wait::Once, true)
            .await
            .unwrap()
            .is_none());
        assert!(lock::release_on(&backend, &s.keys, "worker-1")
            .await
            .unwrap());
        let next = lock::acquire_on(&backend, &s, "worker-1", Wait::Once, true)
            .await
            .unwrap()
            .unwrap();
        assert!(next.fence > fence);
        assert!(lock::release_on(&backend, &s.keys, "worker-1")
            .await
            .unwrap());
    });
}

#[test]
fn a_fenced_release_deletes_only_while_the_counter_reads_one_of_its_fences() {
    let server = Server::start();
    let client = server.client("t-fenced:");
    block_on(async {
        let shared = client.shared().unwrap();
        let keys = spec(&client, "fenced", 5_000, false).keys;
        // The lock's own keys, and a drop-in shim's (python-redis-lock's key and signal list).
        let compat = keys
            .clone()
            .with_lock_key(b"lock:fenced")
            .with_signal(b"lock-signal:fenced", 1_000);
        for (keys, signal) in [(keys, false), (compat, true)] {
            let first = scripts::acquire_first_send(&keys, "X", 5_000);
            let taken = shared.node.invoke(&first, Retry::Never).await.unwrap();
            let Attempt::Granted { fence } = parse_attempt(&taken).unwrap() else {
                panic!("a free lock was not granted");
            };
            let release = |fences: &[i64]| {
                let inv = scripts::release_fenced(&keys, "X", &keys.wake_channel(), fences);
                let node = &shared.node;
                async move { node.invoke(&inv, Retry::Never).await.unwrap() }
            };
            // Neither is what the counter reads (another grant's hold): nothing is deleted.
            let refused = release(&[fence - 1, fence + 1]).await;
            assert_eq!(refused, redis::Value::Int(0));
            assert!(lock::owner(&shared, &keys).await.unwrap().is_some());
            // One of them is: the hold is deleted.
            assert_eq!(release(&[fence + 1, fence]).await, redis::Value::Int(1));
            assert!(lock::owner(&shared, &keys).await.unwrap().is_none());
            // Gone while the counter still reads one of them (the lock's own release only):
            // nobody took the name since, which the caller tells apart from a lapsed lease.
            let gone = if signal {
                0
            } else {
                protocol::replies::GONE_AT_OWN_FENCE
            };
            assert_eq!(release(&[fence]).await, redis::Value::Int(gone));
            assert_eq!(release(&[fence + 1]).await, redis::Value::Int(0));
        }
    });
}

/// The asyncio acquire's ticket: an abandoned attempt gives back a grant that arrives after the
/// abandon (a runtime task's poll under way is not stopped by its abort), gives back a hold it
/// had already settled into, and never touches a hold that a later acquire took.
#[test]
fn an_abandoned_acquire_gives_back_what_it_obtains_and_nothing_else() {
    use super::hold::Ticket;

    let server = Server::start();
    let client = server.client("t13:");
    let ttl = Duration::from_secs(30);
    let owner = |shared: Arc<super::client::Shared>| async move {
        let value: Option<Vec<u8>> = shared
            .node
            .query(redis::cmd("GET").arg(b"t13:{g}:lock"), Retry::Never)
            .await
            .unwrap();
        value
    };
    block_on(async {
        let shared = client.shared().unwrap();
        let holder = LockHandle::new(client.clone(), b"g", ttl, true, 0, false).unwrap();
        assert!(holder
            .holder()
            .acquire(Wait::Once, None, &())
            .await
            .unwrap());

        // Abandoned while it waits in the queue, then granted by the release.
        let waiter = Arc::new(LockHandle::new(client.clone(), b"g", ttl, true, 0, false).unwrap());
        let ticket = Ticket::default();
        let task = {
            let (waiter, ticket) = (waiter.clone(), ticket.clone());
            tokio::spawn(async move {
                waiter
                    .holder()
                    .acquire_ticketed(Wait::Forever, None, &(), ticket)
                    .await
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let queued: i64 = shared
                .node
                .query(redis::cmd("HLEN").arg(b"t13:{g}:lock:queue"), Retry::Never)
                .await
                .unwrap();
            if queued == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        waiter.holder().abandon(&ticket);
        holder.holder().release().await.unwrap();
        assert!(
            !task.await.unwrap().unwrap(),
            "an abandoned grant must not count"
        );
        assert_eq!(waiter.holder().token(), None);
        let deadline = Instant::now() + Duration::from_secs(2);
        while owner(shared.clone()).await.is_some() {
            assert!(Instant::now() < deadline, "the grant was not given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Abandoned after it settled: the hold goes at once, and from Redis.
        let ticket = Ticket::default();
        let acquired = waiter
            .holder()
            .acquire_ticketed(Wait::Once, None, &(), ticket.clone())
            .await
            .unwrap();
        assert!(acquired);
        waiter.holder().abandon(&ticket);
        assert_eq!(waiter.holder().token(), None);
        let deadline = Instant::now() + Duration::from_secs(2);
        while owner(shared.clone()).await.is_some() {
            assert!(Instant::now() < deadline, "the hold was not given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // An old ticket never touches a later acquire's hold.
        let old = Ticket::default();
        let acquired = waiter
            .holder()
            .acquire_ticketed(Wait::Once, None, &(), old.clone())
            .await
            .unwrap();
        assert!(acquired);
        waiter.holder().release().await.unwrap();
        let acquired = waiter
            .holder()
            .acquire_ticketed(Wait::Once, None, &(), Ticket::default())
            .await
            .unwrap();
        assert!(acquired);
        let token = waiter.holder().token().unwrap();
        waiter.holder().abandon(&old);
        assert_eq!(waiter.holder().token().as_deref(), Some(token.as_str()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(owner(shared.clone()).await, Some(token.into_bytes()));
        waiter.holder().release().await.unwrap();
    });
}

#[test]
fn redlock_votes_for_a_caller_chosen_token_never_take_it_found_in_place() {
    let servers = [Server::start(), Server::start(), Server::start()];
    let client = redlock_client(&[&servers[0], &servers[1], &servers[2]], "rls:");
    let backend = client.backend().unwrap();
    let s = spec(&client, "same", 5_000, false);
    let key = b"rls:{same}:lock";
    let owners = || async {
        let mut found = Vec::new();
        for server in &servers {
            let shared = server.client("rls:").shared().unwrap();
            let value: Option<String> = shared
                .node
                .query(redis::cmd("GET").arg(key), Retry::Never)
                .await
                .unwrap();
            found.push(value);
        }
        found
    };
    let one = Some("worker-1".to_string());
    block_on(async {
        assert!(lock::acquire_on(&backend, &s, "worker-1", Wait::Once, true)
            .await
            .unwrap()
            .is_some());
        // (A vote still out when the round was won lands in the background.)
        let deadline = Instant::now() + Duration::from_secs(3);
        while owners().await != vec![one.clone(); 3] && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A second call with the same identifier is refused, and its lost round deletes
        // nothing: the first call still holds every master.
        assert!(lock::acquire_on(&backend, &s, "worker-1", Wait::Once, true)
            .await
            .unwrap()
            .is_none());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(owners().await, vec![one.clone(); 3]);
        assert!(lock::release_on(&backend, &s.keys, "worker-1")
            .await
            .unwrap());

        // Another call holds two masters with that identifier: this call's vote sets it on the
        // third only, and gives back only there.
        for server in &servers[..2] {
            let shared = server.client("rls:").shared().unwrap();
            let _: () = shared
                .node
                .query(
                    redis::cmd("SET")
                        .arg(key)
                        .arg("worker-1")
                        .arg("PX")
                        .arg(5_000),
                    Retry::Never,
                )
                .await
                .unwrap();
        }
        assert!(lock::acquire_on(&backend, &s, "worker-1", Wait::Once, true)
            .await
            .unwrap()
            .is_none());
        let deadline = Instant::now() + Duration::from_secs(3);
        while owners().await[2].is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(owners().await, vec![one.clone(), one.clone(), None]);
    });
}

/// Recipe holds on Redlock that are never released (the caller lets `ltime` run out) do not stay
/// in the client's record for good; one still live is kept, for a release that deletes only
/// where its own votes set the identifier.
#[test]
fn redlock_recipe_holds_never_released_are_dropped_once_surely_over() {
    use super::client::Backend;
    let servers = [Server::start(), Server::start(), Server::start()];
    let client = redlock_client(&[&servers[0], &servers[1], &servers[2]], "rlk:");
    let backend = client.backend().unwrap();
    let Backend::Redlock(redlock) = &backend else {
        panic!("a Redlock backend")
    };
    let live = spec(&client, "live", 60_000, false);
    const ROUNDS: usize = 4;
    const PER_ROUND: usize = 200;
    block_on(async {
        assert!(
            lock::acquire_on(&backend, &live, "worker-1", Wait::Once, true)
                .await
                .unwrap()
                .is_some()
        );
        for round in 0..ROUNDS {
            for i in 0..PER_ROUND {
                let s = spec(&client, &format!("n{round}-{i}"), 20, false);
                // Half with a caller's identifier, half with a drawn one.
                let (token, chosen) = match i % 2 {
                    0 => ("worker-1".to_string(), true),
                    _ => (super::token::new_token().unwrap(), false),
                };
                assert!(lock::acquire_on(&backend, &s, &token, Wait::Once, chosen)
                    .await
                    .unwrap()
                    .is_some());
            }
            // Past the 20 ms lease, its drift allowance and the slack.
            tokio::time::sleep(Duration::from_millis(1_300)).await;
        }
    });
    let kept = redlock.kept_holds();
    assert!(
        kept <= 2 * PER_ROUND + 64,
        "{kept} of {} recipe holds still kept",
        ROUNDS * PER_ROUND + 1
    );
    assert!(redlock.keeps(&live.keys.lock(), "worker-1"));
    assert!(block_on(lock::release_on(&backend, &live.keys, "worker-1")).unwrap());
}

/// The server's clock in µs, as `fence_next.lua` reads it.
fn server_time_us(shared: &super::client::Shared) -> i64 {
    let (secs, micros): (i64, i64) =
        block_on(shared.node.query(&redis::cmd("TIME"), Retry::Never)).unwrap();
    secs * 1_000_000 + micros
}

#[test]
fn fence_counters_expire_and_restart_from_the_server_clock() {
    use super::client::Deployment;
    use crate::protocol::url::parse_endpoint;
    let server = Server::start();
    let url = format!("redis://127.0.0.1:{}/0", server.port);
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        command: Duration::from_secs(2),
    };
    // A counter that lives 300 ms after the last acquisition.
    let client = Arc::new(
        Client::new(ClientConfig {
            deployment: Deployment::Single(Box::new(parse_endpoint(&url).unwrap())),
            prefix: b"ft:".to_vec(),
            timeouts,
            fence_ttl_ms: 300,
        })
        .unwrap(),
    );
    let shared = client.shared().unwrap();
    let pttl = |key: Vec<u8>| -> i64 {
        block_on(shared.node.query(redis::cmd("PTTL").arg(key), Retry::Never)).unwrap()
    };
    for fair in [false, true] {
        let name = if fair { "fair" } else { "unfair" };
        let s = spec(&client, name, 5_000, fair);
        let before = server_time_us(&shared);
        let first = block_on(lock::acquire(&shared, &s, "a", Wait::Once))
            .unwrap()
            .unwrap();
        // A fresh counter starts from the server's clock in µs, and expires.
        assert!(first.fence >= before, "{} < {before}", first.fence);
        assert!(first.fence <= server_time_us(&shared));
        let left = pttl(s.keys.fence());
        assert!(left > 0 && left <= 300, "{left}");
        // A resent acquire finds its own hold and its fence, even once the counter expired.
        let again = block_on(lock::acquire(&shared, &s, "a", Wait::Once))
            .unwrap()
            .unwrap();
        assert_eq!(again.fence, first.fence);
        assert!(block_on(lock::release(&shared, &s.keys, "a")).unwrap());
        // Back to back: the next fence is larger, and refreshes the expiry.
        let second = block_on(lock::acquire(&shared, &s, "b", Wait::Once))
            .unwrap()
            .unwrap();
        assert!(second.fence > first.fence);
        assert!(block_on(lock::release(&shared, &s.keys, "b")).unwrap());
        // Idle past the ttl: no key of the name is left at all...
        std::thread::sleep(Duration::from_millis(450));
        let pattern = format!("ft:{{{name}}}*");
        let left: Vec<Vec<u8>> = block_on(
            shared
                .node
                .query(redis::cmd("KEYS").arg(pattern), Retry::Never),
        )
        .unwrap();
        assert!(left.is_empty(), "{left:?}");
        // ...and the next fence still exceeds every earlier one.
        let third = block_on(lock::acquire(&shared, &s, "c", Wait::Once))
            .unwrap()
            .unwrap();
        assert!(third.fence > second.fence);
        assert!(block_on(lock::release(&shared, &s.keys, "c")).unwrap());
    }
    // A counter ahead of the clock (written by a master whose clock ran ahead) counts on.
    let s = spec(&client, "ahead", 5_000, false);
    let ahead = server_time_us(&shared) + 3_600_000_000;
    block_on(shared.node.query::<()>(
        redis::cmd("SET").arg(s.keys.fence()).arg(ahead),
        Retry::Never,
    ))
    .unwrap();
    let got = block_on(lock::acquire(&shared, &s, "a", Wait::Once))
        .unwrap()
        .unwrap();
    assert_eq!(got.fence, ahead + 1);
    assert!(pttl(s.keys.fence()) > 0);
}

#[test]
fn a_fair_grant_on_release_issues_a_fence_with_an_expiry() {
    let server = Server::start();
    let client = server.client("fg:");
    let shared = client.shared().unwrap();
    let keys = client.keys(b"g").unwrap();
    let join = Some(Queueing::Join { place_ms: 5_000 });
    let run = |token: &str| {
        let inv = scripts::acquire(&keys, token, 10_000, join, "");
        parse_attempt(&block_on(shared.node.invoke(&inv, Retry::Never)).unwrap()).unwrap()
    };
    let Attempt::Granted { fence: first } = run("a") else {
        panic!("a is first");
    };
    // The counter is gone (as if expired) while b waits: the grant starts from the clock.
    block_on(
        shared
            .node
            .query::<()>(redis::cmd("DEL").arg(keys.fence()), Retry::Never),
    )
    .unwrap();
    assert!(matches!(run("b"), Attempt::Busy { .. }));
    assert!(block_on(lock::release(&shared, &keys, "a")).unwrap());
    let Attempt::Granted { fence: granted } = run("b") else {
        panic!("b was granted on release");
    };
    assert!(granted > first, "{granted} after {first}");
    let left: i64 = block_on(
        shared
            .node
            .query(redis::cmd("PTTL").arg(keys.fence()), Retry::Never),
    )
    .unwrap();
    let day = i64::try_from(crate::protocol::keys::DEFAULT_FENCE_TTL_MS).unwrap();
    assert!(left > day - 60_000 && left <= day, "{left}");
}

/// Fences across two successive restarts of different Redlock masters stay strictly increasing,
/// also when the counters ran ahead of the servers' clocks (so the clock floor alone would not
/// do): the winner raises the counter on every master that answers, including one whose vote
/// did not count (here: held by a stranger).
#[test]
fn redlock_fences_increase_across_two_restarts_of_different_masters() {
    let mut servers = [Server::start(), Server::start(), Server::start()];
    let stranger = |server: &Server, on: bool| {
        let shared = server.client("rr:").shared().unwrap();
        let mut cmd = redis::cmd(if on { "SET" } else { "DEL" });
        cmd.arg(b"rr:{n}:lock".to_vec());
        if on {
            cmd.arg("stranger").arg("PX").arg(60_000);
        }
        block_on(shared.node.query::<()>(&cmd, Retry::Never)).unwrap();
    };
    let fence_on = |server: &Server| -> Option<i64> {
        let shared = server.client("rr:").shared().unwrap();
        block_on(shared.node.query(
            redis::cmd("GET").arg(b"rr:{n}:fence".to_vec()),
            Retry::Never,
        ))
        .unwrap()
    };
    let ahead = {
        let shared = servers[0].client("rr:").shared().unwrap();
        server_time_us(&shared) + 3_600_000_000
    };
    for server in &servers {
        let shared = server.client("rr:").shared().unwrap();
        block_on(shared.node.query::<()>(
            redis::cmd("SET").arg(b"rr:{n}:fence".to_vec()).arg(ahead),
            Retry::Never,
        ))
        .unwrap();
    }
    let client = redlock_client(&[&servers[0], &servers[1], &servers[2]], "rr:");
    let handle = LockHandle::new(
        client.clone(),
        b"n",
        Duration::from_secs(1),
        false,
        0,
        false,
    )
    .unwrap();
    let mut fences = Vec::new();
    let take = |handle: &LockHandle| {
        let until = Wait::Until(Instant::now() + Duration::from_secs(15));
        assert!(block_on(handle.holder().acquire(until, None, &())).unwrap());
        let fence = handle.fence().unwrap();
        let _ = block_on(handle.holder().release());
        fence
    };
    fences.push(take(&handle));
    // Master 2 restarts empty and is held by a stranger there: its vote is "busy".
    servers[2].restart();
    stranger(&servers[2], true);
    fences.push(take(&handle));
    // The winner raised master 2's counter too (in the background).
    let deadline = Instant::now() + Duration::from_secs(5);
    while fence_on(&servers[2]).is_none_or(|f| f < fences[1]) {
        assert!(Instant::now() < deadline, "master 2 was never raised");
        std::thread::sleep(Duration::from_millis(20));
    }
    stranger(&servers[2], false);
    // Master 0 restarts empty, and master 1 is held by a stranger: the majority is {0, 2}.
    servers[0].restart();
    stranger(&servers[1], true);
    fences.push(take(&handle));
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(fences[0] > ahead, "{fences:?}");
}

/// The semaphore "s" of `client` with `limit` permits leased 5 s.
fn semaphore_s(client: &Client, limit: u64, fair: bool) -> super::semaphore::SemaphoreSpec {
    super::semaphore::SemaphoreSpec {
        name: b"s".to_vec(),
        keys: client.keys(b"s").unwrap(),
        limit,
        lease: Duration::from_secs(5),
        fair,
        slots: false,
    }
}

#[test]
fn a_first_attempt_refused_for_another_limit_gives_nothing_back() {
    // The refusal wrote nothing, so nothing may be given back for the token: a give-back sent
    // in the background could land after a later hold of the same token and end it.
    use super::error::Error;
    use super::semaphore;
    let server = Server::start();
    let client = server.client("sg:");
    let shared = client.shared().unwrap();
    let evalsha_calls = || -> u64 {
        let info: String = block_on(
            shared
                .node
                .query(redis::cmd("INFO").arg("commandstats"), Retry::Never),
        )
        .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for fair in [false, true] {
        let (one, five) = (semaphore_s(&client, 1, fair), semaphore_s(&client, 5, fair));
        // Every script loaded (acquire and release), so each attempt is one EVALSHA.
        assert!(block_on(semaphore::acquire(&shared, &one, "z", Wait::Once))
            .unwrap()
            .is_some());
        assert!(block_on(semaphore::release(&shared, &one, "z")).unwrap());
        assert!(block_on(semaphore::acquire(&shared, &one, "a", Wait::Once))
            .unwrap()
            .is_some());
        let before = evalsha_calls();
        let err = block_on(semaphore::acquire(&shared, &five, "b", Wait::Once)).unwrap_err();
        assert!(matches!(err, Error::Limit(_)), "{err:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(evalsha_calls() - before, 1, "fair: {fair}");
        assert!(block_on(semaphore::release(&shared, &one, "a")).unwrap());
    }
}

#[test]
fn a_semaphore_refuses_another_limit_while_holders_or_waiters_of_the_live_one_remain() {
    use super::error::Error;
    use super::semaphore;
    let server = Server::start();
    let client = server.client("sl:");
    let shared = client.shared().unwrap();
    let spec = |limit: u64, fair: bool| semaphore_s(&client, limit, fair);
    let keys = client.keys(b"s").unwrap();
    let get = |key: Vec<u8>| -> Option<String> {
        block_on(shared.node.query(redis::cmd("GET").arg(key), Retry::Never)).unwrap()
    };
    for fair in [false, true] {
        let one = spec(1, fair);
        let five = spec(5, fair);
        assert!(block_on(semaphore::acquire(&shared, &one, "a", Wait::Once))
            .unwrap()
            .is_some());
        assert_eq!(get(keys.semaphore_limit()).as_deref(), Some("1"));
        // Another limit while a holder of the live one remains: refused, naming both.
        let err = block_on(semaphore::acquire(&shared, &five, "b", Wait::Once)).unwrap_err();
        let Error::Limit(message) = err else {
            panic!("{err:?}");
        };
        assert!(
            message.contains("limit 5") && message.contains("limit 1"),
            "{message}"
        );
        // The same limit: busy, as ever.
        assert!(block_on(semaphore::acquire(&shared, &one, "c", Wait::Once))
            .unwrap()
            .is_none());
        assert!(block_on(semaphore::release(&shared, &one, "a")).unwrap());
        // Nobody of the old limit is left: the new one takes effect.
        assert!(
            block_on(semaphore::acquire(&shared, &five, "b", Wait::Once))
                .unwrap()
                .is_some()
        );
        assert_eq!(get(keys.semaphore_limit()).as_deref(), Some("5"));
        assert!(matches!(
            block_on(semaphore::acquire(&shared, &one, "a", Wait::Once)),
            Err(Error::Limit(_))
        ));
        // The limit lives as long as the holders: extended with them, gone after them.
        let ext = protocol::semaphore::extend(&keys, "b", Duration::from_secs(60));
        assert!(block_on(executor::run(&shared, &ext)).unwrap());
        let pttl: i64 = block_on(
            shared
                .node
                .query(redis::cmd("PTTL").arg(keys.semaphore_limit()), Retry::Never),
        )
        .unwrap();
        assert!(pttl > 50_000, "{pttl}");
        assert!(block_on(semaphore::release(&shared, &five, "b")).unwrap());
        // The last holder out takes the limit with it: nothing of the semaphore is left.
        assert_eq!(get(keys.semaphore_limit()), None);
    }
    // A queued waiter of the live limit holds it too (fair).
    let one = spec(1, true);
    assert!(block_on(semaphore::acquire(&shared, &one, "a", Wait::Once))
        .unwrap()
        .is_some());
    let waiter = block_on(semaphore::acquire(
        &shared,
        &one,
        "w",
        Wait::Until(Instant::now() + Duration::from_millis(300)),
    ));
    assert!(waiter.unwrap().is_none());
    let join = Queueing::Join { place_ms: 10_000 };
    let queued = scripts::semaphore_acquire(&keys, "q", 5_000, 1, true, join);
    block_on(shared.node.invoke(&queued, Retry::Never)).unwrap();
    assert!(block_on(semaphore::release(&shared, &one, "a")).unwrap());
    assert!(matches!(
        block_on(semaphore::acquire(&shared, &spec(2, true), "b", Wait::Once)),
        Err(Error::Limit(_))
    ));
}

#[test]
fn a_reentrant_holder_counts_its_acquires_in_redis() {
    let server = Server::start();
    let client = server.client("t20:");
    let lease = Duration::from_secs(10);
    let handle =
        LockHandle::with_reentry(client.clone(), b"r", lease, false, 0, false, true).unwrap();
    let holder = handle.holder();
    let holds = |client: &Arc<Client>| -> Option<Vec<u8>> {
        let shared = client.shared().unwrap();
        block_on(async {
            shared
                .node
                .query(redis::cmd("GET").arg("t20:{r}:lock:holds"), Retry::Never)
                .await
                .unwrap()
        })
    };
    assert!(block_on(holder.acquire(Wait::Once, None, &())).unwrap());
    let (token, fence) = (holder.token().unwrap(), handle.fence());
    assert!(block_on(holder.acquire(Wait::Once, None, &())).unwrap());
    assert!(block_on(holder.acquire(Wait::Once, None, &())).unwrap());
    assert_eq!(holder.depth(), 3);
    assert_eq!(holder.token().unwrap(), token);
    assert_eq!(handle.fence(), fence);
    assert_eq!(holds(&client), Some(format!("{token} 3").into_bytes()));
    let other = LockHandle::new(client.clone(), b"r", lease, false, 0, false).unwrap();
    for depth in [2, 1] {
        block_on(holder.release()).unwrap();
        assert_eq!(holder.depth(), depth);
        assert!(!block_on(other.holder().acquire(Wait::Once, None, &())).unwrap());
    }
    assert_eq!(holds(&client), None);
    block_on(holder.release()).unwrap();
    assert!(block_on(holder.release()).is_err());
    assert!(block_on(other.holder().acquire(Wait::Once, None, &())).unwrap());
    // Not re-entrant by default.
    assert!(block_on(other.holder().acquire(Wait::Once, None, &())).is_err());
}

/// A Redlock master's node on `server` (every call waits for the calls that timed out before
/// it), with a short command timeout, and a call that never answers (a BLPOP on a key nobody
/// pushes) for it to time out on.
fn in_order_node(server: &Server, command_ms: u64) -> (Arc<super::node::Node>, redis::Cmd) {
    use super::node::{Node, Target};
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        command: Duration::from_millis(command_ms),
    };
    let target = Target::Direct(redis::Client::open(server.url()).unwrap());
    let mut never = redis::cmd("BLPOP");
    never.arg("t-reset:never").arg(0);
    (
        Arc::new(Node::new(Arc::new(target), timeouts).in_order()),
        never,
    )
}

#[test]
fn a_reset_forgets_the_calls_that_timed_out_on_the_old_master() {
    use redis::Value;
    let server = Server::start();
    let (node, never) = in_order_node(&server, 200);
    block_on(async {
        // A call that never answers times out and stays due.
        let err = node.query::<Value>(&never, Retry::Never).await.unwrap_err();
        assert!(err.to_string().contains("waiting for an answer"), "{err}");
        // While it is due, the next call cannot be sent after it: it fails.
        let err = node
            .query::<String>(&redis::cmd("PING"), Retry::Never)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("earlier call"), "{err}");
        // The master changed (Sentinel named another): the old one's calls no longer order the
        // new one's, so a call goes out at once.
        node.reset();
        let pong: String = node.query(&redis::cmd("PING"), Retry::Never).await.unwrap();
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn a_call_on_the_old_master_that_times_out_after_a_reset_is_not_waited_for() {
    use redis::Value;
    let server = Server::start();
    let (node, never) = in_order_node(&server, 300);
    block_on(async {
        // A call on the old master, still unanswered when the failover is announced.
        let in_flight = {
            let node = node.clone();
            tokio::spawn(async move { node.query::<Value>(&never, Retry::Never).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.reset();
        let err = in_flight.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("waiting for an answer"), "{err}");
        // Its timeout came after the reset: the new master's calls do not wait for it.
        let pong: String = node.query(&redis::cmd("PING"), Retry::Never).await.unwrap();
        assert_eq!(pong, "PONG");
    });
}

/// A node and an exclusive pool on `server` as `Shared` pairs them (the pool reads the node's
/// resets), with a command timeout of `command_ms`.
fn node_and_exclusive_pool(
    server: &Server,
    command_ms: u64,
) -> (Arc<super::node::Node>, Arc<super::exclusive::ExclusivePool>) {
    use super::exclusive::ExclusivePool;
    let (node, _) = in_order_node(server, command_ms);
    let pool = ExclusivePool::new(node.target().clone(), node.timeouts(), node.resets());
    (node, Arc::new(pool))
}

#[test]
fn an_exclusive_call_on_the_old_master_that_times_out_after_a_reset_is_not_waited_for() {
    use redis::Value;
    let server = Server::start();
    let (node, pool) = node_and_exclusive_pool(&server, 300);
    block_on(async {
        // A replica-acknowledged attempt's pipeline on the old master, unanswered when the
        // failover is announced.
        let in_flight = {
            let (node, pool) = (node.clone(), pool.clone());
            tokio::spawn(async move {
                let mut pipe = redis::pipe();
                pipe.cmd("BLPOP").arg("t-reset:never").arg(0);
                pool.pipeline::<Value>(
                    &pipe,
                    Duration::from_millis(300),
                    |conn, opened| node.keep_overdue_conn(conn, opened),
                    |_| false,
                    |_| None,
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.reset();
        pool.reset();
        let err = in_flight.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("waiting for a pipeline"), "{err}");
        // It timed out after the reset: the new master's calls do not wait for it.
        let pong: String = node.query(&redis::cmd("PING"), Retry::Never).await.unwrap();
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn an_exclusive_connection_of_the_old_master_is_not_reused_after_a_reset() {
    use redis::Value;
    let server = Server::start();
    let (node, pool) = node_and_exclusive_pool(&server, 2_000);
    block_on(async {
        // A pipeline on the old master answers after the failover was announced.
        let in_flight = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut pipe = redis::pipe();
                pipe.cmd("BLPOP").arg("t-reset:empty").arg(0.3);
                pool.pipeline::<Value>(
                    &pipe,
                    Duration::from_secs(2),
                    |_, _| {},
                    |_| false,
                    |_| None,
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.reset();
        pool.reset();
        in_flight.await.unwrap().unwrap();
        // Its connection is not kept for the next attempt (it would go to the old master).
        assert_eq!(pool.idle_count(), 0);
        // One opened after the reset is.
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        let _: Value = pool
            .pipeline(
                &pipe,
                Duration::from_secs(2),
                |_, _| {},
                |_| false,
                |_| None,
            )
            .await
            .unwrap();
        assert_eq!(pool.idle_count(), 1);
    });
}

/// Three Redlock masters and a slot semaphore "s" of limit 2 on them: the servers (stopped when
/// dropped), the Redlock, the spec and each master's own connection.
fn redlock_semaphore_of_limit_2(
    prefix: &str,
) -> (
    [Server; 3],
    Arc<super::redlock::Redlock>,
    crate::protocol::semaphore::SemaphoreSpec,
    Vec<Arc<super::shared::Shared>>,
) {
    use super::client::Backend;
    let servers = [Server::start(), Server::start(), Server::start()];
    let client = redlock_client(&[&servers[0], &servers[1], &servers[2]], prefix);
    let Ok(Backend::Redlock(redlock)) = client.backend() else {
        panic!("a Redlock client");
    };
    let spec = crate::protocol::semaphore::SemaphoreSpec {
        name: b"s".to_vec(),
        keys: client.keys(b"s").unwrap(),
        limit: 2,
        lease: Duration::from_secs(20),
        fair: false,
        slots: true,
    };
    let masters = servers
        .iter()
        .map(|s| s.client(prefix).shared().unwrap())
        .collect();
    (servers, redlock, spec, masters)
}

/// A Redlock semaphore's permit is one slot on a majority: a master where the token holds
/// another slot (an earlier round's grant whose give-back never landed) is no vote for the slot
/// asked for. Counting it let a third holder into a semaphore of limit 2 (the slot asked for
/// was taken on a majority, the stale slot was on one master only).
#[test]
fn a_redlock_semaphore_master_holding_another_slot_is_no_vote() {
    use super::redlock_semaphore;
    use crate::protocol::semaphore::{release_any, slot_attempt, SlotReply};
    let (_servers, redlock, spec, masters) = redlock_semaphore_of_limit_2("rss:");
    let take = |i: usize, token: &str, slot: u64| -> SlotReply {
        block_on(executor::run(
            &masters[i],
            &slot_attempt(&spec, token, slot),
        ))
        .unwrap()
    };
    // A holds slot 0 on masters 1 and 2, C slot 1 on masters 0 and 2: the limit is reached.
    for (i, token, slot) in [(1, "A", 0), (2, "A", 0), (0, "C", 1), (2, "C", 1)] {
        assert_eq!(
            take(i, token, slot),
            SlotReply::Granted { slot: slot as i64 }
        );
    }
    // Each acquire asks a random slot first: slot 1 is the one a stale vote would win.
    let mut admitted = 0;
    for _ in 0..12 {
        assert_eq!(take(0, "T", 0), SlotReply::Granted { slot: 0 });
        let granted =
            block_on(redlock_semaphore::acquire(&redlock, &spec, "T", Wait::Once)).unwrap();
        if granted.is_some() {
            admitted += 1;
        }
        std::thread::sleep(Duration::from_millis(100)); // the lost round's give-backs land
        for master in &masters {
            block_on(executor::run(master, &release_any(&spec, "T"))).unwrap();
        }
    }
    assert_eq!(admitted, 0, "a third holder got in, limit 2");
}

/// A master that still holds another slot of the token (a lost round's grant whose give-back
/// never landed) drops it for the slot asked: otherwise, after a round won elsewhere, Redlock's
/// extend and `owned` (which count masters by token) would take it for part of the hold, and
/// renewal would keep it (the reviewer's three holders of a limit-2 semaphore).
#[test]
fn a_redlock_semaphore_master_drops_a_stale_slot_of_the_token_for_the_one_asked() {
    use super::redlock_semaphore;
    use crate::protocol::semaphore::{release_any, slot_attempt, SlotReply};
    let (_servers, redlock, spec, masters) = redlock_semaphore_of_limit_2("rsw:");
    let slot_on = |i: usize| -> Option<String> {
        block_on(
            masters[i].node.query(
                redis::cmd("HGET")
                    .arg(spec.keys.semaphore_slots())
                    .arg("tT"),
                Retry::Never,
            ),
        )
        .unwrap()
    };
    let mut won_elsewhere = 0;
    for _ in 0..12 {
        // An earlier round's grant of slot 0 on master 0 whose give-back never landed.
        let planted = slot_attempt(&spec, "T", 0);
        assert_eq!(
            block_on(executor::run(&masters[0], &planted)).unwrap(),
            SlotReply::Granted { slot: 0 }
        );
        assert!(
            block_on(redlock_semaphore::acquire(&redlock, &spec, "T", Wait::Once))
                .unwrap()
                .is_some()
        );
        std::thread::sleep(Duration::from_millis(100)); // the give-back lands
        if slot_on(1).as_deref() == Some("1") {
            // Won slot 1 on masters 1 and 2: master 0 holds T in no other slot any more.
            won_elsewhere += 1;
            assert_ne!(slot_on(0).as_deref(), Some("0"));
        }
        for master in &masters {
            block_on(executor::run(master, &release_any(&spec, "T"))).unwrap();
        }
    }
    assert!(
        won_elsewhere > 0,
        "every acquire asked slot 0 first (1 in 4096)"
    );
}

/// A Redlock permit's extend and ownership steps count a master only while it holds the token in
/// the slot the permit won: a stale lease of the token in another slot (an earlier round's grant
/// whose give-back never landed) is neither counted nor extended.
#[test]
fn a_redlock_semaphore_master_counts_for_a_hold_only_in_its_slot() {
    use crate::protocol::semaphore::{slot_attempt, slot_extend, slot_owned, SlotReply};
    let (_servers, _redlock, spec, masters) = redlock_semaphore_of_limit_2("rsh:");
    let run = |i: usize, step: &protocol::step::Step<bool>| {
        block_on(executor::run(&masters[i], step)).unwrap()
    };
    for (i, slot) in [(0, 0), (1, 1), (2, 1)] {
        let granted = block_on(executor::run(&masters[i], &slot_attempt(&spec, "T", slot)));
        assert_eq!(granted.unwrap(), SlotReply::Granted { slot: slot as i64 });
    }
    let lease = Duration::from_secs(60);
    assert!(!run(0, &slot_owned(&spec, "T", 1)));
    assert!(!run(0, &slot_extend(&spec, "T", 1, lease)));
    assert!(run(1, &slot_owned(&spec, "T", 1)));
    assert!(run(2, &slot_extend(&spec, "T", 1, lease)));
    assert!(!run(2, &slot_owned(&spec, "U", 1)));
    let lease_end = |i: usize| -> f64 {
        let score: Option<f64> = block_on(
            masters[i].node.query(
                redis::cmd("ZSCORE")
                    .arg(spec.keys.semaphore_holders())
                    .arg("T"),
                Retry::Never,
            ),
        )
        .unwrap();
        score.unwrap()
    };
    // Only master 2's lease was stretched (to 60 s; the others keep the 20 s they were granted).
    assert!(lease_end(2) - lease_end(1) > 30_000.0);
    assert!(lease_end(0) - lease_end(1) < 1_000.0);
}
