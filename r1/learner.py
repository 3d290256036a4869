"""The learner: the models being trained and what is done to them: score, update, export.

It owns the policy (and the critic, the reference), their AdamW optimizers
and learning-rate schedules (each as long as its own optimizer's steps), and
the two things an iteration does with them: step 2, scoring (one packed
forward per model, no gradient), and step 4, the update (`ppo_epochs` policy
and `vf_epochs` critic passes of `minibatches` optimizer steps), then the HF
export. The loop (r1/trainer.py) decides when; r1/credit.py toward what.

An optimizer step sums packed micro-batches normalised by counts over the
whole mini-batch on every rank, so the update does not depend on how tokens
are split; a non-finite loss or gradient on any rank skips the step on every
rank. LoRA (r1/lora.py): the optimizers hold adapters and value head only,
the reference is the policy with adapters off. train.precision=bf16: a bf16
copy computes, the optimizers step the float32 masters (r1/precision.py).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from r1 import distributed, lora
from r1.algos.estimators import ESTIMATORS
from r1.algos.losses import aggregate, entropy_bonus, kl_penalty, value_loss
from r1.algos.policy_losses import POLICY_LOSSES, PolicyInputs
from r1.config import Config, ConfigError
from r1.credit import Credit
from r1.model import Transformer
from r1.packing import Plan, filler
from r1.precision import Compute
from r1.run import build_model, lr_lambda


def build_models(cfg: Config, tok, device) -> tuple:
    """(policy, critic or None, reference or None) in float32, built in this order from the global RNG the
    caller seeded (a pretrained critic's value head draws from it). A critic for an estimator that needs
    one (GAE), a reference for a KL term (algo.kl_coef > 0); a tiny critic or reference starts as the policy."""
    if cfg.model.lora_rank:
        return lora_models(cfg, tok, device)
    policy = build_model(cfg.model.path, cfg, tok, device, seed=cfg.run.seed)
    critic = ref = None
    if ESTIMATORS[cfg.algo.advantage].needs_critic:
        critic = build_model(cfg.model.critic_path or cfg.model.path, cfg, tok, device, value_head=True,
                             seed=cfg.run.seed)
        if cfg.model.path == "tiny" and not cfg.model.critic_path:  # same init as the policy body
            critic.model.load_state_dict(policy.model.state_dict())
        critic = first_layers(critic, cfg.model.critic_layers, cfg.model.critic_path or cfg.model.path)
    if cfg.algo.kl_coef > 0:
        ref = build_model(cfg.model.ref_path or cfg.model.path, cfg, tok, device, seed=cfg.run.seed)
        if cfg.model.path == "tiny" and not cfg.model.ref_path:
            ref.load_state_dict(policy.state_dict())
        ref.requires_grad_(False)
    return policy, critic, ref


def lora_models(cfg: Config, tok, device) -> tuple:
    """(policy, critic or None, None) over one frozen base (r1/lora.py): the base in bfloat16 on CUDA (float32
    on the CPU), the critic's body the same Parameter objects, adapters and value head in float32. The
    reference is not a model: the Learner runs the policy with its adapters off."""
    m = cfg.model
    policy = build_model(m.path, cfg, tok, device, seed=cfg.run.seed)
    if device.type == "cuda":
        policy.to(torch.bfloat16)  # the frozen base: autocast computes in bf16 anyway; half the bytes
    lora.freeze_base(policy)
    critic = None
    if ESTIMATORS[cfg.algo.advantage].needs_critic:
        with torch.device("meta"):
            critic = Transformer(policy.cfg, value_head=True)
        lora.share_body(critic, policy)
        critic = first_layers(critic, m.critic_layers, m.path)
        critic.score = torch.nn.Linear(policy.cfg.hidden_size, 1, device=device)
        if m.path == "tiny":  # build_model's tiny init
            torch.nn.init.normal_(critic.score.weight, std=0.02)
        else:  # Transformer.from_pretrained's: a zero head
            torch.nn.init.zeros_(critic.score.weight)
        torch.nn.init.zeros_(critic.score.bias)
    lora.add_adapters(policy, m.lora_rank, m.lora_alpha, m.lora_targets, m.lora_dropout)
    if critic is not None:
        lora.add_adapters(critic, m.lora_rank, m.lora_alpha, m.lora_targets, m.lora_dropout)
    return policy, critic, None


def first_layers(critic: Transformer, k: int, path: str) -> Transformer:
    """The critic cut to its first k blocks (model.critic_layers; 0 = all), its final norm and value head kept:
    the values are read from the residual stream at depth k. The blocks dropped are freed here, before any
    optimizer, precision copy or FSDP wrapper sees them, so a checkpoint and a resume hold the same k."""
    n = len(critic.model.layers)
    if not k or k == n:
        return critic
    if k > n:
        raise ConfigError(f"config key 'model.critic_layers'={k}: the critic's model ({path}) has {n} layers")
    critic.model.layers = critic.model.layers[:k]
    critic.cfg = critic.cfg.replace(num_layers=k)
    return critic


def epochs(algo, it: int, critic: bool) -> tuple:
    """(policy passes, critic passes) of iteration `it`: the policy rests while the critic warms up
    (algo.critic_warmup), the critic makes algo.vf_epochs passes (0 = ppo_epochs); no critic, no passes."""
    if not critic:
        return algo.ppo_epochs, 0
    return (0 if it < algo.critic_warmup else algo.ppo_epochs), (algo.vf_epochs or algo.ppo_epochs)


def schedule_lengths(cfg: Config, critic: bool) -> tuple:
    """(policy, critic) optimizer steps over train.steps iterations, each the length of its model's
    learning-rate schedule: the passes `epochs` gives, algo.minibatches steps each. A schedule counts the
    steps its own optimizer takes, so each cosine reaches its floor at the run's last step."""
    a, n = cfg.algo, cfg.train.steps  # the sums of `epochs` over the iterations, in closed form
    if not critic:
        return n * a.ppo_epochs * a.minibatches, 0
    return max(0, n - a.critic_warmup) * a.ppo_epochs * a.minibatches, n * (a.vf_epochs or a.ppo_epochs) * a.minibatches


class Learner:
    """The trained models with their optimizers and schedules: scoring, the update, the export."""

    def __init__(self, cfg: Config, tok, d, dtype: torch.dtype, policy: Transformer, critic: Transformer | None,
                 ref: Transformer | None, checkpointing: bool):
        """Wrap the models (r1/distributed.py: activation checkpointing, FSDP2 over d's ranks) and make their
        optimizers. dtype: the rollout dtype, which the export uses."""
        self.cfg, self.tok, self.d, self.device, self.dtype = cfg, tok, d, d.device, dtype
        self.model_cfg = policy.cfg
        # LoRA: FSDP shards what trains; the frozen base, one set of tensors that policy and critic share, stays
        # whole on every rank (no gradient, no optimizer state: sharding it would split the sharing)
        frozen = {p for m in (policy, critic) if m is not None for p in m.parameters() if not p.requires_grad}
        self.policy = distributed.parallelize(policy, d, checkpointing, ignored=frozen)
        self.critic = distributed.parallelize(critic, d, checkpointing, ignored=frozen) if critic is not None else None
        self.ref = distributed.parallelize(ref, d, False) if ref is not None else None
        if cfg.model.lora_rank and cfg.algo.kl_coef > 0:
            self.ref = lora.Reference(self.policy)  # the shared base itself: no copy
        # what runs the forward and backward: the model, or its bf16 copy (train.precision=bf16, r1/precision.py;
        # several GPUs: FSDP's mixed precision does the same, config.validate refuses LoRA)
        self.copies = {}
        self.gap_max = None  # the sampler gap's max over an update that scored no old logprobs (policy_objective)
        self.scored_weights = True  # whether the policy still has the weights scoring used (update sets it)
        if cfg.train.precision == "bf16" and d.world == 1:
            self.copies = {k: Compute(m, torch.bfloat16) for k, m in
                           (("policy", self.policy), ("critic", self.critic), ("ref", self.ref)) if m is not None}
        self.policy_fwd, self.critic_fwd, self.ref_fwd = (self.copies.get(k, m) for k, m in
                                                           (("policy", self.policy), ("critic", self.critic),
                                                            ("ref", self.ref)))
        policy_total, critic_total = schedule_lengths(cfg, self.critic is not None)
        self.opt = torch.optim.AdamW(lora.trainable(self.policy), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                                     betas=(0.9, 0.95))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, policy_total))
        self.models, self.optims, self.scheds = {"policy": self.policy}, {"policy": self.opt}, {"policy": self.sched}
        self.copt = self.csched = None
        if self.critic is not None:
            self.copt = torch.optim.AdamW(lora.trainable(self.critic), lr=cfg.train.critic_lr,
                                          weight_decay=cfg.train.weight_decay, betas=(0.9, 0.95))
            self.csched = torch.optim.lr_scheduler.LambdaLR(self.copt, lr_lambda(cfg, critic_total))
            self.models["critic"], self.optims["critic"], self.scheds["critic"] = self.critic, self.copt, self.csched

    def autocast(self):
        """bf16 autocast on one GPU (under FSDP the mixed-precision policy casts instead, and with
        train.precision=bf16 a bf16 copy of the weights computes: r1/precision.py)."""
        on = self.device.type == "cuda" and self.d.world == 1 and not self.copies
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=on)

    def reuses_logprobs(self, it: int) -> bool:
        """Whether iteration `it` can skip the policy's scoring forward (train.score_policy=auto): with one epoch
        of one mini-batch the update's forward runs on the weights scoring would, so its logprobs, detached,
        are the old ones (ratio exactly 1; decoupled PPO's proximal policy too); not with a reference model
        (its KL, in the reward or logged, is taken against the old logprobs before credit), nor while the
        critic warms up (the policy does not run then, and the sampler gap is read from its forward), nor with
        model.lora_dropout > 0 (the update's forward drops adapter inputs, scoring's does not: reused, the
        ratio would still be 1 but decoupled PPO's and TIS's weight old/sampler would be dropout noise)."""
        a, m = self.cfg.algo, self.cfg.model
        warming = self.critic is not None and it < a.critic_warmup
        dropout = bool(m.lora_rank and m.lora_dropout)
        return (self.cfg.train.score_policy == "auto" and a.ppo_epochs == 1 and a.minibatches == 1
                and self.ref is None and not warming and not dropout)

    def old_from_sampler(self, it: int) -> bool:
        """Whether iteration `it` takes the sampler's logprobs as the old ones (train.score_policy=sampler):
        scoring skips the policy's forward, the caller sets the credit inputs' old logprobs to the sampler's
        (a reference KL is taken against them), the update takes them for its ratio. Not while the critic
        warms up: the policy does not run in the update then, so scoring runs it and logs the gap."""
        warming = self.critic is not None and it < self.cfg.algo.critic_warmup
        return self.cfg.train.score_policy == "sampler" and not warming

    @torch.no_grad()
    def score(self, micro_batches: list, num_fillers: int = 0, policy: bool = True) -> list:
        """Step 2: per micro-batch, the policy's old logprobs (policy=False: none, see reuses_logprobs), the
        reference's logprobs and the critic's values, from one packed forward each; then `num_fillers` filler
        forwards (FSDP: see packing.filler)."""
        temperature = self.cfg.rollout.temperature or 1.0
        for c in self.copies.values():  # a checkpoint may have been loaded into the master weights
            c.refresh()
        out = []
        for k, mb in enumerate(micro_batches + [filler(self.tok.pad_id, self.device)] * num_fillers):
            args = (mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
            with self.autocast():
                old = None
                if policy:
                    old = self.policy_fwd(*args, sel=mb.sel, targets=mb.targets, temperature=temperature,
                                          kv_rows=mb.kv_rows)[0]
                ref = None
                if self.ref is not None:
                    ref = self.ref_fwd(*args, sel=mb.sel, targets=mb.targets, temperature=temperature,
                                       kv_rows=mb.kv_rows)[0]
                tok_values = step_values = None
                if self.critic is not None:
                    values = self.critic_fwd(*args, kv_rows=mb.kv_rows).float()
                    tok_values, step_values = values[mb.sel], values[mb.step_pos]
            if k < len(micro_batches):
                out.append(Scores(None if old is None else old.float(), None if ref is None else ref.float(),
                                  tok_values, step_values))
        return out

    def update(self, plan: Plan, fillers: list, scores: list, credit: Credit, sampler_logp, it: int) -> dict:
        """Step 4: `ppo_epochs` policy passes and `vf_epochs` critic passes (critic alone during
        `critic_warmup`) over the mini-batches; returns metrics averaged over tokens / optimizer steps
        and ranks. Every rank runs the same passes, mini-batches and (with fillers) micro-batches."""
        policy_epochs, critic_epochs = epochs(self.cfg.algo, it, self.critic is not None)
        work = self.micro_batch_work(plan, scores, credit, sampler_logp)
        norms = [self.minibatch_norms(mini, plan) for mini in work]  # counts: the same every epoch
        stats, skipped = {}, 0
        self.gap_max = None  # policy_objective: the sampler gap when scoring left the old logprobs to the update
        self.scored_weights = True  # the weights scoring ran (or would have run) on: until the first step
        for epoch in range(max(policy_epochs, critic_epochs)):
            for mini, n_fill, norm in zip(work, fillers, norms):
                step_stats = self.train_minibatch(mini, n_fill, plan, epoch < policy_epochs, epoch < critic_epochs,
                                                  norm)
                self.scored_weights = False
                if step_stats is None:
                    skipped += 1
                for k, (tot, cnt) in (step_stats or {}).items():
                    t0, c0 = stats.get(k, (0.0, 0.0))
                    stats[k] = (t0 + tot, c0 + cnt)
        out = _reduce_stats(stats, self.d)
        if "ev_t" in out:
            out["explained_variance"] = _explained_variance(*(out.pop(k) for k in ("ev_t", "ev_t2", "ev_r", "ev_r2")))
        out["skipped_updates"] = float(skipped)
        if ((self.reuses_logprobs(it) or self.old_from_sampler(it))  # every rank alike (a rank with
                and all(s.old_logp is None for s in scores)):
            # no micro-batch too): the sampler gap's max, from the update's forwards
            out["logprob_gap_max"] = distributed.all_max(0.0 if self.gap_max is None else float(self.gap_max), self.d)
        return out

    def micro_batch_work(self, plan: Plan, scores: list, credit: Credit, sampler_logp) -> list:
        """Per mini-batch, (micro-batch, its Scores, its Targets): the flat per-token results split back."""
        sizes = [mb.sel.numel() for mb in plan.micro_batches]
        advantages = torch.split(credit.advantages, sizes)
        sampler = torch.split(sampler_logp, sizes)
        token_targets = torch.split(credit.value_target, sizes) if credit.value_level == "token" else None
        # step targets: on the device once, then gathered there (indexing on the host read each step_index back)
        step_targets = credit.value_target.to(self.device) if credit.value_level == "step" else None
        work, i = [], 0
        for mini in plan.minibatches:
            work.append([])
            for mb in mini:
                value_target = None
                if credit.value_level == "step":
                    value_target = step_targets[mb.step_index]
                elif credit.value_level == "token":
                    value_target = token_targets[i].to(self.device)
                work[-1].append((mb, scores[i], Targets(advantages[i].to(self.device), sampler[i].to(self.device),
                                                        value_target)))
                i += 1
        return work

    def minibatch_norms(self, mini: list, plan: Plan) -> Norms:
        """The denominators of one mini-batch's losses, counted over all its micro-batches and ranks
        (world x this rank's share: FSDP averages gradients), and the token count of every aggregation
        segment over the whole mini-batch (a trajectory's steps may sit in several micro-batches)."""
        algo = self.cfg.algo
        by_step = algo.loss_agg == "step_mean"
        seg_sizes = torch.zeros(plan.num_steps if by_step else plan.num_trajs, device=self.device)
        mask_sum = torch.zeros((), device=self.device)
        for mb, _, _ in mini:  # integer counts in float32: exact; one host read for all micro-batches
            seg = mb.tok_step if by_step else mb.tok_traj
            seg_sizes.index_add_(0, seg, (mb.mask > 0).to(seg_sizes.dtype))
            mask_sum = mask_sum + mb.mask.sum()
        mask_sum, segments = torch.stack([mask_sum, (seg_sizes > 0).sum().to(mask_sum.dtype)]).tolist()
        count = mask_sum if algo.loss_agg == "token_mean" else segments
        policy = float(distributed.all_sum(count, self.d)) / self.d.world
        step_target = ESTIMATORS[algo.advantage].target == "step"
        critic_count = sum(mb.step_index.numel() for mb, _, _ in mini) if step_target else mask_sum
        critic = float(distributed.all_sum(critic_count, self.d)) / self.d.world
        return Norms(policy, critic, seg_sizes)

    def train_minibatch(self, mini: list, n_fill: int, plan: Plan, train_policy: bool, train_critic: bool,
                        norms: Norms | None = None):
        """Forward/backward every micro-batch, then one optimizer step; returns its stats, or None when the
        step was skipped (non-finite loss or gradient on some rank) or there was nothing to train on.
        norms: minibatch_norms(mini, plan), when the caller has them (they do not change between epochs).

        A non-finite loss does not stop the backward passes: under FSDP every
        rank must run the same collectives; the optimizer step is skipped.
        """
        norms = norms or self.minibatch_norms(mini, plan)
        if norms.policy <= 0:
            return {}
        self.opt.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.copt.zero_grad(set_to_none=True)
        # Metrics and losses stay on the device until the mini-batch is done (one host sync for all of
        # them, in _flush; optimizer_step has its own for the gradient norms): a sync per micro-batch kept
        # the GPU idle while the host queued the next one.
        pending, finite, pg_sum, vl_sum = [], torch.ones((), device=self.device), 0.0, 0.0
        for mb, mb_scores, targets in mini:
            if train_policy:
                loss, metrics = self.policy_objective(mb, mb_scores, targets, norms)
                finite = finite * torch.isfinite(loss.detach())
                loss.backward()
                self.fold_grads("policy")
                pending.append(({k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()},
                                mb.mask.sum().detach()))
                pg_sum = pg_sum + loss.detach()
            if train_critic:
                loss, metrics, weight = self.critic_objective(mb, mb_scores, targets, norms.critic)
                finite = finite * torch.isfinite(loss.detach())
                loss.backward()
                self.fold_grads("critic")
                vl_sum = vl_sum + loss.detach()
                pending.append(({k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()}, weight))
        for _ in range(n_fill):
            self.filler_backward(self.cfg.rollout.temperature or 1.0, train_policy, train_critic)
        # each rank's loss is world x its share of the global loss (FSDP averages gradients), so the
        # mean over ranks of these sums, which _reduce_stats takes, is the global mini-batch loss
        if train_policy:
            pending.append(({"pg_loss": pg_sum}, 1.0))
        if train_critic:
            pending.append(({"value_loss": vl_sum}, 1.0))
        stats = {}
        ok = _flush(stats, pending, finite, self.device)
        return stats if self.optimizer_step(ok, stats, train_policy, train_critic) else None

    def policy_objective(self, mb, mb_scores: Scores, targets: Targets, norms: Norms):
        """The policy loss of one micro-batch (the algo.policy_loss entry), minus the entropy bonus, plus the
        KL loss term; all aggregated the same way (algo.loss_agg) over the mini-batch's counts."""
        algo = self.cfg.algo
        with self.autocast():
            logp, entropy = self.policy_fwd(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen,
                                            sel=mb.sel, targets=mb.targets,
                                            temperature=self.cfg.rollout.temperature or 1.0, kv_rows=mb.kv_rows)
        logp, entropy = logp.float(), entropy.float()
        old_logp, metrics = mb_scores.old_logp, {}
        if old_logp is None:  # scoring skipped it: the sampler's (score_policy=sampler), else this forward's
            # (reuses_logprobs: on the weights scoring would have used); the gap from those weights alone
            from_sampler = self.cfg.train.score_policy == "sampler"
            old_logp = targets.sampler_logp if from_sampler else logp.detach()
            if self.scored_weights:
                gap = torch.where(mb.mask.bool(), (logp.detach() - targets.sampler_logp).abs(), 0.0)
                metrics["logprob_gap_mean"] = gap.sum() / mb.mask.sum().clamp(min=1)
                if gap.numel():
                    self.gap_max = gap.max() if self.gap_max is None else torch.maximum(self.gap_max, gap.max())
        agg_seg = mb.tok_step if algo.loss_agg == "step_mean" else mb.tok_traj
        inputs = PolicyInputs(logp, old_logp, targets.advantages, mb.mask, targets.sampler_logp,
                              ratio_seg=mb.tok_step, agg_seg=agg_seg, seg_sizes=norms.seg_sizes)
        loss, loss_metrics = POLICY_LOSSES[algo.policy_loss].fn(inputs, algo, norms.policy)
        metrics.update(loss_metrics)
        if algo.entropy_coef:
            loss = loss - algo.entropy_coef * entropy_bonus(entropy, mb.mask, agg_seg, algo.loss_agg, norms.policy,
                                                            seg_sizes=norms.seg_sizes)
        if self.ref is not None and algo.kl_coef and not algo.kl_in_reward:
            kl_tok = kl_penalty(logp, mb_scores.ref_logp, algo.kl_estimator)
            loss = loss + algo.kl_coef * aggregate(kl_tok, mb.mask, agg_seg, algo.loss_agg, norm=norms.policy,
                                                   seg_sizes=norms.seg_sizes)
        metrics["entropy"] = (entropy * mb.mask).sum() / mb.mask.sum().clamp(min=1)
        return loss, metrics

    def critic_objective(self, mb, mb_scores: Scores, targets: Targets, norm: float):
        """vf_coef x the value loss of one micro-batch at the estimator's target level (a value per step at
        its last prompt token, or per sampled token); returns (loss, metrics, their weight)."""
        algo = self.cfg.algo
        with self.autocast():
            values = self.critic_fwd(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen,
                                     kv_rows=mb.kv_rows).float()
        if ESTIMATORS[algo.advantage].target == "step":
            pred, old = values[mb.step_pos], mb_scores.step_values
            mask = torch.ones(mb.step_pos.numel(), device=self.device)
        else:
            pred, old, mask = values[mb.sel], mb_scores.tok_values, mb.mask
        # no explained_variance per micro-batch (a ratio of one micro-batch): update computes it over the iteration
        loss, metrics = value_loss(pred, old, targets.value_target, mask, clip=algo.value_clip or None, norm=norm,
                                   explained=False)
        metrics.update(_value_moments(pred, targets.value_target, mask))
        return algo.vf_coef * loss, metrics, mask.sum()

    def filler_backward(self, temperature: float, policy: bool = True, critic: bool = True):
        """The forward/backward passes of a micro-batch that contributes zero gradient (see packing.filler),
        for the models this optimizer step trains."""
        mb = filler(self.tok.pad_id, self.device)
        args = (mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
        if policy:
            with self.autocast():
                logp, ent = self.policy_fwd(*args, sel=mb.sel, targets=mb.targets, temperature=temperature)
            ((logp.float().sum() + ent.float().sum()) * 0.0).backward()
            self.fold_grads("policy")
        if critic and self.critic is not None:
            with self.autocast():
                v = self.critic_fwd(*args)
            (v.float().sum() * 0.0).backward()
            self.fold_grads("critic")

    def optimizer_step(self, ok: bool, stats: dict, policy: bool = True, critic: bool = True) -> bool:
        """Clip, check finiteness, step the models this mini-batch trained; a non-finite loss or gradient
        (on any rank) skips the update entirely: parameters, optimizer moments and the learning-rate
        schedule stay as they were."""
        clip = self.cfg.train.grad_clip or float("inf")
        critic = critic and self.critic is not None
        gn = cgn = None
        if policy:
            gn = torch.nn.utils.clip_grad_norm_(lora.trainable(self.policy), clip)
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
        if critic:
            cgn = torch.nn.utils.clip_grad_norm_(lora.trainable(self.critic), clip)
            cgn = cgn.full_tensor() if hasattr(cgn, "full_tensor") else cgn
        finite = ok and all(bool(torch.isfinite(n)) for n in (gn, cgn) if n is not None)
        finite = float(distributed.all_sum(0.0 if finite else 1.0, self.d)) == 0.0
        if not finite:
            warnings.warn("non-finite loss or gradient: update skipped (parameters and optimizer state unchanged)")
            self.opt.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.copt.zero_grad(set_to_none=True)
            return False
        if policy:
            self.opt.step()
            self.sched.step()
            self.refresh("policy")
        if critic:
            self.copt.step()
            self.csched.step()
            self.refresh("critic")
            _accumulate(stats, {"critic_grad_norm": cgn.detach()}, 1.0)
        if policy:
            _accumulate(stats, {"grad_norm": gn.detach()}, 1.0)
        return True

    def fold_grads(self, name: str):
        """train.precision=bf16: the bf16 copy's gradients added to the master's in float32 (r1/precision.py)."""
        if name in self.copies:
            self.copies[name].fold_grads()

    def refresh(self, name: str):
        """train.precision=bf16: the copy's weights from the master's, after its optimizer step."""
        if name in self.copies:
            self.copies[name].refresh()

    def export(self):
        """The policy as an HF folder in run.dir/hf (every rank joins the gather; rank 0 writes); a LoRA run's
        merged, and its adapters alone as a PEFT folder in run.dir/adapter, whose adapter_config.json names a
        base transformers loads (model.path's HF folder, or run.dir/base written here)."""
        from r1.weights import save_hf

        full = distributed.full_state_dict(self.policy)
        m = self.cfg.model
        if self.d.main and m.lora_rank:
            base = lora.loadable_base(m.path)
            if base is None:  # a .gguf, a short name or tiny: the frozen base as an HF folder, written once
                base = os.path.abspath(os.path.join(self.cfg.run.dir, "base"))
                if not os.path.isfile(os.path.join(base, "config.json")):
                    save_hf({k: v.detach().to(self.dtype).cpu().contiguous() for k, v in lora.base_state(full).items()},
                            self.model_cfg.to_hf(self.dtype), base, tokenizer=self.tok.hf)
            lora.save_peft(full, os.path.join(self.cfg.run.dir, "adapter"), m.lora_rank, m.lora_alpha,
                           m.lora_dropout, m.lora_targets, base)
            full = lora.merge(full, m.lora_alpha / m.lora_rank)
        if self.d.main:  # in the rollout dtype (bf16 on CUDA: half the disk; transformers loads either)
            dt = self.dtype
            save_hf({k: v.detach().to(dt).cpu().contiguous() for k, v in full.items()}, self.model_cfg.to_hf(dt),
                    os.path.join(self.cfg.run.dir, "hf"), tokenizer=self.tok.hf)
        distributed.barrier(self.d)


@dataclass
class Scores:
    """One micro-batch's step-2 results (no gradient)."""
    old_logp: torch.Tensor | None  # [M] the policy's logprobs of the sampled tokens (None: the update's own)
    ref_logp: torch.Tensor | None  # [M] the reference's (kl_coef > 0)
    tok_values: torch.Tensor | None  # [M] critic values at the positions predicting sampled tokens
    step_values: torch.Tensor | None  # [K] critic values at each step's last prompt token


@dataclass
class Targets:
    """One micro-batch's share of step 3: what its losses are trained toward."""
    advantages: torch.Tensor  # [M]
    sampler_logp: torch.Tensor  # [M] the generator's logprobs
    value_target: torch.Tensor | None  # [K] or [M] returns for the critic


@dataclass
class Norms:
    """One mini-batch's loss denominators (global count / world) and aggregation segment sizes."""
    policy: float
    critic: float
    seg_sizes: torch.Tensor  # [B] or [K]: masked tokens of each segment over the whole mini-batch


def _accumulate(stats: dict, metrics: dict, weight):
    """stats[k] = (sum of weight * value, sum of weight): a weighted mean, reduced later."""
    w = float(weight)
    for k, v in metrics.items():
        v = float(v.detach()) if torch.is_tensor(v) else float(v)
        tot, cnt = stats.get(k, (0.0, 0.0))
        stats[k] = (tot + v * w, cnt + w)


def _flush(stats: dict, pending: list, finite: torch.Tensor, device) -> bool:
    """_accumulate every (metrics, weight) of `pending`, whose values may be device tensors, and read the
    device flag `finite`, with one host sync; returns the flag as a bool."""
    tensors = [finite] + [v for metrics, w in pending for v in (*metrics.values(), w) if torch.is_tensor(v)]
    host = iter(torch.stack([t.reshape(()).to(device, torch.float64) for t in tensors]).tolist())
    ok = next(host) > 0
    for metrics, w in pending:
        metrics = {k: next(host) if torch.is_tensor(v) else float(v) for k, v in metrics.items()}
        _accumulate(stats, metrics, next(host) if torch.is_tensor(w) else float(w))
    return ok


def _value_moments(pred, target, mask) -> dict:
    """Means of the return and of the critic's residual, and of their squares, over a micro-batch's
    valid positions: weighted by counts and summed over micro-batches and ranks, they give the
    explained variance of the whole iteration. A mean of per-micro-batch ratios would not: a
    micro-batch whose returns barely vary (no success in it) gives a huge negative ratio. Masked sums, not
    a boolean gather: a gather reads its size from the device (a host sync per micro-batch); an empty
    mask gives zeros, whose weight (its mask sum) is 0."""
    keep = mask.bool()
    n = keep.sum().clamp(min=1).double()
    t = torch.where(keep, target.detach().double(), 0.0)
    r = torch.where(keep, t - pred.detach().double(), 0.0)
    return {"ev_t": t.sum() / n, "ev_t2": (t * t).sum() / n, "ev_r": r.sum() / n, "ev_r2": (r * r).sum() / n}


def _explained_variance(t, t2, r, r2) -> float:
    """1 - Var[residual] / Var[return] from the moments of _value_moments; 0 when returns are constant."""
    var_t, var_r = t2 - t * t, r2 - r * r
    return 1.0 - var_r / var_t if var_t > 1e-12 else 0.0


def _reduce_stats(stats: dict, d) -> dict:
    """Weighted means over all ranks: sums of (value * weight, weight) are added across ranks."""
    keys = sorted({k for ks in distributed.gather_objects(sorted(stats), d) for k in ks})
    if not keys:
        return {}
    t = distributed.all_sum(torch.tensor([list(stats.get(k, (0.0, 0.0))) for k in keys], dtype=torch.float64), d)
    return {k: float(t[j, 0] / t[j, 1]) if t[j, 1] > 0 else 0.0 for j, k in enumerate(keys)}
