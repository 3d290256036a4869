"""bench/env_host.py on a few episodes: r1's tokenizer path (memoised render_next, encode by pieces) and
transformers' path build the same prompts, token for token (the benchmark exits otherwise), and both
lanes are timed."""
from pathlib import Path

from bench import env_host

DATA = Path(__file__).resolve().parents[2] / "data" / "gsm8k"


def test_env_host_bench_lanes_build_the_same_prompts():
    r = env_host.main(["--episodes", "24", "--repeats", "2", "--data", str(DATA)])
    assert r["same_prompts"] and r["env_steps"] > 24
    assert r["r1_s"] > 0 and r["transformers_s"] > 0


def test_plain_lane_leaves_the_tokenizer_as_it_was():
    from r1.tokenizer import ChatTokenizer, load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    split = tok._split
    with env_host.Plain(tok):
        assert tok._split is None and "render_next" in vars(tok)
    assert tok._split is split and "render_next" not in vars(tok)
    assert tok.render_next.__func__ is ChatTokenizer.render_next
