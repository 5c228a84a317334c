"""GRPO step time: rstar.rl (vLLM rollouts, packed bf16/fp32 trainer, in-place weight sync) vs TRL's
GRPOTrainer, on the same model, data, group size, lengths and dtype policy, in one run.

Workload (the TRL anchor's, `../shared/reference/trl_anchor.md`): the base SmolLM2-135M-Instruct, chat
prompts "What is A + B? Answer with the number." (A, B in 1..99), 8 prompts x 4 completions per step, at
most 64 completion tokens, temperature 1, lr 1e-6, plain GRPO (no tool, every group trains). Each side
runs with its own defaults otherwise: TRL as GRPOConfig ships it (bf16 autocast over fp32 weights,
gradient checkpointing on, HF `generate`), ours with `compute_dtype="auto"` and engine dtype "auto" (both
follow the hardware: bf16 where the CPU has AVX512_BF16/AMX, else fp32) and the project's engine settings.

TRL runs in a subprocess (`trl_grpo_step.py`) in its own environment, never in the project's: a venv under
the user cache (`~/.cache/rstar/bench/trl-1.16.0`) that reuses this venv's torch/transformers/datasets
through a .pth file and adds `trl==1.16.0` with `--no-deps`. The benchmark creates it on first use (pip
needs the network once). To make it by hand:

    python -m venv --without-pip ~/.cache/rstar/bench/trl-1.16.0
    echo "import site; site.addsitedir('$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')')" \\
        > ~/.cache/rstar/bench/trl-1.16.0/lib/python3.11/site-packages/_rstar_venv.pth
    .venv/bin/python -m pip --python ~/.cache/rstar/bench/trl-1.16.0/bin/python install --no-deps trl==1.16.0

Without TRL (or with `--no-trl`) our side still runs and the step-time goal is reported as null.

Order, never both at once: TRL's process starts first and loads its model while our engine starts, then
waits. Our side runs: one warm-up step and the measured steps (`rstar.rl.grpo.train.run_step`: rollout, reward,
update, weight sync + probe), then rollout tokens/s against the engine's own rate on the same batch (same
prompt ids, n, max tokens, temperature and seeds; alternating rounds), then weight sync
(`WeightSync.sync()`: safetensors into /dev/shm + in-place reload) timed directly. The engine is then shut
down and our trainer freed, and TRL runs its warm-up step and its measured steps. (Alternating the two
sides step by step needs both resident at once: about 23 GiB here, which ran this 23 GiB machine out of
memory.)

    python benchmarks/rl_bench.py [--quick] [--out FILE.json] [--no-trl] [--trl-python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from goals import goal, run_header, write_report

HERE = Path(__file__).resolve().parent
TRL_VERSION = "1.16.0"
MARK = "@@rl_bench "
PROMPT = "What is {a} + {b}? Answer with the number."
MODEL = "smollm2-135m-instruct"  # the embedded base, untuned (the TRL anchor's model)


# --------------------------------------------------------------------------------------------- data


def make_problems(count: int = 512, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    problems = []
    for index in range(count):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        problems.append({"id": f"add-{index}", "problem": PROMPT.format(a=a, b=b), "answer": str(a + b)})
    return problems


# --------------------------------------------------------------------------------------------- TRL side


def trl_venv_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("rstar")) / "bench" / f"trl-{TRL_VERSION}"


def trl_version_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('trl'))"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def ensure_trl(explicit: str | None) -> tuple[str | None, str]:
    """A Python that imports trl==TRL_VERSION (creating the benchmark's venv if needed), and how it was found."""
    if explicit:
        version = trl_version_of(explicit)
        return (explicit, f"--trl-python {explicit} (trl {version})") if version else (None, f"--trl-python {explicit} does not import trl")
    if trl_version_of(sys.executable) == TRL_VERSION:
        return sys.executable, "trl installed in this environment"
    venv = trl_venv_dir()
    python = venv / "bin" / "python"
    if python.exists() and trl_version_of(str(python)) == TRL_VERSION:
        return str(python), f"benchmark venv {venv}"
    print(f"TRL {TRL_VERSION} not found; creating the benchmark's own venv at {venv} (reuses this venv's packages, adds trl --no-deps)", flush=True)
    try:
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)], check=True)
        site_packages = next(venv.glob("lib/python*/site-packages"))
        import site

        ours = site.getsitepackages()[0]
        (site_packages / "_rstar_venv.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", f"trl=={TRL_VERSION}"], check=True, timeout=600)
    except (OSError, subprocess.SubprocessError, StopIteration) as exc:
        print(f"could not install TRL ({exc}); running our side only. Install it by hand as this script's docstring says.", flush=True)
        return None, f"install failed: {exc}"
    if trl_version_of(str(python)) != TRL_VERSION:
        return None, "installed, but trl does not import there"
    return str(python), f"benchmark venv {venv} (created by this run)"


