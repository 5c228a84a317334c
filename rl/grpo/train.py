"""The GRPO-RoC training loop. Each step, in the released order:

    rollout (the serving engine, all samples at once) -> reward (sandbox) -> reject-equal + RoC
    -> GRPO advantages on the kept samples -> one token-mean PPO-clip update (the engine asleep, where it can
    sleep: colocate.py) -> weight sync + probe -> metrics to the database -> checkpoint

A run resumes from its last checkpoint when started again with the same run id (after a crash or kill -9):
steps after that checkpoint are forgotten and redone with the same problems and sampling seeds, so nothing
is counted twice. `rstar rl stop` (or the API's cancel) takes effect between steps.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from rstar.rl.checkpoint import TrainerState, latest_checkpoint, prune_checkpoints, read_state, write_checkpoint
from rstar.rl.data import Problem
from rstar.rl.grpo.colocate import EngineSleep
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.downsample import Selection, downsample
from rstar.rl.grpo.ranks import TrainerRanks
from rstar.rl.grpo.ray_ranks import RayPlacement
from rstar.rl.grpo.recipe import Recipe
from rstar.rl.grpo.rollout import TOOLS, RolloutEnv, generate, prompt_messages, reward
from rstar.rl.grpo.samples import Sample, is_tool_error
from rstar.rl.grpo.trainer import GRPOTrainer, training_trees
from rstar.rl.grpo.weight_sync import WeightSync, WeightSyncFailed
from rstar.rl.plots import plot_run
from rstar.rl.policy import Policy, model_identity, resolve_compute_dtype
from rstar.rl.runs import RunStore
from rstar.server.chat_template import ChatTemplate

Progress = Callable[[int, int, dict], None]


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    run_dir: Path
    recipe: Recipe
    model_dir: Path  # what the engine serves and the trainer starts from
    data: str  # where the problems came from, for the record
    engine_dtype: str  # the engine's weights dtype: what weight sync writes, and the probe's tolerance
    trainer_placement: RayPlacement | None = None  # trainer ranks 1..N-1 as Ray actors; None: processes on this machine


def data_order(count: int, seed: int, cursor: int, take: int) -> list[int]:
    """Problem indices `cursor .. cursor + take` of the run's order: each pass over the data is a fresh
    seeded shuffle, so the order is a pure function of (seed, cursor) and a resumed run sees what it would have."""
    indices = []
    for position in range(cursor, cursor + take):
        epoch, offset = divmod(position, count)
        permutation = list(range(count))
        random.Random(f"{seed}/epoch/{epoch}").shuffle(permutation)
        indices.append(permutation[offset])
    return indices


def prompt_lengths(template: ChatTemplate, problems: list[Problem]) -> list[int]:
    """Each problem's rendered prompt, in tokens, as rollouts send it."""
    return [len(template.encode(prompt_messages(p), TOOLS)) for p in problems]


class RecipeDoesNotFit(ValueError):
    """A recipe whose longest prompt and largest response budget do not fit the context window."""


def window_needed(recipe: Recipe, prompt_tokens: list[int]) -> int:
    """The context window a run needs: the longest prompt that stays (those over max_prompt_tokens are left out,
    as released) plus the largest stage budget. Less, and the loop would cut every budget at the window: a 12K
    stage would quietly train at the window's length."""
    kept = [n for n in prompt_tokens if n <= recipe.stage_config(0).max_prompt_tokens]
    return max(kept, default=0) + recipe.max_response_tokens


def check_window(recipe: Recipe, prompt_tokens: list[int], window: int, window_source: str) -> None:
    """RecipeDoesNotFit naming both numbers when the run needs more than `window`."""
    needed = window_needed(recipe, prompt_tokens)
    if needed > window:
        raise RecipeDoesNotFit(
            f"recipe {recipe.name!r} needs a {needed}-token window (longest prompt {needed - recipe.max_response_tokens} + max_response_tokens "
            f"{recipe.max_response_tokens}), over {window_source} of {window}; lower max_response_tokens or max_prompt_tokens, or use a model with a longer context")


# The ranks vLLM's LoRA engine takes (max_lora_rank); an adapter of a rank between them is padded up.
ENGINE_LORA_RANKS = (8, 16, 32, 64, 128, 256)


def engine_lora_rank(lora_rank: int) -> int:
    """The engine's max_lora_rank for a run training adapters of `lora_rank` (0: no LoRA)."""
    return next(r for r in ENGINE_LORA_RANKS if r >= lora_rank) if lora_rank else 0


