"""The actor: the generator and the agent loop on the policy's current weights, for training and evaluation.

It owns what plays episodes: the generator's model and KV cache
(r1/generate.py), the AgentEnvLoop with the task's environments
(r1/rollout.py), and the weight refresh. The trainer's rollout and
r1/evaluate.py both play through it, so eval.py builds an actor alone
(`standalone`). The generator's model is the policy itself on one float32
process without overlap; otherwise a copy in the rollout dtype that `refresh`
overwrites from the policy's full weights (one update stale by design under
train.overlap: r1/overlap.py). A LoRA policy's generator runs merged weights
in a full copy (model.lora_generator: merged) or the shared frozen base with
copies of the adapters, all that `refresh` then moves. `start` plays in a
thread (train.overlap 1); r1/rollout_process.RemoteActor offers the same
methods with the plays in a process of their own (train.overlap 2).
"""
from __future__ import annotations

import torch

from r1 import chunk_graphs, distributed, lora
from r1.config import Config
from r1.generate import Generator, Sampling
from r1.overlap import Background
from r1.rollout import AgentEnvLoop
from r1.run import build_model, generator_switches
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


def copy_weights(cfg: Config, model, policy):
    """The policy's weights into the generator's `model` (nothing when it is the policy); under FSDP the full
    weights are gathered, so every rank calls it. LoRA: the adapters only (lora_generator: adapters), or the
    merged weights, merged one at a time."""
    if policy is model:
        return
    full = distributed.full_state_dict(policy)
    m = cfg.model
    if m.lora_rank and m.lora_generator == "adapters":  # the base is shared (or a frozen copy): adapters only
        lora.copy_adapters(model, full)
        return
    if m.lora_rank:  # the generator runs the merged weights (one matmul per projection)
        target = model.state_dict()
        with torch.no_grad():
            for k, v in lora.merged_items(full, m.lora_alpha / m.lora_rank):
                target[k].copy_(v)
        return
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(full[k])


class Actor:
    """Plays episodes with one generator (`slots` rows at once) and the task's environments."""

    def __init__(self, cfg: Config, tok, model, slots: int, d):
        self.cfg, self.tok, self.model, self.d = cfg, tok, model, d
        cache_len = cfg.rollout.cache_len or cfg.env.max_context
        stop_strings = get_task(cfg.data.task).stop_strings  # a task's own: Task(stop_strings=...)
        self.gen = Generator(model, slots, cache_len, stop_ids=tok.stop_ids, cuda_graphs=d.device.type == "cuda",
                             **generator_switches(cfg.kernels), share_prompt=cfg.rollout.share_prompt,
                             stop_strings=stop_strings,
                             decode=tok.decode if stop_strings else None)
        self.loop = AgentEnvLoop(self.gen, tok, make_env(cfg, tok), cfg.rollout.max_new_tokens,
                                 sync_every=cfg.rollout.sync_every or None)
        self.playing = None  # the play `start` runs in a thread

    def refresh(self, policy):
        """Copy the policy's weights into the generator's model (copy_weights), after the play in a thread,
        if any, has ended (its error kept for its result()). Under FSDP every rank calls it."""
        if self.playing is not None:
            self.playing.wait()
            self.playing = None
        copy_weights(self.cfg, self.model, policy)

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

    def counted_play(self, rows: list, n: int, sampling: Sampling, **run) -> tuple:
        """play -> (episodes, the graph_counts it added, the CUDA graph captures it deferred)."""
        graphs, deferred = self.graph_counts(), chunk_graphs.deferred()
        played = self.play(rows, n, sampling, **run)
        return played, self.graph_counts(since=graphs), chunk_graphs.deferred() - deferred

    def start(self, rows: list, n: int, sampling: Sampling, **run) -> Background:
        """counted_play in a thread (r1/overlap.py); returns at once. One at a time: refresh, cancel or the
        handle's result() ends it."""
        self.playing = Background(lambda: self.counted_play(rows, n, sampling, **run), self.d.device)
        return self.playing

    def cancel(self):
        """Stop the play in a thread at its next chunk (rollout.Cancelled) and wait for it."""
        if self.playing is None:
            return
        self.loop.stop.set()
        try:
            self.playing.wait()
        finally:
            self.loop.stop.clear()
            self.playing = None

    def close(self):
        """rollout.carry_tokens: the paused episodes are never played on; their environments close."""
        self.loop.drop_carried()


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
