"""Locust entry point: `locust -f loadtest/locustfile.py SseUser GrpcUser ...`.

Settings come from LOADTEST_* environment variables (see settings.py); the
`python -m loadtest run` command sets them and runs Locust headless.
"""

import grpc.experimental.gevent as grpc_gevent

# gRPC's own threads must yield to gevent, or a streaming call blocks every user.
grpc_gevent.init_gevent()

from locust import LoadTestShape  # noqa: E402

from loadtest.settings import LoadSettings  # noqa: E402
from loadtest.shapes import users_at  # noqa: E402
from loadtest.users import (  # noqa: E402,F401
    GrpcBurstSilenceUser,
    GrpcUser,
    OpenAIBurstSilenceUser,
    OpenAIUser,
    SseBurstSilenceUser,
    SseUser,
)


class ConfiguredShape(LoadTestShape):
    """The shape named by LOADTEST_SHAPE (steady, ramp, burst)."""

    def __init__(self) -> None:
        super().__init__()
        self.settings = LoadSettings.from_env()

    def tick(self):
        return users_at(self.settings, self.get_run_time())
