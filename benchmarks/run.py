"""redmutex benchmark: scenarios x peers against one Redis, framed by the physical limit.

    .venv/bin/python benchmarks/run.py [--quick] [--redis URL] [--peers a,b] [--scenarios x,y]
    .venv/bin/python benchmarks/run.py --soak [--soak-cycles N] [--redis URL]

Starts one private redis-server (or uses --redis URL), measures the single-connection round-trip
limit with redis-benchmark at the start and at the end, runs every registered scenario for every
peer that has the capability it needs (multi-process ones on a pool of worker processes), prints
Markdown tables and writes benchmarks/results/latest.json, latest.md and the charts (PNG).
`--soak` runs only the soak instead (soak.py): it writes soak.json and soak.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import interleaved
import machine
import physical
import report
import soak
from peers import PEERS, Peer, Session
from pool import WorkerPool
from redis_target import Target
from scenarios import DEFAULT, QUICK, SCENARIOS, TTL, Context, Scenario, Sizes
from timing import Measurement, latency_summary

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _names(value: str, known: dict[str, Any], what: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})"
        )
    return names


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run, well under 2 minutes")
    parser.add_argument("--redis", metavar="URL", help="use this server instead of a private one")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peer names")
    parser.add_argument(
        "--scenarios",
        help="comma-separated scenario keys (default: all; with --quick, the quick selection)",
    )
    parser.add_argument("--rounds", type=_positive, help="override the number of rounds")
    parser.add_argument("--pairs", type=_positive, help="override timed pairs (single thread)")
    parser.add_argument("--thread-pairs", type=_positive, help="override timed pairs per thread")
    parser.add_argument(
        "--time-limit", type=_positive, help="abort after this many seconds (default 170/600)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_DIR, help="results directory")
    parser.add_argument("--no-charts", action="store_true", help="do not draw the PNG charts")
    parser.add_argument(
        "--soak",
        action="store_true",
        help=f"run only the soak: {soak.CYCLES:,} acquire/release cycles, RSS and leftover keys",
    )
    parser.add_argument(
        "--soak-cycles", type=_positive, help=f"cycles of the soak (default {soak.CYCLES:,})"
    )
    parser.add_argument(
        "--soak-threads",
        type=_positive,
        default=soak.THREADS,
        help=f"threads of the soak (default {soak.THREADS})",
    )
    args = parser.parse_args(argv)
    if args.soak_cycles is not None and not args.soak:
        args.soak = True
    if args.scenarios is None:
        args.scenarios = ",".join(k for k, s in SCENARIOS.items() if s.quick or not args.quick)
    try:
        args.peers = _names(args.peers, PEERS, "peer")
        args.scenarios = _names(args.scenarios, SCENARIOS, "scenario")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    sizes = QUICK if args.quick else DEFAULT
    overrides = {
        "rounds": args.rounds,
        "pairs": args.pairs,
        "thread_pairs": args.thread_pairs,
    }
    return replace(sizes, **{k: v for k, v in overrides.items() if v is not None})


def _start_watchdog(
    seconds: int, target: Target, pools: list[WorkerPool] | None = None
) -> threading.Timer:
    def expire() -> None:
        log(f"benchmark: aborted after the time limit of {seconds} s")
        for pool in pools or []:
            pool.kill()  # only this run's worker processes, each by its own handle
        target.close()  # stops only the redis-server this run started
        os._exit(124)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def _measure_physical(target: Target, sizes: Sizes, when: str, namespace: str) -> dict[str, Any]:
    log(f"physical limit ({when}): redis-benchmark -c 1 -n {sizes.benchmark_requests} ...")
    limit = physical.measure(target, sizes.benchmark_requests, when, f"{namespace}:phys")
    raw = limit.raw_pair_limit
    log(
        f"  SET NX PX {limit.set_rps:,.0f} req/s, EVALSHA {limit.evalsha_rps:,.0f} req/s"
        f" -> pair limit {limit.pair_limit:,.0f} pairs/s"
        + ("" if raw is None else f" (blocking socket: {raw:,.0f} pairs/s)")
    )
    return limit.as_dict()


def _open_peers(names: list[str], url: str) -> tuple[dict[str, Session], dict[str, Any]]:
    sessions: dict[str, Session] = {}
    described: dict[str, Any] = {}
    for name in names:
        peer: Peer = PEERS[name]
        reason = peer.probe()
        if reason is None:
            try:
                sessions[name] = peer.open(url)
            except Exception as exc:  # noqa: BLE001 - reported as the peer's failure
                reason = f"could not open a session: {_one_line(exc)}"
        info: dict[str, Any] = {}
        try:
            info = peer.info()
        except Exception as exc:  # noqa: BLE001 - version info is best effort
            info = {"info_error": _one_line(exc)}
        described[name] = {
            "label": peer.label,
            "available": reason is None,
            "reason": reason,
            "required": peer.required,
            "info": info,
        }
    return sessions, described


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _aggregate_extra(measured: list[Measurement]) -> dict[str, Any]:
    """One value per extra metric over the rounds (None where no round had one): `*_max` the
    max, `*_min` the min, other numbers the median, flags any(), anything else the last's."""
    keys = list(dict.fromkeys(k for m in measured for k in m.extra))
    out: dict[str, Any] = {}
    for key in keys:
        values = [m.extra[key] for m in measured if m.extra.get(key) is not None]
        if not values:
            out[key] = None
        elif all(_is_number(v) for v in values):
            if key.endswith("_max"):
                out[key] = max(values)
            elif key.endswith("_min"):
                out[key] = min(values)
            else:
                out[key] = statistics.median(values)
        elif all(isinstance(v, bool) for v in values):
            out[key] = any(values)
        else:
            out[key] = values[-1]
    return out


