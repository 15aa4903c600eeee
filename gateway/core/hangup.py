"""Work that must stop the moment the caller hangs up (an engine request
nobody will read costs KV blocks and accelerator time), which FastAPI's plain
handlers would not notice: the work runs next to a watch on the connection,
and whichever ends first decides."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class HungUp(Exception):
    """The caller left before the work was done; the work was cancelled."""


async def disconnected(receive: Receive) -> None:
    """Returns when the caller has hung up."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_hung_up(work: Awaitable[T], receive: Receive) -> T:
    """The work's result (or what it raised); HungUp, after cancelling the
    work and waiting for its cleanup, when the caller hung up first."""
    task = asyncio.ensure_future(work)
    hangup = asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait({task, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, hangup, return_exceptions=True)
    if task.cancelled():
        raise HungUp()
    return task.result()
