"""`redmutex.aio.get_or_fill` and `@redmutex.aio.cached` against a real redis-server on loopback:
the cache contract again through asyncio (one fill across tasks and processes, waiters woken by
the store, hand-over when a fill fails or is cancelled, XFetch, keys, codecs) plus what is
asyncio's own: the loop never blocks, cancellation leaves nothing behind."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import multiprocessing
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import redis
import redmutex
from redmutex import _cache, aio
from redmutex._server import RedisServer

if TYPE_CHECKING:
    from conftest import MpProcs

T = TypeVar("T")
FORK = multiprocessing.get_context("fork")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def value_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:value"


def fill_key(prefix: str, name: str) -> str:
    return f"{prefix}{{{name}}}:fill"


def counting_fill(value: T, seconds: float = 0.0) -> tuple[list[int], Callable[[], Awaitable[T]]]:
    """An async fill returning `value` after `seconds`, and the list its calls are counted in."""
    calls: list[int] = []

    async def fill() -> T:
        calls.append(1)
        await asyncio.sleep(seconds)
        return value

    return calls, fill


# --------------------------------------------------------------------------------------------
# Basics
# --------------------------------------------------------------------------------------------


def test_miss_fills_and_stores_then_hits(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls, fill = counting_fill({"answer": 42})

    async def main() -> None:
        assert await aio.get_or_fill(client, "basic", fill, ttl=30) == {"answer": 42}
        assert await aio.get_or_fill(client, "basic", fill, ttl=30) == {"answer": 42}

    run(main())
    assert len(calls) == 1
    assert 0 < r.pttl(value_key(prefix, "basic")) <= 30_000
    assert not r.exists(fill_key(prefix, "basic"))


def test_none_and_plain_fills_and_the_sync_api_share_entries(client: redmutex.Client) -> None:
    async def main() -> None:
        assert await aio.get_or_fill(client, "none", lambda: None, ttl=30) is None
        # A fill that is not async is called as it is; its value is cached like any other.
        assert await aio.get_or_fill(client, "plain", lambda: "plain", ttl=30) == "plain"
        # The value is cached: this fill must not run.
        assert await aio.get_or_fill(client, "none", lambda: 1 / 0, ttl=30) is None

    run(main())
    # Entries are the same as the blocking API's.
    assert redmutex.get_or_fill(client, "plain", lambda: "other", ttl=30) == "plain"
    assert run(aio.get_or_fill(client, "sync-made", lambda: "x", ttl=30)) == "x"


def test_exports() -> None:
    assert {"cached", "get_or_fill", "AsyncCachedFunction"} <= set(aio.__all__)
    assert aio.get_or_fill is not redmutex.get_or_fill
    assert asyncio.iscoroutinefunction(aio.get_or_fill)


# --------------------------------------------------------------------------------------------
# One fill, waiters woken by the store
# --------------------------------------------------------------------------------------------


def test_stampede_of_50_tasks_fills_once(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls, fill = counting_fill("cold", 0.2)

    async def main() -> list[str]:
        return await asyncio.gather(
            *(aio.get_or_fill(client, "cold", fill, ttl=30) for _ in range(50))
        )

    started = time.monotonic()
    assert run(main()) == ["cold"] * 50
    elapsed = time.monotonic() - started
    assert len(calls) == 1
    assert elapsed < 0.2 + 5, elapsed
    assert not r.exists(fill_key(prefix, "cold"))


def _stampede_process(url: str, prefix: str, barrier: Any, out: Any) -> None:
    async def main() -> list[str]:
        client = redmutex.Client(url, prefix=prefix)
        conn = redis.Redis.from_url(url)

        async def fill() -> str:
            n = conn.incr(prefix + "fills")
            await asyncio.sleep(0.3)
            return f"fill-{n}"

        barrier.wait(timeout=30)
        return await asyncio.gather(
            *(aio.get_or_fill(client, "xproc", fill, ttl=60) for _ in range(8))
        )

    try:
        started = time.monotonic()
        values = asyncio.run(main())
        out.put(("ok", values, time.monotonic() - started))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put(("error", repr(exc), 0.0))


@pytest.mark.timeout(120)
def test_stampede_of_tasks_in_4_processes_fills_once(
    redis_server: RedisServer, r: redis.Redis, prefix: str, mp_procs: MpProcs
) -> None:
    procs = 4
    barrier = FORK.Barrier(procs)
    out = FORK.Queue()
    for _ in range(procs):
        mp_procs.start(_stampede_process, redis_server.url, prefix, barrier, out)
    results = [out.get(timeout=60) for _ in range(procs)]
    assert all(kind == "ok" for kind, _, _ in results), results
    assert int(r.get(prefix + "fills") or 0) == 1
    assert {v for _, values, _ in results for v in values} == {"fill-1"}
    slowest = max(elapsed for _, _, elapsed in results)
    assert slowest < 0.3 + 5, slowest


def test_waiters_are_woken_by_the_store_and_the_loop_keeps_ticking(
    client: redmutex.Client,
) -> None:
    """With a 60 s claim lease, the waiting tasks can only learn of the value from the wake-up;
    meanwhile a ticker task on the same loop keeps its 10 ms beat."""

    async def main() -> tuple[list[float], float, list[float]]:
        release = asyncio.Event()
        done: list[float] = []
        ticks: list[float] = []

        async def fill() -> str:
            await release.wait()
            return "stored"

        async def call() -> None:
            assert await aio.get_or_fill(client, "wake", fill, ttl=30, lock_ttl=60) == "stored"
            done.append(time.monotonic())

        async def ticker() -> None:
            while len(done) < 10:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        first = asyncio.ensure_future(call())
        await asyncio.sleep(0.1)  # the first task claims the fill
        waiters = [asyncio.ensure_future(call()) for _ in range(9)]
        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.5)
        assert not done
        stored_at = time.monotonic()
        release.set()
        await asyncio.wait_for(asyncio.gather(first, *waiters, tick), 30)
        return done, stored_at, ticks

    done, stored_at, ticks = run(main())
    assert max(done) - stored_at < 2.0
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 20
    assert max(gaps) < 0.5, max(gaps)


# --------------------------------------------------------------------------------------------
# Failure, cancellation, timeouts
# --------------------------------------------------------------------------------------------


def test_fill_raising_hands_over_to_exactly_one_waiter(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    fills: list[int] = []

    async def fill() -> str:
        fills.append(1)
        n = len(fills)
        await asyncio.sleep(0.1)
        if n == 1:
            raise RuntimeError("the first fill fails")
        return f"filled-by-{n}"

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(aio.get_or_fill(client, "fragile", fill, ttl=60, lock_ttl=60) for _ in range(10)),
            return_exceptions=True,
        )

    results = run(main())
    raised = [x for x in results if isinstance(x, RuntimeError)]
    assert len(raised) == 1 and str(raised[0]) == "the first fill fails"
    assert [x for x in results if not isinstance(x, BaseException)] == ["filled-by-2"] * 9
    assert len(fills) == 2  # handed over through the give-back, not the 60 s lease
    assert not r.exists(fill_key(prefix, "fragile"))


def test_a_store_lost_in_a_network_blip_gives_the_claim_back_once_redis_answers(
    redis_server: RedisServer, prefix: str
) -> None:
    """The filler's store and give-back are lost (the network drops them); once Redis answers
    again the give-back is sent again and the waiter takes the fill over, rather than after
    the claim's whole lease (see the test of the same name in test_cache.py)."""
    from _proxy import FaultProxy

    with FaultProxy(redis_server.port).start() as proxy:
        filler = redmutex.Client(proxy.url, prefix=prefix, command_timeout=0.5)
        waiter = redmutex.Client(redis_server.url, prefix=prefix)

        async def fill() -> str:
            await asyncio.sleep(0.2)  # the waiter is queued by now
            proxy.blackhole()  # the store (and the give-back after it) are lost
            return "lost"

        async def main() -> float:
            filling = asyncio.create_task(
                aio.get_or_fill(filler, "blip", fill, ttl=30, lock_ttl=30)
            )
            await asyncio.sleep(0.05)
            waiting = asyncio.create_task(
                aio.get_or_fill(waiter, "blip", lambda: "w", ttl=30, lock_ttl=30, timeout=8)
            )
            assert await filling == "lost"  # the filler's caller still has its value
            await asyncio.sleep(0.5)
            healed = time.monotonic()
            proxy.heal()
            assert await waiting == "w"
            return time.monotonic() - healed

        try:
            waited = run(main())
        finally:
            proxy.heal()
            filler.close()
            waiter.close()
    assert waited < 5.0, f"the waiter took the fill over {waited:.1f} s after Redis answered"


