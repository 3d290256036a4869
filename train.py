"""Entry point: `python train.py --config configs/smoke.yaml key=value ...` (or under torchrun).

train.stage=rl runs the RL loop (r1/trainer.py); train.stage=sft runs SFT on
expert trajectories (r1/sft.py), whose exported hf/ folder starts RL.
"""
import argparse
import sys

from r1.config import USER_ERRORS, ConfigError, describe, dump, load_config


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config file; repeat to layer files (e.g. a base config, then an ablation)")
    p.add_argument("--keys", action="store_true", help="list every config key with its default and meaning")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=4 algo.advantage=grpo")
    a = p.parse_args(argv)
    if a.keys:
        print(describe())
        return
    try:
        cfg = load_config(a.config, a.overrides)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        print(dump(cfg), flush=True)
    try:  # set-up errors (paths, models, tokenizer, data) are the user's: one line, exit 2
        if cfg.train.stage == "sft":
            from r1.sft import setup_sft, train_sft

            job, run = setup_sft(cfg), train_sft
        else:
            from r1.trainer import Trainer

            job, run = Trainer(cfg), lambda t: t.fit()
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    run(job)  # a failure during training keeps its traceback


if __name__ == "__main__":
    main()
