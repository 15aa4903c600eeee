"""`make serve` = `python -m serving serve`: reaches ready, prints a curl that
works, and stops cleanly on Ctrl-C."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from serving.launcher import free_local_ports

pytestmark = pytest.mark.e2e


def test_serve_prints_a_working_curl_and_stops_on_ctrl_c(model_dir, tmp_path):
    http, grpc, metrics = free_local_ports(3)
    env = {**os.environ, "LLM_BUILD_DIR": str(tmp_path), "LLM_MODEL_DIR": str(model_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--address", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            output.append(line)
            if line.strip() == "Ctrl-C stops the server.":
                break
        text = "".join(output)
        assert "ready." in text, text
        match = re.search(r"^(curl .*?)(?=\n\n)", text, re.S | re.M)
        assert match, text
        curl = match.group(1).replace("\\\n", " ")
        answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=120)
        assert answer.returncode == 0, answer.stderr
        assert "data:" in answer.stdout and "Paris" in answer.stdout, answer.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(output) + proc.stdout.read()
