"""RWLockSide.locked() answers for the whole RWLock: True while a writer or any live reader
holds it, on either side. The API page said "True when a writer holds the RWLock" for the
blocking side (the asyncio one and the code said "somebody holds"); the page must say what the
call does."""

from __future__ import annotations

import re
from pathlib import Path

import redmutex

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def _entry(signature: str) -> str:
    """The text the API page gives under `signature`'s code block."""
    page = PAGE.read_text("utf-8")
    found = re.search(r"```python\n" + re.escape(signature) + r"\n```\n(.*?)\n\n", page, re.DOTALL)
    assert found is not None, signature
    return found.group(1)


def test_a_side_is_locked_while_only_a_reader_holds(client: redmutex.Client) -> None:
    rw = redmutex.RWLock(client, "side-locked", ttl=5)
    reader = rw.read()
    assert reader.acquire(timeout=5)
    try:
        assert rw.write().locked() and rw.read().locked() and rw.locked()
    finally:
        reader.release()
    assert not rw.write().locked()


def test_the_api_page_says_what_a_sides_locked_answers() -> None:
    for signature in ["RWLockSide.locked() -> bool", "async RWLockSide.locked() -> bool"]:
        entry = _entry(signature)
        assert "writer" in entry and "reader" in entry, (signature, entry)
