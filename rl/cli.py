"""`rstar rl`: SFT data, the SFT stage, GRPO-RoC runs, and their status.

    rstar rl make-sft-data --out DIR                  # tool-use conversations, held-out and RL problems
    rstar rl sft DIR/sft_train.jsonl --run-id sft-1    # LoRA SFT; RUN_DIR/final is a servable model
    rstar rl train cpu --data DIR/rl_train.jsonl --run-id grpo-1   # a recipe: shipped name or TOML path
    rstar rl plan --model rstar2-agent-14b --trainer-ranks 8   # what each rank holds, and whether it fits
    rstar rl list | status RUN | stop RUN

The same command with the same --run-id after a crash or kill resumes from the last checkpoint. Runs
execute in this process on their own engine and sandbox; `rstar serve` runs them on the serving engine
through POST /v1/rl/runs instead.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rstar.config import Settings, load_settings

app = typer.Typer(no_args_is_help=True, help="Training: tool-use SFT and GRPO-RoC on the serving stack.")
console = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]rstar rl:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _store(settings: Settings):
    from rstar.rl.runs import RunStore
    from rstar.server.db import open_database

    return RunStore(open_database(settings.resolved_database_url))


def _run_id(given: str | None, kind: str) -> str:
    from rstar.rl.runs import new_run_id

    if given is not None:
        if not given or len(given) > 64 or "/" in given:
            raise _fail(f"--run-id must be 1-64 characters without '/': {given!r}")
        return given
    return new_run_id(kind)


def _interrupt_on_sigterm() -> None:
    """`kill` (SIGTERM) stops a run the way Ctrl-C does: the engine and sandbox shut down, the run stays
    resumable from its last checkpoint. (Python's default for SIGTERM skips all cleanup and leaves vLLM's
    engine processes running on their own.)"""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _progress() -> Progress | _LogProgress:
    if not console.is_terminal:
        return _LogProgress()
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[summary]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
    )


class _LogProgress:
    """Progress where stderr is a file or a pipe (a run under nohup, CI), which rich's bar leaves empty until the
    end: a line per update, at most one per LOG_EVERY_S unless the task is done. Speaks the part of
    `rich.progress.Progress` the commands use."""

    LOG_EVERY_S = 30.0

    def __init__(self):
        self.tasks: dict[int, dict] = {}
        self.started = time.monotonic()

    def __enter__(self) -> _LogProgress:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_task(self, description: str, total: int | None = None, summary: str = "") -> int:
        self.tasks[len(self.tasks)] = {"description": description, "total": total, "completed": 0, "summary": summary, "logged": -math.inf}
        return len(self.tasks) - 1

    def update(self, task: int, completed: int | None = None, total: int | None = None, summary: str | None = None) -> None:
        state = self.tasks[task]
        state.update({k: v for k, v in (("completed", completed), ("total", total), ("summary", summary)) if v is not None})
        now = time.monotonic()
        if now - state["logged"] < self.LOG_EVERY_S and state["completed"] != state["total"]:
            return
        state["logged"] = now
        console.print(f"{state['description']} {state['completed']}/{state['total'] or '?'}  {state['summary']}  {now - self.started:.0f}s elapsed".rstrip(), highlight=False)


def _summary(metrics: dict) -> str:
    keys = (("reward_mean", "reward {:.2f}"), ("tool_call_rate", "tools {:.0%}"), ("loss", "loss {:.3f}"), ("step_s", "{:.0f}s/step"), ("train_s", "train {:.0f}s"))
    return "  ".join(fmt.format(metrics[key]) for key, fmt in keys if isinstance(metrics.get(key), (int, float)))


@app.command("make-sft-data")
def make_sft_data_command(
    out: Annotated[Path, typer.Option(help="Directory for sft_train.jsonl, heldout.jsonl, rl_train.jsonl, manifest.json.")] = Path("sft-data"),
    seed: Annotated[int, typer.Option(help="Same seed, same problems, programs and outputs.")] = 0,
    train: Annotated[int, typer.Option(min=1, help="SFT conversations.")] = 1000,
    heldout: Annotated[int, typer.Option(min=1, help="Held-out problems (phrasings never used for training).")] = 200,
    rl: Annotated[int, typer.Option(min=1, help="RL problems (training phrasings, fresh numbers).")] = 1000,
    gsm8k: Annotated[Optional[Path], typer.Option(help="GSM8K's train.jsonl (question, answer, idx rows): its solutions become programs and conversations too, the rest RL problems. Never the test split.")] = None,
    gsm8k_conversations: Annotated[int, typer.Option(min=0, help="With --gsm8k: how many of its solutions to draw for SFT.")] = 1000,
) -> None:
    """Write tool-use SFT conversations whose programs ran in the sandbox, plus held-out and RL problems."""
    from rstar.evals.data import read_jsonl
    from rstar.rl.sft.data import make_sft_data

    if gsm8k is not None and not gsm8k.is_file():
        raise _fail(f"--gsm8k: no file at {gsm8k} (the shared copy is gsm8k/train.jsonl under the data directory)")
    if gsm8k is not None and gsm8k.name.startswith("test"):
        raise _fail(f"--gsm8k: {gsm8k} looks like the test split, which is for evaluation only; give train.jsonl")
    gsm8k_rows = list(read_jsonl(gsm8k)) if gsm8k else []
    settings = load_settings()
    with _progress() as bars:
        task = bars.add_task("running programs", total=train + heldout, summary="")
        manifest = asyncio.run(make_sft_data(out, seed, train, heldout, rl, settings.sandbox, lambda done, total: bars.update(task, completed=done, total=total),
                                             gsm8k_rows, gsm8k_conversations))
    for name, entry in manifest["files"].items():
        typer.echo(f"{out / name}: {entry['rows']} rows, sha256 {entry['sha256'][:16]}")
    if "gsm8k" in manifest:
        report = manifest["gsm8k"]
        refused = "; ".join(f"{n} {reason}" for reason, n in report["refused"].items())
        typer.echo(f"GSM8K: {report['converted']} of {report['rows']} rows became programs ({refused or 'none refused'}); "
                   f"{report['conversations']} of {report['drawn_for_sft']} drawn printed the gold answer in the sandbox")


@app.command("sft")
def sft_command(
    data: Annotated[str, typer.Argument(help="JSONL of {\"messages\": [...]} conversations in the rStar format.")],
    run_id: Annotated[Optional[str], typer.Option(help="Run id (default: sft-<time>); an unfinished run with this id resumes.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Base model: 'smollm2-135m-instruct' (untuned embedded), a directory or a hub id.")] = "smollm2-135m-instruct",
    epochs: Annotated[Optional[float], typer.Option(help="Passes over the data.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Peak learning rate.")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(help="LoRA rank; 0 for a full fine-tune.")] = None,
    batch: Annotated[Optional[int], typer.Option(help="Conversations per step.")] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    chat_template: Annotated[str, typer.Option(help="'rstar' (what the tuned default is served with), 'model' or a jinja file.")] = "rstar",
) -> None:
    """Supervised fine-tuning on tool conversations, loss on the model's own tokens only (the paper's non-reasoning SFT)."""
    from transformers import AutoTokenizer

    from rstar.rl.sft.train import SFTConfig, SFTSpec, train_sft
    from rstar.rl.sft.encoding import ConversationError, encode_conversation, read_conversations
    from rstar.server.chat_template import choose_template
    from rstar.server.model_store import ModelNotFound, resolve_model

    settings = load_settings()
    overrides = {"epochs": epochs, "learning_rate": lr, "examples_per_step": batch, "seed": seed}
    if lora_rank is not None:
        overrides["lora_rank"] = lora_rank or None
    config = SFTConfig(**{k: v for k, v in overrides.items() if v is not None or k == "lora_rank"})
    try:
        resolved = resolve_model(model, settings.models_dir)
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        template = choose_template(tokenizer, resolved.name, chat_template)
        examples = []
        for where, messages, tools in read_conversations(data):
            try:
                examples.append(encode_conversation(template, messages, tools))
            except ConversationError as exc:
                raise ConversationError(f"{where}: {exc}") from None
    except (ModelNotFound, ConversationError, OSError) as exc:
        raise _fail(str(exc)) from None
    run_id = _run_id(run_id, "sft")
    spec = SFTSpec(run_id=run_id, run_dir=settings.data_dir / "rl_runs" / run_id, model_dir=Path(resolved.path), data=str(data))
    console.print(f"sft run [bold]{run_id}[/bold]: {len(examples)} conversations, {resolved.name}, {'LoRA rank ' + str(config.lora_rank) if config.lora_rank else 'full fine-tune'}; run dir {spec.run_dir}", highlight=False)
    _interrupt_on_sigterm()
    with _progress() as bars:
        task = bars.add_task("sft", total=None, summary="")
        status = train_sft(spec, config, examples, _store(settings), lambda step, total, m: bars.update(task, completed=step, total=total, summary=_summary(m)))
    typer.echo(f"{status}: model in {spec.run_dir / 'final'}" + (f", delta {spec.run_dir / 'delta.safetensors'}" if config.lora_rank else ""))


@app.command("train")
def train_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe name (see `rstar rl recipes`) or a TOML file.")],
    data: Annotated[str, typer.Option(help="Problems with answers: a JSONL file or a Hugging Face dataset id.")],
    run_id: Annotated[Optional[str], typer.Option(help="Run id (default: grpo-<time>); an unfinished run with this id resumes.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model to train. [env: RSTAR_MODEL]")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config value for every stage: --set prompts_per_step=4")] = None,
    ray_address: Annotated[Optional[str], typer.Option(help="Run tool calls and answer checks on sandbox pools of this Ray cluster ('auto', 'ray://host:10001'), "
                                                          "and trainer ranks 1..N-1 (--trainer-ranks N) as its actors, one GPU (on CPU one core) each.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Stop the recipe after this many steps in all (a trial run).")] = None,
    trainer_ranks: Annotated[Optional[int], typer.Option(min=1, help="Trainer processes, the policy sharded across them (FSDP2): one per GPU, or per core on CPU.")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(min=0, help="Train a LoRA adapter of this rank on the frozen base and sync only it (0: full fine-tuning).")] = None,
) -> None:
    """GRPO-RoC on a recipe's stages, with rollouts on an engine and sandbox started in this process."""
    from rstar.rl.data import DataError, load_problems
    from rstar.rl.grpo.distributed import check_world_size
    from rstar.rl.grpo.recipe import RecipeError, load_recipe

    settings = load_settings(model=model, sandbox={"ray_address": ray_address} if ray_address else None)
    try:
        overrides = dict(_parse_setting(item) for item in set_ or [])
        if trainer_ranks is not None:
            overrides["trainer_ranks"] = trainer_ranks
        if lora_rank is not None:
            overrides["lora_rank"] = lora_rank
        loaded = load_recipe(recipe, overrides)
        if max_steps is not None:
            loaded = loaded.truncated(max_steps)
        if ray_address is None:  # on Ray, the cluster's room is checked as the ranks are placed
            check_world_size(loaded.stage_config(0).trainer_ranks)
        problems = load_problems(data)
    except (RecipeError, DataError, ValueError) as exc:
        raise _fail(str(exc)) from None
    run_id = _run_id(run_id, "grpo")
    _interrupt_on_sigterm()
    from rstar.rl.grpo.ray_ranks import NoRoomForRanks
    from rstar.rl.grpo.train import RecipeDoesNotFit

    try:
        status = asyncio.run(_train_in_process(settings, loaded, problems, data, run_id, ray_address))
    except (RecipeDoesNotFit, NoRoomForRanks) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"run {run_id}: {status}")


