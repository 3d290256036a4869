"""SFT on expert chats: the loss mask, a run that learns, and its hf/ export starting an RL run.

The mask is checked against the tokenizer's own rendering of the whole
chat: the trained spans must be exactly the assistant turns' text up to and
including the end-of-turn token, nothing of the system, user or tool turns.
"""
import json
import os
import re

import pytest
import torch

import train
from r1.envs.tool_env import parse_tool_calls
from r1.model import Transformer
from r1.envs.tools import get_tool
from r1.sft import expert_example
from r1.tasks import synthetic
from r1.tokenizer import load_tokenizer
from r1.trajectory import iter_path, load as load_trajs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


def spans(ids, mask):
    """Maximal runs of mask 1 -> list of id lists."""
    out, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            out, cur = out + [cur], []
    return out + ([cur] if cur else [])


def test_mask_is_assistant_content_and_end_of_turn(tok):
    row = synthetic.make_dataset(2, 0, 2)[1]  # a two-operation problem: two calculator calls, then the answer
    messages = synthetic.expert_messages(row)
    tools = [get_tool("calculator").schema]
    ids, mask = expert_example(tok, messages, tools)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    # the layout is the template's rendering of the whole chat, token for token
    assert ids == tok.render(messages, tools=tools, add_generation_prompt=False)
    # what the template puts inside the assistant turns, read from its text: content + end-of-turn
    text = tok.render_text(messages, tools=tools, add_generation_prompt=False)
    expected = re.findall(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", text, flags=re.S)
    trained = [tok.decode(s) for s in spans(ids, mask)]
    assert trained == expected
    assert len(trained) == sum(m["role"] == "assistant" for m in messages) == 3
    for s in spans(ids, mask):
        assert s[-1] in tok.stop_ids and not any(t in tok.stop_ids for t in s[:-1])
    # SFT teaches the call format the RL environment parses
    calls = [parse_tool_calls(t)[0] for t in trained]
    assert calls == [[("calculator", {"expression": e})] for e in re.findall(r"<<([^=]+)=", row["solution"])] + [[]]
    assert trained[-1].endswith(f"#### {row['answer']}<|im_end|>")
    # nothing of the system, user or tool turns is trained on
    untrained = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert row["question"] in untrained and "<tool_response>" in untrained


def test_sft_learns_and_its_export_starts_rl(tmp_path, tok):
    sft, rl = str(tmp_path / "sft"), str(tmp_path / "rl")
    # 4 fixed chats, every step sees all of them: the loss must fall
    train.main(["--config", SMOKE, f"run.dir={sft}", "train.stage=sft", "data.train_size=4", "train.sft_batch=4",
                "train.steps=20", "train.lr=3e-3", "log.tensorboard=false", "train.checkpoint_every=100"])
    with open(os.path.join(sft, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    loss = [m["sft_loss"] for m in lines]
    assert len(loss) == 20 and all(x > 0 for x in loss)
    assert loss[-1] < 0.6 * loss[0], loss  # 10.8 (uniform over 49152 tokens) -> about 4.8
    assert sum(b < a for a, b in zip(loss, loss[1:])) >= 17, loss  # full-batch steps: (almost) every one helps
    assert all(isinstance(m["grad_norm"], float) and m["lr"] == 3e-3 for m in lines)
    for name in ("config.yaml", "checkpoints/latest", "hf/model.safetensors", "hf/config.json", "hf/tokenizer.json"):
        assert os.path.exists(os.path.join(sft, name)), name

    train.main(["--config", SMOKE, f"run.dir={rl}", f"model.path={sft}/hf", "train.steps=1", "rollout.prompts=2",
                "rollout.n=2", "rollout.max_new_tokens=8", "data.train_size=8", "log.tensorboard=false"])
    with open(os.path.join(rl, "metrics.jsonl")) as f:
        assert [json.loads(x)["iter"] for x in f] == [1]
    # the RL run sampled from the SFT weights: its recorded logprobs are the SFT model's
    model = Transformer.from_pretrained(os.path.join(sft, "hf")).eval()
    step = load_trajs(iter_path(rl, 1))[0].steps[0]
    seq = torch.tensor(step.prompt_ids + step.response_ids)
    with torch.no_grad():
        logp = torch.log_softmax(model(seq[None])[0].float(), -1)
    n = len(step.prompt_ids)
    ours = logp[n - 1:-1].gather(1, seq[n:, None])[:, 0]
    assert (ours - torch.tensor(step.logprobs)).abs().max() < 1e-4


def test_no_expert_chat_within_max_context_is_one_line_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "sft"
    with pytest.raises(SystemExit) as e:
        train.main(["--config", SMOKE, f"run.dir={run}", "train.stage=sft", "data.train_size=4", "train.sft_batch=4",
                    "train.steps=2", "env.max_context=64", "rollout.max_new_tokens=8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.max_context=64" in err[0] and "none of the task's 4 expert chats fits" in err[0]
    assert not run.exists()
