"""The Files API subset: upload (multipart, with `purpose`), list, retrieve, content, delete. A file belongs to
the API key that uploaded it (`key_owner`); another key's is a 404. Callers: anyone with the API key, to hand
files to the code interpreter by id (Responses' `{"type": "auto", "file_ids": [...]}`).

The plain functions run in FastAPI's thread pool, so their file I/O stays off the event loop; the upload is
async to parse the multipart body, and writes the file in a thread.
"""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from rstar.server.auth import API_KEY, key_owner
from rstar.server.cursor_pages import ListPage, page
from rstar.server.file_transfer import download, multipart_upload
from rstar.server.files import FileStore
from rstar.server.schemas_files import FileDeleted, FileObject

router = APIRouter(prefix="/v1/files", dependencies=API_KEY)
UPLOAD_PATH = re.compile(r"/v1/files")  # where a body may be as large as a file (limits.BodySizeLimit)


@router.post("")
async def upload_file(request: Request) -> FileObject:
    form, upload = await multipart_upload(request)
    try:
        return await asyncio.to_thread(_store(request).create, key_owner(request), upload.filename, form.get("purpose"), upload.file)
    finally:
        await form.close()


@router.get("")
def list_files(
    request: Request, limit: int = Query(10_000, ge=1, le=10_000), after: str | None = None, order: str = Query("desc", pattern="^(asc|desc)$"), purpose: str | None = None
) -> ListPage[FileObject]:
    return page(_store(request).list(key_owner(request), purpose), limit, after, order)


@router.get("/{file_id}")
def retrieve_file(file_id: str, request: Request) -> FileObject:
    return _store(request).get(file_id, key_owner(request))


@router.get("/{file_id}/content")
def file_content(file_id: str, request: Request) -> StreamingResponse:
    record, content = _store(request).open(file_id, key_owner(request))
    return download(content, record.filename)


@router.delete("/{file_id}")
def delete_file(file_id: str, request: Request) -> FileDeleted:
    _store(request).delete(file_id, key_owner(request))
    return FileDeleted(id=file_id)


def _store(request: Request) -> FileStore:
    return request.app.state.files
