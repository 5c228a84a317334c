"""Files over HTTP, for the routes that take and serve them (containers' files, the Files API): a multipart
upload's `file` part, a copy of it that stops at a cap, and a download that streams a file off the event loop."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from rstar.server.errors import APIError

_CHUNK = 1 << 16


async def multipart_upload(request: Request) -> tuple[FormData, UploadFile]:
    """The body's form and its part named `file` (the caller closes the form); a malformed multipart body, or
    one without that part, is a 400 naming `file`."""
    try:
        form = await request.form(max_files=1, max_fields=8)
    except HTTPException as exc:  # Starlette's word for a malformed multipart body
        raise APIError(400, f"file: malformed multipart body: {exc.detail}", "file", "invalid_multipart") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        await form.close()
        raise APIError(400, "file: send the file as multipart/form-data in a part named `file`.", "file", "missing_file")
    return form, upload


def copy_bounded(source: BinaryIO, target: Path, max_bytes: int) -> int | None:
    """Copy `source` to `target`, counting as it goes; None as soon as it passes `max_bytes`."""
    size = 0
    with target.open("wb") as out:
        while chunk := source.read(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                return None
            out.write(chunk)
    return size


def download(content: BinaryIO, filename: str) -> StreamingResponse:
    """`content` (an open file, closed once sent) as an attachment named `filename`."""
    headers = {"content-disposition": f"attachment; filename*=utf-8''{quote(filename)}", "content-length": str(os.fstat(content.fileno()).st_size)}
    # A sync iterator: Starlette reads it in its thread pool, off the event loop.
    return StreamingResponse(iter(lambda: content.read(_CHUNK), b""), media_type="application/octet-stream", headers=headers,
                             background=BackgroundTask(content.close))
