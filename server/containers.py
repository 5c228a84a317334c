"""Containers: named, expiring directories of files that belong to the API key that made them.

Each container is a directory under the store's root: `meta.json` (name, owner digest, times, the files'
records) beside `data/`, the files themselves, which the code interpreter will see as `/mnt/data`. A file found
in `data/` without a record was written there by code, and is recorded on the next read with source
"assistant". Every method does blocking file I/O: callers on the event loop run them in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO, get_args

from rstar.config import ContainerSettings
from rstar.sandbox.clients import SandboxClient
from rstar.server.errors import APIError
from rstar.server.file_transfer import copy_bounded
from rstar.server.schemas_containers import Container, ContainerCreate, ContainerFile, MemoryLimit

log = logging.getLogger("rstar.server")

MEMORY_LIMITS: tuple[MemoryLimit, ...] = get_args(MemoryLimit)  # smallest first
PURGE_INTERVAL_S = 60.0


def new_id(prefix: str) -> str:
    # 128 random bits: an id is the only thing that names a container, so it must not be guessable.
    return f"{prefix}_{secrets.token_hex(16)}"


def is_expired(meta: dict, now: float) -> bool:
    return now > meta["last_active_at"] + 60 * meta["expires_after"]["minutes"]


def safe_name(filename: str | None) -> str:
    """The file's name inside `data/`: its last path component, so an upload cannot climb out of the directory."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    if name in ("", ".", "..") or name == "meta.json":
        raise APIError(400, f"file: {filename!r} is not a usable file name.", "file", "invalid_file_name")
    return name


def not_found(what: str, ident: str) -> APIError:
    return APIError(404, f"No {what} with id {ident!r}.", f"{what}_id", f"{what}_not_found")


