"""Configuration: one dataclass per section, YAML files, dotted CLI overrides.

    python train.py --config configs/smoke.yaml algo.clip_high=0.28 run.dir=runs/x

Each field carries a docstring (read back by `describe()` for `--help`).
Everything a run does is in the resolved config, which the run folder keeps
as `config.yaml`. Bad input fails early with one line that names the
culprit: the file and line, the key, the closest valid keys, the expected
type or range.

Values are typed by the dataclass field, not guessed: a command-line value
for a `str` field is kept as written (`run.dir=0755` stays "0755"), other
fields parse it as YAML (`train.lr=1e-5`, `env.tools=[calculator]` or
`env.tools=calculator`), and `null`/`None` clears an optional field (and is
an error for a required one, rather than a folder named "null"). A YAML
file is read twice, once as nodes (for line numbers and duplicate keys,
which PyYAML would silently resolve to the last one) and once as values.
Range checks (`BOUNDS`, `validate`) only reject values that cannot mean
anything (a negative step count, top_p above 1), so ablations stay free.
"""
import ast
import dataclasses
import difflib
import inspect
import math
import os
import types
import typing
import warnings
from dataclasses import dataclass, field

import yaml

from r1.algos.estimators import CRITIC_KEYS, ESTIMATORS
from r1.algos.policy_losses import POLICY_LOSSES
from r1.algos.reward_norm import MODES as REWARD_NORM_MODES
from r1.envs.context import CONTEXT_POLICIES
from r1.envs.rewards import REWARDS
from r1.lora import TARGETS as LORA_TARGETS, check_targets


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""


# What a bad path, model, tokenizer or data file raises while a run is set up:
# entry points turn these into one `error:` line (exit 2) instead of a traceback.
USER_ERRORS = (ConfigError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, KeyError)


class NodeError(ConfigError):
    """A config error about the files this node sees (a run folder in the way, a missing path). Every rank of a
    node sees the same files, so under torchrun local rank 0 says it (once a node, not once a rank; `says`)
    and the other ranks leave with the same status without a word."""


def says(e: BaseException, run_wide: bool = False) -> bool:
    """Whether this rank prints the one-line error for `e`: one that every rank of the run meets alike
    (`run_wide`, a config error) on rank 0 only, a NodeError on local rank 0 only, the rest on every rank (they
    can differ by rank). A rank that keeps quiet waits 2 s first: torchrun stops every rank once one has
    failed, and the rank that says the error must not be stopped before it has."""
    rank = "RANK" if run_wide else "LOCAL_RANK" if isinstance(e, NodeError) else None
    if rank is None or int(os.environ.get(rank, "0")) == 0:
        return True
    import time

    time.sleep(2)
    return False


def node_error(message: str) -> SystemExit:
    """A NodeError for code that ends the command with SystemExit: its `error:` line where `says`, else a bare
    status 2 (run_main exits 2 either way)."""
    e = NodeError(message)
    return SystemExit(f"error: {e}" if says(e) else 2)


def run_main(main) -> None:
    """Run a command's main() under the README's exit codes: a user error, raised as SystemExit("error:
    ..."), prints that one line to stderr and exits with status 2; any other exit passes through. Output
    piped into a reader that stops early (`... | head`) ends the command quietly (status 141, as a shell's
    own tools), not with a traceback. A rank of a gloo group (torchrun on CPUs) then leaves through
    r1.distributed.leave, past the interpreter's teardown, which can abort it (that module says why)."""
    import sys

    try:
        main()
        sys.stdout.flush()  # a closed pipe shows here, or at exit where it could no longer be caught
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush succeeds
        _leave(141)
        sys.exit(141)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            _leave(2)
            sys.exit(2)
        if e.code is None or isinstance(e.code, int):
            _leave(e.code or 0)
        raise
    except BaseException as e:  # leaving: its traceback, as Python prints it, and the status Python gives it
        _leave(130 if isinstance(e, KeyboardInterrupt) else 1, print_error=True)
        raise
    _leave(0)


def _leave(code: int, print_error: bool = False) -> None:
    """r1.distributed.leave if that module was imported (no group can be open otherwise; importing it here
    would load torch for `--keys` and the one-line errors)."""
    import sys

    if "r1.distributed" in sys.modules:
        sys.modules["r1.distributed"].leave(code, print_error)


@dataclass
class Run:
    dir: str = "runs/default"
    """Output folder: config.yaml, metrics.jsonl, tensorboard events, checkpoints/, trajectories/, hf/."""
    resume: bool = False
    """Continue from the latest checkpoint in run.dir (otherwise an existing run.dir is an error)."""
    seed: int = 0
    """Seed for sampling, data order and model init."""
    device: str = "auto"
    """auto (cuda if available, else cpu), cpu or cuda."""
    allow_config_change: bool = False
    """With run.resume=true: go on even though the config differs from the run's saved config.yaml in keys that
    change what the run is (algorithm, model, learning rate, ...); the change is printed and the old file kept
    as config.<n>.yaml. Without it such a resume is refused, listing the differences."""
    memory_fraction: float = 1.0
    """Share of the GPU's memory this process plans for (r1/memory.py) and may allocate: 1 = all of it; 0.25 lets
    four runs share one GPU side by side, each with its own plan (a small model leaves most of a GPU idle). On a
    CPU the plan uses at most this share of the machine's RAM (planned for, not enforced)."""
    save: bool = True
    """Write checkpoints and the final hf/ export (adapter/ too with LoRA). false = metrics, logs and
    trajectories only, for benchmarks of big shapes (one checkpoint of a 3B model trained in full is 64 GiB):
    nothing to resume from or to evaluate; needs train.sft_steps=0 (the RL phase starts from the SFT phase's hf/)."""
    dtype: str = "auto"
    """Generator (rollout) dtype: auto (bfloat16 on cuda, float32 on cpu). Training keeps float32 master weights and computes in bf16 on CUDA (autocast on one GPU, FSDP mixed precision on several)."""


