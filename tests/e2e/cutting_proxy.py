"""A TCP proxy that cuts a connection in the middle of a streamed answer: the
flaky network between a client and the gateway, for the resume tests.

It forwards bytes both ways, and on the connections it is told to cut it
closes both sides once the answer has carried `cut_after_events` SSE events
(blank-line separated blocks with a `data:` line)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class CuttingProxy:
    target_port: int
    cut_after_events: int
    connections_to_cut: int = 1
    port: int = 0
    cuts: int = 0
    connections: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _server: asyncio.AbstractServer | None = None

    def start(self) -> CuttingProxy:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        cut = self.cuts < self.connections_to_cut
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def upward() -> None:
            while data := await client_reader.read(65536):
                upstream_writer.write(data)
                await upstream_writer.drain()

        async def downward() -> None:
            seen = b""
            while data := await upstream_reader.read(65536):
                if cut:
                    seen += data
                    events = sum(1 for block in seen.split(b"\n\n") if b"\ndata: " in b"\n" + block)
                    if events >= self.cut_after_events:
                        self.cuts += 1
                        return  # drop the rest: the finally closes both sides
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.ensure_future(upward()), asyncio.ensure_future(downward())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_writer, upstream_writer):
                writer.close()
