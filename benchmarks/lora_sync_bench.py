"""LoRA weight sync against a full-weight sync, on the default model, in one engine and one run.

Both go through `WeightSync.sync` as a run does (write into /dev/shm, the engine loads, the probe checks): the
full sync writes the whole model and the engine reloads it in place; the LoRA sync writes the rank-R adapter
alone (peft's files) and the engine loads it as a new adapter version. The engine is started with LoRA on
(`max_lora_rank`), which on CPU runs it eager; the full reload works on it too, so both sides share it. Each
sync follows a change of the trained weights (random, small), so every one moves real bytes. Bytes are the files
the sync wrote; time is write + load (SyncReport.seconds), the median of the repeats.

    python benchmarks/lora_sync_bench.py [--quick] [--out FILE.json] [--lora-rank 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from goals import goal, print_goals, run_header, write_report

HERE = Path(__file__).resolve().parent


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def measure(policy, engine, dtype: str, probe: list[int], repeats: int) -> dict:
    import torch

    from rstar.rl.grpo.weight_sync import WeightSync

    torch_thread = ThreadPoolExecutor(max_workers=1)
    sync = WeightSync(engine, policy, probe, 1e-3 if dtype == "float32" else 0.15, dtype, torch_thread)
    seconds, gaps = [], []
    try:
        for _ in range(repeats):
            with torch.no_grad():
                for parameter in policy.trainable_parameters():
                    parameter.add_(torch.randn_like(parameter) * 1e-4)
            report = await sync.sync()
            seconds.append(report.seconds)
            gaps.append(report.probe_gap)
        written = directory_bytes(Path(sync._dir.name))
    finally:
        sync.close()
        torch_thread.shutdown()
    return {"sync_s": statistics.median(seconds), "sync_s_all": seconds, "bytes": written, "probe_gaps": gaps}


async def main(args) -> dict:
    import torch

    from rstar.config import EngineSettings, load_settings
    from rstar.rl.grpo.config import GRPOConfig
    from rstar.rl.grpo.train import engine_lora_rank
    from rstar.rl.policy import Policy
    from rstar.server.engine import VllmEngine
    from rstar.server.model_store import resolve_model

    model = Path(resolve_model("default", load_settings().models_dir).path)
    engine = await VllmEngine.start(model, EngineSettings(max_model_len=2048, max_num_seqs=8, enforce_eager=True, max_lora_rank=engine_lora_rank(args.lora_rank)), "bench")
    probe = engine.tokenizer.encode("The probe: compute 17 * 23 with Python, print it, and box the answer. " * 4)
    repeats = 2 if args.quick else 5
    try:
        full = await measure(Policy(model, "float32"), engine, engine.dtype, probe, repeats)
        await engine.reload_weights(model)  # the adapter trains on the original base, not the full side's last weights
        torch.manual_seed(0)
        lora = await measure(Policy(model, "float32", lora=GRPOConfig(lora_rank=args.lora_rank).lora()), engine, engine.dtype, probe, repeats)
    finally:
        await engine.shutdown()
    return {"engine_dtype": engine.dtype, "lora_rank": args.lora_rank, "repeats": repeats, "full": full, "lora": lora}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "published" / "lora_sync_bench.json")
    parser.add_argument("--lora-rank", type=int, default=8)
    args = parser.parse_args()
    began, load_before = time.perf_counter(), os.getloadavg()
    figures = asyncio.run(main(args))
    bytes_ratio = figures["lora"]["bytes"] / figures["full"]["bytes"]
    time_ratio = figures["lora"]["sync_s"] / figures["full"]["sync_s"]
    goals = [goal("LoRA sync bytes / full-weight sync bytes", round(bytes_ratio, 4), "<=", 0.1, "x"),
             goal("LoRA sync time / full-weight sync time", round(time_ratio, 3), "<=", 0.5, "x")]
    report = {**run_header("lora_sync_bench", began, load_before, args.quick), **figures, "goals": goals}
    write_report(args.out, report)
    print(f"full: {figures['full']['bytes'] / 1e6:.1f} MB in {figures['full']['sync_s']:.3f} s; LoRA rank {args.lora_rank}: "
          f"{figures['lora']['bytes'] / 1e6:.1f} MB in {figures['lora']['sync_s']:.3f} s")
    print_goals(goals)
