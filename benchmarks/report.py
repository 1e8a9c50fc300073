"""Turns a finished run into the Markdown tables and the JSON record."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from physical import FORMULA

SUBJECT = "redmutex"  # the library being measured (its variants are named "redmutex-...")
BASELINE = "redis-py"  # what it is compared against in the ratio columns
FAIR_PEER = "redmutex-fair"
PRL = "python-redis-lock"
NOISY_DRIFT_PCT = 15  # start/end physical limits further apart than this: flag the run

# issue 3's "done when"
HANDOFF_P50_US = 250.0
HANDOFF_P99_US = 1000.0
FAIR_SWITCH_PCT = 95.0
FAIR_VS_PRL = 1.3
COMMANDS_SPREAD = 1.25  # "independent of waiting threads": largest/smallest over the axis

# issue 18's "done when"
REDIS_PY_1MS = "redis-py-1ms"
CPU_UNFAIR_VS_REDIS_PY = 1.5  # server CPU per section, redmutex ≤ 1.5× redis-py's (1 ms polling)
RW_VS_LOCK = 0.9  # RWLock read and write pairs/s ≥ 0.9× Lock's
# redmutex's RWLock sides in the interleaved windows (compared with its Lock's, cycle by cycle)
RW_READ_INTERLEAVED = "redmutex RWLock read"
RW_WRITE_INTERLEAVED = "redmutex RWLock write"
RAW_HANDOFF = "raw-pubsub"  # the hand-off floor: SET NX / DEL + PUBLISH, waiter subscribed
HANDOFF_VS_RAW = 1.2  # unfair hand-off p50 ≤ 1.2× the raw reference's (and ≤ HANDOFF_P50_US
# when the raw one is within it), p99 ≤ HANDOFF_P99_US
UNCONTENDED_VS_LIMIT = 0.85  # uncontended pairs/s ≥ 0.85× the blocking-socket limit (interleaved)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, reference: float | None) -> float | None:
    if not value or not reference:
        return None
    return round(value / reference, 3)


def _paired_cpu_ratios(row: dict[str, Any] | None, reference: dict[str, Any] | None) -> list[float]:
    """Server CPU per section of `row` over `reference`'s, round by round: both peers run in every
    round, one right after the other (the order reverses each round), so a ratio within a round
    is not moved by the machine's speed changing between rounds, as a ratio of medians is."""
    mine = [r.get("server_cpu_us_per_section") for r in (row or {}).get("rounds") or []]
    theirs = [r.get("server_cpu_us_per_section") for r in (reference or {}).get("rounds") or []]
    return [a / b for a, b in zip(mine, theirs) if a is not None and b]


def _is_subject(peer: str) -> bool:
    return peer == SUBJECT or peer.startswith(SUBJECT + "-")


def _ok(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("kind", "pairs") == kind]


def _p(row: dict[str, Any] | None, key: str) -> float | None:
    return ((row or {}).get("latency_us") or {}).get(key)