def _parse_setting(item: str) -> tuple[str, object]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"--set {item!r}: expected key=value")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


async def _train_in_process(settings: Settings, recipe, problems, data: str, run_id: str, ray_address: str | None) -> str:
    from transformers import AutoTokenizer

    from rstar.evals.budget import model_window_limit
    from rstar.rl.grpo.ray_ranks import RayPlacement
    from rstar.rl.grpo.rollout import RolloutEnv
    from rstar.rl.grpo.train import RunSpec, check_window, engine_lora_rank, prompt_lengths, train_grpo, window_needed
    from rstar.sandbox.clients import connect
    from rstar.server.chat_template import choose_template
    from rstar.server.model_store import resolve_model
    from rstar.server.ray_replicas import start_engine

    resolved = resolve_model(settings.model, settings.models_dir)
    # The engine's window fits the longest prompt and the largest stage budget, or the run stops here.
    lengths = prompt_lengths(choose_template(AutoTokenizer.from_pretrained(resolved.path), resolved.name, settings.api.chat_template), problems)
    limit = model_window_limit(resolved.path) or settings.engine.max_model_len
    check_window(recipe, lengths, limit, f"{resolved.name}'s longest supported context (max_position_embeddings)")
    engine_settings = settings.engine.model_copy(update={
        "max_model_len": max(settings.engine.max_model_len, window_needed(recipe, lengths)),
        "max_lora_rank": max(settings.engine.max_lora_rank, engine_lora_rank(recipe.stage_config(0).lora_rank)),
        # Where vLLM has sleep mode the engine sleeps during updates (sleep_engine); elsewhere it starts without it.
        "sleep_mode": settings.engine.sleep_mode or recipe.stage_config(0).sleep_engine,
    })
    console.print(f"starting the engine on {resolved.path} with a {engine_settings.max_model_len}-token window (on CPU about a minute, a first compiled start several)", highlight=False)
    # With RSTAR_ENGINE__REPLICAS > 1 rollouts go through the same router as the API's traffic.
    engine = await start_engine(resolved.path, engine_settings, served_model_name=resolved.name, cache_dir=settings.cache_dir)
    try:
        async with connect(settings.sandbox, url=settings.api.sandbox_url, ray=ray_address is not None) as sandbox:
            env = RolloutEnv(engine, choose_template(engine.tokenizer, resolved.name, settings.api.chat_template), sandbox)
            placement = RayPlacement(ray_address) if ray_address is not None else None
            spec = RunSpec(run_id, settings.data_dir / "rl_runs" / run_id, recipe, Path(resolved.path), data, engine.dtype, placement)
            console.print(f"grpo run [bold]{run_id}[/bold]: recipe {recipe.name}, {len(problems)} problems, {recipe.total_steps} steps; run dir {spec.run_dir}", highlight=False)
            with _progress() as bars:
                task = bars.add_task("grpo", total=recipe.total_steps, summary="")
                return await train_grpo(env, spec, problems, _store(settings), lambda step, total, m: bars.update(task, completed=step, summary=_summary(m)), lengths)
    finally:
        await engine.shutdown()


