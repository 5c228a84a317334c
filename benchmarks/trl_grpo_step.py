"""TRL's GRPOTrainer on the rl_bench workload, one step at a time: the baseline side of `rl_bench.py`.

Runs in TRL's own environment (see `rl_bench.py`: a venv that reuses this project's torch and transformers
and adds `trl==1.16.0`), never in the project's: it imports nothing of rstar. Everything is TRL's default
except what the workload fixes: the model path, the data and its reward, 32 completions per step in groups
of 4 (`per_device_train_batch_size=32`, `num_generations=4`), `max_completion_length=64`,
`learning_rate=1e-6`, `use_cpu=True`, `report_to=[]`, `max_steps`, `seed`. So the trainer runs as TRL's users
run it: fp32 weights under bf16 autocast (`bf16=True` is GRPOConfig's default), gradient checkpointing on
(its default), `beta=0`, `loss_type="dapo"`, HF `generate` for rollouts.

Protocol (stdout lines starting with `@@rl_bench ` are JSON events; everything else is TRL's own output):
before each step (the first is the caller's warm-up) the script waits for a line on stdin (`go`), so the
caller decides when TRL runs and never runs its own work at the same time; EOF stops it. Each step is
timed from `on_step_begin` (after the go-ahead) to `on_step_end`: generation, reward, loss, backward and
the AdamW step. TRL's own profiling timers (normally sent only to wandb/mlflow/trackio) are recorded too,
for the phase split.

    python trl_grpo_step.py --model DIR --problems FILE.json --steps N [--threads K]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections import defaultdict

MARK = "@@rl_bench "
INTEGER = re.compile(r"-?\d+")


def emit(event: str, **fields) -> None:
    sys.stdout.write(MARK + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--problems", required=True, help="JSON list of {problem, answer}")
    parser.add_argument("--steps", type=int, required=True, help="measured steps after the warm-up step")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import datasets
    import transformers
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    problems = json.load(open(args.problems, encoding="utf-8"))
    dataset = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": p["problem"]}], "answer": p["answer"]} for p in problems])

    # The step being measured: TRL's profiling timers and what the reward saw.
    current: dict = {"profile": defaultdict(float), "completions": 0, "completion_tokens": 0, "rewards": []}

    original_log_metrics = profiling.ProfilingContext._log_metrics

    def record_timer(self, duration: float) -> None:
        current["profile"][self.name] += duration
        original_log_metrics(self, duration)

    profiling.ProfilingContext._log_metrics = record_timer

    def contains_answer(completions, answer, completion_ids=None, **kwargs) -> list[float]:
        """The TRL anchor's reward: 1.0 if the completion contains the integer answer, else 0."""
        rewards = []
        for completion, gold in zip(completions, answer):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            rewards.append(1.0 if gold in INTEGER.findall(text) else 0.0)
        current["completions"] += len(completions)
        current["completion_tokens"] += sum(len(ids) for ids in completion_ids or [])
        current["rewards"].extend(rewards)
        return rewards

    class Pace(TrainerCallback):
        started = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            emit("waiting", step=state.global_step)
            if sys.stdin.readline().strip() != "go":
                emit("stopped")
                os._exit(0)
            current["profile"].clear()
            current.update(completions=0, completion_tokens=0, rewards=[])
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            elapsed = time.perf_counter() - self.started
            profile = dict(current["profile"])
            prepare = profile.get("GRPOTrainer._prepare_inputs", 0.0)
            rewards = current["rewards"]
            emit(
                "step",
                step=state.global_step,
                warmup=state.global_step == 1,
                step_s=elapsed,
                generation_s=profile.get("GRPOTrainer.transformers.generate"),
                prepare_s=prepare,  # generation + reward + advantages (+ any log-prob pass)
                train_s=elapsed - prepare,  # forward, backward, clip, AdamW
                reward_s=profile.get("GRPOTrainer._calculate_rewards"),
                completions=current["completions"],
                completion_tokens=current["completion_tokens"],
                reward_mean=sum(rewards) / len(rewards) if rewards else None,
                profile=profile,
                peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            )

    with tempfile.TemporaryDirectory(prefix="rl-bench-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=32,
            num_generations=4,
            max_completion_length=64,
            learning_rate=1e-6,
            use_cpu=True,
            report_to=[],
            max_steps=1 + args.steps,
            seed=args.seed,
        )
        trainer = GRPOTrainer(model=args.model, reward_funcs=contains_answer, args=config, train_dataset=dataset, callbacks=[Pace()])
        tokenizer = trainer.processing_class
        prompt_tokens = [len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]) for row in dataset.select(range(8))]
        model = trainer.model
        emit(
            "config",
            versions={"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__, "datasets": datasets.__version__},
            torch_threads=torch.get_num_threads(),
            weights_dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            bf16_autocast=bool(config.bf16),
            mixed_precision=str(trainer.accelerator.mixed_precision),
            gradient_checkpointing=bool(config.gradient_checkpointing),
            per_device_train_batch_size=config.per_device_train_batch_size,
            num_generations=config.num_generations,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            max_completion_length=config.max_completion_length,
            learning_rate=config.learning_rate,
            lr_scheduler_type=str(config.lr_scheduler_type),
            temperature=config.temperature,
            top_p=config.top_p,
            beta=config.beta,
            loss_type=config.loss_type,
            num_iterations=config.num_iterations,
            scale_rewards=str(config.scale_rewards),
            use_vllm=config.use_vllm,
            prompt_tokens_first_8=prompt_tokens,
            reward="1.0 if the completion contains the integer answer (regex -?\\d+), else 0 (the TRL anchor's)",
        )
        trainer.train()
    emit("done", peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


if __name__ == "__main__":
    main()