def add_ratios(record: dict[str, Any]) -> None:
    """Adds `vs_baseline` and `vs_physical_limit` to each result, a `ratios` summary for the
    redmutex peers, and the issue-3 `targets`.

    `vs_baseline` is throughput / redis-py's throughput, except for hand-off latency, where it
    is redis-py's p50 / this p50 (both: above 1 is better than redis-py).
    """
    limit = record["physical_limit"].get("mean_pair_limit")
    raw_limit = record["physical_limit"].get("mean_raw_pair_limit")
    by_key = {(r["scenario"], r["peer"]): r for r in record["results"]}
    ratios: dict[str, Any] = {}
    for row in record["results"]:
        kind = row.get("kind", "pairs")
        baseline = by_key.get((row["scenario"], BASELINE))
        if kind == "handoff":
            row["vs_baseline"] = _ratio(_p(baseline, "p50"), _p(row, "p50"))
        elif kind == "commands":
            row["vs_baseline"] = None
        else:
            row["vs_baseline"] = _ratio(row.get("per_second"), (baseline or {}).get("per_second"))
        single = row.get("single_connection")
        row["vs_physical_limit"] = _ratio(row.get("per_second"), limit) if single else None
        row["vs_raw_limit"] = _ratio(row.get("per_second"), raw_limit) if single else None
        if _is_subject(row["peer"]) and row.get("status") == "ok" and kind != "commands":
            entry = {f"{row['peer']}/{BASELINE}": row["vs_baseline"]}
            if row["vs_physical_limit"] is not None:
                entry[f"{row['peer']}/physical_limit"] = row["vs_physical_limit"]
            if row["vs_raw_limit"] is not None:
                entry[f"{row['peer']}/blocking_socket_limit"] = row["vs_raw_limit"]
            ratios.setdefault(row["scenario"], {}).update(entry)
    for peer, measured in _interleaved_peers(record).items():
        if _is_subject(peer) and measured.get("ratio_median") is not None:
            ratios.setdefault("uncontended", {}).update(
                {
                    f"{peer}/blocking_socket_limit_interleaved": measured["ratio_median"],
                    f"{peer}/blocking_socket_limit_interleaved_min": measured["ratio_min"],
                }
            )
    record["ratios"] = ratios
    record["targets"] = _targets(record, by_key)


def _interleaved_peers(record: dict[str, Any]) -> dict[str, Any]:
    """Per peer, the uncontended windows taken in turns with the limit (interleaved.py)."""
    return (record["physical_limit"].get("interleaved") or {}).get("peers") or {}