PROBE_PROMPT_TOKENS = 192


def probe_ids(env: RolloutEnv, problem: Problem) -> list[int]:
    """A fixed sequence for the weight-sync probe: the end of a rendered problem and a short tool-using
    answer. Long enough that a bf16 engine's scatter leaves the slope check sure (with 48 prompt tokens its
    slopes spread 0.55-1.32 about a mean of 0.98), short because the engine pays a full-vocabulary logprob
    per prompt token (the whole 450-token prompt took 0.8 s)."""
    prompt = env.template.encode(prompt_messages(problem), TOOLS)[-PROBE_PROMPT_TOKENS:]
    answer = env.template.encode_text("I will compute this with Python, then check the result.\n</reason>\n<answer>\n\\boxed{42}\n</answer>")
    return prompt + answer


def probe_tolerance(config: GRPOConfig, trainer_dtype: str, engine_dtype: str) -> float:
    # Measured on SmolLM2-135M: fp32 engine vs fp32 trainer 1e-5 mean; any bf16 side 0.03-0.06 mean;
    # a stale or half-loaded weight set 0.02-0.1 on top of that.
    if config.probe_tolerance is not None:
        return config.probe_tolerance
    return 1e-3 if trainer_dtype == engine_dtype == "float32" else 0.15


async def train_grpo(env: RolloutEnv, spec: RunSpec, problems: list[Problem], store: RunStore, progress: Progress = lambda step, total, metrics: None,
                     prompt_tokens: list[int] | None = None) -> str:
    """Run (or resume) a recipe to its end; returns the final status: finished or cancelled. `prompt_tokens`:
    each problem's `prompt_lengths`, when the caller counted them already (to size or check the window)."""
    recipe = spec.recipe
    first = recipe.stage_config(0)
    # Thousands of renders: off the event loop, which may be serving the API.
    lengths = prompt_tokens if prompt_tokens is not None else await asyncio.to_thread(prompt_lengths, env.template, problems)
    check_window(recipe, lengths, env.engine.max_model_len, "the engine's context window")
    problems = [p for p, n in zip(problems, lengths) if n <= first.max_prompt_tokens]  # the release filters overlong prompts
    if not problems:
        raise ValueError(f"no problem in {spec.data} fits max_prompt_tokens={first.max_prompt_tokens}")
    store.begin(spec.run_id, "grpo", str(spec.model_dir), recipe.model_dump(), spec.data, str(spec.run_dir), recipe.total_steps)
    with store.failed_on_error(spec.run_id):
        status = await _train(env, spec, problems, store, progress)
    store.finish(spec.run_id, status)
    return status


