"""The rules over a resolved config: ranges, and keys that only mean something together.

`validate` runs after every file and override is applied (r1/config_load.py), so a rule sees the final
values and names where each came from (`origin`: a file and line, or the command line). It rejects only
what no run can mean, or a key the chosen estimator, loss or task would ignore without a word; the tables
it reads (BOUNDS, the estimator and loss registries, the task's rewards) live with their owners.
"""
import difflib
import warnings

from r1.config_schema import BOUNDS, COMMAND_LINE, LORA_TARGETS, Config, ConfigError, get
from r1.envs.rewards import REWARDS


def validate(cfg: Config, origin: dict | None = None):
    """Reject values no run can mean; `origin` maps a key to where it was set, for the message."""
    origin = origin or {}

    def name(key):
        return f"'{key}'{origin.get(key, ' (default)')}"

    def fail(key, rule):
        raise ConfigError(f"config key {name(key)} must be {rule}, got {get(cfg, key)!r}")

    for key, (low, high) in BOUNDS.items():
        value = get(cfg, key)
        if low is not None and value < low:
            fail(key, f">= {low}" if high is None or high >= 1000 else f"in [{low}, {high}]")
        if high is not None and value > high:
            fail(key, f"<= {high}" if low is None or high >= 1000 else f"in [{low}, {high}]")
    for key in ("run.dir", "eval.split"):
        if not get(cfg, key).strip():  # `run.dir=` would write into the current folder
            fail(key, "a non-empty path" if key == "run.dir" else "a split name")
    if not 0 < cfg.run.memory_fraction <= 1:
        fail("run.memory_fraction", "in (0, 1]")
    for key in ("rollout.temperature", "eval.temperature"):  # 1/T must stay finite on float32 logits
        if 0 < get(cfg, key) < 1e-3:
            fail(key, "0 (greedy) or >= 0.001")
    if not 0 < cfg.rollout.top_p <= 1:
        fail("rollout.top_p", "in (0, 1]")
    if cfg.algo.log_ratio_clamp <= 0:
        fail("algo.log_ratio_clamp", "> 0")
    _validate_lora(cfg, name, fail)
    if 0 < cfg.algo.dual_clip <= 1:
        fail("algo.dual_clip", "0 (off) or > 1")
    from r1.tasks.registry import get_task, task_tools  # stdlib only; imports the user's task module, if named

    try:
        task = get_task(cfg.data.task)
    except ValueError as e:
        raise ConfigError(f"config key {name('data.task')}: {e}") from None
    if task.max_level is not None and cfg.data.level > task.max_level:  # the limit lives with the task
        fail("data.level", f"in [1, {task.max_level}] for data.task={cfg.data.task}")
    if cfg.data.sft_level and (task.max_level is None or cfg.data.sft_level > task.max_level):
        fail("data.sft_level", f"0 (= data.level) for data.task={cfg.data.task}, which has no levels"
             if task.max_level is None else f"0 (= data.level) or in [1, {task.max_level}] for data.task={cfg.data.task}")
    if cfg.data.rl_max_difficulty and task.difficulty is None:
        raise ConfigError(f"config key {name('data.rl_max_difficulty')}: task {task.name} has no difficulty measure "
                          f"(a Task's `difficulty`); set it to 0, got {cfg.data.rl_max_difficulty}")
    _validate_rewards(cfg, task, name)
    if cfg.eval.split == "val" and not cfg.data.val_size:
        raise ConfigError(f"config key {name('eval.split')} is val, but data.val_size is 0 (no validation split); "
                          f"set data.val_size (e.g. 500) or eval.split=test")
    if task.needs_path and not cfg.data.path:
        raise ConfigError(f"config key {name('data.path')} must name the data of data.task={cfg.data.task}, "
                          f"got {cfg.data.path!r}")
    try:
        task_tools(cfg, task)
    except ValueError as e:
        raise ConfigError(f"config key {name('env.tools')}: {e}") from None
    if cfg.train.sft_steps and cfg.train.stage == "sft":
        raise ConfigError(f"config key {name('train.sft_steps')} is the SFT warm-up of an RL run; with "
                          f"train.stage=sft use train.steps, got train.sft_steps={cfg.train.sft_steps}")
    if (cfg.train.sft_steps or cfg.train.stage == "sft") and task.expert is None:
        raise ConfigError(f"config key {name('data.task')}: task {task.name} has no expert chats for SFT "
                          f"(train.stage=sft or train.sft_steps > 0 need one)")
    if cfg.rollout.max_new_tokens >= cfg.env.max_context:
        raise ConfigError(f"config key {name('rollout.max_new_tokens')} must be below env.max_context "
                          f"({cfg.env.max_context}{origin.get('env.max_context', ', the default')}), which also "
                          f"holds the prompt; got {cfg.rollout.max_new_tokens}")
    _validate_algo(cfg, origin, name, fail)


