"""The type checkers reject misuse of the public API: every line of tests/typing/misuse.py
marked `# E:` is an error under mypy --strict and under pyright, and no other line is.
(tests/typing/user_module.py, the positive side, is checked by `make lint`.)"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MISUSE = Path(__file__).parent / "typing" / "misuse.py"


def _marked_lines() -> set[int]:
    lines = MISUSE.read_text(encoding="utf-8").splitlines()
    return {n for n, line in enumerate(lines, 1) if "# E:" in line}


def _pyright() -> str | None:
    found = shutil.which("pyright", path=str(Path(sys.executable).parent))
    return found or shutil.which("pyright")


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_rejects_every_misuse() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(MISUSE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    flagged = {int(m) for m in re.findall(r"misuse\.py:(\d+): error:", done.stdout)}
    assert flagged == _marked_lines(), done.stdout


@pytest.mark.skipif(_pyright() is None, reason="pyright is not installed")
def test_pyright_rejects_every_misuse() -> None:
    pyright = _pyright()
    assert pyright is not None
    done = subprocess.run(
        [pyright, "--pythonpath", sys.executable, str(MISUSE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    flagged = {int(m) for m in re.findall(r"misuse\.py:(\d+):\d+ - error:", done.stdout)}
    assert flagged == _marked_lines(), done.stdout


def test_api_page_is_up_to_date() -> None:
    """docs/api.md is what scripts/gen_api_docs.py makes of the current docstrings."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_api_docs.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_api_page_names_every_public_name() -> None:
    import redmutex
    from redmutex import aio

    page = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text("utf-8")
    missing = [f"redmutex.{n}" for n in redmutex.__all__ if f"redmutex.{n}" not in page]
    missing += [f"redmutex.aio.{n}" for n in aio.__all__ if f"redmutex.aio.{n}" not in page]
    assert missing == []