async def _train(env: RolloutEnv, spec: RunSpec, problems: list[Problem], store: RunStore, progress: Progress) -> str:
    recipe = spec.recipe
    config = recipe.stage_config(0)
    dtype, _ = resolve_compute_dtype(config.compute_dtype)
    checkpoint = latest_checkpoint(spec.run_dir)
    if config.trainer_ranks > 1:
        trainer = TrainerRanks(spec.model_dir, dtype, config, config.trainer_ranks, spec.trainer_placement)
    else:
        torch.manual_seed(config.seed)  # LoRA's A factors start random: seeded, so a rerun trains the same adapter
        trainer = GRPOTrainer(Policy(spec.model_dir, dtype, lora=config.lora(), gradient_checkpointing=config.gradient_checkpointing), config)
    policy = trainer.policy
    identity = model_identity(spec.model_dir)
    rng = random.Random(f"{config.seed}/roc")
    state = TrainerState(step=0, data_cursor=0, model_identity=identity)
    stage_problems: list[Problem] = problems

    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if checkpoint is not None:
        try:
            state = read_state(checkpoint, identity)
            trainer.load_training_state(checkpoint)  # written on any number of ranks
        except BaseException:
            if isinstance(trainer, TrainerRanks):  # a refused checkpoint must not leave the other ranks waiting
                trainer.close()
            raise
        rng.setstate(_tuple_state(state.rng["roc"]))
        torch.set_rng_state(torch.tensor(state.rng["torch"], dtype=torch.uint8))
        by_id = {p.id: p for p in problems}
        stage_problems = [by_id[i] for i in state.extra.get("stage_problems", [])] or problems
    store.forget_steps_after(spec.run_id, state.step)

    # All torch work on one thread: glibc gives every thread its own memory arenas, and updates hopping across
    # the default executor's threads grew the process from 5 to 10 GiB in three steps (measured by rl_bench).
    torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rstar-trainer")
    sync = WeightSync(env.engine, policy, probe_ids(env, problems[0]), probe_tolerance(config, dtype, spec.engine_dtype), spec.engine_dtype, torch_thread)
    engine_sleep = EngineSleep(env.engine, config.sleep_engine)
    try:
        if checkpoint is not None or env.engine.weight_version > 0:
            await sync.sync()  # the engine must serve the weights this run continues from
        for step in range(state.step, recipe.total_steps):
            if store.cancel_requested(spec.run_id):
                return "cancelled"
            stage_index, in_stage = recipe.locate(step)
            stage, config = recipe.stages[stage_index], recipe.stage_config(stage_index)
            if in_stage == 0:
                if stage.reset_optimizer and step > 0:
                    trainer.reset_optimizer(config)
                # The data cursor runs on across stages: a stage does not replay the order the last one began with.
                stage_problems = await stage_data(env, stage, config, problems, state, step)
            metrics = await run_step(env, trainer, sync, config, stage_problems, state, rng, step, torch_thread, engine_sleep)
            state.step = step + 1
            state.data_cursor += config.prompts_per_step
            store.record_step(spec.run_id, state.step, stage.name, metrics)
            if state.step % config.save_every == 0 or state.step == recipe.total_steps:
                # Off the event loop: a server-hosted run keeps answering while 1.6 GB are written.
                await asyncio.get_running_loop().run_in_executor(torch_thread, save, spec, store, policy, trainer, state, rng, stage_problems, config.keep_checkpoints)
            await asyncio.to_thread(plot_run, store.get(spec.run_id)["steps"], spec.run_dir / "curves.png", spec.run_id)
            progress(state.step, recipe.total_steps, metrics)
        return "finished"
    finally:
        sync.close()
        if isinstance(trainer, TrainerRanks):
            await asyncio.get_running_loop().run_in_executor(torch_thread, trainer.close)  # collectives stay on the torch thread
        torch_thread.shutdown()


async def stage_data(env: RolloutEnv, stage, config: GRPOConfig, problems: list[Problem], state: TrainerState, step: int) -> list[Problem]:
    """The stage's problems: all of them, or (filter 'unsolved') those the current policy does not solve k/k."""
    if stage.filter == "none":
        return problems
    candidates = problems
    if stage.filter_max_problems is not None and stage.filter_max_problems < len(problems):
        candidates = random.Random(f"{config.seed}/filter/{step}").sample(problems, stage.filter_max_problems)
    groups = await generate(env, candidates, stage.filter_samples, config, config.seed, -1 - step)
    graded = await reward(env, candidates, groups, config.reward_timeout_s, config.reward)
    kept = [problem for problem, samples in zip(candidates, graded) if sum(s.reward for s in samples) < len(samples)]
    if not kept:
        raise ValueError(f"stage {stage.name!r}: the policy solves every judged problem {stage.filter_samples}/{stage.filter_samples}; nothing left to train on")
    return kept


async def run_step(
    env: RolloutEnv, trainer: GRPOTrainer, sync: WeightSync, config: GRPOConfig, problems: list[Problem], state: TrainerState, rng: random.Random, step: int,
    torch_thread: Executor, engine_sleep: EngineSleep,
) -> dict:
    started = time.perf_counter()
    batch = [problems[i] for i in data_order(len(problems), config.seed, state.data_cursor, config.prompts_per_step)]
    groups = await generate(env, batch, config.rollouts_per_prompt, config, config.seed, step)
    generated = time.perf_counter()
    samples = await reward(env, batch, groups, config.reward_timeout_s, config.reward)
    rewarded = time.perf_counter()
    tokenizer = env.template.tokenizer
    traces = [[sample.trace(tokenizer) for sample in group] for group in samples]
    selection = downsample(traces, config.downsample, config.keep_per_prompt, rng, config.min_positive_traces, config.min_negative_traces)
    kept = selection.pick(samples)
    trees = training_trees(kept)
    measured = {
        **rollout_metrics(samples, selection, kept),
        "rollout_s": generated - started,
        "reward_s": rewarded - generated,
        "generated_tokens": sum(s.trajectory.num_sampled_tokens for group in samples for s in group),
    }
    if not trees:  # every group all right or all wrong: no advantage anywhere, nothing to learn or sync
        return {**measured, "trained": False, "weight_version": env.engine.weight_version, "step_s": time.perf_counter() - started}
    async with engine_sleep.asleep():  # awake again before the sync below loads into it
        train_stats = await asyncio.get_running_loop().run_in_executor(torch_thread, trainer.update, trees, config)
    trained = time.perf_counter()
    if config.max_logprob_gap is not None and train_stats["logprob_gap"] > config.max_logprob_gap:
        raise WeightSyncFailed(
            f"step {step + 1}: the rollouts' logprobs differ from the trainer's by {train_stats['logprob_gap']:.4f} on average over the sampled tokens "
            f"(max_logprob_gap {config.max_logprob_gap}): the engine did not sample from the policy being trained"
        )
    report = await sync.sync()
    return {
        **measured,
        **train_stats,
        "trained": True,
        "train_s": trained - rewarded,
        "weight_version": report.weight_version,
        "probe_gap": report.probe_gap,
        "probe_change": report.probe_change,
        "probe_followed": report.probe_followed,
        "probe_followed_error": report.probe_followed_error,
        "probe_replicas": report.probe_replicas,
        "sync_write_s": report.write_s,
        "sync_reload_s": report.reload_s,
        "sync_s": report.seconds,
        "step_s": time.perf_counter() - started,
    }