def _targets(
    record: dict[str, Any], by_key: dict[tuple[str, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(target: str, where: str, measured: str, met: bool | None) -> None:
        out.append({"target": target, "where": where, "measured": measured, "met": met})

    for peer, measured in _interleaved_peers(record).items():
        median, low = measured.get("ratio_median"), measured.get("ratio_min")
        if not _is_subject(peer) or median is None:
            continue
        add(
            f"uncontended ≥ {UNCONTENDED_VS_LIMIT:g}× the blocking-socket limit"
            " (windows interleaved with it, median)",
            f"{peer}, 1 thread, 1 name",
            f"median {median:.2f}×, min {_num(low, 2)}×"
            f" ({len(measured.get('ratios') or [])} windows)",
            median >= UNCONTENDED_VS_LIMIT,
        )

    for scenario in ("handoff2", "handoff4"):
        for peer in (SUBJECT, FAIR_PEER):
            row = by_key.get((scenario, peer))
            if row is None:
                continue
            p50, p99 = _p(row, "p50"), _p(row, "p99")
            met = (
                None
                if p50 is None or p99 is None
                else p50 <= HANDOFF_P50_US and p99 <= HANDOFF_P99_US
            )
            add(
                f"hand-off p50 ≤ {HANDOFF_P50_US / 1000:g} ms and p99 ≤ {HANDOFF_P99_US / 1000:g} ms",
                f"{peer}, {row['title']}",
                f"p50 {_num(p50, 1)} µs, p99 {_num(p99, 1)} µs",
                met,
            )
    for scenario in ("handoff2", "handoff4"):
        row, raw = by_key.get((scenario, SUBJECT)), by_key.get((scenario, RAW_HANDOFF))
        p50, p99, raw_p50 = _p(row, "p50"), _p(row, "p99"), _p(raw, "p50")
        if row is None or p50 is None or p99 is None or raw_p50 is None:
            continue
        floor = HANDOFF_VS_RAW * raw_p50
        if raw_p50 <= HANDOFF_P50_US:
            floor = min(floor, HANDOFF_P50_US)
        add(
            f"unfair hand-off p50 ≤ {HANDOFF_VS_RAW:g}× {RAW_HANDOFF}'s"
            f" (and ≤ {HANDOFF_P50_US / 1000:g} ms when it allows), p99 ≤ {HANDOFF_P99_US / 1000:g} ms",
            f"{SUBJECT}, {row['title']}",
            f"p50 {_num(p50, 1)} vs {_num(raw_p50, 1)} µs = {_num(p50 / raw_p50, 2)}×,"
            f" p99 {_num(p99, 1)} µs",
            p50 <= floor and p99 <= HANDOFF_P99_US,
        )
    for scenario in ("contended4", "contended8"):
        row = by_key.get((scenario, FAIR_PEER))
        if row is None:
            continue
        switches = row.get("owner_switch_pct")
        add(
            f"fair mode ≥ {FAIR_SWITCH_PCT:g} % owner switches",
            f"{FAIR_PEER}, {row['title']}",
            f"{_num(switches, 1)} %",
            None if switches is None else switches >= FAIR_SWITCH_PCT,
        )
        prl = by_key.get((scenario, PRL))
        ratio = _ratio(row.get("per_second"), (prl or {}).get("per_second"))
        add(
            f"fair-mode throughput ≥ {FAIR_VS_PRL:g}× python-redis-lock's",
            f"{FAIR_PEER}, {row['title']}",
            (
                f"{_num(row.get('per_second'))} vs {_num((prl or {}).get('per_second'))}"
                f" sections/s = {_num(ratio, 2)}×"
            ),
            None if ratio is None else ratio >= FAIR_VS_PRL,
        )
    for scenario in ("handoff2", "handoff4", "contended4", "contended8"):
        rows = {
            peer: by_key.get((scenario, peer))
            for peer in (SUBJECT, FAIR_PEER, PRL, BASELINE, REDIS_PY_1MS)
        }
        cpu = {peer: (row or {}).get("server_cpu_us_per_section") for peer, row in rows.items()}
        title = (rows[SUBJECT] or {}).get("title", scenario)
        reference = REDIS_PY_1MS if cpu[REDIS_PY_1MS] is not None else BASELINE
        for target, peer, against, bound in (
            ("server CPU per section, fair ≤ python-redis-lock's", FAIR_PEER, PRL, 1.0),
            (
                f"server CPU per section, unfair ≤ {CPU_UNFAIR_VS_REDIS_PY:g}× {reference}'s",
                SUBJECT,
                reference,
                CPU_UNFAIR_VS_REDIS_PY,
            ),
        ):
            mine, theirs = cpu[peer], cpu[against]
            if mine is None or not theirs:
                continue
            # The verdict is the median of the rounds' paired ratios where there are rounds to
            # pair; the medians of the rounds' µs are shown beside it.
            ratios = _paired_cpu_ratios(rows[peer], rows[against])
            ratio = statistics.median(ratios) if ratios else mine / theirs
            spread = (
                f" (median of {len(ratios)} rounds, {min(ratios):.2f}–{max(ratios):.2f})"
                if len(ratios) > 1
                else ""
            )
            add(
                target,
                f"{peer}, {title}",
                f"{mine:.1f} vs {theirs:.1f} µs; {ratio:.2f}×{spread}",
                ratio <= bound,
            )
    interleaved_peers = _interleaved_peers(record)
    for side in (RW_READ_INTERLEAVED, RW_WRITE_INTERLEAVED):
        measured = interleaved_peers.get(side) or {}
        median, low = measured.get("vs_relative_median"), measured.get("vs_relative_min")
        if median is not None:
            add(
                f"RWLock pairs/s ≥ {RW_VS_LOCK:g}× Lock's (uncontended, windows interleaved"
                " with Lock's, median)",
                side,
                f"median {median:.2f}×, min {_num(low, 2)}×",
                median >= RW_VS_LOCK,
            )
    lock_rate = (by_key.get(("uncontended", SUBJECT)) or {}).get("per_second")
    for scenario in ("rwlock-read", "rwlock-write"):
        row = by_key.get((scenario, SUBJECT)) or {}
        rate = row.get("per_second")
        # Judged by the rounds' own Lock runs (just before and after each, seconds apart); the
        # uncontended scenario's Lock, minutes earlier, is shown beside it for reference.
        ratios = [r["vs_lock"] for r in row.get("rounds") or [] if r.get("vs_lock")]
        earlier = _ratio(rate, lock_rate)
        if ratios:
            ratio = statistics.median(ratios)
            add(
                f"RWLock pairs/s ≥ {RW_VS_LOCK:g}× Lock's (uncontended, separate scenarios,"
                " Lock run before and after each round)",
                f"{SUBJECT}, {scenario}",
                f"{_num(rate)} vs {_num(row.get('lock_per_second'))} pairs/s;"
                f" {ratio:.2f}× (median of {len(ratios)} rounds,"
                f" {min(ratios):.2f}–{max(ratios):.2f}); vs the uncontended scenario's"
                f" {_num(lock_rate)}: {_num(earlier, 2)}×",
                ratio >= RW_VS_LOCK,
            )
        elif earlier is not None:
            add(
                f"RWLock pairs/s ≥ {RW_VS_LOCK:g}× Lock's (uncontended, separate scenarios)",
                f"{SUBJECT}, {scenario}",
                f"{_num(rate)} vs {_num(lock_rate)} pairs/s = {earlier:.2f}×",
                earlier >= RW_VS_LOCK,
            )
    for peer in (SUBJECT, FAIR_PEER):
        points = sorted(
            (r["point"], r["commands_per_handoff"])
            for r in record["results"]
            if r.get("kind") == "commands"
            and r.get("axis") == "threads"
            and r["peer"] == peer
            and r.get("status") == "ok"
        )
        if len(points) < 2:
            continue
        values = [v for _, v in points]
        spread = max(values) / min(values) if min(values) > 0 else math.inf
        add(
            "commands per hand-off independent of waiting threads"
            f" (largest/smallest ≤ {COMMANDS_SPREAD:g})",
            f"{peer}, 1 process, {points[0][0]}→{points[-1][0]} waiting threads",
            ", ".join(f"{w}: {v:.2f}" for w, v in points) + f" (spread {spread:.2f})",
            spread <= COMMANDS_SPREAD,
        )
    return out


def _header(record: dict[str, Any]) -> list[str]:
    m, cfg = record["machine"], record["config"]
    lines = [
        "# redmutex benchmark",
        "",
        (
            f"- date: {record['date']}; run took {record['duration_s']:.0f} s"
            f" ({'--quick' if cfg['quick'] else 'default'} run)"
        ),
        (
            f"- machine: nproc {m['nproc']}, {m['cpu_model'] or 'cpu model unknown'},"
            f" {m['platform']}; load average {m['loadavg_start']} at start,"
            f" {m['loadavg_end']} at end"
        ),
        (
            f"- Python {m['python']}; redis-server {m['redis_server']} ({cfg['redis']});"
            f" redis-benchmark {m['redis_benchmark']}"
        ),
    ]
    for name, peer in record["peers"].items():
        info = peer.get("info") or {}
        extras = ", ".join(f"{k} {v}" for k, v in info.items() if k != "version")
        status = "" if peer["available"] else f" — **skipped, unavailable**: {peer['reason']}"
        version = info.get("version") or "?"
        lines.append(
            f"- {name} {version}{' (' + extras + ')' if extras else ''}: {peer['label']}{status}"
        )
    lines += [
        (
            f"- in-process scenarios: {cfg['rounds']} round(s) per scenario and peer, peers"
            f" interleaved; {cfg['warmup']} warm-up pairs, then up to {cfg['pairs']:,} pairs"
            f" (per thread: {cfg['thread_pairs']:,}) or {cfg['max_seconds']:g} s; ops/s is the"
            " median round, latencies are per acquire+release pair, pooled over rounds; GC"
            f" paused while timing; every lock has ttl={cfg['ttl']:g} s"
        ),
        (
            f"- multi-process scenarios: {cfg['process_rounds']} round(s) of"
            f" {cfg['process_seconds']:g} s per scenario and peer (hand-off and contended:"
            f" {cfg.get('cpu_rounds', cfg['process_rounds'])} rounds, peers interleaved, the"
            " order reversed each round, so that the server CPU per section is compared round"
            " by round; commands per hand-off: one"
            f" {cfg['command_seconds']:g} s window) on a pool of spawned worker processes,"
            f" each warmed up {cfg['warmup_seconds']:g} s on the name first; times are"
            " `time.perf_counter_ns()` (CLOCK_MONOTONIC, shared by the processes)"
        ),
    ]
    return lines


def _physical(record: dict[str, Any]) -> list[str]:
    phys = record["physical_limit"]
    lines = [
        "",
        f"## Physical limit (`redis-benchmark -c 1 -n {record['config']['benchmark_requests']} -q`)",
        "",
        (
            "| when | SET NX PX req/s | EVALSHA (SET NX PX) req/s | pair limit pairs/s"
            " | blocking socket: SET req/s | EVALSHA req/s | pair limit pairs/s |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for when in ("start", "end"):
        p = phys.get(when)
        if p:
            lines.append(
                f"| {when} | {_num(p['set_rps'])} | {_num(p['evalsha_rps'])}"
                f" | {_num(p['pair_limit'])} | {_num(p.get('raw_set_rps'))}"
                f" | {_num(p.get('raw_evalsha_rps'))} | {_num(p.get('raw_pair_limit'))} |"
            )
    drift = phys.get("drift_pct")
    drift_note = f" (start and end differ by {drift:.0f}%)." if drift is not None else "."
    lines += [
        "",
        (
            f"`{FORMULA}` pairs/s: an acquire+release pair needs at least these two round"
            " trips on one connection. Ratios use the mean of start and end:"
            f" {_num(phys.get('mean_pair_limit'))} pairs/s{drift_note}"
            " The same two commands sent one at a time over a blocking socket from Python"
            " (write, then block in read) give the second reference,"
            f" {_num(phys.get('mean_raw_pair_limit'))} pairs/s: redis-benchmark's event-loop"
            " client costs more per request where system calls are dear (VMs), so a client"
            " library can beat its figure; the blocking-socket one is the tighter limit."
        ),
    ]
    lines += _interleaved(record)
    if drift is not None and drift > NOISY_DRIFT_PCT:
        lines += [
            "",
            (
                f"**Noisy machine**: the physical limit moved by more than {NOISY_DRIFT_PCT}%"
                " during the run (see the load average); compare ratios, not absolute numbers."
            ),
        ]
    return lines


def _interleaved(record: dict[str, Any]) -> list[str]:
    measured = record["physical_limit"].get("interleaved")
    if not measured:
        return []
    if measured.get("error"):
        return [
            "",
            f"Uncontended vs the blocking-socket limit, interleaved: failed ({measured['error']}).",
        ]
    limits = measured["limit_per_second"]
    relative = measured.get("relative_to")
    lines = [
        "",
        "### Uncontended vs the blocking-socket limit, in interleaved windows",
        "",
        (
            f"{measured['cycles']} cycles of {measured['window_s']:g} s windows: "
            + measured["method"]
            + ". A change of the machine's speed between the start and the end of the run cannot"
            " fake or hide a gap here. The limit's windows: median"
            f" {_num(measured['limit_per_second_median'])} pairs/s (from {_num(min(limits))} to"
            f" {_num(max(limits))}). CPU µs per pair, medians of the windows: the client's"
            " (`time.process_time` of the benchmark process; for the limit, the Python loop"
            " writing and reading the socket) and the server's (INFO cpu before and after each"
            ' window). The row "redmutex\'s requests, blocking socket" sends the two requests of'
            " one redmutex acquire+release (caught once with MONITOR, the same token each time)"
            " from the limit's socket and loop: the server's work of a redmutex pair with the"
            " limit's client, so redmutex's gap to it is the client's share and its own gap to the"
            " limit the scripts' share."
            + (
                f" The last column divides each window by {relative}'s window of the same cycle"
                " (median)."
                if relative
                else ""
            )
        ),
        "",
        (
            "| peer | pairs/s (median window) | ×limit, median | ×limit, min"
            " | client CPU µs/pair | server CPU µs/pair |"
            + (f" ×{relative}, same cycle |" if relative else "")
        ),
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if relative else ""),
        (
            f"| blocking-socket limit | {_num(measured['limit_per_second_median'])} | 1 | 1"
            f" | {_num(measured['limit_cpu_us_per_pair_median'], 1)}"
            f" | {_num(measured.get('limit_server_cpu_us_per_pair_median'), 1)} |"
            + (" — |" if relative else "")
        ),
    ]
    for peer, p in measured["peers"].items():
        same_cycle = "1" if peer == relative else _num(p.get("vs_relative_median"), 2)
        lines.append(
            f"| {peer} | {_num(p['per_second_median'])} | {_num(p['ratio_median'], 2)}"
            f" | {_num(p['ratio_min'], 2)} | {_num(p['cpu_us_per_pair_median'], 1)}"
            f" | {_num(p.get('server_cpu_us_per_pair_median'), 1)} |"
            + (f" {same_cycle} |" if relative else "")
        )
    return lines


def _failed(row: dict[str, Any], columns: int) -> str:
    return f"| {row['title']} | {row['peer']} | {row['status']}: {row['error']} |" + "|" * (
        columns - 3
    )


def _pairs_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Throughput: acquire+release pairs",
        "",
        (
            f"| scenario | peer | pairs/s | p50 µs | p99 µs | ×{BASELINE} | ×physical limit"
            " (redis-benchmark) | ×blocking-socket limit |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["status"] != "ok":
            lines.append(_failed(row, 8))
            continue
        lat = row.get("latency_us") or {}
        lines.append(
            f"| {row['title']} | {row['peer']} | {_num(row['per_second'])}"
            f" | {_num(lat.get('p50'), 1)} | {_num(lat.get('p99'), 1)}"
            f" | {_num(row['vs_baseline'], 2)} | {_num(row['vs_physical_limit'], 2)}"
            f" | {_num(row.get('vs_raw_limit'), 2)} |"
        )
    return lines


def _handoff_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Hand-off latency",
        "",
        (
            "From the holder's `release()` returning to the next holder's `acquire()` returning, in"
            " another process that was already waiting (each holder keeps the lock 1 ms, then asks"
            " again only once another process has taken over)."
        ),
        "",
        (
            "| scenario | peer | hand-offs | p50 µs | p90 µs | p99 µs | max µs"
            f" | {BASELINE} p50 ÷ p50 | client CPU µs/section | server CPU µs/section"
            " | commands/section |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["status"] != "ok":
            lines.append(_failed(row, 11))
            continue
        lat = row.get("latency_us") or {}
        lines.append(
            f"| {row['title']} | {row['peer']} | {_num(lat.get('count'))}"
            f" | {_num(lat.get('p50'), 1)} | {_num(lat.get('p90'), 1)}"
            f" | {_num(lat.get('p99'), 1)} | {_num(lat.get('max'), 1)}"
            f" | {_num(row['vs_baseline'], 1)}"
            f" | {_num(row.get('client_cpu_us_per_section'), 1)}"
            f" | {_num(row.get('server_cpu_us_per_section'), 1)}"
            f" | {_num(row.get('commands_per_section'), 1)} |"
        )
    return lines


def _contended_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Contended throughput",
        "",
        (
            "Every process loops acquire → empty section → release on one name, asking again at"
            " once. Owner switches: consecutive sections held by different processes (for a lock)."
            " Longest wait: the slowest `acquire()` called in the window, also if it was served only"
            " after it. Holders: the most seen at once (allowed)."
        ),
        "",
        (
            "| scenario | peer | sections/s | owner switches % | longest wait ms | wait p50 ms"
            f" | wait p99 ms | sections per process min–max | holders | ×{BASELINE}"
            " | client CPU µs/section | server CPU µs/section | commands/section |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["status"] != "ok":
            lines.append(_failed(row, 13))
            continue
        lat = row.get("latency_us") or {}
        capacity = row.get("capacity")
        switches = _num(row.get("owner_switch_pct"), 1) if capacity == 1 else "—"
        p50 = lat.get("p50")
        p99 = lat.get("p99")
        lines.append(
            f"| {row['title']} | {row['peer']} | {_num(row['per_second'])} | {switches}"
            f" | {_num(row.get('longest_wait_ms_max'), 1)}"
            f" | {_num(p50 / 1000 if p50 is not None else None, 2)}"
            f" | {_num(p99 / 1000 if p99 is not None else None, 2)}"
            f" | {row.get('sections_per_contender_min', '?')}–"
            f"{row.get('sections_per_contender_max', '?')}"
            f" | {row.get('max_holders_max', '?')} ({'any' if capacity is None else capacity})"
            f" | {_num(row['vs_baseline'], 2)}"
            f" | {_num(row.get('client_cpu_us_per_section'), 1)}"
            f" | {_num(row.get('server_cpu_us_per_section'), 1)}"
            f" | {_num(row.get('commands_per_section'), 1)} |"
        )
    return lines


def _commands_tables(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "## Redis commands per hand-off",
        "",
        (
            "INFO commandstats deltas over a window of hand-offs (as in the hand-off latency"
            " scenario: hold 1 ms, ask again once another contender has taken over), divided by the"
            " hand-offs; commandstats counts a script call and each command the script runs."
        ),
    ]
    axes = (
        ("threads", "1 process; waiting threads →"),
        ("processes", "processes (× 2 threads each) →"),
    )
    for axis, heading in axes:
        on_axis = [r for r in rows if r.get("axis") == axis]
        if not on_axis:
            continue
        points = sorted({r["point"] for r in on_axis})
        peers = list(dict.fromkeys(r["peer"] for r in on_axis))
        lines += [
            "",
            f"| {heading} | " + " | ".join(str(p) for p in points) + " |",
            "|---|" + "---:|" * len(points),
        ]
        for peer in peers:
            cells = []
            for point in points:
                row = next((r for r in on_axis if r["peer"] == peer and r["point"] == point), None)
                if row is None:
                    cells.append("")
                elif row["status"] != "ok":
                    cells.append(row["status"])
                else:
                    cells.append(f"{row['commands_per_handoff']:.2f}")
            lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    details = []
    for row in rows:
        if _is_subject(row["peer"]) and row["status"] == "ok":
            top = list(row.get("per_command", {}).items())[:6]
            details.append(
                f"- {row['peer']}, {row['title']}: "
                + ", ".join(f"{k} {v:.2f}" for k, v in top)
                + f" ({row['handoffs']:.0f} hand-offs)"
            )
    if details:
        lines += ["", "Per command (calls per hand-off):", "", *details]
    return lines


def _targets_table(record: dict[str, Any]) -> list[str]:
    targets = record.get("targets") or []
    if not targets:
        return []
    lines = [
        "",
        "## Targets of issues 3 and 18 (loopback)",
        "",
        "| target | where | measured | met |",
        "|---|---|---|---|",
    ]
    for t in targets:
        met = {True: "**yes**", False: "**no**", None: "—"}[t["met"]]
        lines.append(f"| {t['target']} | {t['where']} | {t['measured']} | {met} |")
    return lines


def _summary(record: dict[str, Any]) -> list[str]:
    summary = []
    for scenario, ratio in record.get("ratios", {}).items():
        parts = [f"{k} = {_num(v, 2)}" for k, v in ratio.items() if v is not None]
        if parts:
            summary.append(f"- {scenario}: " + "; ".join(parts))
    lines = ["", "## Ratios", "", *summary] if summary else []
    charts = record.get("charts") or {}
    if charts.get("files"):
        lines += ["", "## Charts", ""] + [f"![{f}]({f})" for f in charts["files"]]
    elif charts.get("error"):
        lines += ["", f"Charts: not drawn ({charts['error']})."]
    if record["errors"]:
        lines += ["", "Errors:", *[f"- {e}" for e in record["errors"]]]
    return lines


def markdown(record: dict[str, Any]) -> str:
    rows = record["results"]
    return (
        "\n".join(
            [
                *_header(record),
                *_physical(record),
                *_pairs_table(_ok(rows, "pairs")),
                *_handoff_table(_ok(rows, "handoff")),
                *_contended_table(_ok(rows, "contended")),
                *_commands_tables(_ok(rows, "commands")),
                *_targets_table(record),
                *_summary(record),
            ]
        )
        + "\n"
    )


def write(record: dict[str, Any], text: str, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "latest.json", directory / "latest.md"
    json_path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    md_path.write_text(text)
    return json_path, md_path
