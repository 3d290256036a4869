"""The rollout process's hand-over between two plays (train.overlap 2), asked for two ways in one run.

In a rollout-bound run (GRPO on the H200: the update ends before the next
play does) the iteration's period is the rollout process's play plus its
time between plays, Handle.idle_seconds (the trainer's `rollout_idle_s`).
That time holds the child's pickling and sending of the episodes, and, when
the trainer asks for the next play only after it has taken the reply
(`after`, the trainer's order before 2026-12-05), the trainer's side too:
taking the 4-MB reply, the refresh of the shared weights, the next request.
Asked for before the reply (`ahead`, r1/overlap.Rollouts.get now), the
request waits in the child, which starts it the moment the last play's
episodes are sent. Both orders drive the same RemoteActor, alternately in
rounds (a drift in the machine's load falls on both), with the trainer's
update a sleep of --update times a warm play's length (below 1: rollout
bound). The episodes are the config's own; --plays plays per order and round,
the same seeds in both orders of a round, so both play the same episodes (on
the H100, with a seed per order, the periods could not be told from the
plays' lengths).
The sleep is scaled by a warm play, after --warmup untimed ones: the first
play captures the CUDA graphs and compiles, and on an H100 took 23.7 s
against 2.2 s for the next one, so a sleep of half of it made the run
update-bound, the opposite of what the bench is for. One warm-up play was
not enough either: the second play took 2.68 s against 1.12-1.24 s for the
timed ones after it, and the run was update-bound again; after three it
was 1.49 s and the run rollout-bound (H100, 2026-12-05). Hence 3.

Prints one JSON object: per order the medians of `idle_s` (the child's time
between plays, from its second play on), `period_s` (between two replies
taken by the trainer) and `play_s` (the child's time for a play);
`rollout_bound` (each order's plays longer than the sleep; if not, the
period is the sleep's and only the idle times mean something); and,
measured in this process on one play's episodes, `reply_mb`, `dumps_s` and
`loads_s` (the pickling the child does and the decoding the trainer does,
off the child's path) and `refresh_s`.

    python bench/handover.py [--config configs/gsm8k_tool.yaml] [--plays 6] [--rounds 2] [--update 0.5]
                             [--warmup 3] [--save PATH] [key=value ...]
Without CUDA the config's model is replaced by a tiny random one (model.path=tiny) unless a key says
otherwise: a check of the code on a CPU, whose two processes share its cores (not a GPU estimate).
"""
import argparse
import datetime
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from r1.config import ConfigError, load_config  # noqa: E402
from r1.distributed import Dist  # noqa: E402
from r1.generate import Sampling  # noqa: E402
from r1.memory import slots_needed  # noqa: E402
from r1.rollout_process import RemoteActor  # noqa: E402
from r1.run import build_model, run_tokenizer  # noqa: E402
from r1.tasks.data import load_rows  # noqa: E402

CPU_MODEL = ["model.path=tiny", "model.tiny_layers=2", "model.tiny_hidden=64", "rollout.slots=512"]


