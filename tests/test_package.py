"""The package itself: what `import redmutex` loads and which attributes it offers."""

from __future__ import annotations

import subprocess
import sys

import pytest

LAZY_AIO = r"""
import sys
import redmutex
assert "redmutex.aio" not in sys.modules, "import redmutex loaded redmutex.aio"
assert "asyncio" not in sys.modules, "import redmutex loaded asyncio"
assert "aio" in dir(redmutex)
aio = redmutex.aio
assert aio is sys.modules["redmutex.aio"]
assert redmutex.aio.Lock.__module__ == "redmutex.aio"
from redmutex import aio as again
assert again is aio
try:
    redmutex.no_such_thing
except AttributeError as exc:
    assert "no_such_thing" in str(exc)
else:
    raise AssertionError("redmutex.no_such_thing did not raise AttributeError")
print("ok")
"""


@pytest.mark.timeout(60)
def test_aio_is_an_attribute_loaded_on_first_use() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LAZY_AIO], check=False, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
