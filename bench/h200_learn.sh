#!/usr/bin/env bash
# The learning proof on one H200 (issue 8), in one device call, each phase time-boxed:
# base eval -> SFT on expert calculator trajectories -> eval -> RL (step-level PPO) -> eval,
# and RL (GRPO) from the same SFT checkpoint -> eval. Results land in $OUT (or ./runs/h200).
#   bench/h200_learn.sh MODEL.gguf GSM8K_DIR EVAL_LIMIT SFT_STEPS RL_ITERS
set -u
MODEL=$1; DATA=$2; LIMIT=${3:-300}; SFT=${4:-120}; RL=${5:-6}
O=${OUT:-runs/h200}; R=runs/h200; mkdir -p $O $R
C="--config configs/gsm8k_tool.yaml data.path=$DATA"
ev() { timeout ${3:-150} python3 eval.py $C model.path=$1 eval.limit=$LIMIT eval.out=$R/eval-$2 2>$O/eval-$2.err | tail -1 | tee $O/eval-$2.json; }
ev $MODEL base
timeout 200 python3 train.py $C model.path=$MODEL train.stage=sft run.dir=$R/sft train.steps=$SFT train.lr=5e-5 \
  train.warmup=10 train.schedule=cosine train.checkpoint_every=1000 data.train_size=4000 log.progress=false > $O/sft.log 2>&1; tail -3 $O/sft.log
ev $R/sft/hf sft
for A in step_gae grpo; do
  timeout 170 python3 train.py $C model.path=$R/sft/hf run.dir=$R/rl-$A algo.advantage=$A train.steps=$RL \
    rollout.prompts=64 rollout.n=4 train.lr=2e-6 eval.every=0 log.progress=false > $O/rl-$A.log 2>&1; tail -3 $O/rl-$A.log
  cp $R/rl-$A/metrics.jsonl $O/metrics-rl-$A.jsonl 2>/dev/null
  ev $R/rl-$A/hf rl-$A
done
cp $R/sft/metrics.jsonl $O/metrics-sft.jsonl 2>/dev/null
ls $O
