"""The peer, end to end: TRL's GRPOTrainer on our GSM8K-with-calculator task, side by side with ours.

    python bench/peer_trl.py train --model SFT_HF --tokenizer TOK --out DIR --seconds 300
    python bench/peer_trl.py report --ours RUN --trl DIR --ours-eval E1 --trl-eval E2 --sft-eval E0 ...

`train` runs TRL's GRPOTrainer for a fixed wall time and saves its policy as an HF folder
(DIR/hf) that eval.py reads; `report` puts both runs, their evals and the paired comparison in
one JSON object (bench/results/peer_trl.json). bench/device.py peer-trl is the device job: both
trainers at once, one GPU each, from the same SFT checkpoint, then both evaluated by eval.py.

Why it is built this way:
- TRL sees our task token for token. SmolLM2's ChatML has no tool syntax, and TRL finds tool
  calls through the tokenizer: its chat template renders calls and results, its response parser
  reads calls back out of sampled text. So the tokenizer gets CHAT_TEMPLATE, ChatML with calls
  and results written exactly as r1.tokenizer writes them for SmolLM2 (the Hermes convention;
  tests/test_peer_trl.py renders the expert chats both ways and compares ids), and TRL's own
  `<tool_call>` parser (its Qwen one).
- The system prompt holds our calculator schema block verbatim (the template ignores the schemas
  TRL passes, which transformers builds from a docstring and would word differently); the tool
  runs our calculator; the reward is r1.tasks.gsm8k.score of the last turn, 0 when an episode
  ends on a tool call (our env at max_steps). Our side runs with env.rewards.malformed=0 so
  both optimise the same reward.
- The settings the issue names come from configs/gsm8k_tool.yaml: 64 prompts x 8, lr 1e-5,
  temperature 1, 192 new tokens a turn, 6 turns (5 tool rounds), 4 optimizer steps per batch of
  512 episodes. Everything else is TRL's default: HF generate on one GPU (no vLLM here), bf16
  autocast, gradient checkpointing, the "dapo" loss, beta 0, a linear learning-rate decay, and
  weights loaded in fp32 (TRL's default for a model given by path; our trainer's master copy too).
- The wall-time stop is a TrainerCallback with the rule of train.time_limit: stop after the
  last optimizer step of the batch during which the time ran out, so no sampled episode is
  thrown away and both sides overrun by at most one iteration.
- Nothing TRL-specific is imported at module level, so the template test runs without TRL.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# SmolLM2's own template (ChatML, a default system turn) plus the Hermes rendering of r1.tokenizer:
# an assistant's tool calls as `<tool_call>\n{json}\n</tool_call>` after its content, joined by
# newlines; consecutive tool results as one user turn of `<tool_response>` blocks.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{ '<|im_start|>user\\n' }}"
    "{%- else -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}"
    "{%- set ns = namespace(text=message['content'] or '') -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set f = call['function'] -%}"
    "{%- if ns.text -%}{%- set ns.text = ns.text + '\\n' -%}{%- endif -%}"
    "{%- set ns.text = ns.text + '<tool_call>\\n{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": '"
    " + (f['arguments'] | tojson) + '}\\n</tool_call>' -%}"
    "{%- endfor -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + ns.text + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def prompt_messages(row) -> list:
    """The first turn our gsm8k_tool env renders for `row`, as plain messages: the system prompt with
    the calculator schema block, then the question."""
    from r1.envs.tools import get_tool
    from r1.tasks import gsm8k
    from r1.tokenizer import hermes_messages

    return hermes_messages(gsm8k.make_prompt(row, tools=True), [get_tool("calculator").schema])


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the number.

    Args:
        expression: The expression, for example "(48 + 24) / 2".
    """
    from r1.envs.tools import get_tool

    return get_tool("calculator")({"expression": expression}).text


def final_reward(messages: list, gold: str) -> float:
    """Our gsm8k score of the last assistant turn; 0 if the episode ended on a tool call or a tool result."""
    from r1.tasks import gsm8k

    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return 0.0
    return float(gsm8k.score(last.get("content") or "", gold))


# ---------------------------------------------------------------- train (TRL)


def train(a) -> dict:
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
        from trl.chat_template_utils import qwen3_template
    except ImportError as e:  # only this benchmark needs them: not in requirements.txt
        raise SystemExit(f"error: peer_trl.py train needs TRL ({e}); pip install trl==1.16.0 datasets") from None

    from r1.tasks import gsm8k
    from r1.tasks.builtin import GSM8K_DIR

    for flag, path in (("--model", a.model), ("--tokenizer", a.tokenizer)):
        if not os.path.isfile(os.path.join(path, "config.json" if flag == "--model" else "tokenizer_config.json")):
            raise SystemExit(f"error: {flag} {path} is not an HF {flag[2:]} folder (e.g. our SFT run's hf/)")
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        sys.exit(f"error: --out {out} exists and is not empty (nothing was overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    rows = gsm8k.load_split(a.data or GSM8K_DIR, "train")
    data = Dataset.from_list([{"prompt": prompt_messages(r), "answer": r["answer"]} for r in rows])

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    tok.chat_template = CHAT_TEMPLATE
    tok.response_template = qwen3_template  # TRL's parser for `<tool_call>{json}</tool_call>` after content
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    stats = {"generations": 0, "episodes": 0, "correct": 0.0, "reward_sum": 0.0}

    def reward(completions, answer, **_):
        r = [final_reward(c, g) for c, g in zip(completions, answer)]
        stats["generations"] += 1
        stats["episodes"] += len(r)
        stats["reward_sum"] += sum(r)
        return r

    per_generation = a.minibatches  # optimizer steps per batch of prompts x n episodes
    episodes = a.prompts * a.n
    micro = episodes // (per_generation * a.accum)

    class WallClock(TrainerCallback):
        """Stops after the last optimizer step of the batch in which --seconds ran out; logs with times."""

        def __init__(self):
            self.t0, self.logs, self.end = None, [], None

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % per_generation == 0 and time.time() - self.t0 >= a.seconds:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append({"t": round(time.time() - self.t0, 2), "step": state.global_step, **(logs or {})})

        def on_train_end(self, args, state, control, **kw):
            self.end = time.time()

    clock = WallClock()
    cfg = GRPOConfig(
        output_dir=str(out / "trainer"), seed=a.seed, learning_rate=a.lr, num_generations=a.n,
        per_device_train_batch_size=micro, gradient_accumulation_steps=a.accum,
        steps_per_generation=per_generation * a.accum, temperature=a.temperature,
        max_completion_length=a.max_completion, generation_kwargs={"max_new_tokens": a.max_new_tokens},
        max_tool_calling_iterations=a.max_steps - 1, max_steps=a.max_iterations * per_generation,
        logging_steps=1, save_strategy="no", report_to="none",
        bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
    )
    trainer = GRPOTrainer(model=a.model, reward_funcs=reward, args=cfg, train_dataset=data,
                          processing_class=tok, tools=[calculator], callbacks=[clock])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    seconds = clock.end - clock.t0
    trainer.save_model(str(out / "hf"))
    sampled = sum(l["completions/mean_length"] * episodes for l in clock.logs if "completions/mean_length" in l)
    res = {
        "seconds": round(seconds, 1), "iterations": stats["generations"], "episodes": stats["episodes"],
        "optimizer_steps": trainer.state.global_step, "sampled_tokens": round(sampled),
        "episodes_s": round(stats["episodes"] / seconds, 3), "sampled_tok_s": round(sampled / seconds, 1),
        "batch_reward_mean": round(stats["reward_sum"] / max(stats["episodes"], 1), 4),
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "settings": {"prompts": a.prompts, "n": a.n, "lr": a.lr, "temperature": a.temperature,
                     "max_new_tokens_per_turn": a.max_new_tokens, "max_completion_length": a.max_completion,
                     "max_steps": a.max_steps, "optimizer_steps_per_iteration": per_generation,
                     "micro_batch": micro, "grad_accum": a.accum},
    }
    (out / "trl_stats.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "trl_logs.jsonl").write_text("".join(json.dumps(l) + "\n" for l in clock.logs))
    print(json.dumps(res), flush=True)
    return res


# ---------------------------------------------------------------- report


def loop_seconds(run: str, rows: list) -> tuple:
    """(seconds, how) of our training loop, measured as TRL's is (first iteration's start to last
    iteration's end, logging and trajectory writing included): the last `time_elapsed` in
    metrics.jsonl; for a run from before that key, an upper bound from tensorboard, from the event
    file's creation (before the loop starts) to the last iteration's scalars."""
    if "time_elapsed" in rows[-1]:
        return rows[-1]["time_elapsed"], "time_elapsed"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(os.path.join(run, "tb"))
    tb.Reload()
    return tb.Scalars("reward_mean")[-1].wall_time - tb.FirstEventTimestamp(), "tensorboard (upper bound)"


def ours_stats(run: str) -> dict:
    """Iterations, episodes, sampled tokens and loop seconds of one of our runs, from its metrics."""
    from r1.logger import read_back

    lines = read_back(os.path.join(run, "metrics.jsonl"), upto=10**9)
    rows = [m for m in map(json.loads, lines) if "time_rollout" in m]
    if not rows:
        raise SystemExit(f"error: {run}/metrics.jsonl has no training iterations")
    seconds, how = loop_seconds(run, rows)
    phases = sum(m["time_rollout"] + m["time_score"] + m["time_train"] for m in rows)
    episodes = int(sum(m["n"] for m in rows))
    sampled = sum(m["mean_response_len"] * m["n"] for m in rows)
    return {"seconds": round(seconds, 1), "seconds_from": how, "phase_seconds": round(phases, 1),
            "iterations": len(rows), "episodes": episodes,
            "sampled_tokens": round(sampled), "episodes_s": round(episodes / seconds, 3),
            "sampled_tok_s": round(sampled / seconds, 1),
            "batch_reward_mean": round(sum(m["reward_mean"] * m["n"] for m in rows) / episodes, 4),
            "peak_memory_gb": round(max(m.get("peak_mem_gb", 0.0) for m in rows), 2) or None}  # torch allocated


def peak_from_smi(path: str | None) -> dict:
    """{gpu index: peak MiB} from an `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms N` log."""
    peaks = {}
    if path and os.path.exists(path):
        for line in open(path):
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                peaks[int(parts[0])] = max(peaks.get(int(parts[0]), 0), int(parts[1]))
    return peaks


def process_seconds(results_dir: str) -> dict:
    """{phase: seconds} of whole commands (start-up, loading and export included), from the
    `HH:MM:SS done NAME Ns` lines bench/device.py peer-trl writes to progress.txt."""
    import re

    out, path = {}, os.path.join(results_dir, "progress.txt")
    if os.path.exists(path):
        for line in open(path):
            m = re.match(r"\S+ done (\S+) (\d+)s$", line.strip())
            if m:
                out[m.group(1)] = int(m.group(2))
    return out


def report(a) -> dict:
    from r1.compare import correct_by_problem, mcnemar

    def compare(x, y):
        return mcnemar(correct_by_problem(x), correct_by_problem(y))

    def acc(path):
        f = os.path.join(path, "eval.json")
        if not os.path.isfile(f):
            raise SystemExit(f"error: {f} not found (the eval.out folder eval.py wrote)")
        return json.load(open(f))

    stats = os.path.join(a.trl, "trl_stats.json")
    if not os.path.isfile(stats):
        raise SystemExit(f"error: {stats} not found (written by `peer_trl.py train --out {a.trl}` when it ends)")
    ours, trl = ours_stats(a.ours), json.load(open(stats))
    peaks = peak_from_smi(a.smi)
    ours["peak_gpu_gb"] = round(peaks[a.ours_gpu] / 1024, 1) if a.ours_gpu in peaks else None
    trl["peak_gpu_gb"] = round(peaks[a.trl_gpu] / 1024, 1) if a.trl_gpu in peaks else None
    walls = process_seconds(os.path.dirname(os.path.abspath(a.ours)))
    for side, name in ((ours, "ours"), (trl, "trl")):  # the whole command, start-up and export included
        if name in walls:
            side["process_seconds"] = walls[name]
            side["process_episodes_s"] = round(side["episodes"] / walls[name], 3)
    ev = {k: acc(p) for k, p in (("sft", a.sft_eval), ("ours", a.ours_eval), ("trl", a.trl_eval)) if p}
    res = {
        "name": "peer_trl", "date": time.strftime("%Y-%m-%d"), "hardware": a.hardware,
        "seconds": a.seconds, "r1_episodes_s": ours["episodes_s"], "trl_episodes_s": trl["episodes_s"],
        "episodes_ratio": round(ours["episodes_s"] / trl["episodes_s"], 2) if trl["episodes_s"] else None,
        "episodes_ratio_process": (round(ours["process_episodes_s"] / trl["process_episodes_s"], 2)
                                   if "process_episodes_s" in ours and "process_episodes_s" in trl else None),
        "r1_sampled_tok_s": ours["sampled_tok_s"], "trl_sampled_tok_s": trl["sampled_tok_s"],
        "r1_iterations": ours["iterations"], "trl_iterations": trl["iterations"],
        "r1_accuracy": ev.get("ours", {}).get("accuracy"), "trl_accuracy": ev.get("trl", {}).get("accuracy"),
        "sft_accuracy": ev.get("sft", {}).get("accuracy"), "eval_n": ev.get("ours", {}).get("n"),
        "r1": ours, "trl": trl,
        "evals": {k: {x: v.get(x) for x in ("accuracy", "n", "mean_turns", "mean_tool_calls", "malformed_rate",
                                             "mean_response_len")} for k, v in ev.items()},
    }
    if a.ours_eval and a.trl_eval:
        res["paired_trl_vs_r1"] = compare(a.trl_eval, a.ours_eval)
    if a.sft_eval:
        for k in ("ours", "trl"):
            if ev.get(k):
                res[f"paired_sft_vs_{'r1' if k == 'ours' else k}"] = compare(a.sft_eval, getattr(a, f"{k}_eval"))
    text = json.dumps(res, indent=1) + "\n"
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text)
    print(text, end="")
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train TRL's GRPOTrainer for --seconds and save DIR/hf")
    t.add_argument("--model", required=True, help="HF folder of the starting policy (our SFT's hf/)")
    t.add_argument("--tokenizer", required=True, help="HF tokenizer folder (SmolLM2's)")
    t.add_argument("--out", required=True)
    t.add_argument("--data", default=None, help="GSM8K folder (default: the copy in data/gsm8k)")
    t.add_argument("--seconds", type=float, default=300.0)
    t.add_argument("--max-iterations", type=int, default=10_000, help="also stop after this many batches")
    t.add_argument("--prompts", type=int, default=64)
    t.add_argument("--n", type=int, default=8)
    t.add_argument("--lr", type=float, default=1e-5)
    t.add_argument("--temperature", type=float, default=1.0)
    t.add_argument("--max-new-tokens", type=int, default=192, help="per turn, as rollout.max_new_tokens")
    t.add_argument("--max-completion", type=int, default=1536, help="all turns and tool results together")
    t.add_argument("--max-steps", type=int, default=6, help="turns, as env.max_steps")
    t.add_argument("--minibatches", type=int, default=4, help="optimizer steps per batch, as algo.minibatches")
    t.add_argument("--accum", type=int, default=4, help="gradient accumulation per optimizer step")
    t.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("report", help="both runs, their evals and the paired comparison as one JSON object")
    r.add_argument("--ours", required=True, help="our run folder")
    r.add_argument("--trl", required=True, help="the train command's --out")
    r.add_argument("--ours-eval")
    r.add_argument("--trl-eval")
    r.add_argument("--sft-eval")
    r.add_argument("--smi", help="nvidia-smi memory log")
    r.add_argument("--ours-gpu", type=int, default=0)
    r.add_argument("--trl-gpu", type=int, default=1)
    r.add_argument("--seconds", type=float, default=None, help="the wall time both were given")
    r.add_argument("--hardware", default="")
    r.add_argument("--json", default=None)
    a = p.parse_args(argv)
    return train(a) if a.cmd == "train" else report(a)


if __name__ == "__main__":
    from r1.exits import run_main

    run_main(main)
