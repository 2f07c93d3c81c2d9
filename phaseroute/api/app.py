"""The Batch API's FastAPI app: routes, error shapes, and the state every route reads.

``create_app(settings)`` wires the blob store (files, batches, outputs), the tenant registry
and the jobs view (both followed from Kafka when the app starts), and the Kafka publisher.
The process keeps no state of its own beyond those followers, so several can serve behind one
address. ``GET /healthz`` (no key) says whether the followers have caught up.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request

from phaseroute.api import batches_routes, errors, files_routes
from phaseroute.api.auth import FailureLimiter
from phaseroute.api.batch_store import BatchStore
from phaseroute.api.file_store import FileStore
from phaseroute.api.jobs_view import JobsView
from phaseroute.api.kafka_io import publish
from phaseroute.api.registry import TenantRegistry
from phaseroute.config import Settings
from phaseroute.infra.blobstore import open_blob_store

DEFAULT_MODEL = "smollm2-135m"
Publisher = Callable[[Iterable[tuple[str, str, str, dict[str, Any]]]], None]


def create_app(settings: Settings, follow: bool = True, publisher: Publisher | None = None,
               max_auth_failures: int = 10) -> FastAPI:
    registry, jobs = TenantRegistry(), JobsView()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if follow:
            registry.start(settings.bootstrap_servers)
            jobs.start(settings.bootstrap_servers)
        try:
            yield
        finally:
            registry.stop()
            jobs.stop()

    app = FastAPI(title="phaseroute Batch API", version="1", lifespan=lifespan,
                  description="OpenAI-compatible Files and Batches for phaseroute (see docs/batch-api.md).")
    store = open_blob_store(settings.blob_store)
    state = app.state
    state.settings, state.store, state.registry, state.jobs = settings, store, registry, jobs
    state.files, state.batches = FileStore(store), BatchStore(store)
    state.limiter = FailureLimiter(max_failures=max_auth_failures)
    state.publish = publisher or partial(publish, settings.bootstrap_servers)
    state.settings_default_model = DEFAULT_MODEL

    def send_cancel(record: dict[str, Any]) -> None:
        now = time.time()
        state.publish([("jobs.commands", record["id"], "job_command", {
            "job_id": record["id"], "tenant": record["tenant"], "command": "CANCEL", "at": int(now * 1000),
            "reason": "cancelled through the Batch API"})])
        state.batches.put(dict(record, cancel_sent_at=now))

    state.send_cancel = send_cancel
    errors.install(app)
    app.include_router(files_routes.router)
    app.include_router(batches_routes.router)

    @app.get("/healthz", include_in_schema=False)
    def healthz(request: Request) -> dict[str, Any]:
        return {"ok": True, "jobs_caught_up": jobs.caught_up}

    return app
