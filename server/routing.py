"""Which engine replica serves a generation: the routing policies, as pure decisions over a small state.

rStar2-Agent's rollout scheduler sent each request to the engine with the most free KV cache, so that no engine
sits idle while another preempts; the released code used verl's least-requests choice with sticky request ids
instead. Both are here, with round-robin, so they can be compared on the same traffic (benchmarks/router_bench.py).

A multi-turn trajectory re-sends its whole history each turn; the replica that served the previous turn holds
that history in its prefix cache, so the next turn belongs there ("sticky"). The router recognises a turn as the
continuation of a sequence it sent to a replica (that sequence is a proper prefix of the new prompt), comparing
prompts in blocks of tokens like the engines' own prefix caches, so no request-id convention is needed. A prefix
that merely overlaps (the shared system prompt, an RL group's common problem) is no continuation.

The KV-aware policy is the paper's scheduler: a replica takes a request only while its KV cache can hold it
whole (free tokens, less what the generations already there may still write, must cover the prompt's uncached
part plus its max_tokens), so no engine overflows and preempts while another has room; otherwise the request
waits here until capacity frees up. Among replicas with room, a continued trajectory stays on its own, and a new
one goes where the most room is left after admitting it (cached blocks count as free: they cost nothing).
Verl's least-requests sticks unconditionally and otherwise counts requests, blind to how long they will run.

The caller (server/replicas.py) owns the I/O: it polls each replica's stats, counts requests in flight, waits
when `choose` returns None (every replica is at capacity: the request queues here, not inside one engine), and
calls `remember` after dispatching and `forget` when a replica restarts with an empty cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["kv_aware", "least_requests", "round_robin"]
POLICIES: tuple[Policy, ...] = ("kv_aware", "least_requests", "round_robin")


class NoHealthyReplica(RuntimeError):
    """Every replica is down; nothing can serve until one comes back."""


@dataclass(frozen=True)
class ReplicaState:
    """What the router knows about one replica when it decides."""

    healthy: bool
    in_flight: int  # generations sent there and not finished
    kv_free_tokens: int  # KV room in tokens: free in the latest stats, less prompts sent since and output still due


def block_hashes(token_ids: Sequence[int], block_tokens: int) -> list[int]:
    """One hash per full block of the sequence, each chained to the blocks before it (as prefix caches key
    blocks), so equal hashes at position i mean equal prefixes up to block i."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        previous = hash((previous, tuple(token_ids[start : start + block_tokens])))
        hashes.append(previous)
    return hashes


@dataclass
class Router:
    """Routing state for `replicas` engines: which prompt prefixes each one has seen, and a round-robin cursor."""

    replicas: int
    policy: Policy = "kv_aware"
    max_in_flight: int = 64  # per replica; beyond it requests wait at the router (the engines' max_num_seqs)
    block_tokens: int = 16  # vLLM's default KV block size
    max_blocks: int = 1 << 16  # prefix blocks remembered per replica (least recently used forgotten first)
    _seen: list[OrderedDict[int, None]] = field(init=False, repr=False)
    _ends: list[OrderedDict[int, int]] = field(init=False, repr=False)  # last full block -> length of a sequence sent
    _cursor: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.replicas < 1:
            raise ValueError("a router needs at least one replica")
        self._seen = [OrderedDict() for _ in range(self.replicas)]
        self._ends = [OrderedDict() for _ in range(self.replicas)]

    def choose(self, prompt_ids: Sequence[int], states: Sequence[ReplicaState], max_tokens: int = 0) -> int | None:
        """The replica for this prompt (whose generation may write `max_tokens`), or None when every healthy
        replica is at capacity (wait and ask again)."""
        if len(states) != self.replicas:
            raise ValueError(f"expected {self.replicas} replica states, got {len(states)}")
        if not any(state.healthy for state in states):
            raise NoHealthyReplica("no engine replica is healthy")
        open_ = [i for i, state in enumerate(states) if state.healthy and state.in_flight < self.max_in_flight]
        if not open_:
            return None
        if self.policy == "round_robin":
            return self._next_in_turn(open_)
        hashes = block_hashes(prompt_ids, self.block_tokens)
        cached_blocks = [self.cached_blocks(i, hashes) for i in range(self.replicas)]
        cached = [blocks * self.block_tokens for blocks in cached_blocks]
        if self.policy == "kv_aware":
            # an idle replica always takes one: a request larger than any cache still runs (the engine preempts it)
            room = {i: states[i].kv_free_tokens + cached[i] - len(prompt_ids) - max_tokens for i in open_}
            open_ = [i for i in open_ if room[i] >= 0 or states[i].in_flight == 0]
            if not open_:
                return None
        owner = self._continued_on(hashes, cached_blocks, len(prompt_ids), states)
        if owner is not None and owner in open_:
            return owner  # verl keeps a request id on its server unconditionally; the KV-aware one while it fits
        if self.policy == "least_requests":
            return min(open_, key=lambda i: (states[i].in_flight, i))
        # equal room after admission: the replica that already holds more of the prompt computes less
        return min(open_, key=lambda i: (-room[i], -cached[i], states[i].in_flight, i))

    def remember(self, replica: int, token_ids: Sequence[int]) -> None:
        """Record that `replica` now holds this sequence's blocks in its prefix cache."""
        seen, ends = self._seen[replica], self._ends[replica]
        hashes = block_hashes(token_ids, self.block_tokens)
        for block in hashes:
            seen[block] = None
            seen.move_to_end(block)
        if hashes:
            ends[hashes[-1]] = len(token_ids)
            ends.move_to_end(hashes[-1])
        for table in (seen, ends):
            while len(table) > self.max_blocks:
                table.popitem(last=False)

    def forget(self, replica: int) -> None:
        """The replica restarted (or died): its cache is empty."""
        self._seen[replica].clear()
        self._ends[replica].clear()

    def uncached_tokens(self, replica: int, prompt_ids: Sequence[int]) -> int:
        """The prompt tokens the replica would have to compute and store: what a dispatch takes from its room."""
        return len(prompt_ids) - self.cached_blocks(replica, block_hashes(prompt_ids, self.block_tokens)) * self.block_tokens

    def cached_blocks(self, replica: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (given as its block hashes) the replica holds."""
        seen = self._seen[replica]
        count = 0
        for block in hashes:
            if block not in seen:
                break
            count += 1
        return count

    def _continued_on(self, hashes: Sequence[int], cached_blocks: Sequence[int], length: int, states: Sequence[ReplicaState]) -> int | None:
        """The replica holding a sequence this prompt continues: a shorter one sent there whose last full block is
        where the prompt's cached prefix ends (a turn's history is cached up to its own end, and no further, since
        the next block mixes its tail with the new tokens). The longest such sequence wins: an RL group's shared
        prompt is continued by every sample's next turn, but only the sample's own replica holds its answer too
        (the caller remembers each finished sequence). Among equals, the least busy."""
        candidates = [
            (-blocks, states[replica].in_flight, replica)
            for replica, blocks in enumerate(cached_blocks)
            if blocks and self._ends[replica].get(hashes[blocks - 1], length) < length
        ]
        return min(candidates)[2] if candidates else None

    def _next_in_turn(self, open_: Sequence[int]) -> int:
        for step in range(self.replicas):
            candidate = (self._cursor + step) % self.replicas
            if candidate in open_:
                self._cursor = (candidate + 1) % self.replicas
                return candidate
        raise AssertionError("open_ is never empty here")