@dataclass
class Model:
    path: str = "smollm2-135m-instruct"
    """Policy weights: an HF directory, a .gguf file, the short name smollm2-135m-instruct, or `tiny` (random tiny model)."""
    tokenizer: str | None = None
    """Tokenizer source (HF directory, .gguf, short name); defaults to model.path."""
    arch: str = "llama"
    """For model.path=tiny: a model family of r1/families (llama, qwen2, qwen3, mistral, smollm3)."""
    thinking: bool | None = None
    """Qwen3's chat-template switch enable_thinking: null = the template's default; false = no reasoning block."""
    tiny_layers: int = 2
    """For model.path=tiny: number of layers."""
    tiny_hidden: int = 64
    """For model.path=tiny: hidden size."""
    critic_path: str | None = None
    """Critic initialisation: None = the policy's weights (with a fresh value head)."""
    critic_layers: int = 0
    """The critic's depth: 0 = every block of its model; k = its first k blocks (then the final norm and the
    value head). A shallower critic costs proportionally less in scoring and in the update."""
    ref_path: str | None = None
    """Reference policy for KL: None = the initial policy weights."""
    lora_rank: int = 0
    """LoRA (r1/lora.py): 0 = full fine-tuning; r > 0 = train rank-r adapters over one frozen base shared by the
    policy, the critic (its own adapters and value head) and the reference (the base: adapters off)."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapters' output is multiplied by lora_alpha / lora_rank."""
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """The projections that get adapters, in every block: any of q_proj, k_proj, v_proj, o_proj, gate_proj,
    up_proj, down_proj."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input during the update (never while scoring or sampling)."""
    lora_generator: str = "adapters"
    """What the generator of a LoRA run samples with: adapters = the shared frozen base plus rollout-dtype
    copies of the adapters, the update's own arithmetic (the sampler-trainer gap of full fine-tuning) and no
    second copy of the base, for two small matmuls more per projection; merged = one weight per projection,
    W + scale * B @ A rounded into the rollout dtype, in bf16 ~0.04 nats a token from what the update scores
    (bench/lora_precision.py) and a full copy of the base, for a decode without the extra matmuls."""


@dataclass
class Data:
    task: str = "synthetic"
    """A registered task (synthetic: embedded, no download; gsm8k: single step; gsm8k_tool: multi-step with the
    calculator; see r1/tasks/builtin.py) or your own as package.module:attr (docs/tasks.md)."""
    path: str | None = None
    """The task's data: for gsm8k/gsm8k_tool a folder (train/test .jsonl, .jsonl.gz or the HF parquet layout);
    None = the copy shipped in data/gsm8k. Unused by synthetic."""
    level: int = 1
    """Task difficulty, for tasks that have levels (synthetic: 1 = one operation ... higher = more chained steps;
    cli: 1 to 3, deeper trees and two-step requests; a task's own `max_level` bounds it; GSM8K has none)."""
    train_size: int = 2000
    """Training rows: generated tasks (synthetic, cli, your own) make this many; GSM8K: a cap on rows used
    (0 = all)."""
    test_size: int = 200
    """Held-out rows that generated tasks (synthetic, cli, your own) make; GSM8K's test split is fixed."""
    sft_level: int = 0
    """The level of the SFT phase's expert chats (train.sft_steps, train.stage=sft), for tasks with levels;
    0 = data.level. SFT on an easier level, then RL and evaluation on data.level, shows what RL adds beyond
    imitation (configs/cli.yaml: SFT on level 2, RL on level 3 and its two-step requests)."""
    val_size: int = 0
    """A validation split carved from the task's train rows: this many rows (a fixed choice, the same for every
    run.seed) are never trained on (RL or SFT) and form the split `val` (eval.split=val). Tune on it; keep
    `test` for the final number. 0 = no validation split."""
    rl_max_difficulty: int = 0
    """RL's prompts only from training rows whose difficulty, as the task measures it (GSM8K: the calculations
    its reference solution marks), is at most this: rows a policy never solves pay no reward in any sample and
    only lengthen the rollout. 0 = every row. SFT, validation and test rows are never left out."""


@dataclass
class Env:
    max_steps: int = 4
    """Maximum environment steps (model turns) per episode."""
    context_policy: str = "append"
    """A name in r1/envs/context.CONTEXT_POLICIES: append (token-exact concatenation; the episode ends when the budget is reached), window (keep the first prompt and the latest whole turns) or truncate (keep the first prompt and the latest tokens); an env that overrides Env.summarize writes a summary first, under any policy."""
    max_context: int = 2048
    """Token budget of a step's prompt + response; reaching it ends the episode (append) or drops old context (window, truncate; the episode ends only when the first prompt alone does not fit)."""
    malformed_penalty: float = 0.0
    """Reward added (use a negative number) for each step with a malformed tool call."""
    format_reward: float = 0.0
    """Shaping: reward added for each step whose tool calls are all well formed, and for a final answer in
    the task's answer format (0 = off; a small value such as 0.05; see docs/tasks.md on reward hacking)."""
    tool_success_reward: float = 0.0
    """Shaping: reward added for each step whose tool calls all ran without error (0 = off)."""
    command_reward: float = 0.0
    """Shaping, data.task=cli only: reward added for each step whose shell commands were all accepted by the
    sandbox (whitelisted, inside the folder), whether or not they then succeeded (0 = off)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """A rubric: {term: weight} of reward terms in r1/envs/rewards.REWARDS added to each step's reward, after the
    four shaping keys above (which are the terms malformed, format, tool_success and command); e.g.
    `env.rewards={my_term: 0.1}`. Empty = none."""
    tools: list[str] | None = None
    """Tools the env offers: registered names or package.module:attr; null = the task's own tools."""
    tool_format: str = "auto"
    """How the model writes tool calls (r1/tool_formats.py): auto = from its chat template; hermes, llama3, mistral."""


@dataclass
class Rollout:
    prompts: int = 8
    """Prompts per iteration (global, across ranks)."""
    n: int = 4
    """Samples per prompt (a group, for GRPO/RLOO)."""
    max_new_tokens: int = 256
    """Maximum sampled tokens per step."""
    temperature: float = 1.0
    """Sampling temperature; logprobs are recorded at this temperature and the loss uses it too."""
    top_p: float = 1.0
    """Nucleus sampling; the recorded logprob is of the full tempered distribution (see r1/generate.py)."""
    top_k: int = 0
    """Top-k sampling (0 = off); same logprob rule as top_p."""
    slots: int = 0
    """Concurrent rows in the generator's KV cache (continuous batching); 0 or auto = as many as fit in memory
    (r1/memory.py), at most what an iteration runs at once (prompts x n per rank; a quarter more with carry_tokens,
    whose resumed episodes start first) and 512 (640 with carry_tokens)."""
    cache_len: int = 0
    """KV cache positions per slot (0 = env.max_context)."""
    carry_tokens: int = 0
    """0 = off. Else an episode that has sampled this many tokens in one rollout pauses at its next step boundary
    and resumes first in the next rollout, on that rollout's weights (r1/rollout.py): the rollout no longer lasts
    as long as its longest episode. Its steps keep the logprobs and policy_version that sampled them (decoupled
    PPO weighs each token by them: it needs algo.policy_loss=decoupled_ppo, algo.tis_cap > 0 or
    train.score_policy=sampler); critic-free estimators get whole groups. Paused episodes are lost when the run
    ends, and run.resume refuses such a run."""
    share_prompt: bool = False
    """Identical prompts admitted together (a group's samples) are prefilled once: one row's forward, its keys
    and values copied into the others' slots, its last hidden state their first token's logits (each row samples
    with its own noise). false = every row prefills its own prompt (the reference)."""
    sync_every: int = 0
    """Decode steps per chunk of the agent loop, between two collections on the host (stop checks, environment
    steps); 0 or auto = 4 on CUDA, where the next chunk is queued while the host works (r1/generate.py overlap),
    16 on CUDA with R1_OVERLAP=0, 1 on the CPU."""


