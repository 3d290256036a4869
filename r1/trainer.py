"""The RL loop: rollout -> score -> credit -> update -> log, and the run around it (resume, checkpoints, export).

One iteration (`iteration`):
1. rollout: this rank's prompts played on the current weights, or on those one update back, started
   during the last iteration (train.overlap): r1/overlap.Rollouts, with the actor of r1/actor.py;
2. score: the learner (r1/learner.py) runs one packed forward per model: the policy's old logprobs,
   the reference's, the critic's values;
3. credit: advantages and critic targets (r1/credit.py; batch statistics are global);
4. update: the learner's PPO epochs and optimizer steps;
5. log: the batch's metrics and the clocks (r1/telemetry.py), reduced over ranks; the trajectories.
`fit` adds the held-out evaluation it is handed and the checkpoint. This module owns the order of
those steps and the state that spans iterations (the count, the running reward moments, the logger,
the trajectory writer). Prompts are dealt to ranks whole: a prompt's n samples stay on one rank.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import warnings

import torch

from r1 import checkpoint, disk, distributed, memory, packing
from r1.atomic import describe_os_error
from r1.actor import Actor, generator_model
from r1.algos.estimators import ESTIMATORS
from r1.config import Config, ConfigError
from r1.credit import (compute as compute_credit, credit_inputs, informative_groups, normalized_rewards,
                       sampler_logprobs, score_metrics, step_rewards)
from r1.generate import Sampling
from r1.identity import run_identity
from r1.learner import Learner, build_models
from r1.logger import Logger, cpu_cost_line
from r1.overlap import Rollout, Rollouts
from r1.profiler import maybe_profile, wanted
from r1.rollout_process import remote_actor
from r1.run import check_paths, check_run_dir, create_run_dir, resolve_dtype, run_tokenizer
from r1.tasks.data import epoch_order, load_rows, rl_rows
from r1.tasks.registry import check_reset
from r1.telemetry import Telemetry, episode_metrics
from r1.trajectory import Saver, check_episodes, iter_path


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (e.g. a policy whose every sample is NaN): train.py prints one line."""


