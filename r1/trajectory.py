"""The token-exact trajectory store: Step and Trajectory records, save/load/show.

A Step holds exactly what the model saw and sampled: `prompt_ids`, then `response_ids` with the
sampler's `logprobs`, and `response_mask` (1 for a sampled token trained on; prompt, tool output and
forced tokens are never in the response). Ids travel from the sampler to the loss untouched; nothing here
re-tokenizes text. One gzipped JSON-lines file per iteration (`trajectories/iter_000001.jsonl.gz`), a
step's prompt stored as a delta against the previous step, a header naming the tokenizer (`show`
refuses another). Reading back is strict: a bad file, line, field, type or delta is a ValueError naming
file:line. `check_episodes` is the trainer's guard after a rollout: a step with non-finite logprobs,
out-of-vocabulary ids or a non-finite reward ends its episode there; the batch goes on.

    python -m r1.trajectory show RUN_DIR --iter N --index K     # a training run's iteration N
    python -m r1.trajectory show EVAL_OUT --index K              # eval.py's greedy episodes (its eval.out)
"""
import argparse
import gzip
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field, fields
from itertools import chain

import numpy as np


# File format: one JSON object per line and trajectory, {"uid", "group", "sample_id", "total_reward",
# "termination", "num_steps", "num_tool_calls", "policy_version", "meta", "steps": [...]}. A step's prompt
# is {"prompt_keep": k, "prompt_new": [...]}: prompt = (previous prompt + previous response)[:k] +
# prompt_new; the first step has prompt_keep 0, so append-policy episodes stay linear in size. Floats are
# plain JSON numbers (logprobs round-trip exactly). An optional first line {"r1_trajectories": 1,
# "tokenizer": {"name", "vocab_size", "sha256"}} names the tokenizer the ids belong to. check_episodes
# drops the bad step and any after it, keeps a non-finite reward as 0 and finishes the episode with the
# reason as its termination.
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


def common_prefix(a: list, b: list) -> int:
    """Length of the longest common prefix of two id lists. The usual case (b extends a, the append
    policy) is one slice comparison at C speed; otherwise a binary search over slice comparisons."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[lo:mid] == b[lo:mid] else (lo, mid)
    return lo


def to_record(t: Trajectory) -> dict:
    """A trajectory as its JSON record. The step fields are taken as they are (dataclasses.asdict would
    deep-copy every id list element by element: most of the time of writing an iteration's file)."""
    steps, prev = [], []
    for s in t.steps:
        keep = common_prefix(prev, s.prompt_ids)
        d = {k: getattr(s, k) for k in STEP_ORDER}
        d.update(prompt_keep=keep, prompt_new=s.prompt_ids[keep:])
        steps.append(d)
        prev = s.prompt_ids + s.response_ids
    return {"uid": t.uid, "group": t.group, "sample_id": t.sample_id, "total_reward": t.total_reward,
            "termination": t.termination, "num_steps": len(t.steps), "num_tool_calls": t.num_tool_calls,
            "policy_version": t.steps[0].policy_version if t.steps else 0, "meta": t.meta, "steps": steps}


STEP_ORDER = [f.name for f in fields(Step) if f.name != "prompt_ids"]  # a record's step keys, in field order
STEP_FIELDS = set(STEP_ORDER)
RECORD_FIELDS = {"uid", "group", "sample_id", "total_reward", "termination", "num_steps", "num_tool_calls",
                 "policy_version", "meta", "steps"}


def _ids(x, what) -> list:
    if not isinstance(x, list) or not all(type(i) is int and i >= 0 for i in x):
        raise ValueError(f"{what} must be a list of non-negative integer token ids")
    return x


def from_record(r: dict) -> Trajectory:
    """A record (see the module docstring) -> Trajectory; ValueError naming the bad field otherwise."""
    if not isinstance(r, dict):
        raise ValueError(f"expected a JSON object, got {type(r).__name__}")
    unknown = set(r) - RECORD_FIELDS
    if unknown or not isinstance(r.get("steps"), list) or not isinstance(r.get("meta", {}), dict):
        raise ValueError(f"unknown field {sorted(unknown)[0]!r}" if unknown else "'steps' must be a list and "
                         "'meta' an object")
    steps, prev = [], []
    for k, d in enumerate(r["steps"]):
        if not isinstance(d, dict):
            raise ValueError(f"step {k} is not an object")
        d = dict(d)
        bad = set(d) - STEP_FIELDS - {"prompt_keep", "prompt_new"}
        if bad:
            raise ValueError(f"step {k}: unknown field {sorted(bad)[0]!r}")
        keep = d.pop("prompt_keep", 0)
        if type(keep) is not int or not 0 <= keep <= len(prev):
            raise ValueError(f"step {k}: prompt_keep {keep!r:.20} is outside the previous step's {len(prev)} tokens")
        prompt = prev[:keep] + _ids(d.pop("prompt_new", []), f"step {k}: prompt_new")
        response = _ids(d.get("response_ids"), f"step {k}: response_ids")
        lp = d.get("logprobs")
        if not isinstance(lp, list) or len(lp) != len(response) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in lp):
            raise ValueError(f"step {k}: logprobs must be {len(response)} numbers, one per response token")
        mask = d.get("response_mask")
        if mask is not None and (not isinstance(mask, list) or len(mask) != len(response)):
            raise ValueError(f"step {k}: response_mask must be null or {len(response)} values")
        if not isinstance(d.get("info", {}), dict) or not isinstance(d.get("reward", 0.0), (int, float)):
            raise ValueError(f"step {k}: 'info' must be an object and 'reward' a number")
        s = Step(prompt_ids=prompt, **d)
        steps.append(s)
        prev = s.prompt_ids + s.response_ids
    for key, kind in (("uid", str), ("sample_id", str), ("group", int)):
        if not isinstance(r.get(key), kind):
            raise ValueError(f"field {key!r} must be a {kind.__name__}")
    return Trajectory(r["uid"], r["group"], r["sample_id"], steps, str(r.get("termination", "")), r.get("meta", {}))


