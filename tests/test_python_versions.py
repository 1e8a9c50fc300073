"""The package (an abi3 wheel: one build for every CPython >= 3.10) imports and works on each
supported CPython this machine has besides the one running the tests. `import redmutex.aio`
failed on 3.12 and 3.13 (an audit): `inspect.markcoroutinefunction`, new in 3.12, was pointed
at a class whose `__func__` is a slot, while the suite ran on 3.11 alone."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redmutex

SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]  # pyproject.toml's classifiers

SMOKE = r"""
import asyncio, inspect, sys
import redmutex, redmutex.aio as aio

client = redmutex.Client(sys.argv[1], prefix=sys.argv[2])

class Source:
    @aio.cached(client, ttl=5)
    async def read(self, x):
        return x * 2

assert inspect.iscoroutinefunction(Source().read) and inspect.iscoroutinefunction(Source.read)

async def main():
    async with aio.Lock(client, "versions", ttl=5) as lock:
        assert lock.fence is not None
    assert await Source().read(21) == 42

with redmutex.Lock(client, "versions", ttl=5):
    pass
asyncio.run(main())
print("ok", sys.version_info[:2])
"""


def _runs(path: str, version: str) -> bool:
    try:
        done = subprocess.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == version


def _interpreters() -> dict[str, str]:
    """A working interpreter for each supported version other than this one: pyenv's, else
    `python3.X` on the PATH (pyenv's shims there may name versions that are not installed)."""
    found: dict[str, str] = {}
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    for version in SUPPORTED:
        if version == f"{sys.version_info[0]}.{sys.version_info[1]}":
            continue
        pyenv = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")))
        on_path = shutil.which(f"python{version}")
        for path in [*reversed(pyenv), *([on_path] if on_path else [])]:
            if _runs(path, version):
                found[version] = path
                break
    return found


INTERPRETERS = _interpreters()


@pytest.mark.skipif(not INTERPRETERS, reason="no other supported CPython on this machine")
@pytest.mark.parametrize("version", sorted(INTERPRETERS))
def test_the_package_works_on_each_supported_python(
    version: str, redis_url: str, prefix: str
) -> None:
    package = str(Path(redmutex.__file__).parent.parent)
    done = subprocess.run(
        [INTERPRETERS[version], "-c", SMOKE, redis_url, prefix],
        env={**os.environ, "PYTHONPATH": package},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout
