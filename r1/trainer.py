"""The RL loop: rollout -> score -> advantages -> PPO epochs -> log -> checkpoint.

One iteration:
1. roll out with the AgentEnvLoop on the current weights (the generator's
   model is the policy itself on one CPU process, or a bf16 copy refreshed
   from the full weights every iteration on GPU / under FSDP: never stale);
2. score every step with one packed forward per model: the policy's old
   logprobs (and the sampler-trainer logprob gap, logged), the reference's
   logprobs, the critic's values (at each step's last prompt token for
   step-level GAE, at every sampled token for token-level GAE);
3. credit: advantages and critic targets (r1/credit.py, with the estimator
   of r1/algos/estimators.ESTIMATORS; batch statistics are global);
4. update: `ppo_epochs` policy passes (and `vf_epochs` critic passes; the
   critic alone during `critic_warmup`) over `minibatches` optimizer steps,
   each a sum of packed micro-batches (gradient accumulation) normalised by
   counts taken over the whole mini-batch on every rank, so the update does
   not depend on how tokens are split; the policy loss is the
   r1/algos/policy_losses.POLICY_LOSSES entry; non-finite losses or
   gradients skip the update;
5. metrics (reduced over ranks, so rank 0 logs the global batch's numbers),
   trajectories, checkpoint.

Prompts are dealt to ranks whole: the n samples of a prompt (a group) are
generated and scored on one rank.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass

import torch

from r1 import checkpoint, disk, distributed, memory
from r1 import packing
from r1.algos.estimators import ESTIMATORS
from r1.algos.losses import aggregate, entropy_bonus, kl_penalty, value_loss
from r1.algos.policy_losses import POLICY_LOSSES, PolicyInputs
from r1.algos.reward_norm import normalize_rewards, reward_moments
from r1.config import Config, ConfigError
from r1.credit import Credit, CreditInputs, compute as compute_credit, informative_groups
from r1.tasks.registry import make_env
from r1.generate import Generator, Sampling
from r1.logger import Logger
from r1.model import Transformer, tiny_config
from r1.packing import Plan, filler
from r1.profiler import maybe_profile, phase, wanted
from r1.rollout import AgentEnvLoop
from r1.rollout_stats import summarize, traj_stats
from r1.tasks.data import epoch_order, load_rows
from r1.tokenizer import load_tokenizer
from r1.trajectory import Saver, check_episodes, iter_path


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (e.g. a policy whose every sample is NaN): train.py prints one line."""


def resolve_dtype(cfg: Config, device) -> torch.dtype:
    if cfg.run.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.run.dtype)


def build_model(path: str, cfg: Config, tok, device, value_head=False, seed=0) -> Transformer:
    """Training copy in float32 (mixed precision comes from autocast/FSDP)."""
    if path == "tiny":
        torch.manual_seed(seed)
        mc = tiny_config(cfg.model.arch, tie=True, vocab_size=len(tok.hf), num_layers=cfg.model.tiny_layers,
                         hidden_size=cfg.model.tiny_hidden, intermediate_size=2 * cfg.model.tiny_hidden,
                         eos_token_id=tok.eos_id)
        with torch.device(device):
            model = Transformer(mc, value_head=value_head)
        for name, p in model.named_parameters():  # HF-style init: small logits, a diverse random policy
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)
        return model
    return Transformer.from_pretrained(path, dtype=torch.float32, device=device, value_head=value_head)


# Keys that do not change what a run is (where it lives, how it is logged, how long it goes, how it is split
# into memory-sized pieces): a resume may change them freely. Any other difference needs run.allow_config_change.
RESUME_FREE = ("run.dir", "run.resume", "run.allow_config_change", "run.device", "run.memory_fraction", "log.", "eval.", "train.steps",
               "train.time_limit", "train.checkpoint_every", "train.keep_checkpoints", "train.micro_tokens",
               "train.activation_checkpointing", "rollout.slots", "rollout.sync_every")


def config_changes(cfg: Config, saved_path: str, free=RESUME_FREE) -> list:
    """["key old -> new", ...] between a run's saved config.yaml and `cfg`, ignoring keys in `free`
    (a key the saved file lacks is compared with its default). Read with yaml.safe_load: no code."""
    import yaml

    from r1.config import Config as Defaults, to_dict

    try:
        with open(saved_path, encoding="utf-8") as f:
            old = yaml.safe_load(f)
        if not isinstance(old, dict):
            raise ValueError("not a mapping of sections")
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the run's saved config {saved_path}: {str(e).splitlines()[0][:120]}") from None
    new, default = to_dict(cfg), to_dict(Defaults())
    out = []
    for section, fields in new.items():
        before = old.get(section) if isinstance(old.get(section), dict) else {}
        for name, value in fields.items():
            key = f"{section}.{name}"
            if any(key == f or (f.endswith(".") and key.startswith(f)) for f in free):
                continue
            was = before.get(name, default[section][name])
            if was != value:
                out.append(f"{key} {was!r} -> {value!r}")
    return out


def check_run_dir(cfg: Config):
    """Refuse to overwrite a run, or to resume it as something else. Every rank checks before any rank writes
    (see create_run_dir); nothing here writes."""
    d = cfg.run.dir
    if not d.strip():
        raise ConfigError("run.dir is empty; name a folder for the run")
    if os.path.exists(d) and not os.path.isdir(d):
        raise ConfigError(f"run.dir {d} exists and is not a folder")
    # an RL run's own SFT phase (train.sft_steps) lives in run.dir/sft and is not another run
    has_files = os.path.isdir(d) and bool(set(os.listdir(d)) - ({"sft"} if cfg.train.sft_steps else set()))
    if has_files and not cfg.run.resume:
        raise SystemExit(f"error: run.dir {d} exists and is not empty; pass run.resume=true to continue it "
                         f"or choose another run.dir (nothing was overwritten)")
    parent = os.path.abspath(d)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"cannot create run.dir {d}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write run.dir {d}: {parent} is not writable")
    if not cfg.run.resume:
        return
    if not checkpoint.complete(d):
        metrics = os.path.join(d, "metrics.jsonl")
        if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
            raise SystemExit(f"error: run.resume=true but {d} has no complete checkpoint to resume from")
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"run.resume=true: {d} has no checkpoint yet, so the run starts at iteration 0", flush=True)
        return
    saved = os.path.join(d, "config.yaml")
    if os.path.isfile(saved):
        changes = config_changes(cfg, saved)
        if changes and not cfg.run.allow_config_change:
            raise ConfigError(f"run.resume=true with a config that changes the run saved in {saved}: "
                              f"{'; '.join(changes)}; resume with the same settings, or pass "
                              f"run.allow_config_change=true to go on anyway")


def create_run_dir(cfg: Config, dist_info):
    """(rank 0) create the folder and save the resolved config, once everything has loaded.

    Called after the models, tokenizer and data loaded, so a run that fails to
    start leaves nothing behind and the corrected command can reuse run.dir.
    The barrier keeps rank 1 from seeing rank 0's fresh folder as another run.
    A resumed run's config.yaml is never overwritten silently: when the new
    config differs at all, the old file is kept as config.<n>.yaml and one
    line says what changed.
    """
    from r1.atomic import describe_os_error, write_text
    from r1.config import dump

    distributed.barrier(dist_info)
    if dist_info.main:
        path = os.path.join(cfg.run.dir, "config.yaml")
        try:
            os.makedirs(os.path.join(cfg.run.dir, "checkpoints"), exist_ok=True)
            os.makedirs(os.path.join(cfg.run.dir, "trajectories"), exist_ok=True)
            text = dump(cfg)
            changes = config_changes(cfg, path, free=("run.resume",)) if os.path.isfile(path) else None
            if changes == []:
                text = None  # the same run: the saved file stays as it is
            elif changes:
                n = 1
                while os.path.exists(os.path.join(cfg.run.dir, f"config.{n}.yaml")):
                    n += 1
                keep = os.path.join(cfg.run.dir, f"config.{n}.yaml")
                os.replace(path, keep)
                what = "run.allow_config_change=true: " if cfg.run.allow_config_change else ""
                print(f"{what}config.yaml updated ({'; '.join(changes)}); the previous one is kept as {keep}",
                      flush=True)
            if text is not None:
                write_text(path, text)
        except OSError as e:
            raise ConfigError(f"cannot write run.dir {cfg.run.dir}: {describe_os_error(e)}") from None
    distributed.barrier(dist_info)


def run_tokenizer(cfg: Config):
    """The run's tokenizer (model.tokenizer, else model.path; the tiny model borrows SmolLM2's)."""
    src = cfg.model.tokenizer or (cfg.model.path if cfg.model.path != "tiny" else "smollm2-135m-instruct")
    tok = load_tokenizer(src)
    if tok.hf.chat_template is None:
        raise ValueError(f"tokenizer {src} has no chat template; set model.tokenizer to one that has")
    return tok


def lr_lambda(cfg: Config, total: int):
    def f(step):
        if cfg.train.warmup and step < cfg.train.warmup:
            return (step + 1) / cfg.train.warmup
        if cfg.train.schedule == "cosine":
            p = min(1.0, (step - cfg.train.warmup) / max(1, total - cfg.train.warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))
        return 1.0
    return f


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.d = distributed.init(cfg.run.device)
        self.device = self.d.device
        self.dtype = resolve_dtype(cfg, self.device)
        check_run_dir(cfg)
        torch.manual_seed(cfg.run.seed)
        a = cfg.algo
        self.tok = run_tokenizer(cfg)
        self.policy = build_model(cfg.model.path, cfg, self.tok, self.device, seed=cfg.run.seed)
        self.model_cfg = self.policy.cfg
        self.need_critic = ESTIMATORS[a.advantage].needs_critic
        self.reward_moments = torch.zeros(3, dtype=torch.float64)  # running (count, sum, sum sq): normalize_reward
        self.need_ref = a.kl_coef > 0
        self.critic = self.ref = None
        if self.need_critic:
            self.critic = build_model(cfg.model.critic_path or cfg.model.path, cfg, self.tok, self.device,
                                      value_head=True, seed=cfg.run.seed)
            if cfg.model.path == "tiny" and not cfg.model.critic_path:  # same init as the policy body
                self.critic.model.load_state_dict(self.policy.model.state_dict())
        if self.need_ref:
            self.ref = build_model(cfg.model.ref_path or cfg.model.path, cfg, self.tok, self.device, seed=cfg.run.seed)
            if cfg.model.path == "tiny" and not cfg.model.ref_path:
                self.ref.load_state_dict(self.policy.state_dict())
            self.ref.requires_grad_(False)
        # The generator's model: the policy itself, or a separate copy in the rollout dtype.
        self.shared_rollout = self.d.world == 1 and self.dtype == torch.float32
        if self.shared_rollout:
            self.rollout_model = self.policy
        else:
            self.rollout_model = build_model("tiny" if cfg.model.path == "tiny" else cfg.model.path, cfg, self.tok,
                                             self.device, seed=cfg.run.seed).to(self.dtype).eval()
            self.rollout_model.requires_grad_(False)
        self.plan = memory.plan_for(cfg, self.model_cfg, self.d)  # auto slots/micro_tokens/checkpointing, or refuse
        disk.plan_for(cfg, self.model_cfg, self.d)  # room for its checkpoints and hf/, or refuse
        ac = self.plan.checkpointing
        self.policy = distributed.parallelize(self.policy, self.d, ac)
        if self.critic is not None:
            self.critic = distributed.parallelize(self.critic, self.d, ac)
        if self.ref is not None:
            self.ref = distributed.parallelize(self.ref, self.d, False)
        total = cfg.train.steps * a.ppo_epochs * a.minibatches
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                                     betas=(0.9, 0.95))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, total))
        self.models, self.optims, self.scheds = {"policy": self.policy}, {"policy": self.opt}, {"policy": self.sched}
        if self.critic is not None:
            self.copt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.train.critic_lr,
                                          weight_decay=cfg.train.weight_decay, betas=(0.9, 0.95))
            self.csched = torch.optim.lr_scheduler.LambdaLR(self.copt, lr_lambda(cfg, total))
            self.models["critic"], self.optims["critic"], self.scheds["critic"] = self.critic, self.copt, self.csched
        self.train_rows = load_rows(cfg, "train")
        self.eval_rows = load_rows(cfg, cfg.eval.split) if cfg.eval.every else []
        create_run_dir(cfg, self.d)
        cache_len = cfg.rollout.cache_len or cfg.env.max_context
        self.gen = Generator(self.rollout_model, self.plan.slots, cache_len, stop_ids=self.tok.stop_ids,
                             cuda_graphs=self.device.type == "cuda")
        self.loop = AgentEnvLoop(self.gen, self.tok, make_env(cfg, self.tok), cfg.rollout.max_new_tokens,
                                 sync_every=cfg.rollout.sync_every or None)
        self.start = 0
        if cfg.run.resume and checkpoint.complete(cfg.run.dir):
            path, extra = checkpoint.resume(cfg.run.dir, self.models, self.optims, self.scheds, self.d)
            self.start = int(extra["iteration"])
            self.reward_moments = torch.tensor(extra.get("reward_moments", [0.0, 0.0, 0.0]), dtype=torch.float64)
            if self.d.main:
                print(f"resuming {cfg.run.dir} from iteration {self.start} ({os.path.basename(path)}); "
                      f"train.steps={cfg.train.steps}", flush=True)
        self.logger = Logger(cfg.run.dir, self.d.main, cfg.log.tensorboard, cfg.log.progress, cfg.train.steps, self.start)
        self.saver = Saver()  # trajectory files, written in the background

    # -- data ----------------------------------------------------------------
    def prompts_for(self, it: int) -> list:
        """The global prompts of iteration `it` (a seeded permutation per epoch), this rank's share."""
        P, rows = self.cfg.rollout.prompts, self.train_rows
        idx = []
        for k in range(it * P, (it + 1) * P):
            epoch, j = divmod(k, len(rows))
            idx.append(epoch_order(len(rows), f"{self.cfg.run.seed}:{epoch}")[j])
        return [rows[i] for i in idx[self.d.rank::self.d.world]]

    def sync_rollout_weights(self):
        if self.shared_rollout:
            return
        full = distributed.full_state_dict(self.policy)
        with torch.no_grad():
            for k, v in self.rollout_model.state_dict().items():
                v.copy_(full[k])

    # -- one iteration -------------------------------------------------------
    def rollout(self, it: int):
        self.sync_rollout_weights()
        r = self.cfg.rollout
        self.gen.set_sampling(Sampling(r.temperature, r.top_p, r.top_k, seed=hash((self.cfg.run.seed, it)) % 2**31))
        self.rollout_model.eval()
        mine = self.prompts_for(it)
        groups = range(self.d.rank, self.cfg.rollout.prompts, self.d.world)  # global prompt indices of `mine`
        return self.check_episodes(self.loop.run(mine, r.n, policy_version=it, uid_prefix=f"{it}-", groups=groups), it)

    def check_episodes(self, trajs: list, it: int) -> list:
        """One bad episode (non-finite sampler logprobs, token ids outside the vocabulary, a non-finite
        reward) is finished at its bad step with the reason as its termination (trajectory.check_episodes),
        and the batch goes on. When every episode of the global batch had non-finite logprobs or bad
        ids, the policy itself is broken (NaN weights or logits): stop with one line instead of training on
        nothing for the rest of the run."""
        bad = check_episodes(trajs, self.model_cfg.vocab_size)
        broken = sum(1 for _, why in bad if why != "nonfinite_reward")
        n = distributed.all_sum(torch.tensor([float(len(bad)), float(broken), float(len(trajs))]), self.d)
        if n[0] > 0 and self.d.main:
            warnings.warn(f"iteration {it + 1}: {int(n[0])} of {int(n[2])} episodes finished early as invalid "
                          f"(first: {bad[0][0] if bad else 'on another rank'}: {bad[0][1] if bad else ''}); "
                          f"see their termination in the trajectories")
        if n[2] > 0 and n[1] == n[2]:
            raise TrainingStopped(f"iteration {it + 1}: every episode's sampler logprobs were non-finite or its "
                                  f"token ids outside the vocabulary: the policy's weights or logits are not finite; "
                                  f"stopped (run.resume=true goes on from the last checkpoint)")
        return trajs

    def autocast(self):
        on = self.device.type == "cuda" and self.d.world == 1
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=on)

    @torch.no_grad()
    def score(self, micro_batches: list, num_fillers: int = 0) -> list:
        """Step 2: per micro-batch, the policy's old logprobs, the reference's logprobs and the critic's
        values, from one packed forward each; then `num_fillers` filler forwards (FSDP: see packing.filler)."""
        temperature = self.cfg.rollout.temperature or 1.0
        out = []
        for k, mb in enumerate(micro_batches + [filler(self.tok.pad_id, self.device)] * num_fillers):
            args = (mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
            with self.autocast():
                old, _ = self.policy(*args, sel=mb.sel, targets=mb.targets, temperature=temperature)
                ref = None
                if self.ref is not None:
                    ref = self.ref(*args, sel=mb.sel, targets=mb.targets, temperature=temperature)[0]
                tok_values = step_values = None
                if self.critic is not None:
                    values = self.critic(*args).float()
                    tok_values, step_values = values[mb.sel], values[mb.step_pos]
            if k < len(micro_batches):
                out.append(Scores(old.float(), None if ref is None else ref.float(), tok_values, step_values))
        return out

    def iteration(self, it: int) -> dict:
        """Steps 1-5 of the module docstring for iteration `it`; returns its metrics."""
        cfg, algo = self.cfg, self.cfg.algo
        t0 = time.time()
        graphs = self.gen.chunk_graphs
        eager, captured = (graphs.calls["eager"], len(graphs.graphs) + len(self.gen.graphs)) if graphs else (0, 0)
        with phase("r1.rollout"):
            played = self.rollout(it)
        t_roll = time.time() - t0
        eager = graphs.calls["eager"] - eager if graphs else 0  # prefill chunks outside CUDA graphs (0 expected
        # where chunk graphs are usable: bf16/fp16 with torch's flash kernels; otherwise every chunk)
        captured = len(graphs.graphs) + len(self.gen.graphs) - captured if graphs else 0  # CUDA graphs (chunks and
        # decode steps) first captured in this rollout: shapes met for the first time
        trajs = self.trained_trajectories(played)
        t1 = time.time()
        with phase("r1.score"):
            plan = packing.plan(trajs, algo.minibatches, self.plan.micro_tokens, self.device)
            # FSDP: every rank runs as many micro-batches per mini-batch as the busiest rank (fillers)
            fillers = [int(distributed.all_max(len(mini), self.d)) - len(mini) for mini in plan.minibatches]
            scores = self.score(plan.micro_batches, sum(fillers))
            batch = self.credit_inputs(trajs, plan, scores)
            credit = compute_credit(batch, algo)
            sampler_logp = sampler_logprobs(trajs, batch.tok_step)
        t_score = time.time() - t1
        metrics = self.rollout_metrics(played)
        if algo.drop_uniform_groups:
            kept = distributed.all_sum(torch.tensor([float(len(trajs)), float(len(played))]), self.d)
            metrics["trained_frac"] = float(kept[0] / kept[1].clamp(min=1))
        metrics.update(self.score_metrics(batch, credit, sampler_logp))
        t2 = time.time()
        with phase("r1.update"):
            metrics.update(self.update(plan, fillers, scores, credit, sampler_logp, it))
        t_train = time.time() - t2
        n_roll = sum(len(s.response_ids) for t in played for s in t.steps)
        n_train = sum(mb.num_tokens for mb in plan.micro_batches)
        metrics.update(
            time_rollout=t_roll, time_score=t_score, time_train=t_train, lr=self.sched.get_last_lr()[0],
            rollout_tok_s=float(distributed.all_sum(n_roll, self.d)) / max(t_roll, 1e-9),
            **({"rollout_eager_chunks": eager, "rollout_graph_captures": captured} if graphs else {}),
            train_tok_s=float(distributed.all_sum(n_train, self.d)) * algo.ppo_epochs / max(t_train, 1e-9),
        )
        if self.device.type == "cuda":
            metrics["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        if cfg.log.trajectories:
            all_trajs = distributed.gather_objects(played, self.d)
            if self.d.main:  # written while the next iteration runs (r1.trajectory.Saver)
                self.saver.save([t for ts in all_trajs for t in ts], iter_path(cfg.run.dir, it + 1), tokenizer=self.tok)
        metrics["time_other"] = time.time() - t0 - t_roll - t_score - t_train  # this iteration outside its phases
        return metrics

    def trained_trajectories(self, played: list) -> list:
        """The episodes the update uses: all, or (algo.drop_uniform_groups) those of informative groups."""
        if not self.cfg.algo.drop_uniform_groups:
            return played
        keep = informative_groups([t.group for t in played], [t.total_reward for t in played])
        return [t for t, k in zip(played, keep) if k]

    def all_sum_cpu(self, x: torch.Tensor) -> torch.Tensor:
        """Sum a float64 tensor over ranks (identity at world 1), back on the CPU for the credit math."""
        return distributed.all_sum(x, self.d).cpu()

    def credit_inputs(self, trajs: list, plan: Plan, scores: list) -> CreditInputs:
        """Step 3's inputs: this rank's steps and scored tokens, flat and on the CPU (float64 math)."""
        mbs = plan.micro_batches
        steps = [(ti, si, s) for ti, t in enumerate(trajs) for si, s in enumerate(t.steps)]
        step_reward = torch.tensor([s.reward for _, _, s in steps], dtype=torch.float64)
        step_value = tok_value = None
        if self.critic is not None:
            step_value = torch.zeros(len(steps))
            if mbs:
                step_value[_cat([mb.step_index for mb in mbs])] = _cat([s.step_values for s in scores]).float()
            tok_value = _cat([s.tok_values for s in scores], torch.float32)
        return CreditInputs(
            groups=[t.group for t in trajs], step_reward=self.normalized_rewards(step_reward),
            step_traj=torch.tensor([ti for ti, _, _ in steps], dtype=torch.long),
            step_index=torch.tensor([si for _, si, _ in steps], dtype=torch.long),
            tok_step=_cat([mb.tok_step for mb in mbs]), tok_traj=_cat([mb.tok_traj for mb in mbs]),
            mask=_cat([mb.mask for mb in mbs], torch.float32),
            old_logp=_cat([s.old_logp for s in scores], torch.float32),
            ref_logp=_cat([s.ref_logp for s in scores], torch.float32) if self.ref is not None else None,
            step_value=step_value, tok_value=tok_value, all_sum=self.all_sum_cpu)

    def normalized_rewards(self, step_reward: torch.Tensor) -> torch.Tensor:
        """algo.normalize_reward: add this iteration's global reward moments to the running ones, then
        normalise (every rank joins the sum, also one with no steps)."""
        mode = self.cfg.algo.normalize_reward
        if mode == "off":
            return step_reward
        self.reward_moments += self.all_sum_cpu(reward_moments(step_reward))
        return normalize_rewards(step_reward, self.reward_moments, mode)

    def score_metrics(self, batch: CreditInputs, credit: Credit, sampler_logp: torch.Tensor) -> dict:
        """Sampler-trainer logprob gap and KL to the reference over the global batch (every rank joins)."""
        gap = (batch.old_logp - sampler_logp).abs()[batch.mask.bool()]
        g = distributed.all_sum(torch.tensor([float(gap.sum()), gap.numel()]), self.d)
        out = {"logprob_gap_mean": float(g[0] / g[1].clamp(min=1)),
               "logprob_gap_max": distributed.all_max(float(gap.max()) if gap.numel() else 0.0, self.d)}
        if self.ref is not None:
            kl = distributed.all_sum(torch.tensor([float(credit.kl.sum()), float(batch.mask.sum())]), self.d)
            out["kl_ref"] = float(kl[0] / kl[1].clamp(min=1))
        return out

    def rollout_metrics(self, trajs) -> dict:
        rows = distributed.gather_objects([traj_stats(t) for t in trajs], self.d)
        return summarize([r for rs in rows for r in rs])

    def update(self, plan: Plan, fillers: list, scores: list, credit: Credit, sampler_logp, it: int) -> dict:
        """Step 4: `ppo_epochs` policy passes and `vf_epochs` critic passes (critic alone during
        `critic_warmup`) over the mini-batches; returns metrics averaged over tokens / optimizer steps
        and ranks. Every rank runs the same passes, mini-batches and (with fillers) micro-batches."""
        algo = self.cfg.algo
        policy_epochs = 0 if self.critic is not None and it < algo.critic_warmup else algo.ppo_epochs
        critic_epochs = (algo.vf_epochs or algo.ppo_epochs) if self.critic is not None else 0
        work = self.micro_batch_work(plan, scores, credit, sampler_logp)
        stats, skipped = {}, 0
        for epoch in range(max(policy_epochs, critic_epochs)):
            for mini, n_fill in zip(work, fillers):
                step_stats = self.train_minibatch(mini, n_fill, plan, epoch < policy_epochs, epoch < critic_epochs)
                if step_stats is None:
                    skipped += 1
                for k, (tot, cnt) in (step_stats or {}).items():
                    t0, c0 = stats.get(k, (0.0, 0.0))
                    stats[k] = (t0 + tot, c0 + cnt)
        out = _reduce_stats(stats, self.d)
        if "ev_t" in out:
            out["explained_variance"] = _explained_variance(*(out.pop(k) for k in ("ev_t", "ev_t2", "ev_r", "ev_r2")))
        out["skipped_updates"] = float(skipped)
        return out

    def micro_batch_work(self, plan: Plan, scores: list, credit: Credit, sampler_logp) -> list:
        """Per mini-batch, (micro-batch, its Scores, its Targets): the flat per-token results split back."""
        sizes = [mb.sel.numel() for mb in plan.micro_batches]
        advantages = torch.split(credit.advantages, sizes)
        sampler = torch.split(sampler_logp, sizes)
        token_targets = torch.split(credit.value_target, sizes) if credit.value_level == "token" else None
        work, i = [], 0
        for mini in plan.minibatches:
            work.append([])
            for mb in mini:
                value_target = None
                if credit.value_level == "step":
                    value_target = credit.value_target[mb.step_index.cpu()].to(self.device)
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
        for mb, _, _ in mini:
            seg = mb.tok_step if by_step else mb.tok_traj
            seg_sizes += torch.bincount(seg[mb.mask > 0], minlength=seg_sizes.numel()).to(seg_sizes.dtype)
        mask_sum = sum(float(mb.mask.sum()) for mb, _, _ in mini)
        count = mask_sum if algo.loss_agg == "token_mean" else float((seg_sizes > 0).sum())
        policy = float(distributed.all_sum(count, self.d)) / self.d.world
        step_target = ESTIMATORS[algo.advantage].target == "step"
        critic_count = sum(mb.step_index.numel() for mb, _, _ in mini) if step_target else mask_sum
        critic = float(distributed.all_sum(critic_count, self.d)) / self.d.world
        return Norms(policy, critic, seg_sizes)

    def train_minibatch(self, mini: list, n_fill: int, plan: Plan, train_policy: bool, train_critic: bool):
        """Forward/backward every micro-batch, then one optimizer step; returns its stats, or None when the
        step was skipped (non-finite loss or gradient on some rank) or there was nothing to train on.

        A non-finite loss does not stop the backward passes: under FSDP every
        rank must run the same collectives; the optimizer step is skipped.
        """
        norms = self.minibatch_norms(mini, plan)
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
                pending.append(({k: v.detach() if torch.is_tensor(v) else v for k, v in metrics.items()},
                                mb.mask.sum().detach()))
                pg_sum = pg_sum + loss.detach()
            if train_critic:
                loss, metrics, weight = self.critic_objective(mb, mb_scores, targets, norms.critic)
                finite = finite * torch.isfinite(loss.detach())
                loss.backward()
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
            logp, entropy = self.policy(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen, sel=mb.sel,
                                        targets=mb.targets, temperature=self.cfg.rollout.temperature or 1.0)
        logp, entropy = logp.float(), entropy.float()
        agg_seg = mb.tok_step if algo.loss_agg == "step_mean" else mb.tok_traj
        inputs = PolicyInputs(logp, mb_scores.old_logp, targets.advantages, mb.mask, targets.sampler_logp,
                              ratio_seg=mb.tok_step, agg_seg=agg_seg, seg_sizes=norms.seg_sizes)
        loss, metrics = POLICY_LOSSES[algo.policy_loss].fn(inputs, algo, norms.policy)
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
            values = self.critic(mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen).float()
        if ESTIMATORS[algo.advantage].target == "step":
            pred, old = values[mb.step_pos], mb_scores.step_values
            mask = torch.ones(mb.step_pos.numel(), device=self.device)
        else:
            pred, old, mask = values[mb.sel], mb_scores.tok_values, mb.mask
        loss, metrics = value_loss(pred, old, targets.value_target, mask, clip=algo.value_clip or None, norm=norm)
        metrics.pop("explained_variance")  # a ratio per micro-batch: computed over the iteration (update)
        metrics.update(_value_moments(pred, targets.value_target, mask))
        return algo.vf_coef * loss, metrics, mask.sum()

    def filler_backward(self, temperature: float, policy: bool = True, critic: bool = True):
        """The forward/backward passes of a micro-batch that contributes zero gradient (see packing.filler),
        for the models this optimizer step trains."""
        mb = filler(self.tok.pad_id, self.device)
        args = (mb.input_ids, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
        if policy:
            with self.autocast():
                logp, ent = self.policy(*args, sel=mb.sel, targets=mb.targets, temperature=temperature)
            ((logp.float().sum() + ent.float().sum()) * 0.0).backward()
        if critic and self.critic is not None:
            with self.autocast():
                v = self.critic(*args)
            (v.float().sum() * 0.0).backward()

    def optimizer_step(self, ok: bool, stats: dict, policy: bool = True, critic: bool = True) -> bool:
        """Clip, check finiteness, step the models this mini-batch trained; a non-finite loss or gradient
        (on any rank) skips the update entirely: parameters, optimizer moments and the learning-rate
        schedule stay as they were."""
        clip = self.cfg.train.grad_clip or float("inf")
        critic = critic and self.critic is not None
        gn = cgn = None
        if policy:
            gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), clip)
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
        if critic:
            cgn = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), clip)
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
        if critic:
            self.copt.step()
            self.csched.step()
            _accumulate(stats, {"critic_grad_norm": cgn.detach()}, 1.0)
        if policy:
            _accumulate(stats, {"grad_norm": gn.detach()}, 1.0)
        return True

    # -- the loop ------------------------------------------------------------
    def fit(self):
        from r1.evaluate import evaluate

        cfg = self.cfg
        t0 = time.time()
        failed = True
        try:
            for it in range(self.start, cfg.train.steps):
                with maybe_profile(cfg.run.dir, it + 1, self.d.rank) as prof:  # R1_PROFILE=it + 1 (r1/profiler.py)
                    metrics = self.iteration(it)
                if wanted(it + 1):  # the report is not the run's time
                    t0 += distributed.all_max(prof["report_s"], self.d)
                if cfg.eval.every and (it + 1) % cfg.eval.every == 0:
                    res = evaluate(self, self.eval_rows, cfg, out_dir=None)
                    metrics.update({f"eval_{k}": v for k, v in res.items() if isinstance(v, (int, float))})
                metrics["time_elapsed"] = time.time() - t0  # the loop's wall time so far (this session)
                self.logger.log(it + 1, metrics)
                # stop on the slowest clock (max over ranks), so every rank leaves the loop together
                out_of_time = cfg.train.time_limit > 0 and bool(distributed.all_max(
                    float(time.time() - t0 >= cfg.train.time_limit), self.d))
                if (it + 1) % cfg.train.checkpoint_every == 0 or it + 1 == cfg.train.steps or out_of_time:
                    self.saver.wait()  # the checkpoint's trajectory files are on disk before it
                    checkpoint.save(cfg.run.dir, it + 1, self.models, self.optims, self.scheds,
                                    {"iteration": it + 1, "reward_moments": self.reward_moments.tolist()}, self.d,
                                    keep=cfg.train.keep_checkpoints)
                if out_of_time:
                    if self.d.main:
                        print(f"train.time_limit={cfg.train.time_limit:g}s reached after iteration {it + 1}; "
                              f"checkpointed, exporting hf/", flush=True)
                    break
            self.export()
            failed = False
        finally:
            try:
                self.saver.close()
            except OSError as e:  # a trajectory file not written: an error, unless another one is on its way out
                if not failed:
                    raise
                warnings.warn(f"the last trajectory file was not written ({e})")
            finally:
                self.logger.close()

    def export(self):
        from r1.weights import save_hf

        full = distributed.full_state_dict(self.policy)
        if self.d.main:  # in the rollout dtype (bf16 on CUDA: half the disk; transformers loads either)
            dt = self.dtype
            save_hf({k: v.detach().to(dt).cpu().contiguous() for k, v in full.items()}, self.model_cfg.to_hf(dt),
                    os.path.join(self.cfg.run.dir, "hf"), tokenizer=self.tok.hf)
        distributed.barrier(self.d)