@dataclass
class Algo:
    advantage: str = "step_gae"
    """A name in r1/algos/estimators.ESTIMATORS: step_gae, token_gae, grpo, rloo, reinforce_pp, reinforce_pp_baseline (docs/algorithms.md)."""
    policy_loss: str = "ppo"
    """A name in r1/algos/policy_losses.POLICY_LOSSES: ppo (clipped ratio), cispo (clipped importance weight, every token keeps its gradient) or decoupled_ppo (PPO's clip against the proximal policy, weighted prox/behaviour: for train.overlap 1)."""
    gamma: float = 1.0
    """Discount across steps (step_gae; group estimators with reward_level=step) or tokens (token_gae)."""
    lam: float = 1.0
    """GAE lambda (step_gae, token_gae)."""
    grpo_std_norm: bool = True
    """GRPO: divide by the group std (False = Dr.GRPO)."""
    drop_uniform_groups: bool = False
    """grpo / rloo on trajectory rewards: leave groups whose episodes all got the same total reward out of
    the update (their advantages are all 0), so the loss is normalised over informative tokens only
    (DAPO's dynamic-sampling filter, without resampling). Their KL-loss and entropy terms go with them."""
    reward_level: str = "trajectory"
    """Group estimators: score each trajectory by its total reward (trajectory), or each step by its discounted
    return-to-go, compared with the same step index of the group's other episodes (step)."""
    normalize_reward: str = "off"
    """off, std (divide step rewards by their running std) or mean_std (also subtract the running mean); running
    moments over every reward seen, on all ranks (r1/algos/reward_norm.py)."""
    whiten: bool = False
    """Whiten advantages over the global batch (all ranks); implied by reinforce_pp*, so refused there."""
    adv_clip: float = 0.0
    """Clip advantages to [-adv_clip, adv_clip] (0 = off)."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.2
    """PPO ratio clip above 1 (clip-higher: e.g. 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 for negative advantages (0 = off)."""
    ratio_level: str = "token"
    """ppo: token, or step (GSPO-style geometric mean ratio over the step's tokens; any loss_agg)."""
    log_ratio_clamp: float = 20.0
    """Clamp |log ratio| before exp."""
    tis_cap: float = 0.0
    """Truncated importance sampling cap against the sampler logprobs (0 = off)."""
    loss_agg: str = "token_mean"
    """token_mean, seq_mean_token_sum, seq_mean_token_mean or step_mean."""
    value_clip: float = 0.0
    """PPO value clipping range (0 = off)."""
    vf_coef: float = 1.0
    """Value loss coefficient (the critic has its own optimizer; this scales its loss)."""
    vf_epochs: int = 0
    """Critic passes over each iteration's rollouts (0 = ppo_epochs); passes beyond ppo_epochs train the critic alone."""
    critic_warmup: int = 0
    """The first N iterations train the critic only (the policy, its optimizer and its schedule stay as they are)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    kl_coef: float = 0.0
    """KL to the reference policy (0 = no reference model is built)."""
    kl_estimator: str = "k3"
    """k1, k2 or k3."""
    kl_in_reward: bool = False
    """Apply KL as a per-token reward penalty instead of a loss term."""
    ppo_epochs: int = 1
    """Passes over each iteration's rollouts."""
    minibatches: int = 1
    """Optimizer steps per epoch."""


@dataclass
class Train:
    stage: str = "rl"
    """rl or sft (SFT on expert trajectories, loss on assistant tokens only)."""
    steps: int = 10
    """RL iterations (rl) or optimizer steps (sft)."""
    sft_steps: int = 0
    """rl: first run this many SFT optimizer steps (train.sft_batch chats each, lr train.sft_lr, linear warm-up
    over min(20, steps/10) then cosine to 10%) on the task's expert chats, a phase in run.dir/sft/ with its own
    metrics.jsonl and tb/, then RL from that policy (0 = RL from model.path)."""
    sft_lr: float = 1e-5
    """Learning rate of the SFT warm-up phase (train.sft_steps > 0)."""
    lr: float = 1e-6
    """Policy learning rate."""
    critic_lr: float = 1e-5
    """Critic learning rate."""
    warmup: int = 0
    """Linear warmup in optimizer steps."""
    schedule: str = "constant"
    """constant or cosine (to 10% of lr)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    micro_tokens: int = 0
    """Tokens per packed micro-batch (gradient accumulation within a mini-batch); 0 or auto = the largest
    power of two up to 16384 that fits in memory (r1/memory.py)."""
    activation_checkpointing: str = "auto"
    """Recompute each block in backward to save memory: true, false, or auto (on only when the update would
    not fit without it; r1/memory.py)."""
    sft_batch: int = 16
    """SFT: conversations per optimizer step."""
    checkpoint_every: int = 1
    """Save a checkpoint every N iterations (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept in run.dir/checkpoints (>= 1). Older ones are deleted only after a newer one is written,
    checksummed and named by `latest`; 2 leaves a fallback if the newest is later found damaged."""
    overlap: int = 0
    """RL: 1 = the rollout of iteration k+1 runs (a background thread) while iteration k scores and updates,
    on the weights before update k: one step off-policy, corrected with the sampler's logprobs (needs
    algo.policy_loss=decoupled_ppo or algo.tis_cap > 0; run.resume is refused). 2 = the same with the rollout
    in a process of its own, so the two do not take turns on one interpreter (one a rank, no LoRA adapters
    generator: r1/rollout_process.py). 0 = the synchronous loop (r1/overlap.py)."""
    precision: str = "autocast"
    """RL, one device: autocast = float32 weights under bf16 autocast on a GPU (every linear casts its weight and
    input in every forward; float32 on the CPU); bf16 = a bf16 copy of the weights runs the forward and backward,
    its gradients summed in float32 into the float32 master weights, refreshed after each optimizer step: what
    FSDP's mixed precision does on several GPUs, where it is used whichever is set (r1/precision.py). Not with
    model.lora_rank > 0 (its base is bf16 already). The SFT stage keeps autocast."""
    score_policy: str = "auto"
    """RL: auto = scoring skips the policy's forward when the update's own gives the same old logprobs (one
    epoch of one mini-batch, algo.ppo_epochs=1 and algo.minibatches=1, no reference model, the policy trained this
    iteration): the update's forward runs on the weights scoring would, so the ratio is exactly 1 and the
    sampler-trainer gap is logged from it (r1/learner.py). always = score it anyway (the reference path).
    sampler = never score it (but during algo.critic_warmup): the sampler's recorded logprobs are the old ones, so
    the ratio is taken against the policy that sampled (PPO's own definition; the sampler-trainer gap and, under
    train.overlap, the policy lag fall inside the clip), decoupled PPO's proximal policy is the sampler's
    (its behaviour weight is 1), a reference KL is taken against them; the gap is logged from the update's first
    mini-batch, the one on the weights scoring would have used. Not exact against always: a choice of algorithm,
    one policy forward over the batch less."""
    share_prefix: bool = False
    """RL: pack each group's first prompt once per micro-batch, not once per sample: its rows run through the
    models once and every sample's attention reads them (r1/packing.py). The same logprobs, values and
    gradients (float64-equal); mini-batches are then dealt whole groups at a time, not trajectories round-robin,
    so the split differs from false's. false = every sample packed whole, as before."""
    time_limit: float = 0.0
    """RL: stop after the iteration that passes this many seconds of this process's training
    (0 = no limit); the run then checkpoints and exports hf/ as at its last step, and
    `run.resume=true` continues it."""


@dataclass
class Eval:
    every: int = 0
    """Evaluate every N iterations during training (0 = off)."""
    limit: int = 0
    """Evaluate on at most N problems (0 = the whole split)."""
    n: int = 1
    """Samples per problem for pass@k (1 = greedy only)."""
    temperature: float = 1.0
    """Sampling temperature for pass@k."""
    split: str = "test"
    """Split to evaluate (in training too, every eval.every iterations): test, or val (data.val_size rows
    carved from train; choose settings on val, report test once)."""
    out: str | None = None
    """eval.py: folder for trajectories and the result JSON (default: a temp-free run folder under runs/eval-*)."""
    adapter: str | None = None
    """eval.py: a LoRA adapter folder (r1's RUN/adapter, PEFT's layout) applied unmerged over model.path, as a
    LoRA run's generator (model.lora_generator=adapters) ran it. eval.py sets it itself for a LoRA run folder
    given as model.path, whose merged hf/ export (bf16 on a GPU) rounds small adapter updates away."""


@dataclass
class Log:
    tensorboard: bool = True
    """Write tensorboard event files in run.dir."""
    trajectories: bool = True
    """Save every iteration's trajectories in run.dir/trajectories/."""
    progress: bool = True
    """Show a progress bar with ETA on the console."""


@dataclass
class Config:
    run: Run = field(default_factory=Run)
    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    env: Env = field(default_factory=Env)
    rollout: Rollout = field(default_factory=Rollout)
    algo: Algo = field(default_factory=Algo)
    train: Train = field(default_factory=Train)
    eval: Eval = field(default_factory=Eval)
    log: Log = field(default_factory=Log)


CHOICES = {
    "run.device": ["auto", "cpu", "cuda"], "run.dtype": ["auto", "float32", "bfloat16"],
    "model.arch": ["llama", "qwen2", "qwen3", "mistral", "smollm3"], "model.lora_generator": ["merged", "adapters"],
    "env.context_policy": CONTEXT_POLICIES,
    # the algorithm tables themselves (live: an entry added to a table is a valid choice)
    "algo.advantage": ESTIMATORS, "algo.policy_loss": POLICY_LOSSES, "algo.normalize_reward": REWARD_NORM_MODES,
    "algo.reward_level": ["trajectory", "step"], "algo.ratio_level": ["token", "step"],
    "algo.loss_agg": ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "step_mean"],
    "algo.kl_estimator": ["k1", "k2", "k3"], "train.stage": ["rl", "sft"], "train.schedule": ["constant", "cosine"],
    "train.activation_checkpointing": ["auto", "true", "false"],
    "train.precision": ["autocast", "bf16"],
    "train.score_policy": ["auto", "always", "sampler"],
}
# Names a reader brings from elsewhere for a choice key, and what to write instead.
ALIASES = {"algo.advantage": {"ppo": "for PPO use step_gae: step-level GAE with a critic; token_gae is the "
                                     "token-level one"}}

# Integer keys where `auto` is accepted and stored as 0 (the memory plan then picks the value).
AUTO_ZERO = ("rollout.slots", "train.micro_tokens", "rollout.sync_every")

# Inclusive (low, high) bounds, None = open. Strict bounds and rules over two keys are in validate().
BOUNDS = {
    "model.tiny_layers": (1, None), "model.tiny_hidden": (1, None), "model.lora_rank": (0, None),
    "model.critic_layers": (0, None),
    "model.lora_dropout": (0.0, 0.99),
    "data.level": (1, None), "data.train_size": (0, None), "data.test_size": (0, None),
    "data.val_size": (0, None), "data.sft_level": (0, None),
    "env.max_steps": (1, None), "env.max_context": (1, None), "env.malformed_penalty": (None, 0.0),
    "rollout.prompts": (1, None), "rollout.n": (1, None), "rollout.max_new_tokens": (1, None),
    "rollout.temperature": (0.0, None), "rollout.top_k": (0, None),
    "rollout.slots": (0, None), "rollout.cache_len": (0, None), "rollout.sync_every": (0, 4096),
    "rollout.carry_tokens": (0, None),
    "algo.gamma": (0.0, 1.0), "algo.lam": (0.0, 1.0), "algo.adv_clip": (0.0, None), "algo.clip_low": (0.0, 1.0),
    "algo.clip_high": (0.0, None), "algo.dual_clip": (0.0, None), "algo.tis_cap": (0.0, None),
    "algo.value_clip": (0.0, None), "algo.vf_coef": (0.0, None), "algo.kl_coef": (0.0, None),
    "algo.ppo_epochs": (1, None), "algo.minibatches": (1, None), "algo.vf_epochs": (0, None),
    "algo.critic_warmup": (0, None),
    "train.steps": (0, None), "train.lr": (0.0, None), "train.critic_lr": (0.0, None), "train.warmup": (0, None),
    "train.weight_decay": (0.0, None), "train.grad_clip": (0.0, None), "train.micro_tokens": (0, None),
    "train.sft_batch": (1, None), "train.sft_steps": (0, None), "train.sft_lr": (0.0, None),
    "env.format_reward": (0.0, None), "env.tool_success_reward": (0.0, None),
    "env.command_reward": (0.0, None), "train.checkpoint_every": (1, None), "train.time_limit": (0.0, None),
    "train.keep_checkpoints": (1, None), "train.overlap": (0, 2), "data.rl_max_difficulty": (0, None),
    "eval.every": (0, None), "eval.limit": (0, None), "eval.n": (1, None), "eval.temperature": (0.0, None),
}
# Upper bounds on sizes, far above any real run (a 1M-token context, 64k slots) but low enough that a typo
# (`rollout.slots=10000000000`) is a config error naming the key instead of an allocation failure later.
HUGE = 2**20
for _key, _high in {"model.tiny_layers": 1024, "model.tiny_hidden": 65536, "data.level": 1000, "data.sft_level": 1000,
                    "model.critic_layers": 1024,
                    "data.train_size": 10**9, "data.test_size": 10**9, "data.val_size": 10**9, "env.max_steps": 100_000,
                    "env.max_context": HUGE, "rollout.prompts": HUGE, "rollout.n": 65536,
                    "rollout.max_new_tokens": HUGE, "rollout.top_k": HUGE, "rollout.slots": 65536,
                    "rollout.cache_len": HUGE, "rollout.carry_tokens": HUGE, "algo.ppo_epochs": 10_000,
                    "algo.minibatches": HUGE,
                    "train.steps": 10**9, "train.warmup": 10**9, "train.micro_tokens": 2**24,
                    "train.sft_batch": HUGE, "train.sft_steps": 10**9, "train.checkpoint_every": 10**9, "train.keep_checkpoints": 10_000,
                    "eval.every": 10**9, "eval.limit": 10**9, "eval.n": 65536}.items():
    BOUNDS[_key] = (BOUNDS.get(_key, (None, None))[0], _high)

NULLS = ("null", "Null", "NULL", "~", "None", "none")  # null, in a file or on the command line
COMMAND_LINE = " (command line)"


def all_keys() -> list[str]:
    return [f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(s.type)]


def sections() -> list[str]:
    return [s.name for s in dataclasses.fields(Config)]


def get(cfg: Config, key: str):
    """The value of a dotted key, e.g. get(cfg, "algo.clip_high")."""
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def _unknown(key: str, where: str) -> ConfigError:
    keys = all_keys()
    # Same field name in another section first (train.clip_high -> algo.clip_high), then spelling.
    name = key.rpartition(".")[2]
    close = [k for k in keys if k.rpartition(".")[2] == name and k != key]
    close += [k for k in difflib.get_close_matches(key, keys, n=3, cutoff=0.5) if k not in close]
    hint = f"; did you mean {', '.join(close[:3])}?" if close else "; `python train.py --keys` lists them all"
    return ConfigError(f"unknown config key '{key}'{where}{hint}")


def _type_name(tp, optional: bool) -> str:
    if typing.get_origin(tp) is dict:
        name = "a mapping of name: {}".format(typing.get_args(tp)[1].__name__)
    elif typing.get_origin(tp) is list:
        name = f"a list of {typing.get_args(tp)[0].__name__}"
    else:
        name = {bool: "true or false", float: "float (e.g. 1e-5)"}.get(tp, getattr(tp, "__name__", str(tp)))
    return name + (" or null" if optional else "")


def _from_text(raw: str, tp):
    """A command-line value -> a Python value, by the field's type (str stays as written)."""
    if tp is str or raw == "":
        return raw
    if typing.get_origin(tp) is list and not raw.lstrip().startswith("["):
        return [v.strip() for v in raw.split(",") if v.strip()]
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _coerce(key: str, value, tp, where: str, text: bool = False):
    """Check/convert one value against a field type; raise ConfigError naming the key."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        tp = next(a for a in args if a is not type(None))
    if isinstance(value, str) and value in NULLS:
        value = None  # `model.tokenizer=None`; a required field then says it got None
    if optional and value is None:
        return None
    if text and value is not None:
        value = _from_text(value, tp)
    bad = ConfigError(f"config key '{key}'{where} expects {_type_name(tp, optional)}, got {value!r:.80}")
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise bad
        _, inner = typing.get_args(tp)
        return {str(k): _coerce(f"{key}.{k}", v, inner, where) for k, v in value.items()}
    if typing.get_origin(tp) is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise bad
        (inner,) = typing.get_args(tp)
        return [_coerce(key, v, inner, where) for v in value]
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if key in AUTO_ZERO and isinstance(value, str) and value.strip().lower() == "auto":
            return 0
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}'{where} expects a finite float, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool) and "true" in CHOICES.get(key, ()):
            value = str(value).lower()  # `activation_checkpointing: true` in a file: a true/false/auto key
        if isinstance(value, str) and "true" in CHOICES.get(key, ()):
            value = value.lower()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # `dir: 2024` in a file
        if not isinstance(value, str):
            raise bad
        if key in CHOICES and value not in CHOICES[key]:
            close = difflib.get_close_matches(value, list(CHOICES[key]), n=3, cutoff=0.5)
            alias = ALIASES.get(key, {}).get(value.lower())
            hint = f" ({alias})" if alias else f" (closest: {', '.join(close)})" if close else ""
            raise ConfigError(f"config key '{key}'{where} must be one of {', '.join(CHOICES[key])}; "
                              f"got {value!r:.80}{hint}")
        return value
    raise bad


def _set(cfg: Config, key: str, value, where: str = "", text: bool = False):
    section, _, name = key.partition(".")
    if section not in sections() or "." in name:
        raise _unknown(key, where)
    hints = typing.get_type_hints(type(getattr(cfg, section)))
    if name not in hints:
        raise _unknown(key, where)
    setattr(getattr(cfg, section), name, _coerce(key, value, hints[name], where, text))


def _at(path: str, line: int | None) -> str:
    return f" in {path}:{line}" if line else f" in {path}"


def _flatten(data: dict, path: str, lines: dict) -> list[tuple[str, object, str]]:
    """{section: {name: value}} -> [(dotted key, value, where)]; a dotted key at the top level is kept."""
    out = []
    for k, v in data.items():
        k = str(k)
        where = _at(path, lines.get(k))
        if "." in k:
            out.append((k, v, where))  # `algo.gamma: 0.9` at the top level
        elif k in sections():
            if v is None:
                continue  # an empty section (every key commented out) keeps the defaults
            if not isinstance(v, dict):
                raise ConfigError(f"config section '{k}'{where} must be a mapping of {k}.* keys, got {v!r:.80}")
            out += [(f"{k}.{name}", value, _at(path, lines.get(f"{k}.{name}"))) for name, value in v.items()]
        elif isinstance(v, dict):
            close = difflib.get_close_matches(k, sections(), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"unknown config section '{k}'{where}; {hint}sections: {', '.join(sections())}")
        else:
            out.append((k, v, where))  # a stray key such as `lr: 1e-5`: _set names the close keys
    return out


def read_yaml(path: str) -> tuple[dict, dict]:
    """A config file -> ({section: {name: value}}, {key or dotted key: line number})."""
    if not os.path.exists(path):
        folder = os.path.dirname(path) or "."
        try:
            names = sorted(f for f in os.listdir(folder) if f.endswith((".yaml", ".yml")))
        except OSError:  # no such folder, or one that cannot be listed: no suggestion
            names = []
        near = difflib.get_close_matches(os.path.basename(path), names, n=1)
        raise ConfigError(f"config file not found: {path}" + (f" (closest: {os.path.join(folder, near[0])})"
                                                              if near else ""))
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    from r1.bounded import read_text

    try:  # a FIFO or a device is refused, not waited on or read forever; 1 MiB: configs/ holds 2 KB files
        text = read_text(path, 1 << 20, "config file")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    except ValueError as e:  # not a regular file, too large, not UTF-8: the message names the file
        raise ConfigError(str(e)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark else path
        problem = " ".join((getattr(e, "problem", None) or str(e).splitlines()[0]).split())
        context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and start and mark and start.line != mark.line:  # where the broken construct began
            problem += f" ({context} at line {start.line + 1})"
        raise ConfigError(f"bad YAML in {at}: {problem}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (run:, model:, ...), "
                          f"got a {type(data).__name__}")
    return data, _key_lines(root, path)


def _key_lines(root, path: str) -> dict:
    """Line of every section and key; a key given twice is an error (PyYAML keeps the last silently)."""
    lines = {}

    def walk(node, prefix):
        seen = {}
        for key_node, value_node in node.value:
            key, line = prefix + str(key_node.value), key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"duplicate config key '{key}' in {path}:{line} (first at line {seen[key]})")
            seen[key] = lines[key] = line
            if not prefix and isinstance(value_node, yaml.MappingNode):
                walk(value_node, key + ".")

    walk(root, "")
    return lines


def _parse_override(text: str) -> tuple[str, str]:
    key, eq, raw = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"bad override '{text}': expected key=value, e.g. train.steps=4")
    return key.strip(), raw


def load_config(path: str | list | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file(s), later files winning (a base config, then an ablation) <- key=value overrides,
    each checked, then validate()."""
    cfg, origin = Config(), {}
    paths = [path] if isinstance(path, str) else list(path or [])
    if paths and os.path.basename(os.path.dirname(os.path.abspath(paths[0]))) == "ablations":
        raise ConfigError(f"{paths[0]} is an ablation: it switches a few keys of a recipe and is meant as the later "
                          f"file, e.g. --config configs/gsm8k_tool.yaml --config {paths[0]}")
    for path in paths:
        data, lines = read_yaml(path)
        for key, value, where in _flatten(data, path, lines):
            _set(cfg, key, value, where)
            origin[key] = where
    for text in overrides:
        key, raw = _parse_override(text)
        _set(cfg, key, raw, COMMAND_LINE, text=True)
        origin[key] = COMMAND_LINE
    validate(cfg, origin)
    check_environment()
    return cfg


# The environment switches of the GPU paths (README): unset, 0 or 1; R1_PROFILE: an iteration number;
# R1_SWITCH_US: microseconds (r1/overlap.py).
SWITCHES = ("R1_COMPILE", "R1_FUSE", "R1_CHUNK_GRAPHS", "R1_OVERLAP", "R1_MIX", "R1_FUSE_TRAIN")


def check_environment():
    """A mistyped switch (R1_FUSE=false, R1_PROFILE=last) is a one-line error before anything runs, not a
    traceback at import or in the middle of a run."""
    for name in SWITCHES:
        v = os.environ.get(name, "")
        if v not in ("", "0", "1"):
            raise ConfigError(f"environment variable {name}={v!r}: use 0 (off) or 1 (on), or leave it unset")
    v = os.environ.get("R1_PROFILE", "")
    if v and not (v.isdigit() and int(v) >= 1):
        raise ConfigError(f"environment variable R1_PROFILE={v!r}: give the iteration to profile, 1 or more")
    v = os.environ.get("R1_SWITCH_US", "")
    if v and not (v.isdigit() and int(v) >= 1):
        raise ConfigError(f"environment variable R1_SWITCH_US={v!r}: give the interpreter's thread switch "
                          f"interval in microseconds, 1 or more (Python's default is 5000)")


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
    """env.rewards names terms of r1/envs/rewards.REWARDS (read after the task's module registered its own);
    a task-only term (`general=False`) set for a task that does not list it in Task.rewards is refused."""
    from r1.tasks.registry import TASKS

    weights = {}
    for term, weight in cfg.env.rewards.items():
        key = f"env.rewards.{term}"
        if term not in REWARDS:
            close = difflib.get_close_matches(term, list(REWARDS), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"config key {name('env.rewards')}: unknown reward {term!r}; {hint}"
                              f"known: {', '.join(REWARDS)}")
        if REWARDS[term].key:
            raise ConfigError(f"config key {name('env.rewards')}: set reward {term!r} with its own key "
                              f"{REWARDS[term].key}, not in env.rewards")
        weights[key] = weight
    for term, r in REWARDS.items():
        key = r.key or f"env.rewards.{term}"
        weight = get(cfg, r.key) if r.key else weights.get(key, 0.0)
        if weight and not r.general and term not in task.rewards:
            payers = [t.name for t in TASKS.values() if term in t.rewards]
            shown = r.key or f"env.rewards ({term})"
            by = r.paid_by or (f"the {' / '.join(payers)} task" if payers else "tasks listing it in Task.rewards")
            raise ConfigError(f"config key {name(shown)} is paid by {by} only; "
                              f"data.task={cfg.data.task} would ignore it (set it to 0)")


def _validate_lora(cfg: Config, name, fail):
    """The model.lora_* rules: known target names; keys that LoRA's one shared base cannot honour."""
    m = cfg.model
    unknown = check_targets(m.lora_targets)
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


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save(cfg: Config, path: str):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(dump(cfg))
    os.replace(tmp, path)


def describe(section: str = "") -> str:
    """Every key (or one section's) with its default, written as in a YAML file, and its docstring (--keys)."""
    names = [s.name for s in dataclasses.fields(Config)]
    if section and section not in names:
        close = difflib.get_close_matches(section, names, n=1, cutoff=0.5)
        raise ConfigError(f"--keys {section}: no such section (sections: {', '.join(names)})"
                          + (f"; did you mean {close[0]}?" if close else ""))
    lines = []
    for s in dataclasses.fields(Config):
        if section and s.name != section:
            continue
        docs = _field_docs(s.type)
        lines.append(f"{s.name}:")
        for f in dataclasses.fields(s.type):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            key = f"{s.name}.{f.name}"
            shown = "auto" if key in AUTO_ZERO and default == 0 else _yaml_value(default)
            lines.append(f"  {key} = {shown}  # {docs.get(f.name, '')}")
    return "\n".join(lines)


def _yaml_value(v) -> str:
    """A default as a YAML file or an override writes it: null, true, 1.0e-06, [a, b]."""
    text = yaml.safe_dump(v, default_flow_style=True, width=1000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text


def plural(n: int, word: str) -> str:
    """'1 step', '2 steps'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def header(cfg: Config, files) -> str:
    """The few lines a run starts with (the whole resolved config is saved as run.dir/config.yaml)."""
    t = cfg.train
    if t.stage == "sft":
        steps = f"SFT {plural(t.steps, 'step')} x {plural(t.sft_batch, 'chat')}"
    else:
        steps = (f"SFT {plural(t.sft_steps, 'step')} x {plural(t.sft_batch, 'chat')}, then " if t.sft_steps else "") + \
                f"RL {plural(t.steps, 'iteration')} x {plural(cfg.rollout.prompts * cfg.rollout.n, 'episode')}"
    algo = "sft" if t.stage == "sft" else f"{cfg.algo.advantage} ({cfg.algo.policy_loss})"
    return (f"config: {', '.join(files) if files else '(defaults)'}; run.dir {cfg.run.dir} "
            f"(the resolved config goes there as config.yaml)\n"
            f"task {cfg.data.task}; model {cfg.model.path}; algorithm {algo}; {steps}")


def _field_docs(cls) -> dict:
    """Attribute docstrings (a string literal right after a field) of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = b.value.value
    return docs