def rollout_metrics(groups: list[list[Sample]], selection: Selection, kept_groups: list[list[Sample]]) -> dict:
    samples = [s for group in groups for s in group]
    kept = [s for group in kept_groups for s in group]
    positives = [s for s in kept if s.reward > 0]
    negatives = [s for s in kept if s.reward <= 0]

    def error_rate(chosen: list[Sample]) -> float | None:
        calls = [call for s in chosen for call in s.trajectory.tool_calls]
        return sum(is_tool_error(call) for call in calls) / len(calls) if calls else None

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return {
        "reward_mean": mean([s.reward for s in samples]),
        "solve_rate": mean([float(any(s.reward > 0 for s in group)) for group in groups]),
        "kept_reward_mean": mean([s.reward for s in kept]),
        "groups": selection.groups_in,
        "groups_dropped_equal": selection.groups_dropped_equal,
        "groups_dropped_small": selection.groups_dropped_small,
        "groups_kept": len(selection.kept),
        "traces_kept": selection.traces_kept,
        "positives_kept": selection.positives_kept,
        "negatives_kept": selection.negatives_kept,
        "response_tokens_mean": mean([len(s.trajectory.response_ids) for s in samples]),
        "sampled_tokens_mean": mean([s.trajectory.num_sampled_tokens for s in samples]),
        "turns_mean": mean([len(s.trajectory.turns) for s in samples]),
        "tool_calls_mean": mean([len(s.trajectory.tool_calls) for s in samples]),
        "tool_call_rate": mean([float(bool(s.trajectory.tool_calls)) for s in samples]),
        "tool_error_rate": error_rate(samples),
        # The paper's measure of what RoC does to the policy: errors among every correct rollout, before selection.
        "tool_error_rate_positive": error_rate([s for s in samples if s.reward > 0]),
        # Among the samples selection kept: RoC picks positives for their low error penalty, so this is low by design.
        "tool_error_rate_kept_positive": error_rate(positives),
        "tool_error_rate_kept_negative": error_rate(negatives),
        "stop_reasons": dict(Counter(s.trajectory.stop_reason or "none" for s in samples)),
        "grader_failures": sum(s.grade_status != "ok" for s in samples),
    }


def save(spec: RunSpec, store: RunStore, policy: Policy, trainer: GRPOTrainer, state: TrainerState, rng: random.Random, stage_problems: list[Problem], keep: int) -> None:
    state.rng = {"roc": rng.getstate(), "torch": torch.get_rng_state().tolist()}
    state.extra["stage_problems"] = [p.id for p in stage_problems]
    # A LoRA run's checkpoint holds its adapter (peft's files, on its base), not the merged model.
    write_model = policy.save_adapter if getattr(policy, "lora", None) is not None else policy.save_pretrained
    path = write_checkpoint(spec.run_dir, state, write_model, trainer.save_training_state)
    removed = prune_checkpoints(spec.run_dir, keep)
    store.record_checkpoint(spec.run_id, state.step, str(path), [str(p) for p in removed])


def _tuple_state(value) -> tuple:
    """random.Random's state after a JSON round trip (lists back to tuples)."""
    return tuple(_tuple_state(v) if isinstance(v, list) else v for v in value)