class TrlRunner:
    """`trl_grpo_step.py` in its own process; `step()` lets it run exactly one step and returns its figures."""

    def __init__(self, python: str, model_dir: str, problems_file: Path, steps: int, threads: int, log_file: Path):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.log = open(log_file, "w", encoding="utf-8")
        command = [python, str(HERE / "trl_grpo_step.py"), "--model", model_dir, "--problems", str(problems_file), "--steps", str(steps), "--threads", str(threads)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.events: queue.Queue = queue.Queue()
        self.steps: list[dict] = []
        self.config: dict = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith(MARK):
                self.events.put(json.loads(line[len(MARK):]))
            else:
                self.log.write(line)
        self.events.put({"event": "exited"})

    def wait_for(self, *names: str, timeout: float = 1800) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"TRL sent none of {names} within {timeout:.0f} s") from None
            if event["event"] == "config":
                self.config = event
            if event["event"] == "step":
                self.steps.append(event)
            if event["event"] in names:
                return event
            if event["event"] == "exited":
                raise RuntimeError(f"TRL's process exited (code {self.process.wait()}); see {self.log.name}")

    def step(self) -> dict:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        event = self.wait_for("step")
        return event

    def close(self, timeout: float = 120) -> None:
        try:
            if self.process.poll() is None and self.process.stdin:
                try:
                    self.process.stdin.close()  # a waiting TRL reads EOF and stops
                except BrokenPipeError:
                    pass
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self.reader.join(timeout=10)
            self.log.close()


# --------------------------------------------------------------------------------------------- our side


async def rollout_vs_engine(env, config, problems, rounds: int, first_step: int) -> list[dict]:
    """Our rollout path (`rstar.rl.grpo.rollout.generate`: agent loop, logprobs, per-token stream parsing) vs the
    engine's own generation of the same 32 sequences (`engine.generate` for each, all concurrent, same
    prompt ids, sampling seeds, max tokens and stop token), alternating which goes first."""
    from rstar.rl.grpo.rollout import generate, prompt_messages, sample_seed
    from rstar.rl.grpo.train import data_order
    from rstar.server.engine import SamplingOptions

    template, engine = env.template, env.engine
    stop_ids = tuple(template.encode_text(template.turn_end.rstrip()))
    results = []
    for round_index in range(rounds):
        step = first_step + round_index
        batch = [problems[i] for i in data_order(len(problems), config.seed, step * config.prompts_per_step, config.prompts_per_step)]
        prompt_ids = [template.encode(prompt_messages(p), [], add_generation_prompt=True) for p in batch]

        async def ours() -> tuple[float, int, list[list[int]]]:
            started = time.perf_counter()
            groups = await generate(env, batch, config.rollouts_per_prompt, config, config.seed, step)
            elapsed = time.perf_counter() - started
            flat = [t for group in groups for t in group]
            assert all(t.prompt_ids == prompt_ids[p] for p, group in enumerate(groups) for t in group), "rollout prompt ids differ from the template's"
            return elapsed, sum(t.num_sampled_tokens for t in flat), [list(t.response_ids) for t in flat]

        async def own() -> tuple[float, int, list[list[int]]]:
            async def one(p: int, s: int) -> list[int]:
                options = SamplingOptions(max_tokens=config.max_response_tokens, temperature=config.temperature, top_p=config.top_p,
                                          seed=sample_seed(config.seed, step, p, s), stop_token_ids=stop_ids)
                return [token async for delta in engine.generate(prompt_ids[p], options) for token in delta.token_ids]

            started = time.perf_counter()
            outputs = await asyncio.gather(*(one(p, s) for p in range(len(batch)) for s in range(config.rollouts_per_prompt)))
            elapsed = time.perf_counter() - started
            return elapsed, sum(len(o) for o in outputs), outputs

        order = ("rollout", "engine") if round_index % 2 == 0 else ("engine", "rollout")
        measured = {}
        for name in order:
            measured[name] = await (ours() if name == "rollout" else own())
        (r_s, r_tok, r_ids), (e_s, e_tok, e_ids) = measured["rollout"], measured["engine"]
        row = {
            "round": round_index, "first": order[0],
            "rollout_s": r_s, "rollout_tokens": r_tok, "rollout_tok_s": r_tok / r_s,
            "engine_s": e_s, "engine_tokens": e_tok, "engine_tok_s": e_tok / e_s,
            "same_tokens": r_ids == e_ids, "ratio": (r_tok / r_s) / (e_tok / e_s),
        }
        results.append(row)
        print(f"  rollout vs engine round {round_index + 1}/{rounds}: rollout {row['rollout_tok_s']:.1f} tok/s ({r_tok} tok), "
              f"engine {row['engine_tok_s']:.1f} tok/s ({e_tok} tok), ratio {row['ratio']:.3f}, same tokens {row['same_tokens']}", flush=True)
    return results


