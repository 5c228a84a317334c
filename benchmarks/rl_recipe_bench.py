"""The CPU recipe's comparison: GRPO-RoC vs plain GRPO vs a zero-learning-rate control, several seeds each.

Every run is `rstar rl train cpu --set seed=S` on the default model (the tool-use SFT model) and
`rl_train.jsonl` of `rstar rl make-sft-data` (seed 0), started as a user would; the seed sets the problem
order, the rollouts' sampling seeds and RoC's draws, and the same seeds are used in every arm:

- roc:     the recipe as shipped (reject-equal + RoC as released, 8 rollouts -> 4 kept);
- plain:   plain GRPO, no down-sampling (all 8 rollouts of every group train);
- control: the recipe at learning rate 0. AdamW at lr 0 changes no weight (the step and the decoupled decay
           are both scaled by lr), so the control's checkpoints are the start model: by default it is
           evaluated once, as the served default model, and paired with every seed (`--train-control`
           runs its training anyway, for its rollout metrics).

Each run's last checkpoint is served by `rstar serve` and asked the held-out set of `heldout_shapes`
(problems over 37 sentence shapes that no training data uses) at temperature 0. Reported per arm: accuracy
with a 95% interval from a bootstrap over seeds and problems (and, beside it, over seeds and shapes, since a
shape tends to pass or fail whole), the paired difference to the control with its interval, tool-call and
cell-error rates; per step, from each run's own metrics, the tool-error rate among all positive rollouts
before down-sampling (the paper's measure) and, labelled as such, among the positives RoC kept.

`--task gsm8k` runs the same recipe on word problems no one here wrote (issue 27): it trains on
`gsm8k_rl_train.jsonl` of `rstar rl make-sft-data --gsm8k` (GSM8K's training split) and judges each
checkpoint on the first --gsm8k-test problems of GSM8K's test split through `rstar eval run --suite gsm8k`
(the suite's defaults, temperature 0; gsm8k_bench's path). GSM8K has no sentence shapes, so its intervals
are over seeds and problems only.

Runs and evaluations are stored in --work as they finish, so an interrupted comparison resumes there.

    python benchmarks/rl_recipe_bench.py [--task heldout|gsm8k] [--seeds 0,1,2] [--steps N] [--heldout N]
                                         [--gsm8k-test N] [--arms roc,plain,control] [--work DIR]
                                         [--out FILE.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
sys.path.insert(0, str(REPO_ROOT))

from goals import goal, run_header, write_report  # noqa: E402
from gsm8k_bench import run_harness  # noqa: E402
from heldout_shapes import heldout_set  # noqa: E402
from tool_use_bench import evaluate  # noqa: E402

from rstar.rl.grpo.recipe import load_recipe  # noqa: E402

ARMS = {
    "roc": [],
    "plain": ["--set", "downsample=none", "--set", "keep_per_prompt=8"],
    "control": ["--set", "learning_rate=0"],
}
RECIPE_STEPS = load_recipe("cpu").total_steps
LAST_STEPS = 2  # "the last steps" of the tool-error goal: the mean of each run's last two steps
RESAMPLES = 4000


def train(run_id: str, arm: str, seed: int, data: Path, work: Path, steps: int) -> dict:
    env = {**os.environ, "RSTAR_DATA_DIR": str(work / "data"), "COLUMNS": "160"}
    command = [sys.executable, "-m", "rstar.cli", "rl", "train", "cpu", "--data", str(data), "--run-id", run_id,
               "--max-steps", str(steps), "--set", f"seed={seed}", *ARMS[arm]]
    started = time.perf_counter()
    with open(work / f"{run_id}.log", "a") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return {"train_s": time.perf_counter() - started}


def run_record(work: Path, run_id: str) -> tuple[list[dict], Path]:
    """The run's per-step metrics and its last checkpoint, from the product's own database."""
    with sqlite3.connect(work / "data" / "rstar.db") as connection:
        rows = connection.execute("select step, metrics from rl_steps where run_id = ? order by step", (run_id,))
        steps = [{"step": step, **json.loads(metrics)} for step, metrics in rows]
        (run_dir,) = connection.execute("select run_dir from rl_runs where id = ?", (run_id,)).fetchone()
    latest = (Path(run_dir) / "latest").read_text().strip()
    return steps, Path(run_dir) / latest


def stored(path: Path, compute) -> dict:
    """The JSON at path, computing and writing it first if it is not there (how the comparison resumes)."""
    if not path.exists():
        path.write_text(json.dumps(compute(), indent=1))
    return json.loads(path.read_text())


def bootstrap(matrix: np.ndarray, clusters: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean of a seeds x problems matrix and a 95% interval, resampling seeds and then clusters of problems
    (each problem its own cluster, or the problems of one shape) with replacement."""
    labels, members = np.unique(clusters, return_inverse=True)
    sums = np.zeros((matrix.shape[0], len(labels)))
    counts = np.bincount(members, minlength=len(labels))
    for j in range(len(labels)):
        sums[:, j] = matrix[:, members == j].sum(axis=1)
    means = np.empty(RESAMPLES)
    for r in range(RESAMPLES):
        seeds = rng.integers(0, matrix.shape[0], matrix.shape[0])
        picked = rng.integers(0, len(labels), len(labels))
        means[r] = sums[np.ix_(seeds, picked)].sum() / (counts[picked].sum() * len(seeds))
    low, high = np.percentile(means, [2.5, 97.5])
    return float(matrix.mean()), float(low), float(high)