def _progress(scenario: Scenario, name: str, round_no: int, m: Measurement) -> str:
    head = f"  {scenario.key} / {name} round {round_no + 1}:"
    lat = latency_summary(m.latencies_ns) or {}
    if scenario.kind == "commands":
        return (
            f"{head} {m.extra['commands_per_handoff']:.2f} commands per hand-off"
            f" ({m.extra['handoffs']} hand-offs)"
        )
    if scenario.kind == "contended":
        switches, longest = m.extra["owner_switch_pct"], m.extra["longest_wait_ms_max"]
        return (
            f"{head} {m.per_second:,.0f} {scenario.unit}s/s,"
            f" owner switches {'—' if switches is None else f'{switches:.1f}'} %,"
            f" longest wait {'—' if longest is None else f'{longest:.1f}'} ms"
        )
    return (
        f"{head} {m.per_second:,.0f} {scenario.unit}s/s,"
        f" p50 {lat.get('p50', 0):.1f} µs, p99 {lat.get('p99', 0):.1f} µs"
    )


def _run_scenario(
    scenario: Scenario,
    sessions: dict[str, Session],
    peer_order: list[str],
    sizes: Sizes,
    namespace: str,
    pool: WorkerPool | None = None,
    commandstats: Any = None,
    server_cpu: Any = None,
) -> list[dict[str, Any]]:
    eligible = [
        p
        for p in peer_order
        if scenario.needs in PEERS[p].capabilities
        or (scenario.reference and scenario.reference in PEERS[p].capabilities)
    ]
    runs: dict[str, list[Measurement]] = {p: [] for p in eligible}
    failures: dict[str, str] = {}
    rounds: int = getattr(sizes, scenario.rounds)
    for round_no in range(rounds):
        order = eligible if round_no % 2 == 0 else eligible[::-1]
        for name in order:
            if name not in sessions or name in failures:
                continue
            ctx = Context(
                namespace=namespace,
                sizes=sizes,
                peer=name,
                pool=pool,
                commandstats=commandstats,
                server_cpu=server_cpu,
            )
            try:
                measurement = scenario.run(sessions[name], ctx)
            except Exception as exc:  # noqa: BLE001 - one peer's failure must not end the run
                failures[name] = _one_line(exc)
                log(f"  {scenario.key} / {name}: FAILED {failures[name]}")
                continue
            runs[name].append(measurement)
            log(_progress(scenario, name, round_no, measurement))
    rows = []
    for name in eligible:
        row: dict[str, Any] = {
            "scenario": scenario.key,
            "title": scenario.title,
            "kind": scenario.kind,
            "unit": scenario.unit,
            "single_connection": scenario.single_connection,
            "processes": scenario.processes,
            "axis": scenario.axis,
            "point": scenario.point,
            "capacity": scenario.capacity,
            "peer": name,
        }
        if name not in sessions:
            row.update(status="unavailable", error="see peers")
        elif name in failures:
            row.update(status="error", error=failures[name])
        else:
            measured = runs[name]
            pooled = [v for m in measured for v in m.latencies_ns]
            row.update(
                status="ok",
                error=None,
                per_second=round(statistics.median(m.per_second for m in measured), 1),
                latency_us=latency_summary(pooled),
                **_aggregate_extra(measured),
                rounds=[m.summary() for m in measured],
            )
        rows.append(row)
    return rows


