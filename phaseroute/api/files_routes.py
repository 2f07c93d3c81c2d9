"""``/v1/files``: upload (multipart, streamed into the tenant's prefix), retrieve, list,
download, delete. Every lookup is in the caller's own prefix: another tenant's id is a 404."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from phaseroute.api.auth import authenticate
from phaseroute.api.errors import ERROR_RESPONSES, ApiError, not_found
from phaseroute.api.file_store import FileTooLarge
from phaseroute.api.wire import FileDeleted, FileList, FileObject

router = APIRouter(prefix="/v1/files", tags=["files"], responses=ERROR_RESPONSES)
Tenant = Annotated[str, Depends(authenticate)]
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000


@router.post("", response_model=FileObject)
def create_file(
    request: Request, tenant: Tenant, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()],
    anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
    expires_s: Annotated[int | None, Form(alias="expires_after[seconds]")] = None,
) -> FileObject:
    if purpose != "batch":
        raise ApiError(400, f"purpose {purpose!r}: this service stores batch input files only (purpose 'batch')",
                       "invalid_purpose", "purpose")
    if anchor not in (None, "created_at"):
        raise ApiError(400, f"expires_after[anchor] {anchor!r} must be 'created_at'", "invalid_expires_after",
                       "expires_after")
    if expires_s is not None and not MIN_EXPIRY_S <= expires_s <= MAX_EXPIRY_S:
        raise ApiError(400, f"expires_after[seconds] {expires_s} must be between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}",
                       "invalid_expires_after", "expires_after")
    limit = request.app.state.settings.max_input_bytes
    try:
        meta = request.app.state.files.save(tenant, file.file, file.filename or "upload.jsonl", purpose, limit, expires_s)
    except FileTooLarge as exc:
        raise ApiError(400, str(exc), "file_too_large", "file") from None
    return FileObject(**meta)


@router.get("", response_model=FileList)
def list_files(
    request: Request, tenant: Tenant, after: str | None = None, limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc", purpose: str | None = None,
) -> FileList:
    data, more = request.app.state.files.page(tenant, after, limit, order == "desc", purpose)
    return FileList(data=[FileObject(**m) for m in data], first_id=data[0]["id"] if data else None,
                    last_id=data[-1]["id"] if data else None, has_more=more)


def _file(request: Request, tenant: str, file_id: str) -> dict[str, Any]:
    meta: dict[str, Any] | None = request.app.state.files.get(tenant, file_id)
    if meta is None:
        raise not_found("file", file_id)
    return meta


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(request: Request, tenant: Tenant, file_id: str) -> FileObject:
    return FileObject(**_file(request, tenant, file_id))


@router.get("/{file_id}/content", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
def file_content(request: Request, tenant: Tenant, file_id: str) -> StreamingResponse:
    meta = _file(request, tenant, file_id)
    return StreamingResponse(request.app.state.files.content(tenant, meta["id"]), media_type="application/octet-stream",
                             headers={"Content-Length": str(meta["bytes"])})


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(request: Request, tenant: Tenant, file_id: str) -> FileDeleted:
    _file(request, tenant, file_id)
    request.app.state.files.delete(tenant, file_id)
    return FileDeleted(id=file_id)