def interval(matrix: np.ndarray, problems: list[dict]) -> dict:
    """Mean and 95% interval over seeds and problems, and over seeds and shapes where problems have shapes."""
    rng = np.random.default_rng(0)
    mean, low, high = bootstrap(matrix, np.arange(matrix.shape[1]), rng)
    result = {"mean": round(100 * mean, 2), "ci95": [round(100 * low, 2), round(100 * high, 2)], "ci95_over_shapes": None}
    if all("phrasing" in p for p in problems):
        _, shape_low, shape_high = bootstrap(matrix, np.array([p["phrasing"] for p in problems]), rng)
        result["ci95_over_shapes"] = [round(100 * shape_low, 2), round(100 * shape_high, 2)]
    return result


def answers_matrix(evaluations: list[dict], key: str) -> np.ndarray:
    """Seeds x problems; every evaluation must have answered the same problems in the same order."""
    if len({tuple(a["id"] for a in e["answers"]) for e in evaluations}) > 1:
        raise ValueError("the evaluations answered different problems: they cannot be paired")
    return np.array([[float(a[key]) for a in e["answers"]] for e in evaluations])


def error_curve(steps: list[dict], key: str) -> list[float | None]:
    return [s.get(key) for s in steps]


def last_steps_mean(curve: list[float | None]) -> float | None:
    values = [v for v in curve[-LAST_STEPS:] if v is not None]
    return sum(values) / len(values) if values else None


def summarize(arm: str, runs: list[dict], control: list[dict] | None, problems: list[dict]) -> dict:
    evaluations = [r["heldout"] for r in runs]
    accuracy = answers_matrix(evaluations, "accurate")
    cells = sum(a["cells"] for e in evaluations for a in e["answers"])
    summary = {
        "seeds": [r["seed"] for r in runs],
        "accuracy": interval(accuracy, problems),
        "per_seed_accuracy": [round(100 * row.mean(), 2) for row in accuracy],
        "tool_call_rate": interval(answers_matrix(evaluations, "tool_call"), problems),
        "cell_error_rate": round(100 * sum(a["cell_errors"] for e in evaluations for a in e["answers"]) / max(1, cells), 2),
        "per_family_accuracy": {family: round(100 * float(np.mean([a["accurate"] for e in evaluations for a in e["answers"] if a["family"] == family])), 1)
                                for family in sorted({p["family"] for p in problems})},
    }
    if control is not None and arm != "control":
        # Paired by seed where the control was trained per seed, else every seed against the one start model.
        reference = answers_matrix([c["heldout"] for c in control], "accurate")
        if reference.shape[0] == 1:
            reference = np.repeat(reference, accuracy.shape[0], axis=0)
        summary["difference_to_control"] = interval(accuracy - reference, problems)
    trained = [r for r in runs if r["steps"]]
    if trained:
        summary["tool_error_rate_positive_per_step"] = {r["seed"]: error_curve(r["steps"], "tool_error_rate_positive") for r in trained}
        summary["tool_error_rate_kept_positive_per_step"] = {r["seed"]: error_curve(r["steps"], "tool_error_rate_kept_positive") for r in trained}
        lasts = [last_steps_mean(curve) for curve in summary["tool_error_rate_positive_per_step"].values()]
        summary["tool_error_rate_positive_last_steps"] = sum(v for v in lasts if v is not None) / max(1, sum(v is not None for v in lasts))
        summary["reward_mean_per_step"] = {r["seed"]: error_curve(r["steps"], "reward_mean") for r in trained}
        summary["train_minutes"] = [round(r["train_s"] / 60, 1) for r in trained]
    return summary