def _validate_rewards(cfg: Config, task, name):
    """env.rewards names terms of r1/envs/rewards.REWARDS (read after the task's module registered its own), each
    weight on the side its term's `sign` allows; a task-only term (`general=False`) set for a task that does not
    list it in Task.rewards is refused."""
    from r1.tasks.registry import TASKS

    for term, weight in cfg.env.rewards.items():
        if term not in REWARDS:
            close = difflib.get_close_matches(term, list(REWARDS), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"config key {name('env.rewards')}: unknown reward {term!r}; {hint}"
                              f"known: {', '.join(REWARDS)}")
        r = REWARDS[term]
        if r.sign * weight < 0:
            raise ConfigError(f"config key {name('env.rewards')}: reward {term!r} is a "
                              f"{'penalty' if r.sign < 0 else 'bonus'}, its weight must be "
                              f"{'<= 0' if r.sign < 0 else '>= 0'}, got {weight!r}")
        if weight and not r.general and term not in task.rewards:
            payers = [t.name for t in TASKS.values() if term in t.rewards]
            by = r.paid_by or (f"the {' / '.join(payers)} task" if payers else "tasks listing it in Task.rewards")
            raise ConfigError(f"config key {name('env.rewards')}: reward {term!r} is paid by {by} only; "
                              f"data.task={cfg.data.task} would ignore it (set it to 0)")


def _validate_lora(cfg: Config, name, fail):
    """The model.lora_* rules: known target names; keys that LoRA's one shared base cannot honour."""
    m = cfg.model
    unknown = [t for t in m.lora_targets if t not in LORA_TARGETS]
    if unknown:
        raise ConfigError(f"config key {name('model.lora_targets')}: unknown projection {unknown[0]!r}; "
                          f"known: {', '.join(LORA_TARGETS)}")
    if not m.lora_rank:
        return
    if not m.lora_targets:
        fail("model.lora_targets", "at least one projection when model.lora_rank > 0")
    if not m.lora_alpha > 0:
        fail("model.lora_alpha", "> 0 when model.lora_rank > 0")
    if cfg.train.stage == "sft":  # an RL run's warm-up (train.sft_steps) trains every weight itself (r1/sft.py)
        raise ConfigError(f"config key {name('model.lora_rank')}: LoRA trains the RL stage only; SFT (train.stage=sft) "
                          f"trains every weight: set model.lora_rank=0 for it")
    if cfg.train.precision == "bf16":
        raise ConfigError(f"config key {name('train.precision')}=bf16 copies the weights in bf16, and with "
                          f"model.lora_rank > 0 the frozen base is bf16 already: drop it (or set model.lora_rank=0)")
    for key in ("model.critic_path", "model.ref_path"):
        if get(cfg, key):
            raise ConfigError(f"config key {name(key)}: with model.lora_rank > 0 the critic and the reference "
                              f"share the policy's frozen base; unset it (or set model.lora_rank=0)")


