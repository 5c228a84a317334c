"""OpenAI wire schemas (requests, responses, stream chunks, errors) as pydantic models.

Only the shapes live here (and how a code cell is drawn from a tool-call record, for every endpoint that shows
one); what the server does with them is in `serving_*.py`. Unknown request fields are
ignored rather than rejected, as OpenAI and vLLM do, so newer clients keep working.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from rstar.sandbox.schemas import CONTAINER_ID
from rstar.sandbox.tools import ToolProtocol
from rstar.server.engine import SamplingOptions
from rstar.server.trajectory import ToolCallRecord


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# A penalty a request leaves out is the served model's default (`sampling_defaults` in /v1/models), else off.
PENALTY_OFF = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
_MODEL_DEFAULT = "Default: the served model's (its sampling_defaults in /v1/models), else "


def resolve_penalties(given: Mapping[str, float | None], model_defaults: Mapping[str, float]) -> dict[str, float]:
    """Every penalty as sampled: the value given, else the model's default, else off."""
    return {name: value if (value := given.get(name)) is not None else model_defaults.get(name, off) for name, off in PENALTY_OFF.items()}


class SamplingFields(_Request):
    """The sampling fields every generating endpoint takes, and their one conversion into the engine's options
    (as vLLM's requests have `to_sampling_params`)."""

    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="vLLM extension; 0 or -1 = off")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description=_MODEL_DEFAULT + "0")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description=_MODEL_DEFAULT + "0")
    repetition_penalty: float | None = Field(
        None, gt=0.0, le=2.0, description="vLLM extension; 1 = off, above 1 discourages repeating prompt or answer tokens. " + _MODEL_DEFAULT + "1"
    )
    seed: int | None = None

    def sampling_options(self, max_tokens: int, model_defaults: Mapping[str, float]) -> SamplingOptions:
        """What one generation of this request samples, at most `max_tokens` tokens; the penalties it leaves
        out are the served model's `model_defaults`, else off."""
        penalties = resolve_penalties({name: getattr(self, name) for name in PENALTY_OFF}, model_defaults)
        return SamplingOptions(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0), seed=self.seed, **penalties
        )


# The engine checks every stop string against the text after each token, and holds back as many characters as
# the longest one before streaming them: a request's stop strings are bounded (OpenAI allows 4), and its stop
# token ids, which every request carries along, too.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 256


