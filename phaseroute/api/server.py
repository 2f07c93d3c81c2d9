"""Running the Batch API: ``phaseroute api`` (uvicorn, one process; start more on other ports
or hosts behind a load balancer: they share Kafka and the blob store and keep nothing else).

``api_process_spec`` tells a launcher (``phaseroute up``, the demo) how to start it and when
it is ready.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from phaseroute.config import Settings


@dataclass(frozen=True)
class ApiProcessSpec:
    argv: list[str]  # the command line
    port: int
    ready_url: str  # GET answers 200 once the tenant registry and the jobs view caught up


def api_process_spec(settings: Settings, python: str = sys.executable) -> ApiProcessSpec:
    return ApiProcessSpec(
        argv=[python, "-m", "phaseroute.cli.main", "api", "--host", settings.api_host, "--port", str(settings.api_port)],
        port=settings.api_port, ready_url=f"http://{settings.api_host}:{settings.api_port}/healthz",
    )


def serve(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn drains in-flight requests, then the followers stop)."""
    import uvicorn

    from phaseroute.api.app import create_app

    uvicorn.run(create_app(settings), host=host or settings.api_host, port=port or settings.api_port,
                log_level="info", timeout_graceful_shutdown=10)
