"""What the model sees after a tool call: result text rendered as rStar2-Agent renders it, and the tokens
of the tool turn that carries it.

`tool_turn_ids` is the one bridge from tool results to tokens; the server's agent loop and `rl/` both get
their tool-turn tokens from it (through the agent loop), so serving and training see the same stream.

The tool turn is the chat template's own rendering of the tool messages, cut where the model's turn ends
and the next one's sampled text begins. Two tool protocols differ here (and in the sandbox's result text,
the second cut of that text and the answers to calls the released loop rejects; docs/api.md has the table):

- `released`: as rStar2-Agent's training loop built its stream. It tokenized the tool messages alone, so
  the model's `<|im_end|>` is followed directly by `<|im_start|>user`, with no `\\n` token between.
- `improved`: the template's `\\n` after `<|im_end|>` is kept (with response mask 0). The token stream then
  decodes to exactly the conversation the template renders, so a client that sends the conversation back
  gets the same prompt tokens (prefix-cache hits) and one format serves chat, evals and RL.
"""

from __future__ import annotations

from collections.abc import Sequence

from rstar.sandbox.schemas import RunResult, code_judge_reason
from rstar.sandbox.tools import ToolProtocol, TruncateSide
from rstar.server.chat_template import ChatTemplate

def render_exec_result(result: RunResult, protocol: ToolProtocol) -> str:
    """`Tool call success|failure`, the failure reason (code-judge's), non-empty stdout and stderr, then the
    time the sandbox measured. Under `improved` a line per figure the cell returned (`[image 1: 640x480 PNG]`)
    and per figure left out (the sandbox's note) comes before the time: the model cannot see the picture, but
    it learns that its plot was made and how big it is. `released` never names them, as the release could not."""
    lines = ["Tool call success"] if result.ok else ["Tool call failure", f"reason: {code_judge_reason(result.status)}"]
    if result.stdout:
        lines.append(f"stdout: {result.stdout}")
    if result.stderr:
        lines.append(f"stderr: {result.stderr}")
    if protocol == "improved":
        lines += image_lines(result)
    lines.append(f"execution time: {result.duration_s:.2f}s")
    return "\n".join(lines)


def image_lines(result: RunResult) -> list[str]:
    """`[image N: WxH PNG]` for each figure returned, then `[note]` for each one left out."""
    shown = [f"[image {number}: {image.width}x{image.height} {image.format.upper()}]" for number, image in enumerate(result.images, 1)]
    return shown + [f"[{note}]" for note in result.image_notes]


def decode_failure_text(error: str) -> str:
    """The tool response for a `<tool_call>` span that is not a JSON call object."""
    return f"Failed to decode tool call: {error}"


def execution_error_text(error: str) -> str:
    """The tool response for a call that could not run (unknown tool, bad arguments, sandbox unreachable)."""
    return f"Error when executing tool: {error}"


def truncate_response(text: str, max_chars: int | None, side: TruncateSide = "middle") -> str:
    """Cut an execution's result text to `max_chars`, marking the cut as the released loop does.

    None keeps it whole. "left" keeps the start, "right" the end, "middle" both halves around the cut.
    """
    if max_chars is None or len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


# Stands in for the model's last turn when rendering; the tool turn is whatever the template puts after it.
_TURN_SENTINEL = "\x00rstar-model-turn\x00"


def tool_turn_text(template: ChatTemplate, responses: Sequence[str], sampled_turn_end: str, protocol: ToolProtocol = "improved") -> str:
    """Text from the end of the model's sampled turn to where its next turn's sampled text begins.

    responses: the tool response texts, in call order. sampled_turn_end: the part of the template's
    turn end that the model already sampled (normally its end-of-turn token, '<|im_end|>'), or '' when
    the turn stopped otherwise; the template supplies the rest. Under `released` the whitespace the
    template writes after its end-of-turn token is left out, as the released loop left it out.
    """
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _TURN_SENTINEL},
        *({"role": "tool", "content": response} for response in responses),
    ]
    rendered = template.render(messages, add_generation_prompt=True)
    after_turn = rendered.split(_TURN_SENTINEL, 1)[1]
    closing = template.turn_end
    if protocol == "released" and after_turn.startswith(closing):
        after_turn = closing.rstrip() + after_turn[len(closing) :]
    if not after_turn.startswith(sampled_turn_end):
        raise ValueError(f"the template closes an assistant turn with {after_turn[:20]!r}, not {sampled_turn_end!r}")
    return after_turn[len(sampled_turn_end) :]


def tool_turn_ids(template: ChatTemplate, responses: Sequence[str], sampled_turn_end: str, protocol: ToolProtocol = "improved") -> list[int]:
    """The bridge: token ids of the tool turn (all response-mask 0), including the next turn's opening."""
    return template.encode_text(tool_turn_text(template, responses, sampled_turn_end, protocol))