class StopFields(SamplingFields):
    """The sampling fields of the endpoints that also take stop strings (chat and completions)."""

    stop: str | list[str] | None = Field(None, description=f"At most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters each.")

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(strings)}")
        if any(len(string) > MAX_STOP_CHARS for string in strings):
            raise ValueError(f"each stop string may have at most {MAX_STOP_CHARS} characters")
        return stop

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling_options(self, max_tokens: int, model_defaults: Mapping[str, float]) -> SamplingOptions:
        return dataclasses.replace(super().sampling_options(max_tokens, model_defaults), stop=self.stop_list)


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionSpec(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class AgentOptions(_Request):
    """The rstar extensions every generating endpoint accepts (documented in docs/api.md)."""

    max_turns: int | None = Field(None, ge=1, description="Assistant turns per answer (each tool call starts another); default from settings.")
    tool_timeout: float | None = Field(None, gt=0, description="Seconds one built-in tool execution may run (capped by the sandbox's max_timeout_s).")
    builtin_tools: bool = Field(True, description="Offer and run the built-in Python tool server-side for this request.")
    return_token_ids: bool = Field(False, description="Also return prompt and response token ids (with the response mask).")
    chat_template: Literal["rstar", "model"] | None = Field(
        None, description="Render with the rStar template or the model's own (with the tool protocol); default: the server's choice for its model."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM's: extra variables for the chat template, e.g. {\"math_instruction\": false} leaves the rStar template's answer instruction out."
    )
    tool_protocol: ToolProtocol | None = Field(
        None, description="Tool protocol: 'released' (as rStar2-Agent's code) or 'improved' (docs/api.md compares them); default: the server's choice for its model."
    )


class ChatPrompt(AgentOptions):
    """What a chat request renders into its prompt; /tokenize takes the same fields, so it renders the same."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    continue_final_message: bool = Field(False, description="vLLM's: the final assistant message is the start of the answer.")
    add_generation_prompt: bool = Field(
        True, description="vLLM's. false only together with continue_final_message (the answer continues the final message)."
    )

    @model_validator(mode="after")
    def _consistent_prompt(self):
        if self.continue_final_message and (not self.messages or self.messages[-1].role != "assistant"):
            raise ValueError("continue_final_message requires the last message to be from the assistant")
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be unique")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among tools")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def wire_tools(self) -> list[dict]:
        return [tool.model_dump(exclude_none=True) for tool in self.tools or []]

    @property
    def wire_tool_choice(self) -> str | dict | None:
        return self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice


class ChatCompletionRequest(ChatPrompt, StopFields):
    model: str
    parallel_tool_calls: bool | None = None
    conversation_id: str | None = Field(None, description="Store this exchange into that existing conversation (its messages are replaced).")
    container: str | None = Field(
        None, pattern=CONTAINER_ID, description="Run the built-in tool's cells in this container (/v1/containers): its interpreter and its files at /mnt/data."
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    max_tokens: int | None = Field(None, ge=1, description="Deprecated by OpenAI in favour of max_completion_tokens; both accepted.")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    store: bool | None = Field(None, description="Keep this exchange in the conversation store; default from server settings.")
    user: str | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        # Without a generation prompt the model would have to open its own turn; the agent loop (tool calls,
        # reasoning split) reads an answer that starts inside an assistant turn, so only the continuation form works.
        if not self.add_generation_prompt and not self.continue_final_message:
            raise ValueError("add_generation_prompt=false is supported only with continue_final_message=true")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int  # sampled by the model
    total_tokens: int
    # Extensions: tokens of tool turns (results fed back to the model) and built-in calls made.
    tool_tokens: int | None = None
    tool_calls: int | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


CellStatus = Literal["running", "ok", "error", "timeout", "memory", "output_limit", "queue_timeout", "invalid_input", "internal_error"]


class CodeCell(BaseModel):
    """One built-in tool call the server ran (or refused), for clients to show (extension)."""

    index: int = Field(description="The call's index within the answer, in call order.")
    name: str
    code: str
    status: CellStatus
    stdout: str = ""
    stderr: str = ""
    duration_s: float | None = None
    images: list[str] = Field(default_factory=list, description="The figures the cell drew (matplotlib), as PNG data URLs, in the order it made them.")
    image_notes: list[str] = Field(default_factory=list, description="Why figures were left out (the sandbox's caps on figures per cell, pixels, bytes).")

    @model_serializer(mode="wrap")
    def _every_field(self, handler):
        # Streams drop unset fields (exclude_none); a cell keeps its documented shape, duration_s null included.
        return {name: getattr(self, name) for name in type(self).model_fields}

    @classmethod
    def of_record(cls, record: ToolCallRecord) -> "CodeCell | None":
        """The final state of a call the server answered, live or stored; None for a client tool's call (the
        client runs it: nothing ran and the model was not answered)."""
        if record.exec_status is None and record.response is None:
            return None
        if record.exec_status is None:  # nothing ran: bad JSON, unknown or disabled tool, bad arguments
            # Without code of its own the call is shown as the model wrote it.
            name = record.name if isinstance(record.name, str) else ""
            return cls(index=record.index, name=name, code=record.code or record.raw, status="invalid_input", stderr=record.response)
        return cls(
            index=record.index,
            name=record.name,
            code=record.code,
            status=record.exec_status,
            stdout=record.stdout or "",
            stderr=record.stderr or "",
            duration_s=record.exec_duration_s,
            images=record.images or [],
            image_notes=record.image_notes or [],
        )


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    code_cells: list[CodeCell] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None
    # return_token_ids: every response token (sampled and tool turns) and which the model sampled (1).
    token_ids: list[int] | None = None
    response_mask: list[int] | None = None


class ChatCompletion(BaseModel):
    id: str = Field(default_factory=lambda: new_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    # OpenAI's field for "which backend configuration answered": here the engine's weight version, which
    # an RL run bumps with every update it loads ("rstar-weights-v3").
    system_fingerprint: str | None = None
    conversation_id: str | None = None
    prompt_token_ids: list[int] | None = None
    # Which tool protocol built the answer's tool turns ('released' or 'improved'), so a stored answer says so.
    tool_protocol: str | None = None


def weights_fingerprint(weight_version: int) -> str:
    return f"rstar-weights-v{weight_version}"


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    code_cell: CodeCell | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None
    response_mask: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    conversation_id: str | None = None
    prompt_token_ids: list[int] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "rstar"
    max_model_len: int | None = None
    # The penalties a request that leaves them out samples with (the model's recommended decoding).
    sampling_defaults: dict[str, float] = Field(default_factory=dict)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# -- /v1/completions, /tokenize, /detokenize -------------------------------------------------------------


class CompletionRequest(StopFields):
    """Plain generation from a text or token-id prompt; no chat template, no tool loop (rStar2-Agent's own
    client drives this endpoint with token ids and loops itself)."""

    model: str
    prompt: str | list[int] = Field(description="Text, or token ids as they are.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    max_tokens: int | None = Field(16, ge=1)
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    logprobs: int | None = Field(None, ge=0, le=20, description="Logprobs of the sampled token plus this many top alternatives.")
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None

    def sampling_options(self, max_tokens: int, model_defaults: Mapping[str, float]) -> SamplingOptions:
        return dataclasses.replace(
            super().sampling_options(max_tokens, model_defaults),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            logprobs=self.logprobs,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
        )


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class TokenizeRequest(ChatPrompt):
    """Either `prompt` (text as it is) or `messages` with the rest of a chat request's prompt fields, rendered
    exactly as /v1/chat/completions renders them (its tools, built-in tool and template choice included)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
