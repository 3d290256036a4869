"""The host side of the agent loop's environment steps, without a model: r1's tokenizer vs transformers'.

On a small model the agent loop is bound by the host, not the GPU (bench/agent_rollout.py on one H200,
SmolLM2-135M shape: 0.45 s of environment steps and 0.18 s of detokenising in a 1.65 s rollout of 512
GSM8K episodes). This measures that host work alone, so it runs on any machine: the 512 episodes'
expert tool-use chats (the shapes bench/agent_rollout.py replays) are played through ToolEnv as the loop
plays them (detokenise the response, parse the tool call, run the calculator, render the observation
through the chat template, tokenise it, append), once with r1's ChatTokenizer as it is (render_next
memoised, encode by pieces) and once through transformers alone (every observation rendered by
apply_chat_template and encoded by hf.encode), in the same process, alternating. Both must build the
same prompts, token for token (checked).

    python bench/env_host.py [--episodes 512] [--repeats 9] [--tokenizer DIR]
"""
import argparse
import datetime
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import r1.rollout  # noqa: E402
from bench.agent_rollout import load_rows, make_env_factory, replay  # noqa: E402
from r1.envs.base import Action  # noqa: E402
from r1.tokenizer import _normalize_messages, load_tokenizer  # noqa: E402


def play(tok, episodes, make_env):
    """Every episode's environment steps, as AgentEnvLoop takes them -> the prompts the loop would submit."""
    prompts = []
    for e in episodes:
        env = make_env()
        prompt, _ = env.first_prompt(env.reset(e["sample"]))
        for resp in e["responses"]:
            action = Action(resp, tok.decode(resp), "eos" if resp[-1] in tok.stop_ids else "length")
            _, done, _, nxt, _ = r1.rollout._env_step(env, prompt, action)
            if done or nxt is None:
                break
            prompt = nxt
            prompts.append(prompt)
    return prompts


class Plain:
    """The tokenizer's transformers path: no memo, every text through hf.encode."""

    def __init__(self, tok):
        self.tok = tok

    def __enter__(self):
        tok = self.tok
        self.saved = tok.render_next, tok._split
        tok._split = None  # _encode -> hf.encode for every text
        tok.render_next = lambda msgs, tools=None, add_generation_prompt=True: tok._render_next(
            _normalize_messages(msgs), tools, add_generation_prompt)
        return self

    def __exit__(self, *exc):
        self.tok._split = self.saved[1]
        del self.tok.render_next  # the instance attribute: the class's method again


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--tokenizer", default="smollm2-135m-instruct")
    p.add_argument("--data", default=None, help="a GSM8K folder or file (default: the copy in data/gsm8k)")
    a = p.parse_args(argv)
    tok = load_tokenizer(a.tokenizer)
    make_env = make_env_factory(tok)
    episodes = replay(tok, load_rows(a.data or str(ROOT / "data" / "gsm8k"), a.episodes), make_env)
    times, digests = {"r1": [], "transformers": []}, {}
    for _ in range(a.repeats):
        for lane in times:
            tok._next.clear()  # each run starts cold: only repeats within the run hit the memo
            tok._pieces.clear()
            if lane == "transformers":
                with Plain(tok):
                    t = time.perf_counter()
                    prompts = play(tok, episodes, make_env)
                    times[lane].append(time.perf_counter() - t)
            else:
                t = time.perf_counter()
                prompts = play(tok, episodes, make_env)
                times[lane].append(time.perf_counter() - t)
            digests[lane] = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
    if digests["r1"] != digests["transformers"]:
        raise SystemExit("the two lanes built different prompts")
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"name": "env_host", "episodes": a.episodes, "env_steps": sum(len(e["responses"]) for e in episodes),
           "repeats": a.repeats, "r1_s": round(med["r1"], 3), "transformers_s": round(med["transformers"], 3),
           "r1_min_s": round(min(times["r1"]), 3), "transformers_min_s": round(min(times["transformers"]), 3),
           "ratio": round(med["transformers"] / med["r1"], 2), "same_prompts": True,
           "date": datetime.date.today().isoformat()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