def check_episodes(trajs: list, vocab_size: int) -> list:
    """Finish every episode at its first bad step (see the module docstring); returns [(uid, reason)]."""
    return [] if _all_valid(trajs, vocab_size) else _finish_bad(trajs, vocab_size)


def _finish_bad(trajs: list, vocab_size: int) -> list:
    """check_episodes step by step: each episode's first bad step, and what is done to it."""
    bad = []
    for t in trajs:
        for k, s in enumerate(t.steps):
            reason = None
            if len(s.logprobs) != len(s.response_ids):
                reason = "logprob_count"
            elif not all(isinstance(x, (int, float)) and math.isfinite(x) for x in s.logprobs):
                reason = "nonfinite_logprobs"
            elif any(not 0 <= i < vocab_size for i in s.response_ids):
                reason = "bad_token_id"
            elif not isinstance(s.reward, (int, float)) or not math.isfinite(s.reward):
                s.reward, s.done = 0.0, True  # the reply itself is fine: keep it, unscored
                s.info = {**s.info, "invalid": "nonfinite_reward"}
                t.steps, t.termination = t.steps[: k + 1], "nonfinite_reward"
                bad.append((t.uid, t.termination))
                break
            if reason is not None:
                t.steps, t.termination = t.steps[:k], reason
                if t.steps:
                    t.steps[-1].done = True
                t.meta = {**t.meta, "invalid_step": k}
                bad.append((t.uid, reason))
                break
    return bad


def _all_valid(trajs: list, vocab_size: int) -> bool:
    """True only when check_episodes would find nothing: every step's logprobs are Python ints or floats,
    finite, as many as its response ids, which are Python ints in [0, vocab_size), and every reward is a
    finite number. Checked over the whole batch at once (check_episodes' element-by-element loop took 46 ms of
    host time per iteration at configs/gsm8k_tool.yaml's batch, this 33: bench/host_score.py,
    docs/decisions.md "Host work of scoring"); anything it cannot vouch for, subclasses included, is left to that loop."""
    steps = [s for t in trajs for s in t.steps]
    if any(len(s.logprobs) != len(s.response_ids) for s in steps):
        return False
    if not {type(s.reward) for s in steps} <= {int, float}:
        return False
    if not set(map(type, chain.from_iterable(s.logprobs for s in steps))) <= {int, float}:
        return False
    if not set(map(type, chain.from_iterable(s.response_ids for s in steps))) <= {int}:
        return False
    try:  # an int too large for a float (a reward, a logprob) or for int64 (an id): the loop decides
        if not all(math.isfinite(s.reward) for s in steps):
            return False
        lp = np.fromiter(chain.from_iterable(s.logprobs for s in steps), dtype=np.float64)
        ids = np.fromiter(chain.from_iterable(s.response_ids for s in steps), dtype=np.int64)
    except OverflowError:
        return False
    return bool(np.isfinite(lp).all()) and (ids.size == 0 or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size))


