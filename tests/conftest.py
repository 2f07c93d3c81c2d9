"""Shared fixtures. Integration tests use the real broker that `./dev.sh test` (or
`phaseroute up`) started, at PHASEROUTE_BOOTSTRAP_SERVERS (default localhost:9092)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: see dev.sh

from phaseroute.config import settings


@pytest.fixture(autouse=True)
def _phaseroute_environment_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (``--home`` sets PHASEROUTE_HOME for the process and its
    children) must not move every later test's state dir: PHASEROUTE_* are restored after each test."""
    before = {k: v for k, v in os.environ.items() if k.startswith("PHASEROUTE_")}
    yield
    for key in [k for k in os.environ if k.startswith("PHASEROUTE_") and k not in before]:
        del os.environ[key]
    os.environ.update(before)
    settings.cache_clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the broker is a ``kafka`` test whether or not its module says so:
    ``./dev.sh test`` runs the tests without the broker or the model on every core first, and
    the ``kafka`` and ``model`` tests one at a time after them."""
    for item in items:
        if "bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def bootstrap() -> str:
    """The running broker's bootstrap servers; a missing broker fails the test loudly."""
    from phaseroute.infra.kafka_launcher import broker_answers

    servers = settings().bootstrap_servers
    if not broker_answers(servers, timeout_s=10):
        pytest.fail(f"no Kafka broker answers at {servers}: run `phaseroute up` (./dev.sh test does it)")
    return servers


@pytest.fixture()
def make_topic(bootstrap: str) -> Iterator[Callable[..., str]]:
    """Create uniquely named topics for one test and delete them afterwards."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created: list[str] = []

    def make(prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"test.{prefix}.{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(timeout=30)
        created.append(name)
        return name

    yield make
    if created:
        for future in admin.delete_topics(created).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass
