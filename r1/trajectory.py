"""The token-exact trajectory store: Step and Trajectory records, save/load/show.

A Step holds exactly what the model saw and sampled: `prompt_ids`, then
`response_ids` with the sampler's `logprobs`, and `response_mask` (1 for a
sampled token that is trained on; prompt, tool output and forced tokens are
never in the response, so they are 0 by construction). Ids travel from the
sampler to the loss untouched; nothing here re-tokenizes text.

File format (one file per iteration, `trajectories/iter_000001.jsonl.gz`):
one JSON object per line and trajectory, `{"uid", "group", "sample_id",
"total_reward", "termination", "num_steps", "num_tool_calls", "policy_version",
"meta", "steps": [...]}`. To keep append-policy episodes linear in size, a
step's prompt is stored as a delta against the previous step:
`{"prompt_keep": k, "prompt_new": [...]}` means prompt = (previous prompt +
previous response)[:k] + prompt_new; the first step has prompt_keep 0.
Floats are plain JSON numbers (logprobs round-trip exactly).

    python -m r1.trajectory show RUN_DIR --iter N --index K
"""
import argparse
import gzip
import json
import os
from dataclasses import asdict, dataclass, field


@dataclass
class Step:
    prompt_ids: list
    response_ids: list
    logprobs: list
    reward: float = 0.0
    done: bool = False
    finish: str = "eos"  # how sampling ended: eos | stop | length
    info: dict = field(default_factory=dict)
    response_mask: list | None = None  # None = all ones
    policy_version: int = 0

    @property
    def mask(self) -> list:
        return self.response_mask if self.response_mask is not None else [1] * len(self.response_ids)


@dataclass
class Trajectory:
    uid: str
    group: int
    sample_id: str
    steps: list = field(default_factory=list)
    termination: str = ""  # answered | max_steps | context_budget | ...
    meta: dict = field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def num_tool_calls(self) -> int:
        return int(sum(s.info.get("tool_calls", 0) for s in self.steps))

    @property
    def num_errors(self) -> int:
        return int(sum(len(s.info.get("errors", [])) for s in self.steps))

    def is_append_only(self) -> bool:
        """True when every prompt extends the previous prompt + response (one packed sequence)."""
        for a, b in zip(self.steps, self.steps[1:]):
            prev = a.prompt_ids + a.response_ids
            if b.prompt_ids[: len(prev)] != prev:
                return False
        return True


def to_record(t: Trajectory) -> dict:
    steps, prev = [], []
    for s in t.steps:
        keep = 0
        while keep < min(len(prev), len(s.prompt_ids)) and prev[keep] == s.prompt_ids[keep]:
            keep += 1
        d = asdict(s)
        del d["prompt_ids"]
        d.update(prompt_keep=keep, prompt_new=s.prompt_ids[keep:])
        steps.append(d)
        prev = s.prompt_ids + s.response_ids
    return {"uid": t.uid, "group": t.group, "sample_id": t.sample_id, "total_reward": t.total_reward,
            "termination": t.termination, "num_steps": len(t.steps), "num_tool_calls": t.num_tool_calls,
            "policy_version": t.steps[0].policy_version if t.steps else 0, "meta": t.meta, "steps": steps}


def from_record(r: dict) -> Trajectory:
    steps, prev = [], []
    for d in r["steps"]:
        d = dict(d)
        prompt = prev[: d.pop("prompt_keep")] + d.pop("prompt_new")
        s = Step(prompt_ids=prompt, **d)
        steps.append(s)
        prev = s.prompt_ids + s.response_ids
    return Trajectory(r["uid"], r["group"], r["sample_id"], steps, r.get("termination", ""), r.get("meta", {}))


def iter_path(run_dir: str, iteration: int) -> str:
    return os.path.join(run_dir, "trajectories", f"iter_{iteration:06d}.jsonl.gz")


def save(trajs: list, path: str):
    """Write atomically (temp file + rename): a crash never leaves half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt") as f:
        for t in trajs:
            f.write(json.dumps(to_record(t)) + "\n")
    os.replace(tmp, path)


def load(path: str) -> list:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no trajectory file {path}")
    with gzip.open(path, "rt") as f:
        return [from_record(json.loads(line)) for line in f if line.strip()]


def render(t: Trajectory, decode=None) -> str:
    """A readable view: each step's new prompt part, the response, masks, reward."""
    dec = decode or (lambda ids: " ".join(map(str, ids)))
    out = [f"trajectory {t.uid} group={t.group} sample={t.sample_id} steps={len(t.steps)} "
           f"reward={t.total_reward:g} tool_calls={t.num_tool_calls} termination={t.termination}"]
    prev = []
    for i, s in enumerate(t.steps):
        keep = len(prev) if s.prompt_ids[: len(prev)] == prev else 0
        out.append(f"--- step {i}: prompt {len(s.prompt_ids)} tokens ({len(s.prompt_ids) - keep} new, mask 0), "
                   f"response {len(s.response_ids)} tokens (mask {sum(s.mask)}/{len(s.mask)}), "
                   f"reward {s.reward:g}, done {s.done}, finish {s.finish}, info {s.info}")
        out.append("[prompt, new part]\n" + dec(s.prompt_ids[keep:]))
        out.append("[response]\n" + dec(s.response_ids))
        prev = s.prompt_ids + s.response_ids
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m r1.trajectory", description="Inspect saved trajectories.")
    sub = p.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show", help="print one trajectory with its turns, rewards and masks")
    show.add_argument("run_dir")
    show.add_argument("--iter", type=int, required=True)
    show.add_argument("--index", type=int, default=0)
    show.add_argument("--ids", action="store_true", help="print token ids instead of text")
    a = p.parse_args(argv)
    try:
        trajs = load(iter_path(a.run_dir, a.iter))
    except FileNotFoundError as e:  # a typo in RUN_DIR or --iter deserves one line, not a traceback
        raise SystemExit(f"error: {e}") from None
    if not 0 <= a.index < len(trajs):
        raise SystemExit(f"error: --index {a.index} out of range: iteration {a.iter} has {len(trajs)} trajectories")
    decode = None
    if not a.ids:
        decode = _run_decoder(a.run_dir)
    print(render(trajs[a.index], decode))


def _run_decoder(run_dir):
    """The run's tokenizer (from its config.yaml), or None to print ids."""
    try:
        import yaml

        from r1.tokenizer import load_tokenizer

        with open(os.path.join(run_dir, "config.yaml")) as f:
            model = yaml.safe_load(f)["model"]
        tok = load_tokenizer(model.get("tokenizer") or model["path"])
        return lambda ids: tok.hf.decode(ids, skip_special_tokens=False)
    except Exception as e:  # a readable fallback beats a crash when only ids are at hand
        print(f"(printing token ids: could not load the run's tokenizer: {e})")
        return None


if __name__ == "__main__":
    main()
