"""The --kernels option of the bench scripts that run without a config: config section kernels, set by words.

    python bench/train_step.py --kernels attention=fa4
    python bench/logprob_gap.py --kernels fa4=false decode=sdpa

Each word is a key of config section kernels (r1/config_schema.py Kernels) and its value, checked as the
config checks it (an unknown key or value is a one-line error). use() sets the process-wide paths through
r1/run.py use_kernels, as train.py and eval.py do; generator() gives the Generator's own switches, as
r1/actor.py passes them. A script measures one set of paths a process, so a comparison is two commands.
"""


def add(p):
    """Add --kernels KEY=VALUE ... to an argparse parser."""
    p.add_argument("--kernels", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config section kernels for this process, e.g. attention=fa4 fa4=false compile=false")


def use(words: list):
    """Load the default config with kernels.KEY=VALUE for each word, set the process's paths; the Kernels.
    An error is one line on stderr, exit 2."""
    from r1.config import ConfigError, load_config
    from r1.run import use_kernels

    try:
        cfg = load_config(None, [w if w.startswith("kernels.") else "kernels." + w for w in words])
    except ConfigError as e:
        raise SystemExit(f"error: --kernels: {e}") from None
    use_kernels(cfg)
    return cfg.kernels


def generator(k) -> dict:
    """A Generator's keyword arguments for Kernels k, as r1/actor.py builds them."""
    from r1.run import generator_switches

    return generator_switches(k)


def words(k) -> dict:
    """The keys of Kernels k that differ from the defaults, for a result's JSON to record."""
    from dataclasses import asdict

    from r1.config_schema import Kernels

    base = asdict(Kernels())
    return {key: v for key, v in asdict(k).items() if base[key] != v}