EVAL_FILE = "eval_trajectories.jsonl.gz"  # eval.py's greedy episodes in its eval.out folder (r1/evaluate.py)


def iter_path(run_dir: str, iteration: int) -> str:
    return os.path.join(run_dir, "trajectories", f"iter_{iteration:06d}.jsonl.gz")


def tokenizer_id(tok) -> dict:
    """What identifies a tokenizer's ids: its name, vocabulary size and a hash of the vocabulary."""
    fp = tok.fingerprint() if hasattr(tok, "fingerprint") else None
    return fp or {"name": os.path.basename(str(getattr(tok, "name", "?")))}


def save(trajs: list, path: str, tokenizer=None):
    """Write atomically (temp file, fsync, rename): a crash never leaves half a file. With `tokenizer`,
    the first line records which tokenizer the ids belong to."""
    from r1.atomic import fsync_dir, fsync_file

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with gzip.open(tmp, "wt") as f:
        if tokenizer is not None:
            f.write(json.dumps({"r1_trajectories": 1, "tokenizer": tokenizer_id(tokenizer)}) + "\n")
        for t in trajs:
            f.write(json.dumps(to_record(t)) + "\n")
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


class Saver:
    """save() on a thread of its own, one file at a time: an iteration's file (encoding, gzip, fsync) is
    written while the next iteration runs, not on its critical path. save() waits for the file before; an
    error writing it surfaces at the next save() or wait(). The trainer waits before every checkpoint and
    at the end, so a checkpoint of iteration k has the files of iterations 1..k beside it."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(1, thread_name_prefix="r1-trajectories")
        self.pending = None

    def save(self, trajs: list, path: str, tokenizer=None):
        self.wait()
        if tokenizer is not None:  # the header's fingerprint is computed (then cached) on the caller's thread
            tokenizer_id(tokenizer)
        self.pending = (self.pool.submit(save, list(trajs), path, tokenizer), path)

    def wait(self):
        """The file in flight is written, or an OSError naming it (a full disk reads the same for every file)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending[0].result()
            except OSError as e:
                raise OSError(e.errno, e.strerror or str(e), pending[1]) from e

    def close(self):
        try:
            self.wait()
        finally:
            self.pool.shutdown()


# Read-back caps (r1/bounded.py). One line is one trajectory: a window-policy episode of 16 steps at the largest
# context the config allows (2^20 tokens, every prompt stored whole) is about 120 MB of JSON, so 256 MiB. A file:
# the quickstart's iterations are about 20 MB decompressed, a 1,024-episode iteration of 4 turns of 4,096 tokens
# about 450 MB; real files inflate 2.5-4x (ids and logprobs are digits), a degenerate policy's (one token, logprob
# 0.0) about 40x. So up to 64x the compressed size, and at least 256 MiB: a 3 MB file that inflates 1000x stops
# at 256 MiB read, not at a MemoryError. Parsed, a short trajectory costs far more memory than its text, so a file
# also holds at most 1,000,000 (a rollout batch is thousands, an evaluation 1,319 problems).
MAX_LINE = 256 << 20
MAX_TEXT = 256 << 20
MAX_RATIO = 64
MAX_TRAJECTORIES = 1_000_000


def read(path: str) -> tuple:
    """(header or None, trajectories) of one file; ValueError naming file:line for anything unreadable."""
    from r1.bounded import text_lines

    if not os.path.exists(path):
        raise FileNotFoundError(f"no trajectory file {path}")
    header, out, n = None, [], 0
    try:
        for n, line in text_lines(path, MAX_LINE, MAX_TEXT, "trajectory file", gz=True, ratio=MAX_RATIO):
            if not line.strip():
                continue
            if len(out) >= MAX_TRAJECTORIES:
                raise ValueError(f"trajectory file {path} holds more than {MAX_TRAJECTORIES} trajectories, the most "
                                 f"this reads; refusing to read further")
            try:
                rec = json.loads(line)
                if n == 1 and isinstance(rec, dict) and "r1_trajectories" in rec:
                    header = rec
                    continue
                out.append(from_record(rec))
            except (ValueError, TypeError, RecursionError) as e:
                raise ValueError(f"{path}:{n}: {str(e)[:160]}") from None
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:  # truncated, not gzip, bad bytes
        if n == 0 and "Not a gzipped file" in str(e):  # the wrong file (eval.json, say), not a damaged one
            raise ValueError(f"{path} is not a trajectory file (a gzipped JSON-lines file of episodes, such as "
                             f"eval_trajectories.jsonl.gz or trajectories/iter_*.jsonl.gz)") from None
        raise ValueError(f"{path}: truncated or corrupt after line {n} ({str(e)[:80] or type(e).__name__}); "
                         f"{len(out)} trajectories readable") from None
    return header, out


