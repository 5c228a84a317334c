"""The Files API's store: files uploaded once (`POST /v1/files`) that belong to the API key that uploaded them,
for the code interpreter to be handed by id (`{"type": "auto", "file_ids": [...]}` copies them into a fresh
container).

Each file is a directory under the store's root named by its id: `meta.json` (its record and owner digest)
beside `content`. Every method does blocking file I/O: callers on the event loop run them in a thread.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import BinaryIO, get_args

from rstar.config import FileSettings
from rstar.server.containers import safe_name
from rstar.server.errors import APIError
from rstar.server.file_transfer import copy_bounded
from rstar.server.schemas_files import FileObject, FilePurpose

FILE_ID = re.compile(r"file-[0-9a-f]{32}")  # OpenAI's form, with 128 random bits: an id must not be guessable
PURPOSES: tuple[str, ...] = get_args(FilePurpose)


def file_not_found(file_id: str, field: str = "file_id") -> APIError:
    return APIError(404, f"No file with id {file_id!r}.", field, "file_not_found")


class FileStore:
    def __init__(self, root: Path, limits: FileSettings):
        self.root, self.limits = root, limits
        self._lock = threading.Lock()  # a key's count and bytes are checked and the file added as one step
        root.mkdir(parents=True, exist_ok=True)

    def create(self, owner: str | None, filename: str | None, purpose: object, content: BinaryIO) -> FileObject:
        name = safe_name(filename)
        if purpose not in PURPOSES:
            raise APIError(400, f"purpose: {purpose!r} is not one of {', '.join(PURPOSES)}.", "purpose")
        with self._lock:
            owned = self._owned(owner)
            if len(owned) >= self.limits.max_per_key:
                raise APIError(429, f"files: this key already has {self.limits.max_per_key}, the most a key may have; delete one first.", "files", "too_many_files")
            room = min(self.limits.max_file_bytes, self.limits.max_bytes_per_key - sum(m["bytes"] for m in owned))
            file_id = f"file-{secrets.token_hex(16)}"
            directory = self.root / file_id
            directory.mkdir(mode=0o700)
            size = copy_bounded(content, directory / "content", room)
            if size is None:
                shutil.rmtree(directory, ignore_errors=True)
                over = "max_file_bytes" if room == self.limits.max_file_bytes else "max_bytes_per_key"
                raise APIError(413, f"file: over the files.{over} ({getattr(self.limits, over)} bytes).", "file", "file_too_large")
            meta = {"id": file_id, "owner": owner, "bytes": size, "created_at": int(time.time()), "filename": name, "purpose": purpose,
                    "created_ns": time.time_ns()}  # fmt: skip; created_ns: the list's order, finer than created_at's seconds
            partial = directory / "meta.json.part"
            partial.write_text(json.dumps(meta))
            partial.replace(directory / "meta.json")  # written last: a file without it was never stored
        return _file(meta)

    def list(self, owner: str | None, purpose: str | None = None) -> list[FileObject]:
        owned = sorted(self._owned(owner), key=lambda m: m["created_ns"])
        return [_file(m) for m in owned if purpose is None or m["purpose"] == purpose]

    def get(self, file_id: str, owner: str | None, field: str = "file_id") -> FileObject:
        return _file(self._meta(file_id, owner, field))

    def open(self, file_id: str, owner: str | None, field: str = "file_id") -> tuple[FileObject, BinaryIO]:
        """The file's record and its bytes (the server wrote them: no code ever runs in this directory)."""
        meta = self._meta(file_id, owner, field)
        try:
            return _file(meta), (self.root / file_id / "content").open("rb")
        except OSError:
            raise file_not_found(file_id, field) from None

    def delete(self, file_id: str, owner: str | None) -> None:
        with self._lock:
            self._meta(file_id, owner)
            shutil.rmtree(self.root / file_id, ignore_errors=True)

    def _meta(self, file_id: str, owner: str | None, field: str = "file_id") -> dict:
        """The file's record; 404 naming `field` when it is unknown or another key's (which must look the same)."""
        if not FILE_ID.fullmatch(file_id):
            raise file_not_found(file_id, field)
        try:
            meta = json.loads((self.root / file_id / "meta.json").read_text())
        except (OSError, ValueError):
            raise file_not_found(file_id, field) from None
        if meta["owner"] != owner:
            raise file_not_found(file_id, field)
        return meta

    def _owned(self, owner: str | None) -> list[dict]:
        metas = []
        for path in self.root.glob("file-*/meta.json"):
            try:
                meta = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being deleted
            if meta["owner"] == owner:
                metas.append(meta)
        return metas


def _file(meta: dict) -> FileObject:
    return FileObject(**{k: meta[k] for k in ("id", "bytes", "created_at", "filename", "purpose")})