# The peers the uncontended scenario is also measured for in turns with the limit (interleaved.py).
INTERLEAVED_PEERS = (report.SUBJECT, report.FAIR_PEER, report.BASELINE)


def _interleaved_rwlock_sides(sessions: dict[str, Session], namespace: str) -> dict[str, Any]:
    """redmutex's RWLock read and write sides, for windows taken in turn with its Lock's (issue
    18: RWLock pairs/s ≥ 0.9× Lock's, compared cycle by cycle so a phase change cannot tip it)."""
    subject = sessions.get(report.SUBJECT)
    if subject is None or not hasattr(subject, "rwlock_read"):
        return {}
    return {
        report.RW_READ_INTERLEAVED: subject.rwlock_read(f"{namespace}:rw:interleaved", TTL),
        report.RW_WRITE_INTERLEAVED: subject.rwlock_write(f"{namespace}:rw:interleaved", TTL),
    }


def _measure_interleaved(
    target: Target,
    sessions: dict[str, Session],
    sizes: Sizes,
    namespace: str,
    server_cpu: Any = None,
) -> dict[str, Any] | None:
    names = [p for p in INTERLEAVED_PEERS if p in sessions]
    if not names:
        return None
    log(
        f"uncontended vs the blocking-socket limit, interleaved: {sizes.interleave_cycles}"
        f" cycles of {sizes.interleave_window_s:g} s windows ({', '.join(names)})"
    )
    try:
        locks = {p: sessions[p].lock(f"{namespace}:{p}:interleaved", TTL) for p in names}
        locks.update(_interleaved_rwlock_sides(sessions, namespace))
        return interleaved.measure(
            target,
            locks,
            f"{namespace}:phys-interleaved",
            sizes.interleave_cycles,
            sizes.interleave_window_s,
            log,
            server_cpu,
            replayed=report.SUBJECT,
            relative_to=report.SUBJECT,
        )
    except Exception as exc:  # noqa: BLE001 - reported, the rest of the run goes on
        log(f"  interleaved: FAILED {_one_line(exc)}")
        return {"error": _one_line(exc)}


def _cleanup(target: Target, namespace: str) -> int:
    """Deletes every key this run created on a server that is not ours."""
    client = target.redis()
    try:
        keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        return len(keys)
    finally:
        client.close()


def _commandstats(client: Any) -> Any:
    """A reader of INFO commandstats: calls per command (scripts' inner calls included)."""

    def read() -> dict[str, int]:
        stats = client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in stats.items()
            if name != "cmdstat_info"  # the reader's own
        }

    return read


def _server_cpu(client: Any) -> Any:
    """A reader of the server's CPU time so far in µs (INFO cpu: used_cpu_user + used_cpu_sys,
    the main thread and every other)."""

    def read() -> float:
        cpu = client.info("cpu")
        return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6

    return read