def plot(summaries: dict[str, dict], judged_on: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, curves, kept) = plt.subplots(1, 3, figsize=(14, 3.8))
    names = list(summaries)
    for x, name in enumerate(names):
        accuracy = summaries[name]["accuracy"]
        low, high = accuracy["ci95"]
        bars.bar(x, accuracy["mean"], 0.6, yerr=[[accuracy["mean"] - low], [high - accuracy["mean"]]], capsize=4, color=f"C{x}")
        bars.scatter([x] * len(summaries[name]["per_seed_accuracy"]), summaries[name]["per_seed_accuracy"], color="black", s=8, zorder=3)
        bars.text(x, high, f"{accuracy['mean']:.1f}", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(range(len(names)), names)
    bars.set_ylabel(f"{judged_on}, % (95% CI; dots: seeds)")
    for axis, key, title in ((curves, "tool_error_rate_positive_per_step", "all positive rollouts, before down-sampling"),
                             (kept, "tool_error_rate_kept_positive_per_step", "only the positives kept for training")):
        for x, name in enumerate(names):
            for i, (seed, curve) in enumerate(summaries[name].get(key, {}).items()):
                points = [(step + 1, 100 * v) for step, v in enumerate(curve) if v is not None]
                axis.plot(*zip(*points), marker="o", markersize=3, color=f"C{x}", alpha=0.8,
                          linestyle=("-", "--", ":", "-.")[i % 4], label=f"{name} seed {seed}")
        axis.set_xlabel("step")
        axis.xaxis.get_major_locator().set_params(integer=True)
        axis.set_ylabel("tool-error rate, %")
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("heldout", "gsm8k"), default="heldout",
                        help="heldout: the recipe's own problems, judged on held-out shapes; gsm8k: GSM8K train, judged on GSM8K test")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps, 37 held-out problems (one per shape) or 20 GSM8K test problems")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=5, help="steps per run (rstar rl train --max-steps; the recipe has 40)")
    parser.add_argument("--heldout", type=int, default=518, help="held-out problems (14 per shape by default)")
    parser.add_argument("--gsm8k-test", type=int, default=300, help="with --task gsm8k: the first N of GSM8K's 1,319 test problems")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data", help="holds gsm8k/train.jsonl and gsm8k/test.jsonl")
    parser.add_argument("--arms", default="roc,plain,control")
    parser.add_argument("--train-control", action="store_true", help="train the zero-lr control per seed instead of evaluating the start model once")
    parser.add_argument("--work", type=Path, default=Path("rl-recipe-bench"), help="runs, database, logs and evaluations; reuse it to resume")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rl_recipe_bench.json"))
    args = parser.parse_args()
    began, load_before = time.perf_counter(), os.getloadavg()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 2 if args.quick else args.steps
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "sft-data"
    make_data = [sys.executable, "-m", "rstar.cli", "rl", "make-sft-data", "--out", str(data_dir), "--seed", "0"]
    if args.task == "gsm8k":
        make_data += ["--gsm8k", str(args.data_dir / "gsm8k" / "train.jsonl")]
    training_data = data_dir / ("gsm8k_rl_train.jsonl" if args.task == "gsm8k" else "rl_train.jsonl")
    if not training_data.exists():
        subprocess.run(make_data, check=True, capture_output=True)
    arms = args.arms.split(",")
    if args.task == "gsm8k":
        test_limit = 20 if args.quick else args.gsm8k_test
        tag = f"s{steps}-g{test_limit}"

        def evaluate_model(model: str, name: str) -> dict:
            return run_harness(model, "rstar", test_limit, args.data_dir, 16, work, name)
    else:
        problems = heldout_set(37 if args.quick else args.heldout)
        tag = f"s{steps}-h{len(problems)}"

        def evaluate_model(model: str, name: str) -> dict:
            return evaluate(model, problems, 8, work)

    def run(arm: str, seed: int | None) -> dict:
        if seed is None:  # the control as the start model
            heldout = stored(work / f"default-{tag}.eval.json", lambda: evaluate_model("default", f"default-{tag}"))
            return {"seed": "start model", "steps": [], "train_s": 0.0, "heldout": heldout}
        run_id = f"{arm}-seed{seed}-steps{steps}"
        trained = stored(work / f"{run_id}.train.json", lambda: train(run_id, arm, seed, training_data, work, steps))
        step_metrics, checkpoint = run_record(work, run_id)
        heldout = stored(work / f"{run_id}-{tag}.eval.json", lambda: evaluate_model(str(checkpoint), f"{run_id}-{tag}"))
        print(f"{run_id}: {tag} accuracy {heldout['accuracy']:.1%}, tool calls {heldout['tool_call_rate']:.1%}", flush=True)
        return {"seed": seed, "steps": step_metrics, "train_s": trained["train_s"], "heldout": heldout}

    # Seeds outermost, so an interrupted comparison has every arm on its first seeds.
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    if "control" in arms and not args.train_control:
        runs["control"].append(run("control", None))
    for seed in seeds:
        for arm in arms:
            if arm != "control" or args.train_control:
                runs[arm].append(run(arm, seed))

    if args.task == "gsm8k":  # the test problems the harness asked, in the order every evaluation lists them
        problems = [{"id": a["id"], "family": a["family"]} for a in next(iter(runs.values()))[0]["heldout"]["answers"]]
    judged_on = "GSM8K test accuracy" if args.task == "gsm8k" else "held-out accuracy"
    control = runs.get("control")
    summaries = {arm: summarize(arm, arm_runs, control, problems) for arm, arm_runs in runs.items()}
    goals = []
    if "roc" in summaries and "difference_to_control" in summaries["roc"]:
        difference = summaries["roc"]["difference_to_control"]
        goals.append(goal(f"{judged_on}, RoC - control, lower end of the paired 95% interval", difference["ci95"][0], ">=", 0.01, "points"))  # above 0, at the figure's precision
        if args.task == "heldout":  # issue 22's second goal; issue 27 asks only for the lower end above zero
            goals.append(goal(f"{judged_on}, RoC - control, mean", difference["mean"], ">=", 5.0, "points"))
    if {"roc", "plain"} <= summaries.keys():
        roc, plain = (summaries[a].get("tool_error_rate_positive_last_steps") for a in ("roc", "plain"))
        if roc is not None and plain is not None:
            goals.append(goal(f"tool-error rate among all positive rollouts, last {LAST_STEPS} steps, RoC - plain", round(100 * (roc - plain), 2), "<=", -0.01, "points"))  # below 0
    if args.task == "heldout" and "roc" in summaries and summaries["roc"].get("train_minutes"):
        # Issue 10's goal is for the whole recipe: each RoC run's clock plus its mean step time for the steps it skipped.
        projected = [r["train_s"] / 60 + (RECIPE_STEPS - len(r["steps"])) * np.mean([s["step_s"] for s in r["steps"]]) / 60 for r in runs["roc"]]
        goals.append(goal(f"RoC run projected from {steps} to the recipe's {RECIPE_STEPS} steps, mean over seeds", round(float(np.mean(projected)), 1), "<=", 45, "minutes"))
    # Summed from the stored runs, so a resumed comparison still reports the time of the whole of it.
    total_s = sum(r["train_s"] + r["heldout"]["wall_s"] + r["heldout"]["startup_s"] for arm_runs in runs.values() for r in arm_runs)
    if args.task == "heldout":
        goals.append(goal("the whole comparison: training, serving and evaluating every run", round(total_s / 60, 1), "<=", 150, "minutes"))
    header = run_header("rl_recipe_bench", began, load_before, args.quick)
    output = {**header, "task": args.task, "training_data": training_data.name, "judged_on": judged_on, "work": str(work), "seeds": seeds,
              "steps_per_run": steps, "heldout_problems": len(problems), "heldout_shapes": len({p.get("phrasing") for p in problems} - {None}) or None,
              "total_minutes": round(total_s / 60, 1), "control": "trained per seed at lr 0" if args.train_control else "the start model, evaluated once",
              "arms": summaries, "runs": {arm: [{k: v for k, v in r.items() if k != "heldout"} | {"heldout": {k: v for k, v in r["heldout"].items() if k != "answers"}}
                                                for r in arm_runs] for arm, arm_runs in runs.items()}, "goals": goals}
    write_report(args.out, output)
    plot(summaries, judged_on, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
