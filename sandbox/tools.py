"""The built-in tools by name, and the two tool protocols: the words the sandbox, the server, rl and the
settings share, so each is spelled here only.

- `python_code_with_standard_io` (the released code's name) and `execute_python_code_with_standard_io`
  (the paper's name) are aliases: arguments `code` and `input` (piped to stdin), a fresh interpreter.
- `jupyter_code` (argument `code`): notebook-like state by replaying earlier cells, output suppressed.

A protocol says whose semantics a call follows end to end: `released` as rStar2-Agent's code behaved,
`improved` this project's own (docs/api.md compares them). A truncation side says which part of a result
text survives when the server cuts it a second time, after the sandbox's own cut of each stream.
`ToolSettings` holds the protocol and that cut: the agent loop runs with one, GRPO's config is one, and
the API's settings give one for each request.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PYTHON_TOOL = "python_code_with_standard_io"
PYTHON_TOOL_PAPER_NAME = "execute_python_code_with_standard_io"
JUPYTER_TOOL = "jupyter_code"
BUILTIN_TOOLS = frozenset({PYTHON_TOOL, PYTHON_TOOL_PAPER_NAME, JUPYTER_TOOL})

ToolProtocol = Literal["released", "improved"]
TruncateSide = Literal["left", "right", "middle"]

# The released loop's second cut of a result text: verl's max_tool_response_length, left at its default.
RELEASED_MAX_TOOL_RESPONSE_CHARS = 256


class ToolSettings(BaseModel):
    """How built-in tool calls are answered. The defaults are rStar2-Agent's; the field names are the ones
    recipes (GRPOConfig) use."""

    model_config = ConfigDict(extra="forbid")

    tool_protocol: ToolProtocol = Field(
        "released",
        description="Tool protocol (docs/api.md compares them): 'released' as rStar2-Agent's loop and code-judge; 'improved' "
        "is this project's, what the embedded default model's delta was trained with.",
    )
    max_tool_response_chars: int | None = Field(
        RELEASED_MAX_TOOL_RESPONSE_CHARS,
        description="Second cut of each tool result the model sees, after the sandbox's 1000 chars per stream (verl "
        "max_tool_response_length=256); None keeps it whole.",
    )
    tool_response_truncate_side: TruncateSide = Field("middle", description="Which part survives that cut (tool_response_truncate_side=middle).")

    @classmethod
    def of_protocol(cls, protocol: ToolProtocol, max_tool_response_chars: int | None = None) -> ToolSettings:
        """A protocol with the cut a server's setting asks for (ApiSettings.max_tool_response_chars): None the
        protocol's own, 256 chars (middle) as released and none when improved; 0 none."""
        if max_tool_response_chars is None:
            max_tool_response_chars = RELEASED_MAX_TOOL_RESPONSE_CHARS if protocol == "released" else None
        return cls(tool_protocol=protocol, max_tool_response_chars=max_tool_response_chars or None)

    def tool_settings(self) -> ToolSettings:
        """These settings alone, apart from the rest of a config that holds them (GRPOConfig)."""
        return ToolSettings(**{name: getattr(self, name) for name in ToolSettings.model_fields})
