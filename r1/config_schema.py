"""The config's keys: one dataclass per section, each field with its default and a docstring.

The docstrings are the documentation (`python train.py --keys` prints them, r1/config.py describe); the tables
below the dataclasses say what each key may hold: CHOICES (read live from the registries, so a registered name
is a valid choice), BOUNDS (inclusive ranges that reject only values no run can mean, so ablations stay free),
AUTO (int keys written `auto`, 0 inside, where the memory plan picks the value) and REMOVED (old names, refused
with the key that replaced them). Reading files is r1/config_load.py, the rules across keys
r1/config_check.py. Stdlib only: the algorithm tables (which hold torch functions) load when a choice key
is first read, so an unknown key is reported before torch is imported.
"""
import ast
import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

from r1.envs.context import CONTEXT_POLICIES
from r1.families import FAMILIES
from r1.tool_formats import FORMATS

# The projections LoRA can adapt (r1/lora.py reads them from here: a config default that needs no torch).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""




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


@dataclass
class Model:
    path: str = "smollm2-135m-instruct"
    """Policy weights: an HF directory, a .gguf file, the short name smollm2-135m-instruct, or `tiny` (random tiny model)."""
    tokenizer: str | None = None
    """Tokenizer source (HF directory, .gguf, short name); defaults to model.path."""
    arch: str = "llama"
    """For model.path=tiny: a model family of r1/families (its registry lists them)."""
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
    """The projections that get adapters, in every block (any of r1/lora.py TARGETS)."""
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
    """A registered task (r1/tasks/builtin.py; --keys data lists them) or your own as package.module:attr
    (docs/tasks.md)."""
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
    """What a step's prompt keeps when the episode outgrows env.max_context (r1/envs/context.CONTEXT_POLICIES); an
    env that overrides Env.summarize writes a summary first, under any policy."""
    max_context: int = 2048
    """Token budget of a step's prompt + response; reaching it ends the episode (append) or drops old context (window, truncate; the episode ends only when the first prompt alone does not fit)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """The rubric: {term: weight} of reward terms (r1/envs/rewards.REWARDS, and those tasks register) added to
    each step's reward, e.g. `env.rewards={malformed: -0.1, format: 0.05}` or one term, the others kept:
    `env.rewards.format=0.05`. Shaping terms can be gamed: docs/tasks.md. Empty = none."""
    tools: list[str] | None = None
    """Tools the env offers: registered names or package.module:attr; null = the task's own tools."""
    tool_format: str = "auto"
    """How the model writes tool calls (r1/tool_formats.py): auto = from its chat template, or a registered format."""


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
    """Concurrent rows in the generator's KV cache (continuous batching); auto = as many as fit in memory
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
    dtype: str = "auto"
    """The generator's (and the hf/ export's) dtype: auto = bfloat16 on CUDA, float32 on the CPU. The update's
    arithmetic is train.precision's."""
    share_prompt: bool = False
    """Identical prompts admitted together (a group's samples) are prefilled once: one row's forward, its keys
    and values copied into the others' slots, its last hidden state their first token's logits (each row samples
    with its own noise). false = every row prefills its own prompt (the reference)."""
    sync_every: int = 0
    """Decode steps per chunk of the agent loop, between two collections on the host (stop checks, environment
    steps); auto = 4 on CUDA, where the next chunk is queued while the host works (kernels.launch_ahead),
    16 on CUDA without it, 1 on the CPU."""


@dataclass
class Algo:
    advantage: str = "step_gae"
    """The advantage estimator (r1/algos/estimators.ESTIMATORS; docs/algorithms.md)."""
    policy_loss: str = "ppo"
    """The policy loss (r1/algos/policy_losses.POLICY_LOSSES; docs/algorithms.md)."""
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
    """Step rewards divided by their running std (std), also minus their running mean (mean_std), or not (off);
    running moments over every reward seen, on all ranks (r1/algos/reward_norm.py MODES)."""
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
    """A name in r1/algos/losses.KL_ESTIMATORS: k1, k2, k3 (exact, unbiased) or k3_clamped (min(k3, 10), biased low)."""
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
    """Tokens per packed micro-batch (gradient accumulation within a mini-batch); auto = the largest
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
    epoch of one mini-batch, algo.ppo_epochs=1 and algo.minibatches=1, no reference model, no model.lora_dropout,
    the policy trained this iteration): the update's forward runs on the weights scoring would (ratio exactly 1); the
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
class Kernels:
    """Which implementation runs each op. The defaults are the fastest measured paths, each picked where it
    applies (most on CUDA only; the CPU runs the reference ops); the other values are for comparisons."""
    compile: str = "auto"
    """The elementwise ops (RMSNorm, RoPE, SwiGLU) fused by torch.compile: auto = for CUDA tensors, true = on
    every device, false = eager (r1/model.py compile_ops)."""
    fuse: bool = True
    """A generator's model without gradients on CUDA runs q/k/v and gate/up as one matmul each
    (r1/model.py fuse_projections)."""
    fuse_train: bool = False
    """The trained model's q/k/v and gate/up as one matmul each, through concat_linear (r1/model.py); off until
    measured faster."""
    chunk_graphs: bool = True
    """Prefill chunks replayed as CUDA graphs (r1/chunk_graphs.py), where the attention backend allows."""
    launch_ahead: bool = True
    """CUDA: the generator queues the next decode chunk while the host collects the last one and steps the
    environments (r1/generate.py overlap; unrelated to train.overlap)."""
    mixed_steps: bool = True
    """CUDA: observations appended to live rows are prefilled inside the next decode step, one forward for both
    (r1/generate.py)."""
    sample: str = "auto"
    """Token sampling: auto = the Triton kernel where it applies (CUDA, top_k 0, top_p 1), torch = the torch
    reference everywhere (r1/generate.py sample)."""
    attention: str = "auto"
    """The attention backend of every call, training included: auto = picked per call (kernels/attention.py);
    another name forces it (fa4 is an error where it cannot run)."""
    decode: str = "auto"
    """The decode step's attention: auto = the picked backend, sdpa = gather + SDPA."""
    chunks: str = "auto"
    """Prefill chunks' attention over the cache: auto = the picked backend, sdpa = one padded SDPA call,
    loop = SDPA row by row (the reference)."""
    fa4: bool = True
    """Pick flash-attn-4 where it is installed and takes the tensors."""
    fa4_cache: bool = False
    """A picked fa4 reads the KV cache too (decode, chunks); false = the Triton kernels do."""
    paged: bool = False
    """torch's varlen_attn reads the KV cache through a block table, where this torch has one (untested on a
    GPU)."""


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
    kernels: Kernels = field(default_factory=Kernels)