class Trainer:
    """One RL run: builds its learner and actor, then `fit` runs the iterations."""

    def __init__(self, cfg: Config):
        """Everything that can fail on bad input (paths, models, tokenizer, data, memory and disk plans) comes
        before run.dir is created, so a run that fails to start leaves nothing behind."""
        self.cfg = cfg
        self.d = distributed.init(cfg.run.device)
        self.device = self.d.device
        self.dtype = resolve_dtype(cfg, self.device)
        check_run_dir(cfg)
        check_paths(cfg)  # a missing model or data path names its key before anything loads
        if cfg.run.resume and cfg.train.overlap and checkpoint.complete(cfg.run.dir):  # r1/overlap.py
            raise ConfigError(f"config key 'train.overlap'={cfg.train.overlap}: run.resume cannot continue "
                              f"{cfg.run.dir} exactly (its checkpoint holds the weights after the last update, not "
                              f"the ones the next rollout would sample with); resume with train.overlap=0 "
                              f"run.allow_config_change=true")
        if cfg.run.resume and cfg.rollout.carry_tokens and checkpoint.complete(cfg.run.dir):  # r1/rollout.py
            raise ConfigError(f"config key 'rollout.carry_tokens'={cfg.rollout.carry_tokens}: run.resume cannot "
                              f"continue {cfg.run.dir} exactly (the episodes paused when it stopped are not in its "
                              f"checkpoint); resume with rollout.carry_tokens=0 run.allow_config_change=true")
        torch.manual_seed(cfg.run.seed)
        self.tok = run_tokenizer(cfg)
        self.train_rows = load_rows(cfg, "train")  # the data before the plans: a bad data.path is the first word
        self.rl_rows = rl_rows(cfg, self.train_rows)  # RL's prompts: all, or the rows no harder than a cap
        # rollout.carry_tokens: a critic-free estimator compares a prompt's samples (or the batch's), so a group
        # is returned once all its episodes ended; with a critic an episode trains when it ends
        self.whole_groups = not ESTIMATORS[cfg.algo.advantage].needs_critic or cfg.algo.drop_uniform_groups
        check_reset(cfg, self.tok, self.train_rows)  # an env whose reset() raises: one line, no run folder
        policy, critic, ref = build_models(cfg, self.tok, self.device)
        self.model_cfg = policy.cfg
        rollout_model = generator_model(cfg, self.tok, self.d, self.dtype, policy)
        self.plan = memory.plan_for(cfg, self.model_cfg, self.d)  # auto slots/micro_tokens/checkpointing, or refuse
        disk.plan_for(cfg, self.model_cfg, self.d)  # room for its checkpoints and hf/, or refuse
        self.learner = Learner(cfg, self.tok, self.d, self.dtype, policy, critic, ref, self.plan.checkpointing)
        self.reward_moments = torch.zeros(3, dtype=torch.float64)  # running (count, sum, sum sq): normalize_reward
        self.start = 0
        resumed = None
        # the checkpoint is loaded before the run folder's config.yaml and identity are (re)written: a resume that
        # cannot load (a changed model.lora_rank, say) leaves the folder as it was
        if cfg.run.resume and checkpoint.complete(cfg.run.dir):
            lr = self.learner
            path, extra = checkpoint.resume(cfg.run.dir, lr.models, lr.optims, lr.scheds, self.d)
            self.start = int(extra["iteration"])
            self.reward_moments = torch.tensor(extra.get("reward_moments", [0.0, 0.0, 0.0]), dtype=torch.float64)
            resumed = path
        # train.overlap 2: the actor plays in a process of its own (r1/rollout_process.py), started before
        # run.dir exists, so that a failure to start leaves nothing behind
        remote = remote_actor(cfg, self.tok, rollout_model, self.plan, self.d) if cfg.train.overlap == 2 else None
        try:
            create_run_dir(cfg, self.d, run_identity(cfg, self.train_rows))
        except BaseException:
            if remote is not None:
                remote.close()
            raise
        self.actor = remote or Actor(cfg, self.tok, rollout_model, self.plan.slots, self.d)
        if resumed and self.d.main:
            print(f"resuming {cfg.run.dir} after iteration {self.start} ({os.path.basename(resumed)}); "
                  f"train.steps={cfg.train.steps}", flush=True)
        self.logger = Logger(cfg.run.dir, self.d.main, cfg.log.tensorboard, cfg.log.progress, cfg.train.steps, self.start)
        if len(self.rl_rows) < len(self.train_rows):
            self.logger.say(f"RL prompts from {len(self.rl_rows)} of the {len(self.train_rows)} training rows "
                            f"(data.rl_max_difficulty={cfg.data.rl_max_difficulty})")
        self.saver = Saver()  # trajectory files, written in the background
        self.rollouts = Rollouts(self.actor, self.request, ahead=bool(cfg.train.overlap))
        self.telemetry = Telemetry(cfg, self.d)
        self.fit_start = self.last_iter_s = None  # fit's clock, for train.time_limit with train.overlap

    # -- step 1: rollout -----------------------------------------------------
    def prompts_for(self, it: int) -> list:
        """The global prompts of iteration `it` (a seeded permutation per epoch), this rank's share."""
        P, rows = self.cfg.rollout.prompts, self.rl_rows
        idx = []
        for k in range(it * P, (it + 1) * P):
            epoch, j = divmod(k, len(rows))
            idx.append(epoch_order(len(rows), f"{self.cfg.run.seed}:{epoch}")[j])
        return [rows[i] for i in idx[self.d.rank::self.d.world]]

    def request(self, it: int, policy_version: int) -> tuple:
        """What the actor plays for this rank's episodes of iteration `it`: (rows, n, sampling, run)."""
        r = self.cfg.rollout
        sampling = Sampling(r.temperature, r.top_p, r.top_k, seed=hash((self.cfg.run.seed, it)) % 2**31)
        groups = range(self.d.rank, r.prompts, self.d.world)  # global prompt indices of this rank's prompts
        run = dict(policy_version=policy_version, uid_prefix=f"{it}-", groups=groups)
        if r.carry_tokens:  # paused episodes join later rollouts: groups numbered uniquely across iterations
            run.update(groups=range(it * r.prompts + self.d.rank, (it + 1) * r.prompts, self.d.world),
                       carry_tokens=r.carry_tokens, whole_groups=self.whole_groups)
        return self.prompts_for(it), r.n, sampling, run

    def rollout(self, it: int) -> Rollout:
        """Step 1: this rank's episodes of iteration `it` (r1/overlap.Rollouts), checked (check_episodes)."""
        got = self.rollouts.get(it, self.learner.policy, more=lambda: it + 1 < self.cfg.train.steps
                                and not self.ends_the_run())
        return dataclasses.replace(got, trajectories=self.check_episodes(got.trajectories, it))

    def ends_the_run(self) -> bool:
        """train.time_limit with train.overlap: whether this iteration will likely pass the limit (time so far
        plus the last iteration's length, on the slowest rank). Then no next rollout is started: the loop
        would stop after this iteration and only wait for episodes it drops. If the guess is early, the next
        iteration plays its own rollout, on-policy (policy_lag 0)."""
        limit = self.cfg.train.time_limit
        if not limit or self.fit_start is None:
            return False
        late = time.time() - self.fit_start + (self.last_iter_s or 0.0) >= limit
        return bool(distributed.all_max(float(late), self.d))

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

    def trained_trajectories(self, played: list) -> list:
        """The episodes the update uses: all, or (algo.drop_uniform_groups) those of informative groups."""
        if not self.cfg.algo.drop_uniform_groups:
            return played
        keep = informative_groups([t.group for t in played], [t.total_reward for t in played])
        return [t for t, k in zip(played, keep) if k]

    # -- one iteration ---------------------------------------------------------
    def iteration(self, it: int) -> dict:
        """Steps 1-5 of the module docstring for iteration `it`; returns its metrics."""
        algo, d, clock = self.cfg.algo, self.d, self.telemetry
        clock.begin()
        with clock.phase("rollout"):  # 1. rollout
            rollout = self.rollout(it)
        played = rollout.trajectories
        trajs = self.trained_trajectories(played)
        with clock.phase("score"):  # 2. score and 3. credit (time_score covers both)
            plan = packing.plan(trajs, algo.minibatches, self.plan.micro_tokens, self.device,
                                self.cfg.train.share_prefix)
            # FSDP: every rank runs as many micro-batches per mini-batch as the busiest rank (fillers)
            fillers = [int(distributed.all_max(len(mini), d)) - len(mini) for mini in plan.minibatches]
            reused, from_sampler = self.learner.reuses_logprobs(it), self.learner.old_from_sampler(it)
            scores = self.learner.score(plan.micro_batches, sum(fillers), policy=not (reused or from_sampler))
            seen = None if trajs is played or algo.normalize_reward == "off" else step_rewards(played)  # moments'
            rewards = normalized_rewards(step_rewards(trajs), self.reward_moments, algo.normalize_reward, d, seen)
            batch = credit_inputs(trajs, plan, scores, rewards, algo, d)
            sampler_logp = sampler_logprobs(trajs, batch.tok_step)
            if from_sampler:
                batch = dataclasses.replace(batch, old_logp=sampler_logp)
            credit = compute_credit(batch, algo)
        metrics = episode_metrics(self.cfg, played, trajs, d)
        metrics.update(score_metrics(batch, credit, sampler_logp, d, gap=not (reused or from_sampler)))
        with clock.phase("update"):  # 4. update
            metrics.update(self.learner.update(plan, fillers, scores, credit, sampler_logp, it))
        metrics.update(clock.metrics(rollout, plan, lr=self.learner.sched.get_last_lr()[0]))  # 5. log
        self.save_trajectories(played, it)
        metrics["time_other"] = clock.other()
        return metrics

    def save_trajectories(self, played: list, it: int):
        """log.trajectories: every rank's episodes in one file, written while the next iteration runs."""
        if not self.cfg.log.trajectories:
            return
        all_trajs = distributed.gather_objects(played, self.d)
        if self.d.main:
            self.saver.save([t for ts in all_trajs for t in ts], iter_path(self.cfg.run.dir, it + 1),
                            tokenizer=self.tok)

    def held_out(self, evaluate) -> dict:
        """evaluate(actor) on the current weights, as eval_<key> metrics (its numbers only). A rollout in
        flight (train.overlap) finishes first: the evaluation refreshes the generator it samples with."""
        self.rollouts.wait()
        self.actor.refresh(self.learner.policy)
        return {f"eval_{k}": v for k, v in evaluate(self.actor).items() if isinstance(v, (int, float))}

    # -- the loop ------------------------------------------------------------
    @contextlib.contextmanager
    def disk_failure(self, what: str, where):
        """A write that failed (full disk, read-only folder) as one CheckpointError line: what was not written,
        why, and that the last checkpoint is intact (train.py prints it, exit 1)."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - safetensors reports a full disk as its own error type
            why = describe_os_error(e)
            if not isinstance(e, OSError) and not why.startswith(("no space left", "permission denied")):
                raise
            prev = checkpoint.latest(self.cfg.run.dir)
            keep = (f"{prev} is intact: free space (or make run.dir writable) and resume with run.resume=true"
                    if prev else "no checkpoint was written yet")
            file = getattr(e, "filename", None)
            raise checkpoint.CheckpointError(f"could not write {what} {file or where}: {why}; {keep}") from e

    def fit(self, evaluate=None):
        """Iterations start..train.steps, then the HF export. `evaluate`: a function of the actor that returns
        held-out metrics (train.py passes r1/evaluate.py's), run every eval.every iterations and logged with
        the iteration; the loop itself knows nothing of evaluation."""
        cfg = self.cfg
        t0 = self.fit_start = time.time()
        failed = True
        try:
            for it in range(self.start, cfg.train.steps):
                t_it = time.time()
                with maybe_profile(cfg.run.dir, it + 1, self.d.rank) as prof:  # R1_PROFILE=it + 1 (r1/profiler.py)
                    metrics = self.iteration(it)
                if it == self.start and (line := cpu_cost_line("iteration", it + 1, time.time() - t_it,
                                                               cfg.train.steps - self.start, self.device.type)):
                    self.logger.say(line)  # a GPU-sized run on a CPU says what it will cost
                if wanted(it + 1):  # the report is not the run's time
                    t0 += distributed.all_max(prof["report_s"], self.d)
                    self.fit_start = t0
                self.last_iter_s = time.time() - t_it
                if evaluate is not None and cfg.eval.every and (it + 1) % cfg.eval.every == 0:
                    metrics.update(self.held_out(evaluate))
                metrics["time_elapsed"] = time.time() - t0  # the loop's wall time so far (this session)
                with self.disk_failure("metrics", os.path.join(cfg.run.dir, "metrics.jsonl")):
                    self.logger.log(it + 1, metrics)
                # stop on the slowest clock (max over ranks), so every rank leaves the loop together
                out_of_time = cfg.train.time_limit > 0 and bool(distributed.all_max(
                    float(time.time() - t0 >= cfg.train.time_limit), self.d))
                if cfg.run.save and ((it + 1) % cfg.train.checkpoint_every == 0 or it + 1 == cfg.train.steps
                                     or out_of_time):
                    with self.disk_failure("trajectory file", iter_path(cfg.run.dir, it + 1)):
                        self.saver.wait()  # the checkpoint's trajectory files are on disk before it
                    checkpoint.save(cfg.run.dir, it + 1, self.learner.models, self.learner.optims,
                                    self.learner.scheds, {"iteration": it + 1,
                                                          "reward_moments": self.reward_moments.tolist()},
                                    self.d, keep=cfg.train.keep_checkpoints)
                if out_of_time:
                    if self.d.main:
                        print(f"train.time_limit={cfg.train.time_limit:g}s reached after iteration {it + 1}"
                              + ("; checkpointed, exporting hf/" if cfg.run.save else " (run.save=false)"), flush=True)
                    break
            if cfg.run.save:
                with self.disk_failure("the export", os.path.join(cfg.run.dir, "hf")):
                    self.learner.export()
            failed = False
        finally:
            self.rollouts.close()  # a rollout in flight (stopped early: an error, Ctrl-C) ends at its next chunk
            try:
                self.saver.close()
            except OSError as e:  # a trajectory file not written: an error, unless another one is on its way out
                if not failed:
                    raise
                warnings.warn(f"the last trajectory file was not written ({e})")
            finally:
                self.logger.close()
