"""Chat-mode sessions: children that keep their globals across cells, one uid each, ended after an idle TTL.

The table holds the bookkeeping and makes the choices: which index (hence uid and scratch dir) a new
session gets, which idle session gives way when all are taken, which have been idle too long. Forking and
killing their processes is the zygote's.
"""

from __future__ import annotations

from .child import Child
from .container_disk import Usage
from .jobs import Job


class Session:
    def __init__(self, index: int, child: Child, now: float) -> None:
        self.index, self.child = index, child
        self.last_used = now
        self.job: Job | None = None  # the cell it is running
        self.disk_before: Usage | None = None  # a container's: its data dir as its latest cell found it

    @property
    def busy(self) -> bool:
        return self.job is not None


class SessionTable:
    def __init__(self, max_sessions: int, ttl_s: float) -> None:
        self.by_id: dict[str, Session] = {}
        self.free_indices = list(range(max_sessions))
        self.ttl_s = ttl_s

    def get(self, session_id: str) -> Session | None:
        return self.by_id.get(session_id)

    def least_recently_used_idle(self) -> str | None:
        """The session to end when every index is taken and another is asked for; None when all are busy."""
        idle = [(s.last_used, sid) for sid, s in self.by_id.items() if not s.busy]
        return min(idle)[1] if idle else None

    def reserve_index(self) -> int | None:
        return self.free_indices.pop(0) if self.free_indices else None

    def release_index(self, index: int) -> None:
        self.free_indices.append(index)

    def add(self, session_id: str, index: int, child: Child, now: float) -> Session:
        session = Session(index, child, now)
        self.by_id[session_id] = session
        return session

    def remove(self, session_id: str | None) -> Session | None:
        session = self.by_id.pop(session_id, None) if session_id else None
        if session is not None:
            self.release_index(session.index)
        return session

    def jobs(self) -> list[Job]:
        return [s.job for s in self.by_id.values() if s.job is not None]

    def expiries(self) -> list[float]:
        return [s.last_used + self.ttl_s for s in self.by_id.values() if not s.busy]

    def expired(self, now: float) -> list[str]:
        return [sid for sid, s in self.by_id.items() if not s.busy and now - s.last_used > self.ttl_s]
