"""The few lines a run ends with: what ran, what changed, where it is, what to try next.

Read back from the run folder (metrics.jsonl, and sft/metrics.jsonl for the
SFT phase of `train.sft_steps`), so the summary says what was written, not
what the process believes, and `python -m r1.summary RUN_DIR` prints it again
for any finished or stopped run.
"""
import json
import os
import sys

import yaml

from r1.logger import read_back
from r1.trajectory import saved_iterations


def read_metrics(path: str) -> list:
    """The metrics lines of a file (r1.logger.read_back: a cut-off last line is dropped with a warning);
    [] when there is no such file yet."""
    if not os.path.isfile(path):
        return []
    return [json.loads(line) for line in read_back(path, float("inf"))]


def _mean(rows: list, key: str):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def _fmt(x, pct=False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.3f}"


def _setting(config_path: str, section: str, key: str, default: str) -> str:
    """One string setting of the run's resolved config.yaml (`default` when it cannot be read)."""
    try:
        with open(config_path) as f:
            value = (yaml.safe_load(f) or {}).get(section, {}).get(key, default)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return default
    return value if isinstance(value, str) else default


def _eval_split(config_path: str) -> str:
    """The run's eval.split ('test' when it cannot be read)."""
    return _setting(config_path, "eval", "split", "test")


def summarize_run(run_dir: str, config_path: str | None = None) -> list[str]:
    """Lines of text describing the run in run_dir."""
    lines = [f"run folder: {run_dir}"]
    sft = read_metrics(os.path.join(run_dir, "sft", "metrics.jsonl"))
    if sft:
        first, last = sft[0].get("sft_loss"), sft[-1].get("sft_loss")
        lines.append(f"SFT warm-up: {len(sft)} steps, loss {_fmt(first)} -> {_fmt(last)} (run folder sft/)")
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    rl = [r for r in rows if r.get("iter", 0) >= 1]
    evals = [r for r in rows if "eval_accuracy" in r]
    if rl:
        k = max(1, min(5, len(rl) // 2))
        head, tail = rl[:k], rl[-k:]
        lines.append(f"RL: {len(rl)} iterations; batch reward {_fmt(_mean(head, 'reward_mean'))} -> "
                     f"{_fmt(_mean(tail, 'reward_mean'))}, accuracy {_fmt(_mean(head, 'accuracy'), True)} -> "
                     f"{_fmt(_mean(tail, 'accuracy'), True)} (mean of the first / last {k})")
        gap = _mean(rl, "logprob_gap_mean")
        if gap is not None:
            lines.append(f"sampler-trainer logprob gap: mean {gap:.2e} over the run")
    cfg = config_path or os.path.join(run_dir, "config.yaml")
    if evals:
        label = "validation accuracy" if _eval_split(cfg) == "val" else "held-out accuracy"  # val: not the test set
        a, b = evals[0], evals[-1]
        n = int(b.get("eval_n", 0) or 0)
        when = lambda r: "before RL" if r.get("iter", 0) == 0 else f"after iteration {r['iter']}"  # noqa: E731
        if len(evals) > 1:
            lines.append(f"{label}{f' ({n} problems, greedy)' if n else ''}: "
                         f"{_fmt(a['eval_accuracy'], True)} {when(a)} -> {_fmt(b['eval_accuracy'], True)} {when(b)}")
        else:
            lines.append(f"{label}: {_fmt(b['eval_accuracy'], True)} {when(b)}")
    lora_run = os.path.isdir(os.path.join(run_dir, "adapter"))  # a LoRA run (r1/lora.py)
    if os.path.isdir(os.path.join(run_dir, "hf")):
        lines.append(f"policy exported to {os.path.join(run_dir, 'hf')} (loads with transformers"
                     f"{'; the adapters merged in: load it alone' if lora_run else ''})")
    if lora_run:
        lines.append(f"LoRA adapters in {os.path.join(run_dir, 'adapter')} (peft.AutoPeftModelForCausalLM loads them "
                     f"over the base their adapter_config.json names; docs/lora.md)")
    # the run's own resolved config (cfg above): the eval hint keeps every override the run was given
    # hints only for what the run wrote (log.trajectories=false, run.save=false and log.tensorboard=false write less)
    saved = saved_iterations(run_dir)
    lines += ["next:"]
    if saved:
        lines.append(f"  python -m r1.trajectory show {run_dir} --iter {saved[-1]} --index 0   # read an episode")
    if os.path.isdir(os.path.join(run_dir, "hf")):
        lines.append(f"  python eval.py --config {cfg} model.path={run_dir} eval.limit=100          # held-out accuracy")
    curve = next((k for k in ("reward_mean", "sft_loss") if any(k in r for r in rows)), None)  # RL, or SFT alone
    if curve:
        lines.append(f"  python -m r1.plot {run_dir} --keys {curve} --out {curve}.png                  # curves")
    if os.path.isdir(os.path.join(run_dir, "tb")) and os.listdir(os.path.join(run_dir, "tb")):
        lines.append(f"  tensorboard --logdir {run_dir}")
    if _setting(cfg, "data", "task", "") != "gsm8k_tool":  # a GSM8K run has met the recipe; others may not have
        lines += ["  python train.py --config configs/gsm8k_tool.yaml          # GSM8K with the calculator: "
                  "23 min on one H200, SFT then PPO, 14.5% on test (days on a CPU)"]
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        sys.exit("usage: python -m r1.summary RUN_DIR")
    try:
        print("\n".join(summarize_run(argv[0])))
    except ValueError as e:  # a damaged metrics line: read_back names its file and line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
