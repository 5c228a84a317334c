"""The zygote's fd multiplexing: one selector over its control pipe, its SIGCHLD wake-up pipe, and the
stdout, stderr and status pipes of every running job.

Every read is non-blocking, so a child that writes slowly or not at all cannot stall the loop, and a flood
stops at the output cap. Which job a readable fd belongs to is kept here; what to do about it (answer the
job, kill its child) is the zygote's decision.
"""

from __future__ import annotations

import os
import selectors

from .child import Child
from .jobs import Job

READ_CHUNK = 65536


class Streams:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.owners: dict[int, tuple[Job, str]] = {}  # fd -> (job, "out" | "err" | "status")

    def add(self, fd: int, name: str) -> None:
        """One of the zygote's own fds; `select` reports it by `name`."""
        self.selector.register(fd, selectors.EVENT_READ, name)

    def select(self, timeout: float) -> list[tuple[str | None, int]]:
        """(name or None for a job's pipe, fd) of every readable fd."""
        return [(key.data, key.fd) for key, _ in self.selector.select(timeout)]

    def watch(self, job: Job) -> None:
        child = job.child
        for fd, stream in ((child.out, "out"), (child.err, "err"), (child.status, "status")):
            self.selector.register(fd, selectors.EVENT_READ)
            self.owners[fd] = (job, stream)

    def unwatch(self, job: Job) -> None:
        for fd in (job.child.out, job.child.err, job.child.status):
            self._forget(fd)

    def close(self, child: Child) -> None:
        for fd in child.fds():
            try:
                self._forget(fd)
                os.close(fd)
            except OSError:
                pass

    def _forget(self, fd: int) -> None:
        if fd in self.owners:
            self.selector.unregister(fd)
            del self.owners[fd]

    def read(self, fd: int, max_output_bytes: int) -> Job | None:
        """Take what a job's pipe holds; returns the job when that makes it ready to answer."""
        entry = self.owners.get(fd)
        if entry is None:
            return None
        job, stream = entry
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self._forget(fd)
            if stream == "status":
                job.status_eof = True
                return job if job.child.exit_status is not None else None
            return None
        if stream == "status":
            return job if job.take_status(data) else None
        job.take_output(stream, data)
        if job.over_output_cap(max_output_bytes) and job.kill_reason is None:
            job.kill_reason = "output_limit"
            return job
        return None

    @staticmethod
    def read_status(job: Job) -> None:
        """Whatever the status pipe still holds, then the status line parsed if it is complete."""
        if b"\n" not in job.status_buf and not job.status_eof:
            try:
                while len(job.status_buf) < job.status_max:
                    data = os.read(job.child.status, READ_CHUNK)
                    if not data:
                        job.status_eof = True
                        break
                    job.take_status(data)
            except (BlockingIOError, OSError):
                pass
        job.parse_status()

    @staticmethod
    def drain(job: Job, max_output_bytes: int) -> None:
        """What is left in the job's stdout and stderr pipes, up to the output cap."""
        for fd, stream in ((job.child.out, "out"), (job.child.err, "err")):
            try:
                while True:
                    data = os.read(fd, READ_CHUNK)
                    if not data:
                        break
                    job.take_output(stream, data)
                    if job.over_output_cap(max_output_bytes):
                        break
            except (BlockingIOError, OSError):
                pass

    @staticmethod
    def discard_pending(child: Child) -> None:
        """Output a session's background threads wrote between cells belongs to no cell."""
        for fd in (child.out, child.err, child.status):
            try:
                while os.read(fd, READ_CHUNK):
                    pass
            except (BlockingIOError, OSError):
                pass
