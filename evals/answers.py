"""What a sample answered, read from its trajectory the same way whichever path produced it.

A sample's trajectory comes in two shapes (`rstar.evals.client`): the agent loop's own (in process: one
entry per assistant turn, each turn's decoded text) and one built from an HTTP chat response (the response
kept whole under `response`). `answer_view` reads both into one `AnswerView`, splitting turn text the way the
server splits a response (`ToolCallStreamParser`: reasoning inside `<reason>`, tool-call spans out of the
text), so a trajectory and the HTTP response the server would have sent for it read the same, and grade the
same.

Math answers are extracted from that view in one of two ways (`EXTRACTIONS`, a run setting):

- `paper` (default): the rStar2-Agent paper's rule, the `\\boxed{}` inside `<answer>...</answer>`, read from
  the answer text (the text outside the reasoning; the reasoning when the answer never left it); a response
  with no `<answer>` block falls back to its last `\\boxed{}` (`rstar.sandbox.verify.extract_answer`).
- `released`: what the released reward (`rstar2_agent/reward/compute_score.py`) reads: the whole response,
  reasoning and tool output included, last `\\boxed{}` anywhere; without one, the answer-marker heuristics of
  verl's `prime_math` ("answer is X", "X is the answer", "answer: X"); and, when that does not match, a
  second chance from math-verify parsing the whole response (verl's `math_verify` score).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rstar.server.tool_calls import CALL_OPEN, TextDelta, ToolCallEnded, ToolCallStreamParser

PAPER_EXTRACTION = "paper"
RELEASED_EXTRACTION = "released"
EXTRACTIONS = (PAPER_EXTRACTION, RELEASED_EXTRACTION)


@dataclass(frozen=True)
class AnswerView:
    reasoning: str  # model text inside <reason> blocks, every turn in order
    content: str  # model text outside them, every turn in order (built-in tool calls left out)
    tool_outputs: list[str] = field(default_factory=list)  # each built-in call's stdout then stderr, in call order

    @property
    def answer_text(self) -> str:
        """The final answer as a client reads it: the content, or the reasoning when the model never left it
        (a response cut off mid-reasoning)."""
        return self.content or self.reasoning

    @property
    def whole_text(self) -> str:
        """Everything the response holds, as the released reward reads it: reasoning, answer, tool output."""
        return "\n".join(part for part in (self.reasoning, self.content, *self.tool_outputs) if part)


def answer_view(trajectory: dict) -> AnswerView:
    if "response" in trajectory:  # built from an HTTP response: the server already split it
        message = trajectory["response"]["choices"][0].get("message") or {}
        cells = message.get("code_cells") or []
        return AnswerView(message.get("reasoning_content") or "", message.get("content") or "", [_output(c.get("stdout"), c.get("stderr")) for c in cells])
    reasoning, content = [], []
    for turn in trajectory.get("turns", []):
        parser = ToolCallStreamParser(in_reasoning=trajectory.get("starts_in_reasoning", False))
        for event in [*parser.feed(turn["text"]), *parser.finish()]:
            if isinstance(event, TextDelta):
                (reasoning if event.reasoning else content).append(event.text)
            elif isinstance(event, ToolCallEnded) and not event.complete:
                # A call cut off by the budget is no call: the server keeps it in the answer text.
                content.append(CALL_OPEN + event.call.raw)
    outputs = [_output(call.get("stdout"), call.get("stderr")) for call in trajectory.get("tool_calls", []) if call.get("stdout") is not None or call.get("stderr") is not None]
    return AnswerView("".join(reasoning), "".join(content), outputs)


def _output(stdout: str | None, stderr: str | None) -> str:
    return "\n".join(part for part in (stdout, stderr) if part)


def extraction_error(name: str) -> str | None:
    """A one-line complaint for an unknown extraction name, or None."""
    if name in EXTRACTIONS:
        return None
    return f"unknown answer extraction {name!r}; use one of: {', '.join(EXTRACTIONS)}"
