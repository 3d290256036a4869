#!/usr/bin/env bash
# Tuning lanes for the GSM8K-tool recipe (issue 29), side by side on ONE GPU, chosen on the validation split.
#
# Every run carves data.val_size=500 problems out of GSM8K train (never trained on) and evaluates on them
# (eval.split=val); the test split is not read here. Lanes share the GPU, each planning for its own share
# of memory (run.memory_fraction), so a 135M model's runs fill an H200 that one run leaves mostly idle.
#   SFT grid (2 x 2): lr {5e-5, 1.5e-4} x epochs {2, 4} of the 6,973 remaining train problems at 32 chats,
#     the warm-up schedule of train.sft_steps (r1/sft.py warmup_config: short warm-up, cosine to 10%);
#     each evaluated greedy on all 500 validation problems.
#   RL lanes: as soon as the recipe's own SFT (lr 5e-5, 2 epochs) is done and evaluated, RL variants start
#     from it for RL_TIME seconds each (in-run validation curve every 10 iterations, then all 500).
# Phases are resumable (bench/phases.sh): a restarted job skips what is done.
#   bench/h200_tune.sh MODEL.gguf RESULTS_DIR          env: RL_TIME (default 780), SFT_EP2/SFT_EP4 (steps)
#   bench/h200_collect.sh RESULTS_DIR . $OUT            # in later calls: logs, metrics, evals
set -u
M=$1; R=$2; mkdir -p "$R"
RL_TIME=${RL_TIME:-780}; EL=${EVAL_LIMIT:-0}; X=${EXTRA:-}  # EXTRA: overrides for every run (CPU dry runs)
EP2=${SFT_EP2:-436}; EP4=${SFT_EP4:-872}   # 6,973 rows / 32 = 218 steps an epoch
C="--config configs/gsm8k_tool.yaml data.val_size=500 eval.split=val log.progress=false"
. "$(dirname "$0")/phases.sh"  # log, phase

ev() {  # name model frac: greedy on all 500 validation problems
  phase "eval-$1" python3 eval.py $C model.path=$2 eval.limit=$EL run.memory_fraction=$3 $X eval.out="$R/eval-$1" \
    && tail -1 "$R/eval-$1.log" > "$R/eval-$1.json"
}
sft() {  # name steps lr
  phase "$1" python3 train.py $C model.path="$M" train.stage=sft train.sft_steps=0 run.dir="$R/$1" train.steps=$2 train.lr=$3 \
    train.warmup=20 train.schedule=cosine train.checkpoint_every=100000 run.memory_fraction=0.07 $X \
    && ev "$1" "$R/$1/hf" 0.08
}
rl() {  # name overrides...: from the recipe's SFT, RL_TIME seconds
  local name=$1; shift
  phase "$name" python3 train.py $C model.path="$R/sft-lr5e-5-ep2/hf" run.dir="$R/$name" train.sft_steps=0 \
    train.steps=100000 train.time_limit=$RL_TIME train.checkpoint_every=100000 eval.every=10 eval.limit=$EL \
    run.memory_fraction=0.15 train.micro_tokens=4096 "$@" $X && ev "$name" "$R/$name/hf" 0.08
}

log "begin: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")')"
sft sft-lr1.5e-4-ep2 $EP2 1.5e-4 &
sft sft-lr5e-5-ep4 $EP4 5e-5 &
sft sft-lr1.5e-4-ep4 $EP4 1.5e-4 &
( sft sft-lr5e-5-ep2 $EP2 5e-5 || exit 1
  rl rl-ppo-lr1e-5 train.lr=1e-5 &
  rl rl-ppo-lr2e-5 train.lr=2e-5 train.critic_lr=2e-5 &
  rl rl-grpo-lr2e-5 algo.advantage=grpo train.lr=2e-5 algo.drop_uniform_groups=true &
  rl rl-ppo-lr1e-5-p128 train.lr=1e-5 rollout.prompts=128 &
  wait ) &
wait
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$R/progress.txt" 2>/dev/null
finish; exit $?
