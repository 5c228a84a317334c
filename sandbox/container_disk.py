"""A container's disk cap, held while code runs in it.

The server checks an upload against the container's caps before it lands (server/containers.py). Code is
another matter: a cell sees the data dir at /mnt/data, on the host's disk, and RLIMIT_FSIZE caps each file it
writes, not how many. So the zygote measures the data dir of every live container interpreter every CHECK_S
seconds, during its cells and between them (a thread the code started runs on after the cell answers). When
the dir holds more entries or bytes than a container may, the zygote kills the interpreter and `remove_new`
deletes what the code wrote since its latest cell began, so the container is back where it was.

The overshoot is bounded by what one process can write in CHECK_S (plus one file of RLIMIT_FSIZE), and only
the latest cell's writes are ever removed: files from earlier cells and every upload stay.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass

CHECK_S = 0.05


@dataclass(frozen=True)
class Caps:
    max_entries: int  # files, directories and links, at any depth
    max_bytes: int

    @classmethod
    def of_config(cls, cfg: dict) -> "Caps":
        return cls(int(cfg["max_files"]), int(cfg["max_bytes"]))


@dataclass(frozen=True)
class Usage:
    entries: int
    bytes: int
    inodes: frozenset[int]  # of every entry counted; complete only when the scan was not cut short

    def over(self, caps: Caps) -> str | None:
        """Which cap the dir passed, in words, or None."""
        if self.entries > caps.max_entries:
            return f"more than {caps.max_entries} files (max_files)"
        if self.bytes > caps.max_bytes:
            return f"{self.bytes} bytes, over the {caps.max_bytes}-byte cap (max_bytes)"
        return None


def measure(data_dir: str, caps: Caps) -> Usage:
    """Entries and bytes under `data_dir`, never following a link. A regular file counts its size or the blocks
    it holds, whichever is larger, once per inode (a hard link is not a second copy). The scan stops after
    max_entries + 1 entries: a dir of a million empty files costs no more to judge than one just over the cap."""
    entries, size, inodes = 0, 0, set()
    stack = [data_dir]
    while stack and entries <= caps.max_entries:
        try:
            listing = list(os.scandir(stack.pop()))
        except OSError:
            continue  # removed meanwhile
        for entry in listing:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            entries += 1
            if info.st_ino in inodes:
                continue
            inodes.add(info.st_ino)
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(info.st_mode):
                size += max(info.st_size, info.st_blocks * 512)
            if entries > caps.max_entries:
                break
    return Usage(entries, size, frozenset(inodes))


def remove_new(data_dir: str, before: Usage, owner: int | None) -> int:
    """Delete every entry whose inode `before` did not hold (a new directory with all it holds), keeping those
    not owned by `owner` when it is given: an upload that landed meanwhile is the server's. Returns how many
    top-level removals were made. Only called once the code is dead, so nothing under the dir moves meanwhile."""
    removed = 0
    stack = [data_dir]
    while stack:
        try:
            listing = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in listing:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_ino in before.inodes:
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                continue
            if owner is not None and info.st_uid != owner:
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)  # never follows a link inside it
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    continue
            removed += 1
    return removed