def load(path: str) -> list:
    return read(path)[1]


def load_eval(path: str) -> list:
    """eval.py's greedy episodes: from its eval.out folder (EVAL_FILE in it) or the file itself."""
    return load(os.path.join(path, EVAL_FILE) if os.path.isdir(path) else path)


def termination(t: Trajectory) -> str:
    """How the episode ended, for a reader: an episode whose last reply was cut at rollout.max_new_tokens
    (finish=length) says so, though the env scored that reply as its final answer (stored: answered)."""
    if t.termination == "answered" and t.steps and t.steps[-1].finish == "length":
        return "length (the last reply was cut at rollout.max_new_tokens and scored as the final answer)"
    return t.termination


def render(t: Trajectory, decode=None) -> str:
    """A readable view: each step's new prompt part, the response, masks, reward."""
    dec = decode or (lambda ids: " ".join(map(str, ids)))
    out = [f"trajectory {t.uid} group={t.group} sample={t.sample_id} steps={len(t.steps)} "
           f"reward={t.total_reward:g} tool_calls={t.num_tool_calls} termination={termination(t)}"]
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


def saved_iterations(run_dir: str) -> list:
    """The iterations whose trajectory file (iter_path) is in run_dir, ascending; [] without trajectories/."""
    folder = os.path.join(run_dir, "trajectories")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(m.group(1)) for f in names if (m := re.fullmatch(r"iter_(\d+)\.jsonl\.gz", f)))


def _saved_iterations(run_dir: str) -> str:
    """'; saved: iterations 1-3' (what --iter may name in run_dir), or '; RUN_DIR has no trajectories/'."""
    folder = os.path.join(run_dir, "trajectories")
    if not os.path.isdir(folder):
        return f"; {run_dir} has no trajectories/ folder (log.trajectories=false, or not a run folder)"
    its = saved_iterations(run_dir)
    if not its:
        return f"; {folder} holds no iteration yet"
    if len(its) == 1:
        return f"; saved: iteration {its[0]}"
    return f"; saved: iterations {its[0]}-{its[-1]}" if its == list(range(its[0], its[-1] + 1)) else \
        f"; saved: iterations {', '.join(map(str, its[:8]))}{' ...' if len(its) > 8 else ''}"


def _show_path(target: str, iteration) -> tuple:
    """(trajectory file, folder whose config.yaml names the tokenizer) for `show`: a run folder with --iter,
    an eval.out folder (its eval_trajectories.jsonl.gz), or a trajectory file itself."""
    if os.path.isfile(target):
        if iteration is not None:  # the file says which iteration it holds; a second answer could only disagree
            raise SystemExit(f"error: {target} is a trajectory file: --iter is for a run folder; drop it")
        folder = os.path.dirname(os.path.abspath(target))
        if os.path.basename(folder) == "trajectories":  # RUN_DIR/trajectories/iter_N.jsonl.gz: the run's config
            folder = os.path.dirname(folder)
        return target, folder
    if iteration is not None:
        if os.path.isfile(os.path.join(target, EVAL_FILE)) and not os.path.isdir(os.path.join(target, "trajectories")):
            raise SystemExit(f"error: {target} is an eval.out folder ({EVAL_FILE}): --iter is for a run folder; drop it")
        return iter_path(target, iteration), target
    if os.path.isfile(os.path.join(target, EVAL_FILE)):
        return os.path.join(target, EVAL_FILE), target
    if not os.path.isdir(target):
        raise SystemExit(f"error: {target}: no such run folder, eval.out folder or trajectory file")
    files = sorted(f for f in os.listdir(target) if f.endswith(".jsonl.gz"))  # e.g. docs/results/'s eval copies
    here = f"; trajectory files in it: {', '.join(files[:6])}{' ...' if len(files) > 6 else ''}" if files else ""
    raise SystemExit(f"error: {target}: --iter N names the iteration of a training run{_saved_iterations(target)}"
                     f"{here}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m r1.trajectory", description="Inspect saved trajectories.")
    sub = p.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show", help="print one trajectory with its turns, rewards and masks")
    show.add_argument("run_dir", help="a run folder (with --iter), an eval.out folder, or a .jsonl.gz file")
    show.add_argument("--iter", type=int, default=None, help="the iteration of a run folder, from 1")
    show.add_argument("--index", type=int, default=0)
    show.add_argument("--ids", action="store_true", help="print token ids instead of text")
    show.add_argument("--tokenizer", default=None, help="decode with this tokenizer (an HF folder, a .gguf, or a "
                      "short name such as smollm2-135m-instruct) instead of the one the run's config.yaml names: "
                      "for files whose run is not on this machine (docs/results/)")
    a = p.parse_args(argv)
    path, folder = _show_path(a.run_dir, a.iter)
    try:
        header, trajs = read(path)
    except (FileNotFoundError, ValueError) as e:  # a typo in RUN_DIR or --iter, a damaged file: one line
        missing = isinstance(e, FileNotFoundError) and a.iter is not None
        raise SystemExit(f"error: {e}{_saved_iterations(a.run_dir) if missing else ''}") from None
    if not 0 <= a.index < len(trajs):
        what = f"iteration {a.iter}" if a.iter is not None else path
        raise SystemExit(f"error: --index {a.index} out of range: {what} has {len(trajs)} trajectories")
    decode = None
    if not a.ids:
        decode = _run_decoder(folder, path, header, trajs[a.index], a.tokenizer)
    t = trajs[a.index]
    if a.iter is not None and re.fullmatch(r"\d+-\d+-\d+", t.uid):  # a training uid: <iteration from 0>-<group>-<sample>
        print(f"iteration {a.iter} (--iter counts from 1; the uid {t.uid} is <iteration - 1>-<group>-<sample>)")
    print(render(t, decode))


