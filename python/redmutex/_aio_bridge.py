"""Called on the event loop's thread by the Rust core when an awaited operation ends."""

from __future__ import annotations

import asyncio
from typing import Any


def resolve(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile: the core has already cleaned up
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