def _validate_algo(cfg: Config, origin: dict, name, fail):
    """The algo.* rules, read from the estimator and loss tables.

    A key that the chosen estimator or loss does not read, set away from its
    default, would be ignored without a word: it is refused, unless the choice
    was made in another place than the key (a later file or the command line
    switched the estimator of a base config, e.g. `gsm8k_tool.yaml` with
    `algo.advantage=grpo`); then the base's setting is dormant, and a warning
    names it.
    """
    from r1.algos.estimators import CRITIC_KEYS, ESTIMATORS  # the tables hold torch functions: loaded here
    from r1.algos.policy_losses import POLICY_LOSSES

    a, defaults = cfg.algo, Config()
    estimator, loss = ESTIMATORS[a.advantage], POLICY_LOSSES[a.policy_loss]

    def refuse_unread(keys, read, choice_key, chosen):
        for k in keys:
            if k in read or get(cfg, k) == get(defaults, k):
                continue
            msg = f"config key {name(k)} does not apply to {chosen}"
            where, choice_where = origin.get(k), origin.get(choice_key)
            if choice_where is not None and where not in (None, COMMAND_LINE) and where != choice_where:
                warnings.warn(f"{msg}{choice_where}; ignored", stacklevel=4)
                continue
            raise ConfigError(f"{msg}; remove it or set it to its default {get(defaults, k)!r}, "
                              f"got {get(cfg, k)!r}")

    def algo_keys(names):
        return ["algo." + k for k in names]

    chosen = f"algo.advantage={a.advantage}"
    refuse_unread(algo_keys(sorted({k for e in ESTIMATORS.values() for k in e.keys})), algo_keys(estimator.keys),
                  "algo.advantage", chosen)
    critic_keys = algo_keys(CRITIC_KEYS) + ["model.critic_layers"]
    refuse_unread(critic_keys, critic_keys if estimator.needs_critic else (), "algo.advantage", f"{chosen} (no critic)")
    refuse_unread(algo_keys(sorted({k for p in POLICY_LOSSES.values() for k in p.keys})), algo_keys(loss.keys),
                  "algo.policy_loss", f"algo.policy_loss={a.policy_loss}")
    if "reward_level" in estimator.keys and a.reward_level == "trajectory" and a.gamma != defaults.algo.gamma:
        raise ConfigError(f"config key {name('algo.gamma')} discounts step rewards: it needs algo.reward_level=step "
                          f"with {chosen} (a trajectory's score is its undiscounted total), got {a.gamma!r}")
    if a.policy_loss in ("ppo", "decoupled_ppo") and a.clip_low >= 1:
        fail("algo.clip_low", f"< 1 for algo.policy_loss={a.policy_loss} (1 - clip_low bounds the ratio)")
    if a.drop_uniform_groups and (not estimator.zero_on_uniform_groups or a.reward_level != "trajectory"
                                  or a.whiten or (a.kl_in_reward and a.kl_coef > 0)):
        # only there is a uniform group's advantage exactly 0 and the others' independent of it
        raise ConfigError(f"config key {name('algo.drop_uniform_groups')} needs a group baseline on trajectory "
                          f"rewards alone (algo.advantage grpo or rloo, reward_level trajectory, whiten false, no "
                          f"KL in the reward), got advantage={a.advantage} reward_level={a.reward_level} "
                          f"whiten={a.whiten} kl_in_reward={a.kl_in_reward} kl_coef={a.kl_coef}")
    if not cfg.run.save and cfg.train.sft_steps and cfg.train.stage == "rl":
        raise ConfigError(f"config key {name('run.save')}=false leaves no SFT export for the RL phase to start from: "
                          f"it needs train.sft_steps=0, got {cfg.train.sft_steps}")
    if cfg.train.overlap and a.policy_loss != "decoupled_ppo" and not a.tis_cap:
        raise ConfigError(f"config key {name('train.overlap')}={cfg.train.overlap} samples with the weights one "
                          f"update back: it needs algo.policy_loss=decoupled_ppo or algo.tis_cap > 0 to correct for "
                          f"them, got policy_loss={a.policy_loss} tis_cap={a.tis_cap}")
    if cfg.rollout.carry_tokens and a.policy_loss != "decoupled_ppo" and not a.tis_cap \
            and cfg.train.score_policy != "sampler":
        raise ConfigError(f"config key {name('rollout.carry_tokens')}={cfg.rollout.carry_tokens} resumes paused "
                          f"episodes on newer weights, so an episode's earlier steps come from older ones: it needs "
                          f"algo.policy_loss=decoupled_ppo, algo.tis_cap > 0 or train.score_policy=sampler to "
                          f"correct for them, got policy_loss={a.policy_loss} tis_cap={a.tis_cap} "
                          f"score_policy={cfg.train.score_policy}")
    if cfg.train.overlap == 2 and cfg.model.lora_rank and cfg.model.lora_generator == "adapters":
        raise ConfigError(f"config key {name('train.overlap')}=2 (the rollout in a process of its own) copies full "
                          f"weights to that process, not LoRA adapters over a shared base: set "
                          f"model.lora_generator=merged, or train.overlap=1")
    if cfg.train.stage == "rl" and estimator.group_baseline and cfg.rollout.n < 2:
        raise ConfigError(f"config key {name('rollout.n')} must be >= 2 for {chosen} "
                          f"(a group of one has no baseline), got {cfg.rollout.n}")
