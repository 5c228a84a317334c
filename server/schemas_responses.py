"""Wire schemas of `/v1/responses` (OpenAI's Responses API), the request side.

Output items and stream events are built in `serving_responses.py` in the shapes of openai-python's
`types/responses` (code_interpreter_call, message, reasoning, function_call); unknown request fields are
ignored as elsewhere.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar.server.schemas import AgentOptions, NamedToolChoice, SamplingFields
from rstar.server.schemas_containers import MemoryLimit


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text", "text"] = "input_text"
    text: str


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class AutoContainer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["auto"] = "auto"
    file_ids: list[str] = Field(default_factory=list)
    memory_limit: MemoryLimit | None = None


class CodeInterpreterTool(BaseModel):
    """OpenAI's server-side code tool; here it is the built-in Python tool in the sandbox. A container id runs
    the cells in that container (docs/api.md); `auto` with file_ids makes a container holding those files
    (server/auto_container.py); `auto` without them runs each cell in a fresh process, as before."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["code_interpreter"]
    container: str | AutoContainer = Field(default_factory=AutoContainer)


class ResponsesRequest(AgentOptions, SamplingFields):
    model: str
    input: str | list[InputMessage | FunctionCallItem | FunctionCallOutputItem]
    instructions: str | None = None
    tools: list[CodeInterpreterTool | FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    # What a chat completion may ask for and a response does not: one answer, no logprobs.
    n: ClassVar[int] = 1
    logprobs: ClassVar[bool] = False
    top_logprobs: ClassVar[int | None] = None

    @property
    def token_limit(self) -> int | None:
        return self.max_output_tokens

    @model_validator(mode="after")
    def _named_choice_is_offered(self):
        names = {tool.name for tool in self.tools if isinstance(tool, FunctionTool)}
        choice = self.tool_choice
        if isinstance(choice, dict):
            # The Responses API names a function flat: {"type": "function", "name": ...}.
            if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
                raise ValueError("tool_choice must be auto, none, required or {'type': 'function', 'name': ...}")
            self.tool_choice = NamedToolChoice(function={"name": choice["name"]})
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among tools")
        return self

    @property
    def code_interpreter(self) -> bool:
        return any(isinstance(tool, CodeInterpreterTool) for tool in self.tools)

    def named_container(self) -> tuple[str, str] | None:
        """(the container id the code_interpreter tool names, the field that names it), or None."""
        for i, tool in enumerate(self.tools):
            if isinstance(tool, CodeInterpreterTool) and isinstance(tool.container, str):
                return tool.container, f"tools.{i}.container"
        return None

    def auto_container(self) -> tuple[AutoContainer, str] | None:
        """(the code_interpreter tool's `auto` container, the field that holds it) when it names files, or None."""
        for i, tool in enumerate(self.tools):
            if isinstance(tool, CodeInterpreterTool) and isinstance(tool.container, AutoContainer) and tool.container.file_ids:
                return tool.container, f"tools.{i}.container"
        return None

    def chat_messages(self) -> list[dict]:
        """The input as chat messages for the template: instructions first, tool calls and outputs paired."""
        messages: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, InputMessage):
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        return messages