def play_all(actor, policy, rows, n, plays: int, update_s: float, ahead: bool, seed: int) -> tuple:
    """`plays` plays one after another, the next asked for before (ahead) or after the last one's reply,
    with a sleep of update_s as the trainer's score and update -> (child idle seconds, periods, play seconds)."""
    def start(k):
        return actor.start(rows, n, Sampling(1.0, seed=seed + k), uid_prefix=f"{seed + k}-")

    actor.refresh(policy)
    handle, idle, period, play_s, last = start(0), [], [], [], None
    for k in range(1, plays + 1):
        if not ahead:
            handle.wait()
        nxt = None
        if k < plays:
            actor.refresh(policy)
            nxt = start(k)
        handle.result()
        now = time.time()
        if last is not None:
            period.append(now - last)
        last = now
        if k > 1:  # the block's first play follows the last block's: not a hand-over of this order
            idle.append(handle.idle_seconds)
        play_s.append(handle.seconds)
        time.sleep(update_s)
        handle = nxt
    return idle, period, play_s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/gsm8k_tool.yaml")
    ap.add_argument("--plays", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--update", type=float, default=0.5, help="the trainer's sleep, times a warm play's length")
    ap.add_argument("--warmup", type=int, default=3, help="untimed plays first (graph captures, compilation)")
    ap.add_argument("--save", default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.warmup < 0:
        raise SystemExit(f"error: --warmup must be >= 0, got {a.warmup}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    try:
        cfg = load_config(a.config, [*([] if cuda else CPU_MODEL), f"run.device={device.type}", "train.overlap=2",
                                     "algo.policy_loss=decoupled_ppo", *a.overrides])
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    d = Dist(0, 1, 0, device)
    tok = run_tokenizer(cfg)
    dtype = torch.bfloat16 if cuda else torch.float32
    policy = build_model(cfg.model.path, cfg, tok, device, seed=cfg.run.seed).eval().requires_grad_(False)
    shared = build_model(cfg.model.path, cfg, tok, device, seed=cfg.run.seed).to(dtype).eval().requires_grad_(False)
    rows = load_rows(cfg, "train")[:cfg.rollout.prompts]
    slots = cfg.rollout.slots or slots_needed(cfg, 1)  # auto (0): the rows a play needs, the memory plan's rule
    actor = RemoteActor(cfg, tok, shared, slots, d)
    try:
        t0 = time.time()
        for k in range(a.warmup):
            actor.play(rows, cfg.rollout.n, Sampling(1.0, seed=k + 1), uid_prefix=f"u{k}-")
        warmup_s = time.time() - t0
        t0 = time.time()  # a warm play: its length sets the sleep; its episodes the payload measures
        played = actor.play(rows, cfg.rollout.n, Sampling(1.0, seed=0), uid_prefix="w-")
        play_s = time.time() - t0
        update_s = a.update * play_s
        data = pickle.dumps(played, protocol=pickle.HIGHEST_PROTOCOL)
        t = time.perf_counter()
        pickle.dumps(played, protocol=pickle.HIGHEST_PROTOCOL)
        dumps_s = time.perf_counter() - t
        t = time.perf_counter()
        pickle.loads(data)
        loads_s = time.perf_counter() - t
        refresh = []
        for _ in range(5):
            t = time.perf_counter()
            actor.refresh(policy)
            if cuda:
                torch.cuda.synchronize()
            refresh.append(time.perf_counter() - t)
        out = {"after": ([], [], []), "ahead": ([], [], [])}
        for r in range(a.rounds):
            for name in ("after", "ahead"):
                idle, period, plays = play_all(actor, policy, rows, cfg.rollout.n, a.plays, update_s,
                                               name == "ahead", seed=1000 * (r + 1))  # the same in both orders
                out[name][0].extend(idle)
                out[name][1].extend(period)
                out[name][2].extend(plays)
                print(f"round {r + 1} {name}: idle {[round(x, 4) for x in idle]}", file=sys.stderr, flush=True)
    finally:
        actor.close()
    result = {
        "name": "handover", "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "model": cfg.model.path, "episodes": len(played), "plays_per_order": a.plays * a.rounds,
        "warmup_plays": a.warmup, "warmup_s": round(warmup_s, 4),
        "play_s": round(play_s, 4), "update_s": round(update_s, 4),
        **{name: {"idle_s": round(statistics.median(idle), 4), "period_s": round(statistics.median(period), 4),
                  "idle_max_s": round(max(idle), 4), "play_s": round(statistics.median(plays), 4)}
           for name, (idle, period, plays) in out.items()},
        # what the bench is for: each order's plays longer than the sleep (else the period is the sleep's)
        "rollout_bound": all(statistics.median(plays) > update_s for _, _, plays in out.values()),
        "reply_mb": round(len(data) / 2**20, 3), "dumps_s": round(dumps_s, 6), "loads_s": round(loads_s, 6),
        "refresh_s": round(statistics.median(refresh), 6),
        "torch": torch.__version__, "date": datetime.date.today().isoformat(),
    }
    print(json.dumps(result))
    if not result["rollout_bound"]:
        print(f"warning: update-bound (the sleep, {update_s:.3f} s, outlasted the plays): the periods are the "
              "sleep's and only the idle times mean something; try more --warmup plays or a smaller --update",
              file=sys.stderr)
    if a.save:
        Path(a.save).parent.mkdir(parents=True, exist_ok=True)
        with open(a.save, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