def test_cancelled_filler_gives_the_claim_to_a_waiter(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def main() -> tuple[str, float]:
        async def slow() -> str:
            await asyncio.sleep(60)
            return "never"

        filler = asyncio.ensure_future(aio.get_or_fill(client, "cx", slow, ttl=60, lock_ttl=60))
        await asyncio.sleep(0.2)
        assert r.exists(fill_key(prefix, "cx"))
        waiter = asyncio.ensure_future(aio.get_or_fill(client, "cx", lambda: "taken over", ttl=60))
        await asyncio.sleep(0.2)
        cancelled_at = time.monotonic()
        filler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await filler
        value = await asyncio.wait_for(waiter, 10)
        return value, time.monotonic() - cancelled_at

    value, took = run(main())
    assert value == "taken over"
    assert took < 5, took  # not the 60 s lease
    assert not r.exists(fill_key(prefix, "cx"))


class _Fatal(BaseException):
    """A BaseException of the user's own, neither an Exception nor an interrupt asyncio knows."""


@pytest.mark.parametrize("error", [GeneratorExit, _Fatal])
def test_fill_raising_a_base_exception_gives_the_claim_back_at_once(
    client: redmutex.Client, r: redis.Redis, prefix: str, error: type[BaseException]
) -> None:
    """The caller gets the fill's own BaseException and a waiter takes over through the
    give-back. GeneratorExit used to come back as "RuntimeError: generator ignored
    GeneratorExit", its claim held (and renewed) while the caller kept it."""

    async def fill() -> str:
        await asyncio.sleep(0.2)
        raise error()

    async def main() -> tuple[BaseException, str, float]:
        filler = asyncio.ensure_future(aio.get_or_fill(client, "base", fill, ttl=60, lock_ttl=60))
        await asyncio.sleep(0.1)
        waiter = asyncio.ensure_future(
            aio.get_or_fill(client, "base", lambda: "W", ttl=60, lock_ttl=60, timeout=8)
        )
        t0 = time.monotonic()
        # Not `await filler`: asyncio throws a task's exception into its awaiter, and a thrown
        # GeneratorExit would close this coroutine.
        await asyncio.wait([filler])
        kept = filler.exception()  # kept: its frames must not keep the claim alive
        assert kept is not None
        return kept, await waiter, time.monotonic() - t0

    kept, value, took = run(main())
    assert type(kept) is error
    assert value == "W"
    assert took < 5, took  # not the 60 s lease
    assert not r.exists(fill_key(prefix, "base"))


def test_a_closed_filling_coroutine_gives_the_claim_back(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    """``coro.close()`` (a framework dropping an un-run coroutine, or GC) throws GeneratorExit
    into the fill: the close must succeed (no "coroutine ignored GeneratorExit") and the claim
    be given back without an await."""
    filling = asyncio.Event()

    async def fill() -> str:
        filling.set()
        await asyncio.sleep(60)
        return "never"

    async def main() -> str:
        coro = aio.get_or_fill(client, "closed", fill, ttl=60, lock_ttl=60)
        # Drive the coroutine by hand (no task) until its fill runs, then close it.
        pending = coro.send(None)
        while not filling.is_set():
            while pending is not None and not pending.done():
                await asyncio.sleep(0.005)
            pending = coro.send(None)
        coro.close()
        return await aio.get_or_fill(client, "closed", lambda: "again", ttl=60, timeout=5)

    assert run(main()) == "again"
    assert not r.exists(fill_key(prefix, "closed"))


def test_cancellation_at_random_points_leaves_no_claim(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    rng = random.Random(7)

    async def main() -> None:
        async def fill() -> int:
            await asyncio.sleep(rng.uniform(0, 0.003))
            return 1

        for i in range(200):
            name = f"rc{i % 20}"
            tasks = [
                asyncio.ensure_future(aio.get_or_fill(client, name, fill, ttl=0.05, lock_ttl=30))
                for _ in range(3)
            ]
            await asyncio.sleep(rng.uniform(0, 0.004))
            for t in tasks:
                if rng.random() < 0.7:
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # Background give-backs of cancelled fills finish within a few round trips.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and list(r.scan_iter(prefix + "*:fill")):
            await asyncio.sleep(0.05)
        # And nobody is stuck: every entry can still be filled at once.
        for n in range(20):
            assert await aio.get_or_fill(client, f"rc{n}", lambda: "ok", ttl=30, timeout=5) in (
                1,
                "ok",
            )

    run(main())
    assert list(r.scan_iter(prefix + "*:fill")) == []


def test_timeout_waiting_for_another_fill(client: redmutex.Client) -> None:
    async def main() -> float:
        async def slow() -> str:
            await asyncio.sleep(2)
            return "slow"

        filler = asyncio.ensure_future(aio.get_or_fill(client, "late", slow, ttl=30))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(redmutex.LockTimeoutError, match="late"):
            await aio.get_or_fill(client, "late", slow, ttl=30, timeout=0.3)
        waited = time.monotonic() - started
        with pytest.raises(redmutex.LockTimeoutError):
            await aio.get_or_fill(client, "late", slow, ttl=30, timeout=0)
        assert await filler == "slow"
        return waited

    waited = run(main())
    assert 0.25 < waited < 1.5, waited


def test_a_fill_asking_for_its_own_entry_through_a_url_spelled_otherwise_raises(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    # The same server, db and prefix spelled otherwise is the same entry: the fill waited for
    # its own claim (for ever with timeout=None).
    port = redis_server.port
    outer = redmutex.Client(f"redis://127.0.0.1:{port}")
    inner = redmutex.Client(f"redis://127.0.0.1:{port}/0")
    elsewhere = redmutex.Client(f"redis://127.0.0.1:{port}/1")

    async def own() -> str:
        return await aio.get_or_fill(inner, "spelled", lambda: "inner", ttl=30, timeout=3)

    async def via_task() -> str:
        return await asyncio.ensure_future(own())

    async def other_db() -> int:
        return await aio.get_or_fill(elsewhere, "spelled-db", lambda: 5, ttl=30, timeout=3)

    async def main() -> None:
        for fill in (own, via_task):
            with pytest.raises(RuntimeError, match="its own fill"):
                await aio.get_or_fill(outer, "spelled", fill, ttl=30)
        assert await aio.get_or_fill(outer, "spelled-db", other_db, ttl=30) == 5

    try:
        asyncio.run(main())
        assert not r.exists("redmutex:{spelled}:fill")
    finally:
        r.delete("redmutex:{spelled-db}:value")
        for c in (outer, inner, elsewhere):
            c.close()


def test_a_fill_asking_for_its_own_entry_raises_instead_of_hanging(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    async def own() -> str:
        return await aio.get_or_fill(client, "self", own, ttl=30)

    async def via_task() -> str:
        return await asyncio.ensure_future(aio.get_or_fill(client, "self2", via_task, ttl=30))

    same_place = redmutex.Client(client.url, prefix=prefix)

    async def through_another_client() -> str:
        return await aio.get_or_fill(same_place, "self3", through_another_client, ttl=30, timeout=5)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="its own fill"):
            await aio.get_or_fill(client, "self", own, ttl=30)
        with pytest.raises(RuntimeError, match="its own fill"):
            await aio.get_or_fill(client, "self3", through_another_client, ttl=30, timeout=5)
        with pytest.raises(RuntimeError, match="its own fill"):
            await aio.get_or_fill(client, "self2", via_task, ttl=30)

        # Other entries may be filled from within a fill, and tasks are independent otherwise.
        async def outer() -> int:
            return await aio.get_or_fill(client, "inner", lambda: 1, ttl=30)

        assert await aio.get_or_fill(client, "outer", outer, ttl=30) == 1

    run(main())
    assert not r.exists(fill_key(prefix, "self"))
    assert not r.exists(fill_key(prefix, "self2"))


def test_a_task_started_by_a_fill_may_ask_for_the_entry_once_the_fill_ended(
    client: redmutex.Client,
) -> None:
    # A fill that starts a background refresher: the task inherits the fill's context, but once
    # the fill has ended, its reads of the entry (a hit, and a fill after invalidate) are ordinary.
    background: list[asyncio.Task[None]] = []
    seen: list[Any] = []
    fill_ended = asyncio.Event()  # bound to the loop at its first use (Python >= 3.10)

    @aio.cached(client, ttl=30, key="refreshed")
    async def load() -> int:
        if not background:
            background.append(asyncio.create_task(refresh()))
        return len(seen)

    async def refresh() -> None:
        await fill_ended.wait()
        seen.append(await load())  # a plain hit
        await load.invalidate()
        seen.append(await load())  # a fill of its own

    async def main() -> None:
        assert await load() == 0
        fill_ended.set()
        await asyncio.wait_for(background[0], 10)

    run(main())
    assert seen == [0, 1]


# --------------------------------------------------------------------------------------------
# The decorator, keys, codecs, XFetch
# --------------------------------------------------------------------------------------------


def test_cached_with_template_key_and_invalidate(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls: list[int] = []

    @aio.cached(client, ttl=30, key="user:{user_id}")
    async def load_user(user_id: int, verbose: bool = False) -> dict[str, Any]:
        calls.append(user_id)
        await asyncio.sleep(0.01)
        return {"id": user_id, "verbose": verbose}

    async def main() -> None:
        assert await load_user(7) == {"id": 7, "verbose": False}
        assert await load_user(user_id=7, verbose=True) == {"id": 7, "verbose": False}
        assert await load_user(8) == {"id": 8, "verbose": False}
        assert calls == [7, 8]
        assert r.exists(value_key(prefix, "user:7"))
        assert await load_user.invalidate(7) is True
        assert await load_user.invalidate(7) is False
        assert await load_user(7, verbose=True) == {"id": 7, "verbose": True}
        assert calls == [7, 8, 7]

    run(main())
    assert load_user.__name__ == "load_user"


def test_derived_and_constant_keys(client: redmutex.Client, r: redis.Redis, prefix: str) -> None:
    @aio.cached(client, ttl=30)
    async def square(x: int, power: int = 2) -> int:
        return x**power

    @aio.cached(client, ttl=30, key="the-one")
    async def one() -> str:
        return "one"

    async def main() -> None:
        assert await square(3) == 9
        assert await one() == "one"
        with pytest.raises(TypeError, match="argument .x."):
            await square(object())  # type: ignore[arg-type]

    run(main())
    assert r.exists(
        value_key(
            prefix, f"{__name__}.test_derived_and_constant_keys.<locals>.square(x=3, power=2)"
        )
    )
    assert redmutex.get_or_fill(client, "the-one", lambda: "other", ttl=30) == "one"


def test_cached_methods_bind_and_leave_self_out_of_derived_keys(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    calls: list[tuple[int, int]] = []

    class Repo:
        def __init__(self, n: int) -> None:
            self.n = n

        @aio.cached(client, ttl=30)
        async def load(self, x: int) -> int:
            calls.append((self.n, x))
            return x * 10

        @aio.cached(client, ttl=30, key=lambda self, x: f"aio-fn:{self.n}:{x}")
        async def by_function(self, x: int) -> int:
            return self.n * 1000 + x

    async def main() -> None:
        assert await Repo(1).load(5) == 50
        assert await Repo(2).load(5) == 50
        assert calls == [(1, 5)]
        assert await Repo(2).load.invalidate(5) is True
        assert await Repo.load.invalidate(Repo(1), 5) is False
        assert await Repo(3).by_function(4) == 3004
        assert await Repo(3).by_function.invalidate(4) is True

    run(main())
    assert r.exists(value_key(prefix, f"{__name__}.{Repo.__qualname__}.load(x=5)")) == 0
    # Still coroutine functions to frameworks that ask (bound or not).
    assert inspect.iscoroutinefunction(Repo.load)
    assert inspect.iscoroutinefunction(Repo(1).load)
    assert Repo(1).load.__name__ == "load"


def test_cached_validates_at_decoration_time(client: redmutex.Client) -> None:
    with pytest.raises(ValueError, match="ttl"):
        aio.cached(client, ttl=-1)
    with pytest.raises(ValueError, match="beta"):
        aio.cached(client, ttl=1, beta=-1)
    with pytest.raises(ValueError):
        aio.cached(client, ttl=1, serializer="yaml")

    async def f(a: int) -> int:
        return a

    with pytest.raises((ValueError, TypeError)):
        aio.cached(client, ttl=1, key="{missing}")(f)
    with pytest.raises(TypeError, match="fill"):
        run(aio.get_or_fill(client, "k", "not callable", ttl=1))  # type: ignore[arg-type]


def test_json_codec_and_tampered_signed_payload(
    client: redmutex.Client, r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        got = await aio.get_or_fill(client, "j", lambda: {"a": [1, 2]}, ttl=30, serializer="json")
        assert got == {"a": [1, 2]}
        await aio.get_or_fill(client, "s", lambda: "signed", ttl=30, secret=b"k" * 32)
        r.set(value_key(prefix, "s"), b"tampered" + (r.get(value_key(prefix, "s")) or b""))
        with caplog.at_level(logging.WARNING, logger="redmutex"):
            again = await aio.get_or_fill(client, "s", lambda: "refilled", ttl=30, secret=b"k" * 32)
        assert again == "refilled"

    run(main())
    assert any("ignoring the stored payload" in rec.getMessage() for rec in caplog.records)


def test_every_caller_gets_the_value_as_it_round_trips(client: redmutex.Client) -> None:
    @aio.cached(client, ttl=30, key="rt-aio", serializer="json")
    async def pair() -> tuple[int, int]:
        return (1, 2)

    async def main() -> None:
        # The filler's caller gets the list JSON gives back, as every later caller does.
        assert await pair() == [1, 2]
        assert await pair() == [1, 2]
        first = await aio.get_or_fill(client, "rt-aio-2", lambda: (3,), ttl=30, serializer="json")
        assert first == [3]
        # Tasks that wait for the fill get what the filler got.
        got = await asyncio.gather(
            *(
                aio.get_or_fill(client, "rt-aio-3", slow_tuple, ttl=30, serializer="json")
                for _ in range(5)
            )
        )
        assert got == [[4, 5]] * 5

    async def slow_tuple() -> tuple[int, int]:
        await asyncio.sleep(0.1)
        return (4, 5)

    run(main())


def test_invalidate_during_a_fill_drops_its_result(
    client: redmutex.Client, r: redis.Redis, prefix: str
) -> None:
    @aio.cached(client, ttl=30, key="inv")
    async def slow() -> str:
        await asyncio.sleep(0.3)
        return "old"

    async def main() -> None:
        task = asyncio.ensure_future(slow())
        await asyncio.sleep(0.1)
        assert await slow.invalidate() is False  # no value yet, but the fill is dropped
        assert await task == "old"  # its caller still gets it...

    run(main())
    assert not r.exists(value_key(prefix, "inv"))  # ...but it is not stored


def test_xfetch_refreshes_once_when_due_and_never_with_beta_zero(
    client: redmutex.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    fills: list[int] = []

    async def fill() -> int:
        fills.append(1)
        await asyncio.sleep(0.05)
        return len(fills)

    async def main() -> None:
        assert await aio.get_or_fill(client, "hot", fill, ttl=30) == 1
        # A draw of ~0 makes -δ·β·ln(draw) huge: the refresh is due for every reader. Of several
        # concurrent readers exactly one refills, the others return the value they read.
        monkeypatch.setattr(_cache, "_random", lambda: 1e-300)
        got = await asyncio.gather(
            *(aio.get_or_fill(client, "hot", fill, ttl=30) for _ in range(5))
        )
        assert sorted(got) == [1, 1, 1, 1, 2]
        assert await aio.get_or_fill(client, "cold", fill, ttl=30, beta=0) == 3
        assert await aio.get_or_fill(client, "cold", fill, ttl=30, beta=0) == 3

    run(main())
    assert len(fills) == 3


def test_xfetch_refresh_whose_fill_raises_serves_the_current_value(
    client: redmutex.Client,
    r: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The early refresher is a reader of a valid value: a failed refresh is logged and gives
    the claim back, the reader gets the value it read, and a later refresh tries again."""
    calls: list[int] = []

    async def slow() -> str:
        await asyncio.sleep(0.05)  # a δ that makes the draw below refresh
        return "old"

    async def failing() -> str:
        calls.append(1)
        raise ConnectionRefusedError("backend down")

    async def main() -> None:
        assert await aio.get_or_fill(client, "early", slow, ttl=30) == "old"
        payload = r.get(value_key(prefix, "early"))
        monkeypatch.setattr(_cache, "_random", lambda: 1e-300)  # every reader is due
        with caplog.at_level(logging.WARNING, logger="redmutex"):
            for _ in range(3):
                assert await aio.get_or_fill(client, "early", failing, ttl=30) == "old"
                assert not r.exists(fill_key(prefix, "early"))  # given back at once
        assert r.get(value_key(prefix, "early")) == payload  # untouched, still valid
        assert await aio.get_or_fill(client, "early", lambda: "new", ttl=30) == "new"

    run(main())
    assert len(calls) == 3
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all(
        rec.exc_info and isinstance(rec.exc_info[1], ConnectionRefusedError) for rec in warnings
    )


def test_xfetch_refresh_that_redis_refuses_to_claim_serves_the_current_value(
    make_server: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis full (maxmemory, noeviction): the refresh's claim is refused; the reader picked to
    refresh gets the valid value it read (see the test of the same name in test_cache.py)."""
    server = make_server()
    admin = redis.Redis.from_url(server.url)
    calls: list[int] = []

    async def slow() -> str:
        await asyncio.sleep(0.05)  # a δ that makes the draw below refresh
        return "old"

    async def fill() -> str:
        calls.append(1)
        return "new"

    async def main(client: redmutex.Client) -> None:
        assert await aio.get_or_fill(client, "full", slow, ttl=30) == "old"
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", max(int(admin.info("memory")["used_memory"]) - 100_000, 1))
        monkeypatch.setattr(_cache, "_random", lambda: 1e-300)  # every reader is due
        with caplog.at_level(logging.WARNING, logger="redmutex"):
            assert await aio.get_or_fill(client, "full", fill, ttl=30) == "old"
        with pytest.raises(redmutex.LockError, match="OOM"):
            await aio.get_or_fill(client, "cold", fill, ttl=30)
        admin.config_set("maxmemory", 0)
        assert await aio.get_or_fill(client, "full", fill, ttl=30) == "new"

    with redmutex.Client(server.url) as client:
        run(main(client))
    assert calls == [1]
    assert "early refresh" in caplog.text and "OOM" in caplog.text


def test_xfetch_refresh_cancelled_propagates_and_gives_the_claim_back(
    client: redmutex.Client, r: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancellation is no fill failure: the refresher's task ends cancelled, the claim is
    given back (in the background) and the value stays."""

    async def hanging() -> str:
        await asyncio.sleep(60)
        return "never"

    async def slow() -> str:
        await asyncio.sleep(0.05)  # a δ that makes the draw below refresh
        return "old"

    async def main() -> None:
        assert await aio.get_or_fill(client, "early", slow, ttl=30) == "old"
        monkeypatch.setattr(_cache, "_random", lambda: 1e-300)  # every reader is due
        refresher = asyncio.ensure_future(aio.get_or_fill(client, "early", hanging, ttl=30))
        deadline = time.monotonic() + 5
        while not r.exists(fill_key(prefix, "early")):
            assert time.monotonic() < deadline, "the refresh never claimed the fill"
            await asyncio.sleep(0.01)
        refresher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await refresher
        while r.exists(fill_key(prefix, "early")):
            assert time.monotonic() < deadline, "the claim was not given back"
            await asyncio.sleep(0.01)
        assert await aio.get_or_fill(client, "early", lambda: "new", ttl=30) == "new"

    run(main())