@dataclass
class Scores:
    """One micro-batch's step-2 results (no gradient)."""
    old_logp: torch.Tensor  # [M] the policy's logprobs of the sampled tokens
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


def _cat(tensors: list, dtype=torch.long) -> torch.Tensor:
    """Concatenate per-micro-batch tensors on the CPU; an empty list gives an empty tensor."""
    return torch.cat([t.cpu() for t in tensors]) if tensors else torch.zeros(0, dtype=dtype)


def sampler_logprobs(trajs: list, tok_step: torch.Tensor) -> torch.Tensor:
    """The generator's logprobs [M] in micro-batch token order (they are stored per step, in step order).

    Token j of the flat order is the k-th token of step tok_step[j] that the order meets, so it takes that
    step's k-th stored logprob: k from a stable sort by step (vectorised; a Python loop over the tokens
    took 0.28 s of CPU for 512 GSM8K-tool episodes)."""
    steps = [s for t in trajs for s in t.steps]
    logprobs = torch.tensor([lp for s in steps for lp in s.logprobs], dtype=torch.float32)
    if tok_step.numel() == 0:  # (no steps, or none scored)
        return logprobs[:0]
    lens = torch.tensor([len(s.response_ids) for s in steps])
    starts = lens.cumsum(0) - lens
    order = torch.sort(tok_step, stable=True).indices
    by_step = tok_step[order]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel()) - torch.searchsorted(by_step, by_step)
    return logprobs[starts[tok_step] + rank]


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
    micro-batch whose returns barely vary (no success in it) gives a huge negative ratio."""
    keep = mask.bool()
    t = target.detach().double()[keep]
    r = t - pred.detach().double()[keep]
    if t.numel() == 0:
        return {}
    return {"ev_t": t.mean(), "ev_t2": (t * t).mean(), "ev_r": r.mean(), "ev_r2": (r * r).mean()}


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


_traj_stats = traj_stats  # the name r1/compare.py and older callers import
