"""The actor: the generator and the agent loop on the policy's current weights, for training and evaluation.

It owns what plays episodes: the run's tokenizer, the generator's model and
its KV cache (r1/generate.py), the AgentEnvLoop with the task's
environments (r1/rollout.py), and the weight refresh. The trainer's rollout
and r1/evaluate.py both play through it, so evaluation needs no trainer:
eval.py builds an actor alone (`standalone`) on model.path.

The generator's model is the policy itself on one float32 process; on a GPU
or under FSDP it is a full copy in the rollout dtype, which `refresh`
overwrites from the policy's full weights before every use: never stale
(with train.overlap: 1 also on one float32 process, and one update stale by
design: r1/overlap.py). A LoRA policy (r1/lora.py) gets a generator of its
own: merged weights W + scale * B @ A in a full copy (model.lora_generator:
merged), or the shared frozen base with copies of the adapters, which are
all that `refresh` moves (adapters; the policy itself on one float32
process without overlap).
"""
from __future__ import annotations

import torch

from r1 import distributed, lora
from r1.config import Config
from r1.generate import Generator, Sampling
from r1.rollout import AgentEnvLoop
from r1.run import build_model
from r1.tasks.registry import get_task, make_env


def generator_model(cfg: Config, tok, d, dtype: torch.dtype, policy=None):
    """The generator's model: `policy` itself on one float32 process (unless train.overlap: then the next
    rollout samples while the update changes the policy; or LoRA with merged weights); a LoRA policy's base
    with copies of its adapters (model.lora_generator: adapters); otherwise model.path built in the rollout
    dtype, without gradients (with a policy: a copy that `Actor.refresh` keeps current)."""
    adapters = bool(cfg.model.lora_rank) and cfg.model.lora_generator == "adapters"
    if (policy is not None and d.world == 1 and dtype == torch.float32 and (adapters or not cfg.model.lora_rank)
            and not cfg.train.overlap):
        return policy
    if adapters and policy is not None:  # the base shared, the adapters copied (r1/lora.py generator_copy)
        return lora.generator_copy(policy, dtype)
    model = build_model(cfg.model.path, cfg, tok, d.device, seed=cfg.run.seed)
    if policy is None and cfg.eval.adapter:  # eval.py: the base with a LoRA run's adapters, unmerged
        lora.load_peft(model, cfg.eval.adapter)
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


class Actor:
    """Plays episodes with one generator (`slots` rows at once) and the task's environments."""

    def __init__(self, cfg: Config, tok, model, slots: int, d):
        self.cfg, self.tok, self.model, self.d = cfg, tok, model, d
        cache_len = cfg.rollout.cache_len or cfg.env.max_context
        stop_strings = get_task(cfg.data.task).stop_strings  # a task's own: Task(stop_strings=...)
        k = cfg.kernels  # the generator's own switches (None: on where it applies)
        self.gen = Generator(model, slots, cache_len, stop_ids=tok.stop_ids, cuda_graphs=d.device.type == "cuda",
                             fuse=None if k.fuse else False, overlap=None if k.launch_ahead else False,
                             mix=None if k.mixed_steps else False, chunk_graphs=k.chunk_graphs,
                             triton_sample=k.sample != "torch",
                             share_prompt=cfg.rollout.share_prompt, stop_strings=stop_strings,
                             decode=tok.decode if stop_strings else None)
        self.loop = AgentEnvLoop(self.gen, tok, make_env(cfg, tok), cfg.rollout.max_new_tokens,
                                 sync_every=cfg.rollout.sync_every or None)

    def refresh(self, policy):
        """Copy the policy's weights into the generator's model (nothing when it is the policy). Under FSDP
        the full weights are gathered: every rank calls it."""
        if policy is self.model:
            return
        full = distributed.full_state_dict(policy)
        m = self.cfg.model
        if m.lora_rank and m.lora_generator == "adapters":  # the base is shared (or a frozen copy): adapters only
            lora.copy_adapters(self.model, full)
            return
        if m.lora_rank:  # the generator runs the merged weights (one matmul per projection), merged one at a time
            target = self.model.state_dict()
            with torch.no_grad():
                for k, v in lora.merged_items(full, m.lora_alpha / m.lora_rank):
                    target[k].copy_(v)
            return
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(full[k])

    def graph_counts(self, since: tuple | None = None) -> tuple | None:
        """(prefill chunks run outside CUDA graphs, CUDA graphs captured: chunks and decode steps) so far, or
        their increase `since` an earlier count; None without chunk graphs (the CPU). Eager chunks are 0
        where chunk graphs are usable (bf16/fp16 with torch's flash kernels), else every chunk; captures
        are shapes met for the first time."""
        graphs = self.gen.chunk_graphs
        if not graphs:
            return None
        now = (graphs.calls["eager"], len(graphs.graphs) + len(self.gen.graphs))
        return now if since is None else (now[0] - since[0], now[1] - since[1])

    def play(self, rows: list, n: int, sampling: Sampling, **run) -> list:
        """n episodes per row with this sampling; `run`: AgentEnvLoop.run's policy_version, uid_prefix, groups."""
        self.gen.set_sampling(sampling)
        training = self.model.training  # the generator may be the policy itself: its mode (LoRA dropout) returns
        self.model.eval()
        try:
            return self.loop.run(rows, n, **run)
        finally:
            self.model.train(training)


def standalone(cfg: Config) -> Actor:
    """An actor on model.path with nothing to train (evaluation: train.steps=0): the model in the rollout
    dtype, its KV cache sized by the memory plan, no run folder."""
    from r1 import memory
    from r1.run import resolve_dtype, run_tokenizer

    d = distributed.init(cfg.run.device)
    torch.manual_seed(cfg.run.seed)
    tok = run_tokenizer(cfg)
    model = generator_model(cfg, tok, d, resolve_dtype(cfg, d.device))
    plan = memory.plan_for(cfg, model.cfg, d)
    return Actor(cfg, tok, model, plan.slots, d)