def _algorithm_table(key: str):
    """The registry whose names `key` takes, imported when first read (it imports torch)."""
    if key == "algo.advantage":
        from r1.algos.estimators import ESTIMATORS
        return ESTIMATORS
    if key == "algo.policy_loss":
        from r1.algos.policy_losses import POLICY_LOSSES
        return POLICY_LOSSES
    if key == "algo.normalize_reward":
        from r1.algos.reward_norm import MODES
        return MODES
    from r1.algos.losses import KL_ESTIMATORS
    return KL_ESTIMATORS


class Choices(Mapping):
    """{key: the names it takes}: lists, and the algorithm tables themselves, read live (an entry added to a
    table is a valid choice) and imported on first read."""

    TABLES = ("algo.advantage", "algo.policy_loss", "algo.normalize_reward", "algo.kl_estimator")

    def __init__(self, fixed: dict):
        self.fixed = fixed

    def __getitem__(self, key):
        if key in self.TABLES:
            return _algorithm_table(key)
        names = self.fixed[key]
        return names() if callable(names) else names  # a registry read when asked (the families, the formats)

    def __contains__(self, key):  # without reading a table
        return key in self.fixed or key in self.TABLES

    def __iter__(self):
        return iter([*self.fixed, *self.TABLES])

    def __len__(self):
        return len(self.fixed) + len(self.TABLES)


CHOICES = Choices({
    "run.device": ["auto", "cpu", "cuda"], "rollout.dtype": ["auto", "float32", "bfloat16"],
    "model.arch": lambda: FAMILIES, "env.tool_format": lambda: ["auto", *FORMATS],
    "model.lora_generator": ["merged", "adapters"],
    "env.context_policy": CONTEXT_POLICIES,
    "algo.reward_level": ["trajectory", "step"], "algo.ratio_level": ["token", "step"],
    "algo.loss_agg": ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "step_mean"],
    "train.stage": ["rl", "sft"], "train.schedule": ["constant", "cosine"],
    "train.activation_checkpointing": ["auto", "true", "false"],
    "train.precision": ["autocast", "bf16"],
    "train.score_policy": ["auto", "always", "sampler"],
    "kernels.compile": ["auto", "true", "false"], "kernels.sample": ["auto", "torch"],
    "kernels.attention": ["auto", "fa4", "flash_attn", "torch_flash", "sdpa", "triton", "math"],
    "kernels.decode": ["auto", "sdpa"], "kernels.chunks": ["auto", "sdpa", "loop"],
})
# Names a reader brings from elsewhere for a choice key, and what to write instead.
ALIASES = {"algo.advantage": {"ppo": "for PPO use step_gae: step-level GAE with a critic; token_gae is the "
                                     "token-level one"}}

# Integer keys whose derived value is written `auto` (in files, overrides and the saved config.yaml) and held as
# 0 inside (the memory plan or the device then picks it); a written 0 is refused, so each has one spelling.
AUTO = ("rollout.slots", "train.micro_tokens", "rollout.sync_every")

# Keys that were removed or renamed -> the key that replaced them (an entry of a mapping key: env.rewards.<term>).
REMOVED = {"env.malformed_penalty": "env.rewards.malformed", "env.format_reward": "env.rewards.format",
           "env.tool_success_reward": "env.rewards.tool_success", "env.command_reward": "env.rewards.command",
           "run.dtype": "rollout.dtype"}


# Inclusive (low, high) bounds, None = open. Strict bounds and rules over two keys are in validate().
BOUNDS = {
    "model.tiny_layers": (1, None), "model.tiny_hidden": (1, None), "model.lora_rank": (0, None),
    "model.critic_layers": (0, None),
    "model.lora_dropout": (0.0, 0.99),
    "data.level": (1, None), "data.train_size": (0, None), "data.test_size": (0, None),
    "data.val_size": (0, None), "data.sft_level": (0, None),
    "env.max_steps": (1, None), "env.max_context": (1, None),
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
    "train.checkpoint_every": (1, None), "train.time_limit": (0.0, None),
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


COMMAND_LINE = " (command line)"  # where a key was set, for the messages: after "config key 'x'"


def all_keys() -> list[str]:
    return [f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(s.type)]


def sections() -> list[str]:
    return [s.name for s in dataclasses.fields(Config)]


def get(cfg: Config, key: str):
    """The value of a dotted key, e.g. get(cfg, "algo.clip_high")."""
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)



def field_docs(cls) -> dict:
    """Attribute docstrings (a string literal right after a field) of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = b.value.value
    return docs