def _run_decoder(run_dir, path, header, traj, name=None):
    """The run's tokenizer (from its config.yaml; `name` instead where given), or None to print ids. A
    tokenizer that is not the one the file records, or a vocabulary the ids do not fit, is an error (exit
    non-zero), not garbage."""
    from r1.tokenizer import load_tokenizer

    source = "the run's config names" if name is None else "--tokenizer gives"
    if name is not None:  # the user's choice: a failure is theirs to see, not a fallback to ids
        try:
            tok = load_tokenizer(name)
        except Exception as e:
            raise SystemExit(f"error: --tokenizer {name}: {e}") from None
    else:
        try:
            import yaml

            from r1.bounded import read_text

            cfg = yaml.safe_load(read_text(os.path.join(run_dir, "config.yaml"), 1 << 20, "config"))  # read_yaml's cap
            name = cfg["model"].get("tokenizer") or cfg["model"]["path"]
            saved_dir = cfg["run"].get("dir") if isinstance(cfg.get("run"), dict) else None
            inside = os.path.relpath(name, saved_dir) if saved_dir else ".."
            if not os.path.exists(name) and not inside.startswith(".."):  # a path inside the run (its sft/hf) that
                name = os.path.join(run_dir, inside)  # does not resolve from here: the run moved, or cwd is elsewhere
            tok = load_tokenizer(name)
        except Exception as e:  # a readable fallback beats a crash when only ids are at hand
            print(f"(printing token ids: could not load the run's tokenizer: {e}; --tokenizer NAME decodes with "
                  f"another)")
            return None
    want = (header or {}).get("tokenizer")
    have = tokenizer_id(tok)
    if isinstance(want, dict) and want.get("sha256") and want.get("sha256") != have.get("sha256"):
        raise SystemExit(f"error: {path} was written with tokenizer {want.get('name')!r} (vocabulary "
                         f"{want.get('vocab_size')}, sha256 {str(want.get('sha256'))[:12]}), but {source} "
                         f"{have.get('name')!r} (vocabulary {have.get('vocab_size')}, sha256 "
                         f"{str(have.get('sha256'))[:12]}); pass --ids to print token ids")
    vocab = len(tok.hf)
    for k, s in enumerate(traj.steps):
        for i in s.prompt_ids + s.response_ids:
            if i >= vocab:
                raise SystemExit(f"error: {path}: trajectory {traj.uid} step {k} holds token id {i}, outside the "
                                 f"vocabulary of {have.get('name')!r} ({vocab} tokens); pass --ids to print token ids")
    if want is None:
        print("(this file does not record its tokenizer: decoded with the run's)")
    return tok.decode


if __name__ == "__main__":
    from r1.exits import run_main

    run_main(main)
