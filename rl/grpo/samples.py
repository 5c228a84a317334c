"""A rollout once rewarded: what down-sampling, the update and the step's metrics read of it.

Apart from the rollouts themselves (rollout.py), so the update does not load the agent loop and the sandbox
client to know what a sample is.
"""

from __future__ import annotations

from dataclasses import dataclass

from rstar.rl.data import Problem
from rstar.rl.grpo.downsample import Trace
from rstar.server.trajectory import ToolCallRecord, Trajectory


@dataclass
class Sample:
    """One rollout of one problem, rewarded."""

    problem: Problem
    trajectory: Trajectory
    reward: float
    grade_status: str  # the verifier's: ok, timeout, error, ...

    def trace(self, tokenizer) -> Trace:
        """What down-sampling reads: the response text with special tokens kept, and the tool records."""
        trajectory = self.trajectory
        return Trace(
            reward=self.reward,
            text=tokenizer.decode(trajectory.response_ids, skip_special_tokens=False),
            num_turns=len(trajectory.turns),
            tool_calls=len(trajectory.tool_calls),
            tool_errors=sum(is_tool_error(call) for call in trajectory.tool_calls),
        )


def is_tool_error(call: ToolCallRecord) -> bool:
    """A call that did not run cleanly: bad JSON, unknown tool or arguments, exception, timeout, limits."""
    return call.decode_error is not None or call.exec_status != "ok" or call.success is False
