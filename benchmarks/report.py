"""Turns a finished run into the Markdown table and the JSON record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from physical import FORMULA

SUBJECT = "redmutex"  # the library being measured
BASELINE = "redis-py"  # what it is compared against in the ratio column
NOISY_DRIFT_PCT = 15  # start/end physical limits further apart than this: flag the run


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, reference: float | None) -> float | None:
    if not value or not reference:
        return None
    return round(value / reference, 3)


def add_ratios(record: dict[str, Any]) -> None:
    """Adds `vs_baseline` and `vs_physical_limit` to each result and a `ratios` summary."""
    limit = record["physical_limit"].get("mean_pair_limit")
    by_key = {(r["scenario"], r["peer"]): r for r in record["results"]}
    ratios: dict[str, Any] = {}
    for row in record["results"]:
        baseline = by_key.get((row["scenario"], BASELINE), {}).get("per_second")
        row["vs_baseline"] = _ratio(row.get("per_second"), baseline)
        row["vs_physical_limit"] = (
            _ratio(row.get("per_second"), limit) if row.get("single_connection") else None
        )
        if row["peer"] == SUBJECT:
            ratios[row["scenario"]] = {
                f"{SUBJECT}/{BASELINE}": row["vs_baseline"],
                f"{SUBJECT}/physical_limit": row["vs_physical_limit"],
            }
    record["ratios"] = ratios


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
        status = "" if peer["available"] else f" — **unavailable**: {peer['reason']}"
        version = info.get("version") or "?"
        lines.append(f"- {name} {version}{' (' + extras + ')' if extras else ''}{status}")
    lines.append(
        f"- method: {cfg['rounds']} round(s) per scenario and peer, peers interleaved;"
        f" {cfg['warmup']} warm-up pairs before each timed run; pairs/s is the median round,"
        " latencies are per acquire+release pair, pooled over rounds; GC paused while timing;"
        f" every lock has ttl={cfg['ttl']:g} s"
    )
    return lines


def _physical(record: dict[str, Any]) -> list[str]:
    phys = record["physical_limit"]
    lines = [
        "",
        f"## Physical limit (`redis-benchmark -c 1 -n {record['config']['benchmark_requests']} -q`)",
        "",
        "| when | SET NX PX req/s | EVALSHA (SET NX PX) req/s | pair limit pairs/s |",
        "|---|---:|---:|---:|",
    ]
    for when in ("start", "end"):
        p = phys.get(when)
        if p:
            lines.append(
                f"| {when} | {_num(p['set_rps'])} | {_num(p['evalsha_rps'])}"
                f" | {_num(p['pair_limit'])} |"
            )
    drift = phys.get("drift_pct")
    drift_note = f" (start and end differ by {drift:.0f}%)." if drift is not None else "."
    lines += [
        "",
        (
            f"`{FORMULA}` pairs/s: an acquire+release pair needs at least these two round"
            " trips on one connection. Ratios use the mean of start and end:"
            f" {_num(phys.get('mean_pair_limit'))} pairs/s{drift_note}"
        ),
    ]
    if drift is not None and drift > NOISY_DRIFT_PCT:
        lines += [
            "",
            (
                f"**Noisy machine**: the physical limit moved by more than {NOISY_DRIFT_PCT}%"
                " during the run (see the load average); compare ratios, not absolute numbers."
            ),
        ]
    return lines


def _results(record: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Results",
        "",
        f"| scenario | peer | pairs/s | p50 µs | p99 µs | ×{BASELINE} | ×physical limit |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in record["results"]:
        if row["status"] != "ok":
            lines.append(
                f"| {row['title']} | {row['peer']} | {row['status']}: {row['error']} |||||"
            )
            continue
        lat = row.get("latency_us") or {}
        lines.append(
            f"| {row['title']} | {row['peer']} | {_num(row['per_second'])}"
            f" | {_num(lat.get('p50'), 1)} | {_num(lat.get('p99'), 1)}"
            f" | {_num(row['vs_baseline'], 2)} | {_num(row['vs_physical_limit'], 2)} |"
        )
    summary = []
    for scenario, ratio in record.get("ratios", {}).items():
        parts = [f"{k} = {_num(v, 2)}" for k, v in ratio.items() if v is not None]
        if parts:
            summary.append(f"- {scenario}: " + "; ".join(parts))
    if summary:
        lines += ["", *summary]
    if record["errors"]:
        lines += ["", "Errors:", *[f"- {e}" for e in record["errors"]]]
    return lines


def markdown(record: dict[str, Any]) -> str:
    return "\n".join([*_header(record), *_physical(record), *_results(record)]) + "\n"


def write(record: dict[str, Any], text: str, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "latest.json", directory / "latest.md"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    md_path.write_text(text)
    return json_path, md_path