class ContainerStore:
    def __init__(self, root: Path, limits: ContainerSettings):
        self.root, self.limits = root, limits
        self._lock = threading.Lock()  # meta.json is read, changed and rewritten as one step
        root.mkdir(parents=True, exist_ok=True)

    # -- containers

    def create(self, request: ContainerCreate, owner: str | None) -> Container:
        if MEMORY_LIMITS.index(request.memory_limit) > MEMORY_LIMITS.index(self.limits.max_memory_limit):
            raise APIError(400, f"memory_limit: {request.memory_limit} is over this server's cap, {self.limits.max_memory_limit}.", "memory_limit")
        with self._lock:
            if len(self._owned(owner)) >= self.limits.max_per_key:
                raise APIError(
                    429, f"containers: this key already has {self.limits.max_per_key}, the most a key may have; delete one first.", "containers", "too_many_containers"
                )
            now = int(time.time())
            meta = {"id": new_id("cntr"), "owner": owner, "name": request.name, "created_at": now, "last_active_at": now,
                    "expires_after": request.expires_after.model_dump(), "memory_limit": request.memory_limit, "files": {},
                    "created_ns": time.time_ns()}  # fmt: skip; created_ns: the list's order, finer than created_at's seconds
            (self.root / meta["id"] / "data").mkdir(parents=True, mode=0o700)  # the sandbox gives it to a cell's uid only
            self._write(meta)
        return _container(meta)

    def list(self, owner: str | None) -> list[Container]:
        with self._lock:
            return [_container(m) for m in sorted(self._owned(owner), key=lambda m: m["created_ns"])]

    def get(self, container_id: str, owner: str | None) -> Container:
        return _container(self._meta(container_id, owner))

    def delete(self, container_id: str, owner: str | None) -> None:
        with self._lock:
            self._meta(container_id, owner)
            shutil.rmtree(self.root / container_id, ignore_errors=True)

    def use(self, container_id: str, owner: str | None) -> Container:
        """The container a request's cells will run in; using it counts as activity."""
        with self._lock:
            meta = self._meta(container_id, owner)
            meta["last_active_at"] = int(time.time())
            self._write(meta)
        return _container(meta)

    def purge_expired(self, now: float | None = None) -> list[str]:
        """Remove the expired containers with their files; their ids."""
        now = time.time() if now is None else now
        with self._lock:
            expired = [m["id"] for m in self._all() if is_expired(m, now)]
            for container_id in expired:
                shutil.rmtree(self.root / container_id, ignore_errors=True)
        return expired

    # -- files

    def add_file(self, container_id: str, owner: str | None, filename: str | None, content: BinaryIO) -> ContainerFile:
        name = safe_name(filename)
        with self._lock:
            meta = self._meta(container_id, owner)
            self._record_written(meta)
            if len(meta["files"]) >= self.limits.max_files:
                raise APIError(400, f"file: the container already holds {self.limits.max_files} files, the most it may.", "file", "too_many_files")
            used = sum(f["bytes"] for f in meta["files"].values() if f["path"] != f"/mnt/data/{name}")
            room = min(self.limits.max_file_bytes, self.limits.max_bytes - used)
            target = self.root / container_id / "data" / name
            partial = target.with_name(f".{name}.{secrets.token_hex(4)}.part")
            size = copy_bounded(content, partial, room)
            if size is None:
                partial.unlink(missing_ok=True)
                over = "max_file_bytes" if room == self.limits.max_file_bytes else "max_bytes"
                cap = self.limits.max_file_bytes if over == "max_file_bytes" else self.limits.max_bytes
                raise APIError(413, f"file: over the container's {over} ({cap} bytes).", "file", "file_too_large")
            partial.replace(target)
            for file_id in [i for i, f in meta["files"].items() if f["path"] == f"/mnt/data/{name}"]:
                del meta["files"][file_id]  # an upload under an existing name replaces that file
            now = int(time.time())
            record = {"id": new_id("cfile"), "created_at": now, "bytes": size, "path": f"/mnt/data/{name}", "source": "user"}
            meta["files"][record["id"]] = record
            meta["last_active_at"] = now
            self._write(meta)
        return ContainerFile(container_id=container_id, **record)

    def list_files(self, container_id: str, owner: str | None) -> list[ContainerFile]:
        with self._lock:
            meta = self._meta(container_id, owner)
            if self._record_written(meta):
                self._write(meta)
        return sorted((ContainerFile(container_id=container_id, **f) for f in meta["files"].values()), key=lambda f: (f.created_at, f.path))

    def file(self, container_id: str, file_id: str, owner: str | None) -> ContainerFile:
        found = next((f for f in self.list_files(container_id, owner) if f.id == file_id), None)
        if found is None:
            raise not_found("file", file_id)
        return found

    def open_file(self, container_id: str, file_id: str, owner: str | None) -> tuple[ContainerFile, BinaryIO]:
        """The file's record and its bytes, opened as a regular file only: code in the container may have put a
        symlink (to a file of this host, outside the sandbox) or a FIFO in its place since it was listed."""
        record = self.file(container_id, file_id, owner)
        path = self.root / container_id / "data" / record.path.removeprefix("/mnt/data/")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            raise not_found("file", file_id) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise not_found("file", file_id)
        return record, os.fdopen(fd, "rb")

    def delete_file(self, container_id: str, file_id: str, owner: str | None) -> None:
        with self._lock:
            meta = self._meta(container_id, owner)
            record = meta["files"].pop(file_id, None)
            if record is None:
                raise not_found("file", file_id)
            (self.root / container_id / "data" / record["path"].removeprefix("/mnt/data/")).unlink(missing_ok=True)
            self._write(meta)

    # -- inside the lock

    def _meta(self, container_id: str, owner: str | None) -> dict:
        """The container's record; 404 when it is unknown, expired or another key's (which must look the same)."""
        path = self.root / Path(container_id).name / "meta.json"
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            raise not_found("container", container_id) from None
        if meta["owner"] != owner or is_expired(meta, time.time()):
            raise not_found("container", container_id)
        return meta

    def _all(self) -> list[dict]:
        metas = []
        for path in self.root.glob("cntr_*/meta.json"):
            try:
                metas.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                log.warning("unreadable container record %s", path)
        return metas

    def _owned(self, owner: str | None) -> list[dict]:
        now = time.time()
        return [m for m in self._all() if m["owner"] == owner and not is_expired(m, now)]

    def _record_written(self, meta: dict) -> bool:
        """Record the files code wrote into `data/` (and forget those it removed); True when anything changed."""
        data = self.root / meta["id"] / "data"
        # Regular files only: a symlink code made would point outside the sandbox once the server follows it.
        on_disk = {e.name: Path(e.path) for e in os.scandir(data) if e.is_file(follow_symlinks=False) and not e.name.startswith(".")}
        known = {f["path"].removeprefix("/mnt/data/"): i for i, f in meta["files"].items()}
        changed = False
        for name, file_id in known.items():
            if name not in on_disk:
                del meta["files"][file_id]
                changed = True
            elif meta["files"][file_id]["bytes"] != (size := on_disk[name].lstat().st_size):
                meta["files"][file_id]["bytes"] = size
                changed = True
        for name in on_disk.keys() - known.keys():
            found = on_disk[name].lstat()
            record = {"id": new_id("cfile"), "created_at": int(found.st_mtime), "bytes": found.st_size, "path": f"/mnt/data/{name}", "source": "assistant"}
            meta["files"][record["id"]] = record
            changed = True
        return changed

    def _write(self, meta: dict) -> None:
        path = self.root / meta["id"] / "meta.json"
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(meta))
        partial.replace(path)  # a reader never sees half a record


def memory_mb(limit: MemoryLimit) -> int:
    """A memory_limit ("4g") in MB: what the container's cells may map beyond the sandbox's warm image."""
    return int(limit.removesuffix("g")) * 1024


def _container(meta: dict) -> Container:
    return Container(**{k: meta[k] for k in ("id", "name", "created_at", "last_active_at", "expires_after", "memory_limit")})


async def stop_interpreter(sandbox: SandboxClient, container_id: str) -> None:
    """End the interpreter the sandbox keeps for a container that is gone, so no process runs on for it. A
    sandbox that cannot be reached is only logged: the container is gone either way, and the sandbox ends
    the interpreter after its session_ttl_s of idleness."""
    try:
        await sandbox.close_container(container_id)
    except Exception as exc:
        log.warning("the interpreter of container %s was not stopped: %s: %s", container_id, type(exc).__name__, exc)


async def purge_expired(store: ContainerStore, sandbox: SandboxClient, now: float | None = None) -> list[str]:
    """Remove the expired containers and their files (in a thread, off the event loop) and stop their
    interpreters; their ids."""
    purged = await asyncio.to_thread(store.purge_expired, now)
    for container_id in purged:
        await stop_interpreter(sandbox, container_id)
    return purged


async def purge_expired_periodically(store: ContainerStore, sandbox: SandboxClient, interval_s: float = PURGE_INTERVAL_S) -> None:
    """`purge_expired` now, then every `interval_s`."""
    while True:
        try:
            if purged := await purge_expired(store, sandbox):
                log.info("removed %d expired containers", len(purged))
        except Exception:
            log.exception("removing expired containers failed; trying again in %.0f s", interval_s)
        await asyncio.sleep(interval_s)
