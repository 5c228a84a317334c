"""The inference engine: a thin wrapper around vLLM's AsyncLLM, one per process.

Token ids in, streamed token ids (+ logprobs and text) out. The API server and RL rollouts both go through
`TokenEngine`, so the agent loop never re-tokenizes history and tests can swap in a scripted engine that
speaks the same interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rstar.config import EngineSettings, default_cache_dir
from rstar.orphan_guard import guard_this_process
from rstar.process_temp import owned_temp_dir
from rstar.server.engine_defaults import (
    EngineDefaults,
    choose_dtype,
    choose_eager,
    choose_sleep_mode,
    choose_threads_bind,
    compile_cache_dir,
    compile_cache_present,
    describe,
    engine_environment,
)

log = logging.getLogger("rstar.engine")


class EngineNotInstalled(RuntimeError):
    """vLLM is missing: neither the `cpu` nor the `gpu` extra is installed."""


class EngineFailed(RuntimeError):
    """The engine is in a state it cannot serve from (for example a failed weight reload)."""


@dataclass(frozen=True)
class SamplingOptions:
    """What one generation may sample; maps one to one onto vLLM's SamplingParams."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: no logprobs; 0: the sampled token's; k: plus the top k
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


@dataclass
class TokenDelta:
    """The tokens one generation produced since its previous delta."""

    token_ids: list[int]
    text: str
    logprobs: list[float] | None = None  # sampled token's logprob, one per token id
    top_logprobs: list[dict[int, float]] | None = None  # per token: {token id: logprob}, top k
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort" once finished
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    num_prompt_tokens: int = 0


@dataclass
class EngineStats:
    """What a scheduler needs to decide whether to send more work."""

    unfinished: int  # requests the frontend still tracks (added, not yet finished or aborted)
    running: int  # scheduled in the last engine step
    waiting: int
    kv_cache_usage: float  # 0..1
    weight_version: int = 0
    kv_capacity_tokens: int = 0  # KV-cache room in tokens (blocks x block size); 0 where unknown
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # of those, tokens whose KV was already cached
    failed: str | None = None  # why the engine cannot serve (it died, a reload failed, it was shut down), or None


