"""Engine step costs of the default model on this machine: what the router simulator's CPU cost model is fed.

One engine (`VllmEngine`, the project's engine settings), greedy, EOS ignored, prompts of distinct token ids so
that no request hits another's prefix cache. Measured, each as the median of `rounds`:

- decode step time at batch 1, 8 and 32 (64 generated tokens per sequence, 16-token prompts): fitted as
  `base + per_seq * batch`;
- the extra step time per token of context: batch 8 with 1024-token prompts against batch 8 with 16-token ones;
- prefill time per prompt token: one 1024-token prompt against one 16-token prompt, one generated token each.

It also records the KV cache's size in tokens: the engine's CPU KV space over the bytes one token takes (2 x
layers x KV heads x head size x the dtype's bytes, from the model's config.json).

    python benchmarks/engine_costs.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from goals import write_report

from rstar.config import EngineSettings, load_settings
from rstar.hardware import cpu_info
from rstar.server.engine import SamplingOptions, VllmEngine
from rstar.server.model_store import resolve_model

SHORT, LONG, DECODE_TOKENS = 16, 1024, 64
_fresh_ids = itertools.count(1000)  # every prompt gets token ids no earlier prompt used: no prefix-cache hits


def fresh_prompt(length: int) -> list[int]:
    return [next(_fresh_ids) % 40_000 + 1000 for _ in range(length)]


async def timed_batch(engine: VllmEngine, batch: int, prompt_tokens: int, max_tokens: int) -> float:
    options = SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(prompt: list[int]) -> int:
        return sum([len(delta.token_ids) async for delta in engine.generate(prompt, options)])

    prompts = [fresh_prompt(prompt_tokens) for _ in range(batch)]
    started = time.perf_counter()
    generated = await asyncio.gather(*(one(prompt) for prompt in prompts))
    elapsed = time.perf_counter() - started
    assert sum(generated) == batch * max_tokens, (generated, max_tokens)
    return elapsed


async def measure(rounds: int) -> dict:
    settings = load_settings()
    model = resolve_model("default", settings.models_dir)
    engine_settings = EngineSettings(max_model_len=2048, max_num_seqs=64)
    engine = await VllmEngine.start(model.path, engine_settings, served_model_name=model.name)
    try:
        await timed_batch(engine, 8, SHORT, 8)  # warm-up: first batches pay one-off allocations
        step_s: dict[str, list[float]] = {"batch_1": [], "batch_8": [], "batch_32": [], "batch_8_long_context": []}
        prefill_s: dict[str, list[float]] = {"short": [], "long": []}
        for _ in range(rounds):
            for batch in (1, 8, 32):
                step_s[f"batch_{batch}"].append(await timed_batch(engine, batch, SHORT, DECODE_TOKENS) / DECODE_TOKENS)
            step_s["batch_8_long_context"].append(await timed_batch(engine, 8, LONG, DECODE_TOKENS) / DECODE_TOKENS)
            prefill_s["short"].append(await timed_batch(engine, 1, SHORT, 1))
            prefill_s["long"].append(await timed_batch(engine, 1, LONG, 1))
    finally:
        await engine.shutdown()

    median = {name: statistics.median(values) for name, values in step_s.items()}
    batches = [1, 8, 32]
    per_seq, base = linear_fit(batches, [median[f"batch_{b}"] for b in batches])
    # The long-context batch also pays its 8 prefills once, spread over its steps; take them out.
    prefill_per_token = (statistics.median(prefill_s["long"]) - statistics.median(prefill_s["short"])) / (LONG - SHORT)
    long_minus_short = median["batch_8_long_context"] - median["batch_8"] - 8 * (LONG - SHORT) * prefill_per_token / DECODE_TOKENS
    per_context_token = max(0.0, long_minus_short / (8 * (LONG - SHORT)))
    return {
        "model": model.name,
        "kv_cache": kv_cache_tokens(Path(model.path), engine_settings, engine.dtype),
        "engine_settings": engine_settings.model_dump(),
        "rounds": rounds,
        "decode_step_s": {name: {"median": median[name], "samples": values} for name, values in step_s.items()},
        "prefill_request_s": prefill_s,
        "fit": {
            "decode_step_base_s": base,
            "decode_step_per_seq_s": per_seq,
            "decode_step_per_context_token_s": per_context_token,
            "prefill_per_token_s": prefill_per_token,
        },
    }


def kv_cache_tokens(model_dir: Path, settings: EngineSettings, dtype: str) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = 4 if dtype in ("float32", "torch.float32") else 2
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_size * dtype_bytes
    return {"bytes_per_token": per_token, "cpu_kv_cache_gib": settings.cpu_kv_cache_gib, "dtype": dtype, "tokens": settings.cpu_kv_cache_gib * 2**30 // per_token}


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, mean_y - slope * mean_x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round instead of three")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_costs.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()  # the machine is shared: the figures only mean something beside its load
    measured = asyncio.run(measure(rounds=1 if args.quick else 3))
    result = {
        "benchmark": "engine_costs",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_info().to_dict(),
        "load_average_before_after": [load_before, os.getloadavg()],
        **measured,
        "goals": [],  # a measurement that feeds router_sim.py; it has no goal of its own
    }
    print(json.dumps(result["fit"], indent=2))
    write_report(args.out, result)


if __name__ == "__main__":
    main()
