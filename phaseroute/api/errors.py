"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the
HTTP status the SDK maps to its exception classes (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 429 RateLimitError, 503 InternalServerError...)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from phaseroute.api.wire import ErrorBody

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (400, "Invalid request"), (401, "Missing, unknown or revoked API key"), (404, "No such object for this tenant"),
        (429, "Too many failed authentications"), (503, "Kafka or the blob store is not available"))
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers or {}


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No {kind} found with id {object_id!r}.", "not_found")


def _body(message: str, code: str | None, param: str | None, status: int) -> dict[str, Any]:
    kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500
                                                                      else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.message, exc.code, exc.param, exc.status), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(_body(f"{param or 'request'}: {first.get('msg')}", "invalid_request", param, 400), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(_body(str(exc.detail), None, None, exc.status_code), exc.status_code)