def _draw_charts(record: dict[str, Any], directory: Path) -> None:
    try:
        import charts
    except ImportError as exc:
        record["charts"] = {"error": f"matplotlib is not installed ({exc})"}
        log(f"charts: skipped: {record['charts']['error']}")
        return
    try:
        paths = charts.draw(record, directory)
    except Exception as exc:  # noqa: BLE001 - a chart must not cost the numbers
        record["charts"] = {"error": _one_line(exc)}
        log(f"charts: failed: {record['charts']['error']}")
        return
    record["charts"] = {"files": [p.name for p in paths]}
    log(f"charts: {', '.join(str(p) for p in paths)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.soak:
        return soak.main(args, log)
    sizes = _sizes(args)
    time_limit = args.time_limit or (170 if args.quick else 720)
    namespace = f"redmutex-bench:{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    record: dict[str, Any] = {
        "schema": 2,
        "date": machine.now_utc(),
        "config": {
            "quick": args.quick,
            "redis": "private redis-server on 127.0.0.1" if args.redis is None else "--redis URL",
            **{k: v for k, v in vars(sizes).items()},
            "ttl": TTL,
            "peers": args.peers,
            "scenarios": args.scenarios,
            "time_limit_s": time_limit,
        },
        "physical_limit": {"formula": physical.FORMULA},
        "results": [],
        "errors": [],
    }
    errors: list[str] = record["errors"]
    sessions: dict[str, Session] = {}
    pools: list[WorkerPool] = []
    stats_client: Any = None
    try:
        with Target(args.redis) as target:
            watchdog = _start_watchdog(time_limit, target, pools)
            log(f"redis: {target.display_url} ({'private' if target.private else 'given'})")
            probe = target.redis()
            try:
                probe.ping()
                record["machine"] = machine.collect(probe)
            finally:
                probe.close()
            phys = record["physical_limit"]
            phys["start"] = _measure_physical(target, sizes, "start", namespace)

            sessions, record["peers"] = _open_peers(args.peers, target.url)
            for name, peer in record["peers"].items():
                facts = ", ".join(f"{k} {v}" for k, v in peer["info"].items())
                log(f"peer {name}: {facts}")
                if not peer["available"]:
                    log(f"peer {name}: unavailable: {peer['reason']}")
                    if peer["required"]:
                        errors.append(f"required peer {name} unavailable: {peer['reason']}")
            workers = max((SCENARIOS[k].processes for k in args.scenarios), default=0)
            if workers:
                pools.append(WorkerPool(target.url, workers, log))
            stats_client = target.redis()
            for key in args.scenarios:
                log(f"scenario {key}:")
                scenario_started = time.monotonic()
                record["results"] += _run_scenario(
                    SCENARIOS[key],
                    sessions,
                    args.peers,
                    sizes,
                    namespace,
                    pools[0] if pools else None,
                    _commandstats(stats_client),
                    _server_cpu(stats_client),
                )
                if key == "uncontended":
                    measured = _measure_interleaved(
                        target, sessions, sizes, namespace, _server_cpu(stats_client)
                    )
                    if measured is not None:
                        phys["interleaved"] = measured
                log(f"  ({key}: {time.monotonic() - scenario_started:.1f} s)")
            for pool in pools:
                pool.close()
            for session in sessions.values():
                session.close()
            sessions = {}

            phys["end"] = _measure_physical(target, sizes, "end", namespace)
            start_limit, end_limit = phys["start"]["pair_limit"], phys["end"]["pair_limit"]
            phys["mean_pair_limit"] = round((start_limit + end_limit) / 2, 1)
            phys["drift_pct"] = round(abs(end_limit - start_limit) / start_limit * 100, 1)
            raw_limits = [phys[w]["raw_pair_limit"] for w in ("start", "end")]
            if all(raw_limits):
                phys["mean_raw_pair_limit"] = round(sum(raw_limits) / 2, 1)
            if not target.private:
                record["keys_cleaned_up"] = _cleanup(target, namespace)
            watchdog.cancel()
    except KeyboardInterrupt:
        log("benchmark: interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - one line on stderr, no traceback
        log(f"benchmark: error: {_one_line(exc)}")
        return 2
    finally:
        for pool in pools:
            pool.kill()  # a no-op after close(); on an error path it reaps the workers
        if stats_client is not None:
            stats_client.close()
        for session in sessions.values():
            session.close()

    record["machine"]["loadavg_end"] = machine.loadavg()
    record["duration_s"] = round(time.monotonic() - started, 1)
    errors += [
        f"{r['scenario']} / {r['peer']}: {r['error']}"
        for r in record["results"]
        if r["status"] == "error"
    ]
    interleaved_error = record["physical_limit"].get("interleaved", {}).get("error")
    if interleaved_error:
        errors.append(f"interleaved uncontended vs limit: {interleaved_error}")
    report.add_ratios(record)
    if not args.no_charts:
        _draw_charts(record, args.output)
    text = report.markdown(record)
    print(text)
    json_path, md_path = report.write(record, text, args.output)
    log(f"wrote {json_path} and {md_path} in {record['duration_s']:.0f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
