"""One settings object for the whole system.

Resolution order, later wins: field defaults, environment (`RSTAR_` prefix, `__` for nested sections, e.g.
`RSTAR_SANDBOX__TIMEOUT_S=10`), then CLI flags, which commands pass in as keyword overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rstar.sandbox.settings import CONTAINER_MAX_BYTES, CONTAINER_MAX_FILES, SandboxSettings
from rstar.sandbox.tools import ToolProtocol
from rstar.server.routing import Policy
from rstar.server.schemas_containers import MemoryLimit

DEFAULT_MODEL = "default"


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("rstar"))


class EngineSettings(BaseModel):
    dtype: str = Field(
        "auto",
        description="Weights and activations. auto: bf16 on GPUs and on CPUs with native bf16 (AVX512_BF16/AMX), else fp32 (emulated bf16 runs several times slower); fp16 is unstable on CPU.",
    )
    max_model_len: int = Field(8192, description="Context window the engine accepts (prompt + all generated and tool tokens).")
    max_num_seqs: int = Field(64, description="Sequences scheduled at once.")
    enforce_eager: bool | Literal["auto"] = Field(
        "auto",
        description="true: eager, the fastest start; false: compiled (torch.compile; CUDA graphs on GPUs), faster generation. auto: "
        "compiled on GPUs and on CPUs with AVX2/AVX-512/NEON (measured 1.2-1.7x eager's tokens/s on 2 cores, first start 276 s vs 95 s), "
        "the compile cache kept in cache_dir so later starts load it; eager on a single core without a cache.",
    )
    seed: int = 0
    logprobs_mode: str = Field(
        "processed_logprobs",
        description="Logprobs of the distribution actually sampled from (after temperature/top-p), which is what RL's old-policy ratio needs; vLLM's own default is raw_logprobs.",
    )
    tensor_parallel_size: int = 1
    max_lora_rank: Literal[0, 8, 16, 32, 64, 128, 256] = Field(
        0,
        description="Largest LoRA adapter rank the engine serves (vLLM enable_lora / max_lora_rank); 0: no LoRA. LoRA RL (`lora_rank` in a GRPO "
        "recipe) needs at least its rank; `rstar rl train` sets it. On CPU vLLM runs a LoRA engine eager (it turns compilation off).",
    )
    sleep_mode: bool = Field(
        False,
        description="vLLM sleep mode (enable_sleep_mode): the engine can free its weights and KV cache while a trainer on the same devices "
        "updates (RL's sleep_engine; `rstar rl train` sets it). CUDA, ROCm and XPU only: elsewhere (CPU) the engine starts without it and says so.",
    )
    gpu_memory_utilization: float = Field(0.85, description="GPU only: fraction of device memory for weights + KV cache.")
    cpu_kv_cache_gib: int = Field(2, description="CPU only: KV-cache size (VLLM_CPU_KVCACHE_SPACE). 2 GiB holds the default model comfortably.")
    replicas: int = Field(
        1,
        ge=1,
        description="Engines behind one router, each a Ray actor: one per GPU (tensor_parallel_size GPUs each), or on CPU an even share of the "
        "cores each, with its own KV cache of cpu_kv_cache_gib. 1 without ray_address: one engine in the API's process, no Ray.",
    )
    routing: Policy = Field(
        "least_requests",
        description="How the router picks a replica (--replicas > 1): least_requests (fewest in flight, a continued trajectory stays on its replica; best in benchmarks/router_sim.py), kv_aware (the paper's scheduler: only where the KV cache holds the prompt and its whole max_tokens, else wait at the router; no preemptions, fewer running sequences), round_robin.",
    )
    ray_address: str | None = Field(None, description="Ray cluster the replicas run on ('auto', 'ray://host:10001'); None starts a local Ray when replicas > 1.")
    cpu_threads_bind: str = Field(
        "auto",
        description="CPU only: VLLM_CPU_OMP_THREADS_BIND. 'auto': every core on machines of up to 4 (binding both of 2 cores generated 1.7x faster), vLLM's NUMA-aware default above; or a range like '0-1'.",
    )


class ApiSettings(BaseModel):
    """Limits and defaults of the OpenAI-compatible API (env: RSTAR_API__<FIELD>)."""

    max_body_bytes: int = Field(4 * 1024 * 1024, description="Largest request body accepted; larger ones are answered 413 before they are read.")
    max_running_requests: int = Field(
        128, description="Requests one engine works on at once (every choice of every request counts one); the engine batches them."
    )
    max_waiting_requests: int = Field(
        256, description="Requests that may wait for a running slot; beyond that a request is answered 429 with Retry-After at once."
    )
    queue_timeout_s: float = Field(60.0, description="A request that waited this long for a running slot is answered 429.")
    request_timeout_s: float = Field(
        1800.0,
        description="Wall-clock limit of one request, tool turns included; a non-stream request then gets 504, a stream an error event. "
        "A stream ends by then whether or not its client reads.",
    )
    write_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a stream waits for its client to take the next bytes; a client that stops reading for longer has "
        "its generation stopped and its admission slots returned, and gets no more bytes.",
    )
    retry_after_s: int = Field(2, description="Retry-After header sent with 429.")
    rl_share: float = Field(
        0.5, gt=0, le=1, description="Fraction of max_running_requests the rollouts of an RL run started over the API may hold at once."
    )
    render_timeout_s: float = Field(
        5.0, gt=0, description="Time one request's prompt may take to render and tokenize (off the event loop); past it the request gets a 400."
    )
    max_turns: int = Field(30, description="Default assistant turns per answer (the paper's evaluation setting); requests may lower or raise it up to max_turns_limit.")
    max_turns_limit: int = Field(100, description="Largest max_turns a request may ask for.")
    chat_template: str | None = Field(
        None, description="'rstar', 'model' or a jinja file; default: the rStar template for rStar models and tokenizers without one, else the model's own."
    )
    sandbox_url: str | None = Field(None, description="A `rstar sandbox serve` to run model code in; default: an in-process sandbox pool.")
    max_tool_timeout_s: float = Field(
        30.0, gt=0, description="Largest tool_timeout a request may ask for (400 past it, or past sandbox.max_timeout_s where that is lower)."
    )
    sandbox_cells_per_request: int = Field(
        1,
        ge=1,
        description="Built-in tool calls one request may run at once; its other choices (n > 1) wait their turn, so one request "
        "cannot take every sandbox worker.",
    )
    tool_protocol: ToolProtocol | None = Field(
        None,
        description="How tool turns are built and results written (docs/api.md compares them). released: as rStar2-Agent's code; improved: "
        "this server's fixes. Default: released for rStar models, improved for the embedded default model (trained on it) and others; "
        "requests may choose their own.",
    )
    sampling_defaults: dict[Literal["presence_penalty", "frequency_penalty", "repetition_penalty"], float] | None = Field(
        None,
        description="Penalties a request that leaves them out samples with (shown in /v1/models). Default: the model's recommended "
        "ones (the embedded default model's are in its delta's .json), none for other models; {} turns them off.",
    )
    max_tool_response_chars: int | None = Field(
        None,
        ge=0,
        description="Second cut of each tool result the model sees (middle kept: first and last halves around '...(truncated)...'), after "
        "the sandbox's per-stream cut. Default: the protocol's, 256 under released (verl's max_tool_response_length), none under "
        "improved; 0 keeps every result whole.",
    )

    @field_validator("sampling_defaults")
    @classmethod
    def _penalties_in_range(cls, defaults: dict[str, float] | None) -> dict[str, float] | None:
        # The request fields' own ranges; imported here because the server's modules import this one.
        from rstar.server.schemas import SamplingFields

        try:
            SamplingFields.model_validate(defaults or {})
        except ValidationError as exc:
            raise ValueError("; ".join(f"{error['loc'][0]} {error['input']}: {error['msg']}" for error in exc.errors())) from None
        return defaults


class ContainerSettings(BaseModel):
    max_file_bytes: int = Field(50 * 2**20, ge=1, description="Largest file one upload may put in a container (413 past it).")
    max_files: int = Field(CONTAINER_MAX_FILES, ge=1, description="Files one container may hold, uploaded and written by code together.")
    max_bytes: int = Field(CONTAINER_MAX_BYTES, ge=1, description="Bytes of files one container may hold (413 past it; code that writes past it is stopped).")
    max_per_key: int = Field(20, ge=1, description="Live containers one API key (or, without one, the server) may have at once (429 past it).")
    max_memory_limit: MemoryLimit = Field("4g", description="Largest memory_limit a container may ask for (400 past it).")


class FileSettings(BaseModel):
    max_file_bytes: int = Field(50 * 2**20, ge=1, description="Largest file one upload to /v1/files may be (413 past it).")
    max_per_key: int = Field(100, ge=1, description="Files one API key (or, without one, the server) may hold in /v1/files (429 past it).")
    max_bytes_per_key: int = Field(2**30, ge=1, description="Bytes of files one API key may hold in /v1/files (413 past it).")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RSTAR_", env_nested_delimiter="__", extra="forbid")

    model: str = Field(DEFAULT_MODEL, description="'default' (embedded SmolLM2-135M-Instruct), a local directory or a Hugging Face id.")
    served_model_name: str | None = Field(None, description="Name clients use in `model`; defaults to the model's directory or id.")
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = Field(
        None,
        description="When set, every /v1 request must carry `Authorization: Bearer <key>`. Without one the server listens on loopback only "
        "(unless insecure_no_auth) and accepts only loopback Host headers.",
    )
    admin_key: str | None = Field(
        None,
        description="A second key, for what changes the server or reads everyone's data: RL runs over the API, the conversation list and "
        "export. Without one those routes take the API key. Must differ from api_key.",
    )
    insecure_no_auth: bool = Field(False, description="Serve on a non-loopback address without an API key: anyone who reaches the port may chat and run code.")
    enable_rl: bool = Field(False, description="Mount /v1/rl (RL runs that retrain the served model) on `rstar serve`; with an API key it needs admin_key.")
    data_dir: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("rstar")))
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Models and the engine's compile cache.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file rstar.db in data_dir. PostgreSQL: postgresql+psycopg://...")
    store_conversations: bool = Field(True, description="Keep every chat completion in the database (a request can opt out with store=false).")
    conversation_retention_days: float = Field(
        0.0,
        ge=0,
        description="Stored conversations whose latest exchange is older than this are deleted (with their trajectories), when the "
        "server starts and every hour after; 0 (the default, so an upgrade deletes nothing) keeps them forever.",
    )
    engine: EngineSettings = Field(default_factory=EngineSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    containers: ContainerSettings = Field(default_factory=ContainerSettings)
    files: FileSettings = Field(default_factory=FileSettings)

    @field_validator("api_key", "admin_key")
    @classmethod
    def _a_real_key(cls, key: str | None, info: ValidationInfo) -> str | None:
        # RSTAR_API_KEY= (set but empty) would otherwise pass as a key every empty bearer token matches.
        if key is not None and not key.strip():
            raise ValueError("an empty key is no key: unset the variable, or give it a real value")
        if info.field_name == "admin_key" and key is not None and key == info.data.get("api_key"):
            raise ValueError("admin_key must differ from api_key, or every API client is an admin")
        return key

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'rstar.db'}"

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @model_validator(mode="after")
    def _containers_in_data_dir(self):
        # One directory for the API's container store and the sandbox's cells: the in-process pool is told where it is.
        if self.sandbox.containers_dir is None:
            self.sandbox.containers_dir = str(self.data_dir / "containers")
        # The sandbox holds code to the same caps the API holds uploads to.
        self.sandbox.container_max_files, self.sandbox.container_max_bytes = self.containers.max_files, self.containers.max_bytes
        return self

    @property
    def containers_dir(self) -> Path:
        return Path(self.sandbox.containers_dir)

    @property
    def files_dir(self) -> Path:
        """Where /v1/files keeps what is uploaded to it."""
        return self.data_dir / "files"


# Settings never printed: by their dotted path.
SECRET_FIELDS = ("api_key", "admin_key", "sandbox.token")


def mask_url(url: str) -> str:
    """A database URL with its password replaced by ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: show none of it
        return "***"


def masked(settings: Settings) -> dict:
    """The settings as JSON data with every secret masked: the keys, the sandbox token and the database password."""
    data = settings.model_dump(mode="json")
    for path in SECRET_FIELDS:
        *sections, name = path.split(".")
        holder = data
        for section in sections:
            holder = holder[section]
        if holder.get(name):
            holder[name] = "***"
    if data.get("database_url"):
        data["database_url"] = mask_url(data["database_url"])
    return data


class SettingsInvalid(ValueError):
    """A setting's value (from the environment or a flag) that the schema refuses; the message names the
    environment variable that sets it, what it should be and what it was."""


def load_settings(**overrides) -> Settings:
    """Settings from defaults + environment, with CLI overrides (None means 'flag not given')."""
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            path = ".".join(str(part) for part in error["loc"])
            variable = "RSTAR_" + "__".join(str(part).upper() for part in error["loc"])
            given = "a secret" if path in SECRET_FIELDS else repr(error.get("input"))
            problems.append(f"{path} ({variable}): {error['msg']}, got {given}")
        raise SettingsInvalid("invalid setting: " + "; ".join(problems)) from None
