"""A real Batch API for the tests: uvicorn serving the app on a free localhost port, on the
real broker, with its blob store in a temporary directory, and tenants with real keys in the
registry topic."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from phaseroute.api import registry
from phaseroute.config import load_settings


@dataclass
class Api:
    base_url: str
    app: object
    blob_root: Path

    def tenant(self, prefix: str = "t") -> tuple[str, str]:
        """A new tenant and its key, once the server's registry knows it."""
        bootstrap = load_settings().bootstrap_servers
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        _, key = registry.add_tenant(bootstrap, name, 1.0, {})
        wait_until(lambda: self.app.state.registry.authenticate(key) == name, f"registry to learn {name}")
        return name, key


def wait_until(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def api(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    import uvicorn

    from phaseroute.api.app import create_app

    root = tmp_path_factory.mktemp("blobs")
    port = _free_port()
    settings = load_settings(blob_store_url=str(root), api_port=port, bootstrap_servers=bootstrap)
    app = create_app(settings, max_auth_failures=5)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(base), "the API to answer", 60)
    yield Api(base + "/v1", app, root)
    server.should_exit = True
    thread.join(15)


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
