"""A small client of the Batch API for the CLI (httpx): upload a file, create, retrieve,
cancel a batch, download a file. Errors come back as ``ApiClientError`` with the server's own
message, or one sentence when nothing answers at the URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx


class ApiClientError(RuntimeError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BatchClient:
    def __init__(self, base_url: str, key: str, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ApiClientError(f"no Batch API answers at {self.base_url} ({type(exc).__name__}); start it with "
                                 "`phaseroute api`, or set PHASEROUTE_API_URL") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise ApiClientError(message, response.status_code)
        return response

    def upload(self, path: Path) -> dict[str, Any]:
        with path.open("rb") as fh:
            return dict(self._call("POST", "/files", files={"file": (path.name, fh)}, data={"purpose": "batch"}).json())

    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str],
               idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window, "metadata": metadata}
        return dict(self._call("POST", "/batches", json=body, headers=headers).json())

    def batch(self, batch_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/batches/{batch_id}").json())

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/batches/{batch_id}/cancel").json())

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/files/{file_id}/content").content

    def close(self) -> None:
        self._http.close()
