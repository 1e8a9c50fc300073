"""PNG charts of a finished run (matplotlib, no display needed), for the README.

    draw(record, directory) -> [paths written]

- uncontended.png: acquire+release pairs/s per peer against the physical limit;
- handoff.png: hand-off latency p50/p99 per peer with 2 and 4 processes (log scale);
- contended.png: contended sections/s and owner-switch % per peer with 4 and 8 processes;
- commands.png: Redis commands per hand-off as waiting threads and processes grow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, no display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

SUBJECT_COLOR = "#c0392b"
FAIR_COLOR = "#e67e22"
PEER_COLOR = "#7f8c8d"
LIMIT_COLOR = "#2c3e50"
LINE_COLORS = ("#2980b9", "#27ae60", "#8e44ad", "#7f8c8d", "#16a085", "#34495e")
DPI = 120


def _color(peer: str) -> str:
    if peer == "redmutex":
        return SUBJECT_COLOR
    if peer.startswith("redmutex"):
        return FAIR_COLOR
    return PEER_COLOR


def _ok_rows(record: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    return [r for r in record["results"] if r["scenario"] == scenario and r["status"] == "ok"]


def _subtitle(record: dict[str, Any]) -> str:
    m = record["machine"]
    return (
        f"{record['date'][:10]}, nproc {m['nproc']}, load {m['loadavg_start'].split()[0]},"
        f" redis-server {m['redis_server']} on loopback"
    )


def _label_bars(ax: Axes, bars: Any, values: list[float], fmt: str) -> None:
    for bar, value in zip(bars, values):
        ax.annotate(
            fmt.format(value),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _uncontended(record: dict[str, Any], directory: Path) -> Path | None:
    rows = _ok_rows(record, "uncontended")
    if not rows:
        return None
    peers = [r["peer"] for r in rows]
    values = [r["per_second"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bars = ax.bar(peers, values, color=[_color(p) for p in peers])
    _label_bars(ax, bars, values, "{:,.0f}")
    phys = record["physical_limit"]
    limit, raw = phys.get("mean_pair_limit"), phys.get("mean_raw_pair_limit")
    for value, text, style in (
        (limit, "physical limit (redis-benchmark -c 1)", "--"),
        (raw, "physical limit (blocking socket)", ":"),
    ):
        if not value:
            continue
        ax.axhline(value, color=LIMIT_COLOR, linestyle=style, linewidth=1)
        ax.annotate(
            f"{text}: {value:,.0f} pairs/s",
            (len(peers) - 0.5, value),
            ha="right",
            va="bottom",
            fontsize=8,
            color=LIMIT_COLOR,
        )
    ax.set_ylabel("acquire+release pairs/s (1 thread)")
    ax.set_title(f"Uncontended lock throughput\n{_subtitle(record)}", fontsize=10)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.set_ylim(0, max([*values, limit or 0, raw or 0]) * 1.15)
    return _save(fig, directory / "uncontended.png")


def _grouped(
    ax: Axes,
    peers: list[str],
    groups: list[tuple[str, dict[str, float]]],
    fmt: str,
) -> None:
    """Bars per peer, one bar per group (e.g. "2 processes", "4 processes"), side by side."""
    width = 0.8 / max(1, len(groups))
    for g, (label, values) in enumerate(groups):
        xs = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(peers))]
        heights = [values.get(p, 0.0) for p in peers]
        bars = ax.bar(
            xs,
            heights,
            width,
            label=label,
            color=[_color(p) for p in peers],
            alpha=1.0 - 0.35 * g,
            edgecolor="black",
            linewidth=0.3,
        )
        _label_bars(ax, bars, heights, fmt)
    ax.set_xticks(range(len(peers)))
    ax.set_xticklabels(peers, rotation=20, fontsize=8)


def _handoff(record: dict[str, Any], directory: Path) -> Path | None:
    by_scenario = {s: _ok_rows(record, s) for s in ("handoff2", "handoff4")}
    peers = list(dict.fromkeys(r["peer"] for rows in by_scenario.values() for r in rows))
    if not peers:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, quantile in zip(axes, ("p50", "p99")):
        groups = [
            (
                f"{scenario[-1]} processes",
                {r["peer"]: r["latency_us"][quantile] / 1000 for r in rows},
            )
            for scenario, rows in by_scenario.items()
            if rows
        ]
        _grouped(ax, peers, groups, "{:.2f}")
        ax.set_yscale("log")
        ax.set_title(f"hand-off latency {quantile}", fontsize=10)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("ms, release() returned → next acquire() returned (log)")
    fig.suptitle(f"Hand-off latency between processes\n{_subtitle(record)}", fontsize=10)
    return _save(fig, directory / "handoff.png")


def _contended(record: dict[str, Any], directory: Path) -> Path | None:
    by_scenario = {s: _ok_rows(record, s) for s in ("contended4", "contended8")}
    peers = list(dict.fromkeys(r["peer"] for rows in by_scenario.values() for r in rows))
    if not peers:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    throughput = [
        (f"{scenario[-1]} processes", {r["peer"]: r["per_second"] for r in rows})
        for scenario, rows in by_scenario.items()
        if rows
    ]
    switches = [
        (
            f"{scenario[-1]} processes",
            {r["peer"]: r.get("owner_switch_pct") or 0.0 for r in rows},
        )
        for scenario, rows in by_scenario.items()
        if rows
    ]
    _grouped(axes[0], peers, throughput, "{:,.0f}")
    axes[0].set_ylabel("critical sections/s, all processes")
    axes[0].set_title("contended throughput (one name)", fontsize=10)
    axes[0].legend(fontsize=8)
    _grouped(axes[1], peers, switches, "{:.0f}")
    axes[1].set_ylabel("owner switches, % of consecutive sections")
    axes[1].set_ylim(0, 110)
    axes[1].set_title("owner switches (100 % = strict turn-taking)", fontsize=10)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Contended lock, processes on one name\n{_subtitle(record)}", fontsize=10)
    return _save(fig, directory / "contended.png")


def _commands(record: dict[str, Any], directory: Path) -> Path | None:
    rows = [r for r in record["results"] if r.get("kind") == "commands" and r["status"] == "ok"]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, axis, xlabel in (
        (axes[0], "threads", "waiting threads in 1 process"),
        (axes[1], "processes", "processes (2 threads each)"),
    ):
        on_axis = [r for r in rows if r.get("axis") == axis]
        others = iter(LINE_COLORS)
        for peer in dict.fromkeys(r["peer"] for r in on_axis):
            points = sorted(
                (r["point"], r["commands_per_handoff"]) for r in on_axis if r["peer"] == peer
            )
            ours = peer.startswith("redmutex")
            ax.plot(
                [p for p, _ in points],
                [v for _, v in points],
                marker="o",
                label=peer,
                color=_color(peer) if ours else next(others, None),
                linewidth=2.5 if ours else 1,
            )
        ticks = sorted({r["point"] for r in on_axis})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("Redis commands per hand-off (commandstats)")
        ax.legend(fontsize=7)
    fig.suptitle(f"Redis work per hand-off\n{_subtitle(record)}", fontsize=10)
    return _save(fig, directory / "commands.png")


def draw(record: dict[str, Any], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [
        _uncontended(record, directory),
        _handoff(record, directory),
        _contended(record, directory),
        _commands(record, directory),
    ]
    return [p for p in paths if p is not None]