class TokenEngine(Protocol):
    """The interface the server and RL use; `VllmEngine` is the real one."""

    model_name: str
    max_model_len: int
    tokenizer: Any
    weight_version: int

    def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str | None = None) -> AsyncIterator[TokenDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Logprob of each token after the first given the ones before it (RL's weight-sync probe)."""
        ...

    async def replica_prompt_logprobs(self, token_ids: Sequence[int]) -> dict[int, list[float]]:
        """`prompt_logprobs` from every replica serving, by replica index (one engine: {0: ...}), so the weight-sync
        probe checks each replica."""
        ...

    def stats(self) -> EngineStats: ...

    async def reload_weights(self, weights_dir: str | Path) -> None: ...

    async def load_adapter(self, adapter_dir: str | Path | None) -> None:
        """Serve base + the LoRA adapter in `adapter_dir` (peft's files) from now on; None: the base alone."""
        ...

    @property
    def sleep_unavailable(self) -> str | None:
        """Why `sleep` cannot free this engine's memory, or None when it can."""
        ...

    async def sleep(self) -> None:
        """Free the weights and KV cache for a trainer on the same devices; requests wait until `wake_up`."""
        ...

    async def wake_up(self) -> None: ...

    async def shutdown(self) -> None: ...


def _not_installed(reason: str) -> EngineNotInstalled:
    return EngineNotInstalled(f"vLLM is not installed ({reason}). Install an engine: `bash install.sh cpu` (CPU) or `bash install.sh gpu` (CUDA).")


def check_vllm_installed() -> None:
    """That vLLM is there to import, without importing it (tens of seconds on a small CPU): commands check this
    first, so a missing engine is said at once; `require_vllm` imports it when the engine starts."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except ValueError:  # sys.modules["vllm"] is None: marked unimportable
        found = False
    if not found:
        raise _not_installed("no module named 'vllm'")


def require_vllm():
    try:
        import vllm  # noqa: F401
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise _not_installed(str(exc)) from exc
    return AsyncLLM


def choose_defaults(model_dir: str | Path, settings: EngineSettings, cache_dir: Path, accelerator_kind: str) -> EngineDefaults:
    """The engine's defaults on this machine (server/engine_defaults.py), from the facts read here."""
    import torch
    import vllm

    from rstar.hardware import cpu_info, usable_cores

    cpu = cpu_info()
    dtype = choose_dtype(settings.dtype, accelerator_kind, cpu)
    config_file = Path(model_dir) / "config.json"
    factors = {
        "model": str(model_dir), "config": config_file.read_text() if config_file.is_file() else None, "dtype": dtype.value,
        "max_model_len": settings.max_model_len, "max_num_seqs": settings.max_num_seqs, "tensor_parallel_size": settings.tensor_parallel_size,
        "vllm": vllm.__version__, "torch": torch.__version__, "accelerator": accelerator_kind, "cpu": [cpu.model, cpu.flags],
    }
    cache = compile_cache_dir(cache_dir, factors)
    eager = choose_eager(settings.enforce_eager, accelerator_kind, cpu, compile_cache_present(cache))
    if accelerator_kind == "cpu":
        cores = usable_cores()
        threads = choose_threads_bind(settings.cpu_threads_bind, cores, os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
        kv_cache = f"{os.environ.get('VLLM_CPU_KVCACHE_SPACE', settings.cpu_kv_cache_gib)} GiB"
    else:
        threads, kv_cache = None, f"{settings.gpu_memory_utilization:.0%} of GPU memory less the weights"
    sleep_mode = choose_sleep_mode(settings.sleep_mode, accelerator_kind, sleep_mode_available())
    return EngineDefaults(dtype=dtype, eager=eager, threads_bind=threads, kv_cache=kv_cache, compile_cache=None if eager.value else cache, sleep_mode=sleep_mode)


def sleep_mode_available() -> bool:
    """Whether vLLM has sleep mode on this platform (it refuses to start with it elsewhere)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    """Set for the engine's processes, which inherit them as they start; this process's environment is restored
    after, so a later start in it chooses from the same facts."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _latest_stats_logger(holder: dict):
    """A vLLM stat-logger factory that keeps the latest scheduler stats in `holder["scheduler"]` and sums the
    prefix cache's per-step queries and hits (prompt tokens looked up / found cached) into `holder["prefix"]`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    holder["prefix"] = {"queries": 0, "hits": 0}

    class LatestSchedulerStats(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                holder["scheduler"] = scheduler_stats
                if (prefix := scheduler_stats.prefix_cache_stats) is not None:
                    holder["prefix"]["queries"] += prefix.queries
                    holder["prefix"]["hits"] += prefix.hits

        def log_engine_initialized(self):
            pass

    return LatestSchedulerStats


class WeightReloadExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`): reload weights in place, tied embeddings included.

    On CPU, every linear layer keeps a repacked copy of its weight for its GEMM kernel, made after loading.
    A tied output head shares the input embedding's tensor but never appears in a checkpoint, so vLLM's
    in-place reload refreshes the embedding and leaves the head's packed copy stale: measured on SmolLM2,
    a reloaded embedding changed the logprobs by only part of what it should (gap 0.013 against the
    trainer's instead of 1e-5). Re-running the head's post-load step after the reload fixes it.
    """

    def rstar_reload_weights(self, weights_path: str) -> None:
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        config = getattr(model, "config", None)
        if head is not None and getattr(config, "tie_word_embeddings", False) and hasattr(head, "quant_method"):
            head.quant_method.process_weights_after_loading(head)


@dataclass
class VllmEngine:
    """AsyncLLM behind the TokenEngine interface. Create with `await VllmEngine.start(...)`."""

    llm: Any
    model_name: str
    max_model_len: int
    tokenizer: Any
    dtype: str = ""  # what the weights run in, e.g. "bfloat16"
    model_path: str = ""  # the directory (or hub id) it started from
    defaults: EngineDefaults | None = None  # what start-up picked on this machine, and why
    weight_version: int = 0
    adapter: Any = None  # the LoRARequest every request runs with (load_adapter), or None: the base alone
    _stats: dict = field(default_factory=dict)
    _failed: str | None = None
    _socket_dir: Any = None  # the TemporaryDirectory of this engine's ZMQ sockets, removed by shutdown()

    @classmethod
    async def start(
        cls, model_dir: str | Path, settings: EngineSettings, served_model_name: str | None = None, cache_dir: Path | None = None
    ) -> "VllmEngine":
        """Start AsyncLLM with the defaults this machine gets (logged on one line); a compiled engine keeps its
        compile cache under `cache_dir` (default: rstar's cache dir) so the next start loads it."""
        AsyncLLM = require_vllm()
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform

        accelerator_kind = "cpu" if current_platform.is_cpu() else "cuda"
        defaults = choose_defaults(model_dir, settings, cache_dir or default_cache_dir(), accelerator_kind)
        if defaults.dtype.warning:
            log.warning(defaults.dtype.warning)
        compilation = {}
        if defaults.compile_cache is not None and accelerator_kind == "cuda":
            # Decode batches never exceed max_num_seqs; vLLM's default captures graphs up to twice that.
            compilation["max_cudagraph_capture_size"] = settings.max_num_seqs
        # vLLM CPU crashes the whole engine ("CPU Generator does not use offset") when a request with a seed
        # is prefilled in chunks: it rewinds the request's generator, which only CUDA generators support.
        # Concurrent seeded requests with long prompts (RL rollouts; any API client sending `seed`) get
        # there within seconds at the default 2048-token step budget. Whole-prompt prefill avoids it.
        whole_prefill = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(settings.max_model_len, 2048)} if current_platform.is_cpu() else {}
        # Two adapter slots: requests still running on an adapter's previous version and new ones on its next may
        # share a batch while a sync switches them.
        lora = {"enable_lora": True, "max_lora_rank": settings.max_lora_rank, "max_loras": 2} if settings.max_lora_rank else {}
        args = AsyncEngineArgs(
            model=str(model_dir),
            served_model_name=[served_model_name] if served_model_name else None,
            dtype=defaults.dtype.value,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            enforce_eager=defaults.eager.value,
            # The rStar system prompt is about 300 tokens of every request: its KV blocks are computed once.
            enable_prefix_caching=True,
            seed=settings.seed,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            logprobs_mode=settings.logprobs_mode,
            max_logprobs=20,
            # Our stat logger alone turns stats on (vLLM adds its Prometheus logger, which /metrics re-exports),
            # without vLLM's per-interval logging logger.
            disable_log_stats=True,
            worker_extension_cls=f"{WeightReloadExtension.__module__}.{WeightReloadExtension.__qualname__}",
            enable_sleep_mode=bool(defaults.sleep_mode and defaults.sleep_mode.value),
            **whole_prefill,
            **lora,
            **({"compilation_config": compilation} if compilation else {}),
        )
        holder: dict = {}
        guard_this_process()  # the engine processes vLLM starts die with this one, even if it is killed outright
        environment = engine_environment(defaults, accelerator_kind, settings.cpu_kv_cache_gib, os.environ)
        # vLLM binds its ZMQ IPC sockets in the temp dir and leaves their files behind when it stops (about 7 per
        # start): each engine gets a directory of its own for them, unless the operator chose one. shutdown() removes
        # it; a killed engine's goes at the next engine start (process_temp).
        socket_dir = None if "VLLM_RPC_BASE_PATH" in os.environ else owned_temp_dir("rstar-engine-ipc-")
        if socket_dir is not None:
            environment["VLLM_RPC_BASE_PATH"] = socket_dir.name
        with _environment(environment):
            llm = AsyncLLM.from_engine_args(args, stat_loggers=[_latest_stats_logger(holder)])
        engine = cls(
            llm=llm,
            model_name=served_model_name or str(model_dir),
            max_model_len=llm.model_config.max_model_len,
            tokenizer=llm.get_tokenizer(),
            dtype=str(llm.model_config.dtype).removeprefix("torch."),
            model_path=str(model_dir),
            defaults=dataclasses.replace(defaults, kv_cache=f"{defaults.kv_cache}, {_kv_cache_tokens(llm)} tokens"),
            _stats=holder,
            _socket_dir=socket_dir,
        )
        log.info(describe(engine.defaults))
        # vLLM keeps a traceback that runs through this frame (an exception it catches while starting); the
        # frame's `llm` would then keep AsyncLLM alive past shutdown(), to interpreter exit, where its
        # finalizer fails noisily because the modules it needs are gone.
        del llm
        return engine

    def _sampling_params(self, options: SamplingOptions):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            repetition_penalty=options.repetition_penalty,
            seed=options.seed,
            stop=list(options.stop) or None,
            stop_token_ids=list(options.stop_token_ids) or None,
            logprobs=options.logprobs,
            ignore_eos=options.ignore_eos,
            include_stop_str_in_output=options.include_stop_str_in_output,
            skip_special_tokens=options.skip_special_tokens,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        """Stream one sequence. Closing the iterator early (client gone, task cancelled) aborts the request.
        Input vLLM refuses raises ValueError before the first delta, as older vLLM releases raised it (newer
        ones raise their VLLMClientError for some checks), so the API can answer it as the client's 400."""
        try:
            from vllm.exceptions import VLLMClientError as Refused
        except ImportError:  # releases before it raise ValueError only
            Refused = ValueError
        from vllm.v1.engine.exceptions import EngineDeadError

        if failure := self.failure():
            raise EngineFailed(failure)
        request_id = request_id or uuid.uuid4().hex
        finished = started = False
        try:
            stream = self.llm.generate(_engine_prompt(prompt_ids), self._sampling_params(options), request_id, lora_request=self.adapter)
            async with contextlib.aclosing(stream):
                async for output in stream:
                    started = True
                    completion = output.outputs[0]
                    finished = output.finished
                    yield TokenDelta(
                        token_ids=list(completion.token_ids),
                        text=completion.text,
                        logprobs=_sampled_logprobs(completion) if options.logprobs is not None else None,
                        top_logprobs=_top_logprobs(completion, options.logprobs) if options.logprobs else None,
                        finished=finished,
                        finish_reason=completion.finish_reason if finished else None,
                        stop_reason=completion.stop_reason if finished else None,
                        num_prompt_tokens=len(output.prompt_token_ids or ()),
                    )
        except EngineDeadError:
            finished = True  # nothing left to abort
            raise EngineFailed(self.failure() or "the engine died; restart the server") from None
        except Refused as exc:
            if started or isinstance(exc, ValueError):
                raise
            raise ValueError(str(exc)) from exc
        finally:
            if not finished:
                await self.llm.abort(request_id)

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        from vllm import SamplingParams

        if failure := self.failure():
            raise EngineFailed(failure)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        final = None
        async for output in self.llm.generate(_engine_prompt(token_ids), params, f"prompt-logprobs-{uuid.uuid4().hex}", lora_request=self.adapter):
            final = output
        # Position 0 has no logprob; each later entry holds the actual token's (rank-0 asked: it alone).
        return [step[token].logprob for token, step in zip(token_ids[1:], final.prompt_logprobs[1:])]

    async def replica_prompt_logprobs(self, token_ids: Sequence[int]) -> dict[int, list[float]]:
        return {0: await self.prompt_logprobs(token_ids)}

    def failure(self) -> str | None:
        """Why the engine cannot serve, or None: a failed reload, a shutdown, or a dead EngineCore (a worker
        the OOM killer took, for one), after which vLLM refuses every request until the process restarts."""
        if self._failed:
            return self._failed
        if self.llm.errored:
            return f"the engine died ({type(self.llm.dead_error).__name__}: {self.llm.dead_error}); restart the server"
        return None

    def stats(self) -> EngineStats:
        if failure := self.failure():
            return EngineStats(unfinished=0, running=0, waiting=0, kv_cache_usage=0.0, weight_version=self.weight_version, failed=failure)
        scheduler = self._stats.get("scheduler")
        return EngineStats(
            unfinished=self.llm.get_num_unfinished_requests(),
            running=scheduler.num_running_reqs if scheduler else 0,
            waiting=scheduler.num_waiting_reqs if scheduler else 0,
            kv_cache_usage=scheduler.kv_cache_usage if scheduler else 0.0,
            weight_version=self.weight_version,
            kv_capacity_tokens=self.kv_capacity_tokens(),
            prefix_cache_queries=self._stats["prefix"]["queries"],
            prefix_cache_hits=self._stats["prefix"]["hits"],
        )

    def kv_capacity_tokens(self) -> int:
        return _kv_cache_tokens(self.llm)

    async def reload_weights(self, weights_dir: str | Path) -> None:
        """Load new weights from a directory of safetensors files, in place, without restarting.

        On vLLM CPU, `model.load_weights` after start-up fails (kernels repack parameters); the
        worker-side `reload_weights` path works. A failed partial load leaves the model unusable, so it
        marks the engine failed rather than serving a half-updated model.
        """
        weights_dir = Path(weights_dir)
        if not any(weights_dir.glob("*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors files in {weights_dir}")
        try:
            await self.llm.collective_rpc("rstar_reload_weights", kwargs={"weights_path": str(weights_dir)})
        except Exception as exc:
            self._failed = f"weight reload from {weights_dir} failed: {exc}; restart the engine"
            raise EngineFailed(self._failed) from exc
        # Cached KV blocks were computed with the old weights.
        await self.reset_prefix_cache()
        self.weight_version += 1

    async def load_adapter(self, adapter_dir: str | Path | None) -> None:
        """Serve base + the LoRA adapter in `adapter_dir` (adapter_config.json and adapter_model.safetensors, as
        peft writes them) to every request from now on, and bump the weight version; None: the base alone.

        Each version is a new adapter to vLLM (name and id from the weight version): vLLM loads an id's files
        once and caches them, so reusing an id would keep serving the old factors. The previous version is then
        removed. Its cached KV blocks need no reset: vLLM's prefix-cache keys include the adapter's name.
        """
        from vllm.lora.request import LoRARequest

        lora_config = self.llm.vllm_config.lora_config
        if adapter_dir is not None and lora_config is None:
            raise ValueError(f"this engine was started without LoRA, so it cannot serve the adapter in {adapter_dir}: start it with the engine setting "
                             f"max_lora_rank (RSTAR_ENGINE__MAX_LORA_RANK) at least the adapter's rank")
        previous = self.adapter
        if adapter_dir is None:
            self.adapter = None
        else:
            version = self.weight_version + 1
            request = LoRARequest(f"rstar-adapter-v{version}", version, str(adapter_dir))
            try:
                loaded = await self.llm.add_lora(request)
            except Exception as exc:  # a bad file leaves the previous adapter serving: nothing half-loaded
                raise EngineFailed(f"loading the LoRA adapter in {adapter_dir} failed: {exc}") from exc
            if not loaded:
                raise EngineFailed(f"vLLM did not load the LoRA adapter in {adapter_dir}")
            self.adapter = request
        if previous is not None:
            await self.llm.remove_lora(previous.lora_int_id)
        self.weight_version += 1

    @property
    def sleep_unavailable(self) -> str | None:
        chosen = self.defaults.sleep_mode if self.defaults is not None else None
        if chosen is None:
            return "the engine was started without sleep mode (the engine setting sleep_mode, RSTAR_ENGINE__SLEEP_MODE=true)"
        return None if chosen.value else chosen.why

    async def sleep(self) -> None:
        """Level 1: the weights go to host memory and the KV cache is dropped (vLLM frees the device memory). In-flight
        requests finish first ("wait": a server-hosted run's API answers are delayed, never aborted); new ones queue."""
        if reason := self.sleep_unavailable:
            raise EngineFailed(f"cannot sleep: {reason}")
        await self.llm.sleep(level=1, mode="wait")

    async def wake_up(self) -> None:
        """Weights back from host memory and a fresh KV cache; queued requests then run. A weight sync after this
        loads into the woken weights."""
        await self.llm.wake_up()

    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block no running request holds (new weights; a benchmark starting cold)."""
        await self.llm.reset_prefix_cache()

    async def shutdown(self) -> None:
        """Stop the engine and its EngineCore process; later calls fail with EngineFailed."""
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
        if self._socket_dir is not None:
            self._socket_dir.cleanup()
            self._socket_dir = None
        self._failed = "the engine has been shut down"


def _engine_prompt(token_ids: Sequence[int]):
    """Token ids in the form vLLM 0.32's AsyncLLM validates in place (`tokens_input`). A raw `TokensPrompt` is
    deprecated there and takes a hop through a thread pool per request before it is sent to the engine core.
    Older vLLM releases take the raw form only."""
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=list(token_ids))
    return tokens_input(list(token_ids))


def _kv_cache_tokens(llm) -> int:
    """The KV cache's size in tokens, as the engine core sized it at start-up (it reports its block count back)."""
    cache = llm.vllm_config.cache_config
    return (cache.num_gpu_blocks or 0) * cache.block_size


def _sampled_logprobs(completion) -> list[float]:
    logprobs = completion.logprobs or []
    return [step[token].logprob for token, step in zip(completion.token_ids, logprobs)]


def _top_logprobs(completion, k: int) -> list[dict[int, float]]:
    steps = completion.logprobs or []
    return [{token: lp.logprob for token, lp in step.items() if lp.rank is not None and lp.rank <= k} for step in steps]