@app.command("merge-lora")
def merge_lora_command(
    adapter: Annotated[Path, typer.Argument(help="A LoRA run's checkpoint (adapter_config.json + adapter_model.safetensors).")],
    out: Annotated[Path, typer.Option(help="Where the merged model goes; `rstar serve --model OUT` then serves it.")],
    base: Annotated[Optional[str], typer.Option(help="The base model (default: the one adapter_config.json names).")] = None,
) -> None:
    """Merge a LoRA checkpoint onto its base: a whole model the engine, `rstar serve` and `rstar eval run` load."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rstar.rl.policy import copy_tokenizer_files

    config_file = adapter / "adapter_config.json"
    if not config_file.is_file():
        raise _fail(f"{adapter} has no adapter_config.json: not a LoRA checkpoint")
    base_dir = Path(base or json.loads(config_file.read_text())["base_model_name_or_path"])
    if not (base_dir / "config.json").is_file():
        raise _fail(f"the adapter's base {base_dir} is not a model directory here: pass --base DIR")
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(out)
    copy_tokenizer_files(base_dir, out)
    typer.echo(f"merged {adapter} onto {base_dir}: {out}")


@app.command("plan")
def plan_command(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="A model directory, an embedded name, a built-in shape (qwen2.5-1.5b, qwen2.5-7b, rstar2-agent-14b) or a hub id. [env: RSTAR_MODEL]")] = None,
    trainer_ranks: Annotated[int, typer.Option(min=1, help="Trainer ranks the policy is sharded across (FSDP2).")] = 1,
    lora_rank: Annotated[int, typer.Option(min=0, help="LoRA rank to plan for; 0: full fine-tune.")] = 0,
    recipe: Annotated[str, typer.Option(help="Recipe whose lengths size the activations: a shipped name or a TOML file.")] = "paper",
    device_memory_gb: Annotated[Optional[float], typer.Option(min=0.001, help="Plan for devices of this much memory, one per rank, instead of the ones found here.")] = None,
) -> None:
    """What each trainer rank would hold (weights, gradients, AdamW, activations) and whether it fits the devices."""
    from rstar.rl.grpo.recipe import RecipeError, load_recipe
    from rstar.rl.plan import GB, Devices, devices_here, plan_rank, problem, recipe_lengths, shape_from_config
    from rstar.rl.policy import resolve_compute_dtype

    settings = load_settings(model=model)
    try:
        loaded = load_recipe(recipe)
        config, source = _model_config(settings.model, settings.models_dir)
        shape = shape_from_config(config)
    except (RecipeError, ValueError, KeyError) as exc:
        raise _fail(f"--model {settings.model}: {exc}" if isinstance(exc, KeyError) else str(exc)) from None
    devices = Devices("named", trainer_ranks, int(device_memory_gb * GB), False) if device_memory_gb else devices_here()
    stages = [loaded.stage_config(i) for i in range(len(loaded.stages))]
    # Activations in the dtype the trainer would compute in there: bf16 on GPUs, this CPU's fastest here.
    dtype = "bfloat16" if devices.kind != "cpu" else resolve_compute_dtype(stages[0].compute_dtype)[0]
    lengths = recipe_lengths(shape, stages, 2 if dtype == "bfloat16" else 4)
    plan = plan_rank(shape, trainer_ranks, lengths, lora_rank)

    kind = f"LoRA rank {lora_rank}" if lora_rank else "full fine-tune"
    typer.echo(f"{settings.model} ({source}): {plan.parameters:,} parameters, {plan.trainable:,} trained ({kind}), on {trainer_ranks} rank{'s' if trainer_ranks > 1 else ''}")
    typer.echo(f"recipe {loaded.name}: rows of {lengths.row_tokens:,} tokens (prompt {lengths.prompt_tokens:,} + response {lengths.response_tokens:,}, token_budget "
               f"{lengths.token_budget:,}), gradient checkpointing {'on' if lengths.gradient_checkpointing else 'off'}, activations in {dtype}")
    per = f"/ {trainer_ranks}" if trainer_ranks > 1 else ""
    table = Table(title="each rank holds")
    for column in ("what", "GB", "how"):
        table.add_column(column, overflow="fold")
    weight_how = f"({plan.parameters:,} frozen + {plan.trainable:,}) x 4 B" if lora_rank else f"{plan.parameters:,} x 4 B (fp32 master weights)"
    rows = [
        ("weights", plan.weights, f"{weight_how} {per}"),
        ("gradients", plan.gradients, f"{plan.trainable:,} x 4 B (fp32) {per}"),
        ("AdamW states", plan.optimizer, f"{plan.trainable:,} x 8 B (two fp32 moments) {per}"),
        ("gathered while computing", plan.gathered, "root + 2 layers at full size, with their gradients" if trainer_ranks > 1 else "none: one rank holds everything already"),
        ("activations", plan.activations, f"one row of {lengths.row_tokens:,} tokens (rl/plan.py: activation_bytes)"),
        ("total", plan.total, "per rank"),
    ]
    for what, size, how in rows:
        table.add_row(what, f"{size / GB:.2f}", how)
    Console().print(table)
    if plan.host_extra:
        what = "the adapter" if lora_rank else "the full weights"
        typer.echo(f"rank 0 also gathers {what} into host memory for each weight sync: {plan.host_extra / GB:.2f} GB")
    why_not = problem(shape, trainer_ranks, lengths, lora_rank, devices)
    if why_not is not None:
        raise _fail(why_not)
    found = {"cuda": "GPUs found", "cpu": "CPU cores found, sharing their RAM", "named": "devices named"}[devices.kind]
    typer.echo(f"fits: {devices.count} x {devices.memory / GB:.1f} GB ({found}); the rollout engine's memory is not counted")


def _model_config(spec: str, models_dir: Path) -> tuple[dict, str]:
    """config.json of a model on disk (or in the hub cache), else a built-in shape; where it came from."""
    from rstar.rl.plan import KNOWN_CONFIGS
    from rstar.server.model_store import ModelNotFound, resolve_model

    local = Path(spec).expanduser() / "config.json"
    if local.is_file():
        return json.loads(local.read_text()), str(local)
    if spec.lower() in KNOWN_CONFIGS:
        return KNOWN_CONFIGS[spec.lower()], "built-in shape"
    try:
        resolved = resolve_model(spec, models_dir, pull=False)
    except ModelNotFound as exc:
        raise ValueError(f"{exc}; built-in shapes: {', '.join(sorted(KNOWN_CONFIGS))}") from None
    if resolved.source == "huggingface":
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(spec, "config.json")).read_text()), f"hub {spec}"
    path = Path(resolved.path) / "config.json"
    return json.loads(path.read_text()), str(path)


@app.command("recipes")
def recipes_command() -> None:
    """The shipped recipes and their stages."""
    from rstar.rl.grpo.recipe import load_recipe, shipped_recipes

    table = Table()
    for column in ("recipe", "stage", "steps", "max tokens", "max turns", "filter", "description"):
        table.add_column(column, overflow="fold")
    for name in shipped_recipes():
        recipe = load_recipe(name)
        for index, stage in enumerate(recipe.stages):
            config = recipe.stage_config(index)
            table.add_row(name if index == 0 else "", stage.name, str(stage.steps), str(config.max_response_tokens), str(config.max_turns), stage.filter, recipe.description if index == 0 else "")
    Console().print(table)


@app.command("list")
def list_command() -> None:
    """Runs, newest first."""
    table = Table()
    for column in ("run", "kind", "status", "step", "model", "updated"):
        table.add_column(column, overflow="fold")
    for run in _store(load_settings()).list():
        table.add_row(run["id"], run["kind"], run["status"], f"{run['step']}/{run['total_steps']}", run["model"], run["updated_at"][:19])
    Console().print(table)


@app.command("status")
def status_command(run_id: Annotated[str, typer.Argument()], json_: Annotated[bool, typer.Option("--json", help="Everything, as JSON.")] = False) -> None:
    """One run: where it stands, its last step's metrics, its checkpoints."""
    from rstar.rl.runs import UnknownRun

    try:
        run = _store(load_settings()).get(run_id)
    except UnknownRun:
        raise _fail(f"no run {run_id!r}") from None
    if json_:
        typer.echo(json.dumps(run, indent=1))
        return
    last = run["steps"][-1] if run["steps"] else {}
    typer.echo(f"{run['id']} ({run['kind']}): {run['status']}, step {run['step']}/{run['total_steps']}, run dir {run['run_dir']}")
    if run["error"]:
        typer.echo(f"error: {run['error']}")
    if last:
        typer.echo("last step: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items() if k not in ("created_at",)))
    for checkpoint in run["checkpoints"]:
        typer.echo(f"checkpoint {checkpoint['step']}: {checkpoint['path']}")


@app.command("stop")
def stop_command(run_id: Annotated[str, typer.Argument()]) -> None:
    """Ask a run to stop after its current step (it can be resumed later with the same command)."""
    from rstar.rl.runs import UnknownRun

    try:
        run = _store(load_settings()).request_cancel(run_id)
    except UnknownRun:
        raise _fail(f"no run {run_id!r}") from None
    typer.echo(f"{run_id}: {run['status']}" + (" (stops after the current step)" if run["status"] == "running" else ""))