def step_row(metrics: dict, index: int, warmup: bool) -> dict:
    keys = ("rollout_s", "reward_s", "train_s", "sync_s", "sync_write_s", "sync_reload_s", "step_s", "generated_tokens", "trained",
            "reward_mean", "solve_rate", "response_tokens_mean", "train_tokens", "packed_tokens", "rows", "grad_norm", "probe_gap",
            "weight_version", "groups_kept", "traces_kept", "stop_reasons", "grader_failures")
    row = {"index": index, "warmup": warmup, **{k: metrics.get(k) for k in keys}}
    row["rollout_tok_s"] = metrics["generated_tokens"] / metrics["rollout_s"] if metrics.get("rollout_s") else None
    row["load_average"] = os.getloadavg()
    row["rss_gib"], row["peak_rss_gib"] = memory_gib()
    return row


def memory_gib() -> tuple[float | None, float | None]:
    """This process's resident set now and at its peak (the engine runs in other processes)."""
    fields = {}
    try:
        with open("/proc/self/status", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 2**20
    except OSError:
        pass
    return fields.get("VmRSS"), fields.get("VmHWM")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


async def run(args, quick: bool) -> dict:
    import torch

    from rstar.config import load_settings
    from rstar.hardware import cpu_info
    from rstar.rl.checkpoint import TrainerState
    from rstar.rl.grpo.config import GRPOConfig
    from rstar.rl.data import Problem
    from rstar.rl.policy import Policy, model_identity, resolve_compute_dtype
    from rstar.rl.memory import release_freed_memory
    from rstar.rl.grpo.colocate import EngineSleep
    from rstar.rl.grpo.rollout import RolloutEnv
    from rstar.rl.grpo.train import probe_ids, probe_tolerance, run_step
    from rstar.rl.grpo.trainer import GRPOTrainer
    from rstar.rl.grpo.weight_sync import WeightSync
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings
    from rstar.server.chat_template import choose_template
    from rstar.server.engine import VllmEngine
    from rstar.server.engine_defaults import describe
    from rstar.server.model_store import resolve_model

    trl_steps, our_steps, own_rounds, sync_calls = (1, 2, 2, 2) if quick else (5, 5, 5, 5)
    threads = cpu_info().cores
    torch.set_num_threads(threads)
    settings = load_settings()
    resolved = resolve_model(MODEL, settings.models_dir)
    model_dir = resolved.path
    raw_problems = make_problems()
    problems = [Problem(p["id"], p["problem"], p["answer"]) for p in raw_problems]
    work = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    problems_file = work / "problems.json"
    problems_file.write_text(json.dumps(raw_problems))
    result: dict = {"order": "ours (engine up), then the engine shut down and our trainer freed, then TRL", "trl": {"steps": [], "warmup": None}}

    trl = None
    trl_python, trl_how = (None, "skipped (--no-trl)") if args.no_trl else ensure_trl(args.trl_python)
    result["trl"]["environment"] = {"python": trl_python, "how": trl_how}
    if trl_python:
        trl_log = args.out.with_suffix(".trl.log")
        trl_log.parent.mkdir(parents=True, exist_ok=True)
        print(f"starting TRL {TRL_VERSION} ({trl_how}); it loads while our engine starts and waits; log {trl_log}", flush=True)
        trl = TrlRunner(trl_python, model_dir, problems_file, trl_steps, threads, trl_log)

    try:
        engine_settings = settings.engine
        print(f"starting the engine on {model_dir} (vLLM, dtype {engine_settings.dtype})", flush=True)
        started = time.perf_counter()
        engine = await VllmEngine.start(model_dir, engine_settings, served_model_name=resolved.name, cache_dir=settings.cache_dir)
        engine_start_s = time.perf_counter() - started
        try:
            template = choose_template(engine.tokenizer, resolved.name, "model")
            config = GRPOConfig(
                prompts_per_step=8, rollouts_per_prompt=4, keep_per_prompt=4, downsample="none", builtin_tools=False,
                max_response_tokens=64, temperature=1.0, learning_rate=1e-6, warmup_steps=0, compute_dtype="auto",
            )
            dtype, dtype_why = resolve_compute_dtype(config.compute_dtype)
            async with LocalClient(SandboxSettings(uid_base=65500)) as sandbox:
                env = RolloutEnv(engine, template, sandbox)
                policy = Policy(model_dir, dtype, gradient_checkpointing=config.gradient_checkpointing)
                trainer = GRPOTrainer(policy, config)
                torch_thread = ThreadPoolExecutor(max_workers=1)  # as train_grpo does: all torch work on one thread
                sync = WeightSync(engine, policy, probe_ids(env, problems[0]), probe_tolerance(config, dtype, engine.dtype), engine.dtype, torch_thread)
                engine_sleep = EngineSleep(engine, config.sleep_engine)  # asleep during updates where the engine has sleep mode
                state = TrainerState(step=0, data_cursor=0, model_identity=model_identity(Path(model_dir)))
                rng = random.Random(f"{config.seed}/roc")
                steps: list[dict] = []
                for index in range(1 + our_steps):
                    metrics = await run_step(env, trainer, sync, config, problems, state, rng, state.step, torch_thread, engine_sleep)
                    state.step += 1
                    state.data_cursor += config.prompts_per_step
                    row = step_row(metrics, index, warmup=index == 0)
                    steps.append(row)
                    print(f"  ours{' (warm-up)' if index == 0 else ''}: step {row['step_s']:.2f} s = rollout {row['rollout_s']:.2f} + reward {row['reward_s']:.2f}"
                          f" + train {row['train_s'] or 0:.2f} + sync {row['sync_s'] or 0:.2f}; {row['generated_tokens']} tokens, reward {row['reward_mean']:.3f},"
                          f" trained {row['trained']}; RSS {row['rss_gib'] or 0:.1f} GiB (peak {row['peak_rss_gib'] or 0:.1f})", flush=True)

                print(f"rollout vs the engine's own generation, {own_rounds} rounds", flush=True)
                own = await rollout_vs_engine(env, config, problems, own_rounds, first_step=1000)

                print(f"weight sync, {sync_calls} direct calls", flush=True)
                syncs = []
                for _ in range(sync_calls):
                    called = time.perf_counter()
                    report = await sync.sync()
                    syncs.append({"sync_s": report.seconds, "write_s": report.write_s, "reload_s": report.reload_s,
                                  "with_probe_s": time.perf_counter() - called, "probe_gap": report.probe_gap})
                    print(f"  sync {report.seconds:.3f} s (write {report.write_s:.3f} + reload {report.reload_s:.3f}); with probe {syncs[-1]['with_probe_s']:.3f} s,"
                          f" gap {report.probe_gap:.4f}", flush=True)
                sync.close()
        finally:
            await engine.shutdown()

        import transformers
        import vllm

        result.update({
            "engine": {"start_s": engine_start_s, "dtype": engine.dtype, "defaults": describe(engine.defaults),
                       "settings": engine_settings.model_dump()},
            "ours": {
                "config": config.model_dump(mode="json"),
                "trainer_compute_dtype": dtype, "trainer_compute_dtype_why": dtype_why, "weights_dtype": "float32",
                "gradient_checkpointing": config.gradient_checkpointing, "chat_template": template.kind, "torch_threads": torch.get_num_threads(),
                "prompt_tokens_first_8": [len(template.encode([{"role": "user", "content": p.problem}], [], add_generation_prompt=True)) for p in problems[:8]],
                "reward": "sandbox verify(): the last \\boxed{} answer equals the gold integer (rStar2-Agent's); 0 without a \\boxed{}",
                "peak_rss_gib": max((s["peak_rss_gib"] or 0) for s in steps),
                "steps": steps,
            },
            "rollout_vs_engine": own,
            "weight_sync": syncs,
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__, "trl": None},
        })

        # Our side is done: free its memory before TRL runs, so TRL does not run short of it (RAM here is 23 GiB).
        del policy, trainer, sync, env
        gc.collect()
        release_freed_memory()
        result["ours"]["rss_after_release_gib"] = memory_gib()[0]

        if trl is not None:
            try:
                print(f"TRL: warm-up step, then {trl_steps} measured", flush=True)
                await asyncio.to_thread(trl.wait_for, "waiting")  # loaded
                for index in range(1 + trl_steps):
                    event = await asyncio.to_thread(trl.step)
                    event["load_average"] = os.getloadavg()
                    if index == 0:
                        result["trl"]["warmup"] = event
                    else:
                        result["trl"]["steps"].append(event)
                    print(f"  TRL{' (warm-up)' if index == 0 else ''}: step {event['step_s']:.2f} s = prepare {event['prepare_s']:.2f}"
                          f" (generate {event['generation_s'] or 0:.2f}) + train {event['train_s']:.2f}; {event['completion_tokens']} tokens,"
                          f" reward {event['reward_mean'] or 0:.3f}; peak RSS {event['peak_rss_gib']:.1f} GiB", flush=True)
                await asyncio.to_thread(trl.wait_for, "done", timeout=300)
            except (RuntimeError, TimeoutError, OSError) as exc:
                print(f"TRL failed ({exc}); see its log", flush=True)
                result["trl"]["error"] = str(exc)
            result["trl"]["config"] = trl.config
            result["trl"]["peak_rss_gib"] = max((s.get("peak_rss_gib") or 0) for s in trl.steps) if trl.steps else None
            result["versions"]["trl"] = (trl.config.get("versions") or {}).get("trl")
    finally:
        if trl is not None:
            trl.close(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    return result


def summarize(result: dict) -> dict:
    measured = [s for s in result["ours"]["steps"] if not s["warmup"]]
    trained = [s for s in measured if s["trained"]]
    trl_steps = result["trl"]["steps"]
    ours = {key: median([s[key] for s in measured]) for key in ("rollout_s", "reward_s", "train_s", "sync_s", "step_s", "generated_tokens", "rollout_tok_s", "reward_mean")}
    ours["steps_measured"], ours["steps_trained"] = len(measured), len(trained)
    # A step that trains nothing (every group equal, only in RoC modes) would be cheaper than TRL's, which always trains:
    # the step-time goal uses trained steps, or else rollout + reward of all steps plus train + sync of any trained one.
    if trained:
        ours["step_s_for_goal"] = median([s["step_s"] for s in trained])
    else:
        any_trained = [s for s in result["ours"]["steps"] if s["trained"]]
        ours["step_s_for_goal"] = (median([s["rollout_s"] + s["reward_s"] for s in measured]) + median([s["train_s"] + s["sync_s"] for s in any_trained])) if any_trained else None
    trl = {key: median([s.get(key) for s in trl_steps]) for key in ("step_s", "generation_s", "prepare_s", "reward_s", "train_s", "completion_tokens", "reward_mean")} if trl_steps else None
    if trl:
        trl["steps_measured"] = len(trl_steps)
    sync_values = [s["sync_s"] for s in result["weight_sync"]] + [s["sync_s"] for s in result["ours"]["steps"] if s["sync_s"] is not None]
    own = result["rollout_vs_engine"]
    return {
        "ours": ours,
        "trl": trl,
        "step_time_ratio": ours["step_s_for_goal"] / trl["step_s"] if trl and ours["step_s_for_goal"] else None,
        "train_time_ratio": ours["train_s"] / trl["train_s"] if trl and ours["train_s"] else None,
        "sync_s_median": median(sync_values),
        "sync_s_max": max(sync_values) if sync_values else None,
        "sync_with_probe_s_median": median([s["with_probe_s"] for s in result["weight_sync"]]),
        "rollout_tok_s_median": median([r["rollout_tok_s"] for r in own]),
        "engine_tok_s_median": median([r["engine_tok_s"] for r in own]),
        "rollout_over_engine": median([r["ratio"] for r in own]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 TRL and 2 of our steps after warm-up, 2 engine rounds, 2 syncs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rl_bench.json"))
    parser.add_argument("--no-trl", action="store_true", help="run our side only")
    parser.add_argument("--trl-python", help=f"a Python that imports trl=={TRL_VERSION} (default: this one, else the benchmark's venv)")
    args = parser.parse_args()

    began = time.perf_counter()
    load_before = os.getloadavg()
    result = asyncio.run(run(args, args.quick))
    summary = summarize(result)
    result = {
        **run_header("rl_bench", began, load_before, args.quick),
        "workload": {"model": MODEL, "prompt": PROMPT, "a_b_range": [1, 99], "problems": 512, "prompts_per_step": 8, "completions_per_prompt": 4,
                     "max_completion_tokens": 64, "temperature": 1.0, "learning_rate": 1e-6},
        **result,
        "summary": summary,
        "goals": [
            goal("step time ours / TRL", _round(summary["step_time_ratio"]), "<=", 0.5, "x"),
            goal("weight sync (s)", _round(summary["sync_s_median"]), "<=", 0.5, "s"),
            goal("rollout tokens/s / engine's own", _round(summary["rollout_over_engine"]), ">=", 0.9, "x"),
        ],
    }
    print_summary(result)
    write_report(args.out, result)


def _round(value):
    return round(value, 4) if value is not None else None


def print_summary(result: dict) -> None:
    s, cpu = result["summary"], result["cpu"]
    ours, trl = s["ours"], s["trl"]

    def f(value, unit=" s"):
        return f"{value:.2f}{unit}" if value is not None else "-"

    print(f"\nrl_bench ({'quick' if result['quick'] else 'full'}), {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])};"
          f" load average {result['load_average']['before'][0]:.1f} -> {result['load_average']['after'][0]:.1f}; wall {result['wall_s']:.0f} s")
    print(f"dtypes: ours trainer {result['ours']['trainer_compute_dtype']} autocast over fp32 weights, engine {result['engine']['dtype']};"
          f" TRL {'bf16 autocast' if (result['trl'].get('config') or {}).get('bf16_autocast') else 'fp32'} over"
          f" {(result['trl'].get('config') or {}).get('weights_dtype', '?')} weights")
    print(f"{'median per step':<22}{'ours':>10}{'TRL':>10}")
    rows = [("step", ours["step_s_for_goal"], trl and trl["step_s"]), ("rollout / generate", ours["rollout_s"], trl and trl["generation_s"]),
            ("reward", ours["reward_s"], trl and trl["reward_s"]), ("train", ours["train_s"], trl and trl["train_s"]), ("weight sync", ours["sync_s"], None)]
    for name, a, b in rows:
        print(f"{name:<22}{f(a):>10}{f(b):>10}")
    print(f"{'generated tokens':<22}{f(ours['generated_tokens'], ''):>10}{f(trl and trl['completion_tokens'], ''):>10}")
    print(f"ours trained in {ours['steps_trained']}/{ours['steps_measured']} measured steps; reward mean ours {f(ours['reward_mean'], '')} (verify, boxed), TRL {f(trl and trl['reward_mean'], '')} (contains)")
    print(f"weight sync median {f(s['sync_s_median'])} (max {f(s['sync_s_max'])}; with the probe {f(s['sync_with_probe_s_median'])})")
    print(f"rollout {f(s['rollout_tok_s_median'], ' tok/s')} vs engine's own {f(s['engine_tok_s_median'], ' tok/s')} on the same batch")


if __name__ == "__main__":
    main()
