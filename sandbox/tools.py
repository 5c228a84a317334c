"""The built-in tools by name, and the two tool protocols: the words the sandbox, the server, rl and the
settings share, so each is spelled here only.

- `python_code_with_standard_io` (the released code's name) and `execute_python_code_with_standard_io`
  (the paper's name) are aliases: arguments `code` and `input` (piped to stdin), a fresh interpreter.
- `jupyter_code` (argument `code`): notebook-like state by replaying earlier cells, output suppressed.

A protocol says whose semantics a call follows end to end: `released` as rStar2-Agent's code behaved,
`improved` this project's own (docs/api.md compares them). A truncation side says which part of a result
text survives when the server cuts it a second time, after the sandbox's own cut of each stream.
"""

from __future__ import annotations

from typing import Literal

PYTHON_TOOL = "python_code_with_standard_io"
PYTHON_TOOL_PAPER_NAME = "execute_python_code_with_standard_io"
JUPYTER_TOOL = "jupyter_code"
BUILTIN_TOOLS = frozenset({PYTHON_TOOL, PYTHON_TOOL_PAPER_NAME, JUPYTER_TOOL})

ToolProtocol = Literal["released", "improved"]
TruncateSide = Literal["left", "right", "middle"]
