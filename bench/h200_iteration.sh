#!/usr/bin/env bash
# Issue 31 on one H200: iteration time of PPO (step GAE) and GRPO on the GSM8K-tool recipe, train.overlap 0
# against 1 (the next rollout beside this iteration's score and update; decoupled PPO, tis_cap 2) and 2 (the same
# with the rollout in a process of its own), PPO overlapped
# again with the interpreter's thread switch interval at 0.2 ms (R1_SWITCH_US: is the interpreter lock what slows
# the two threads side by side?), then the
# micro_tokens lead of docs/decisions.md ("Micro-batch size"): PPO at train.micro_tokens=4096 with run.memory_fraction=0.15 (the lanes')
# and with the whole GPU, to tell small micro-batches from the memory cap (alloc_retries counts the
# allocator's free-and-retry), then PPO synchronous and with the process under kernels.fuse_train=true (ppo-o0-ft,
# ppo-o2-ft: does a 135M step's 1.03-1.145x reach the iteration?), then PPO and GRPO synchronous and PPO with the
# process under train.share_prefix=true (ppo-o0-sp, grpo-o0-sp, ppo-o2-sp: each group's prompt packed once per
# micro-batch, r1/packing.py), then with sharing and train.precision=bf16 (a bf16 copy of the weights computes, no
# autocast: r1/precision.py): ppo-o0-sp-bf, grpo-o0-sp-bf, ppo-o2-sp-bf, and GRPO with the process, sharing, with and
# without the copy (grpo-o2-sp, grpo-o2-sp-bf), then one mini-batch an iteration (algo.minibatches=1), where scoring
# leaves the policy's old logprobs to the update's own forward (train.score_policy=auto, r1/learner.py): GRPO
# synchronous with and without that (grpo-o0-sp-bf-mb1, grpo-o0-sp-bf-mb1-scored), GRPO and PPO with the process
# (grpo-o2-sp-bf-mb1, ppo-o2-sp-bf-mb1). Runs one after another, the GPU to itself; phases are resumable.
#   bench/h200_iteration.sh MODEL RESULTS_DIR   (MODEL: an SFT hf/ folder or the GGUF; results to
#                                                 bench/results/iteration_h200.json unless SAVE is set)
#   env: STEPS (default 12), EXTRA (overrides for every run: CPU dry runs), SAVE ('' = do not save),
#        PROFILE=N (iteration N of every run under R1_PROFILE: how busy the GPU is in each phase, with and without
#        overlap; the medians of iterations 2..STEPS barely move for one slower iteration. Under overlap each
#        phase's busy time includes the rollout thread's kernels (not the o2 lanes': their rollout is another
#        process, which the profiler does not see), and the report, written while the next
#        rollout plays, slows iteration N+1 too)
#        SFT_STEPS=N (MODEL is the GGUF: first the SFT these runs start from, N steps x 32 chats at lr 5e-5 into
#        RESULTS_DIR/sft, as the fifteenth session did by hand with 467; then MODEL is its hf/)
#        ONLY="ppo-o0 ppo-o2" (run these lanes only; a name not among the lanes is refused before anything runs),
#        SKIP="..." (the lanes not to run: phases.sh)
#   (in the background, then calls of `bench/h200_wait.sh RESULTS_DIR . $OUT`; with an SFT first, about 700 s)
set -u
[ $# -eq 2 ] || { echo "usage: bench/h200_iteration.sh MODEL RESULTS_DIR (see the comment at its top)"; exit 2; }
LANES="ppo-o0 ppo-o1 grpo-o0 grpo-o1 ppo-o2 grpo-o2 ppo-o1-sw200 ppo-mt4096-frac015 ppo-mt4096 ppo-o0-ft ppo-o2-ft ppo-o0-sp grpo-o0-sp ppo-o2-sp ppo-o0-sp-bf grpo-o0-sp-bf ppo-o2-sp-bf grpo-o2-sp grpo-o2-sp-bf grpo-o0-sp-bf-mb1 grpo-o0-sp-bf-mb1-scored grpo-o2-sp-bf-mb1 ppo-o2-sp-bf-mb1"
if [ -n "${ONLY:-}" ]; then
  for n in $ONLY; do case " $LANES " in *" $n "*) ;; *) echo "bench/h200_iteration.sh: ONLY names $n, not a lane ($LANES)"; exit 2 ;; esac; done
  SKIP="${SKIP:-}"; for n in $LANES; do case " $ONLY " in *" $n "*) ;; *) SKIP="$SKIP $n" ;; esac; done; export SKIP
fi
M=$1; R=$2; mkdir -p "$R"
STEPS=${STEPS:-12}; X=${EXTRA:-}; SAVE=${SAVE-bench/results/iteration_h200.json}
C="--config configs/gsm8k_tool.yaml log.progress=false log.trajectories=false train.sft_steps=0 eval.every=0"
C="$C train.checkpoint_every=100000 train.steps=$STEPS"
. "$(dirname "$0")/phases.sh"  # log, phase
export R1_PROFILE=${PROFILE:-${R1_PROFILE:-}}
OV="train.overlap=1 algo.policy_loss=decoupled_ppo algo.tis_cap=2"
OV2="train.overlap=2 algo.policy_loss=decoupled_ppo algo.tis_cap=2"  # the rollout in a process (r1/rollout_process.py)
run() {  # name overrides...
  local name=$1; shift
  phase "$name" python3 train.py $C model.path="$M" run.dir="$R/$name" "$@" $X
}
log "begin: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")')"
if [ -n "${SFT_STEPS:-}" ]; then
  phase sft python3 train.py --config configs/gsm8k_tool.yaml model.path="$M" run.dir="$R/sft" train.stage=sft \
    train.sft_steps=0 train.steps="$SFT_STEPS" train.lr=5e-5 train.checkpoint_every=100000 log.progress=false $X || exit 1
  M="$R/sft/hf"
fi
run ppo-o0
run ppo-o1 $OV
run grpo-o0 algo.advantage=grpo
run grpo-o1 algo.advantage=grpo $OV
run ppo-o2 $OV2
run grpo-o2 algo.advantage=grpo $OV2
R1_SWITCH_US=200 run ppo-o1-sw200 $OV  # the interpreter's switch interval 5 ms -> 0.2 ms (r1/overlap.py)
run ppo-mt4096-frac015 train.micro_tokens=4096 run.memory_fraction=0.15
run ppo-mt4096 train.micro_tokens=4096
run ppo-o0-ft kernels.fuse_train=true  # the trainer's q/k/v and gate/up as one matmul each (r1/model.py concat_linear)
run ppo-o2-ft kernels.fuse_train=true $OV2
run ppo-o0-sp train.share_prefix=true  # a group's prompt once per micro-batch: fewer tokens to score and update
run grpo-o0-sp algo.advantage=grpo train.share_prefix=true
run ppo-o2-sp train.share_prefix=true $OV2
SP="train.share_prefix=true"; BF="train.precision=bf16"  # a bf16 copy computes (r1/precision.py)
run ppo-o0-sp-bf $SP $BF
run grpo-o0-sp-bf algo.advantage=grpo $SP $BF
run ppo-o2-sp-bf $SP $BF $OV2
run grpo-o2-sp algo.advantage=grpo $SP $OV2
run grpo-o2-sp-bf algo.advantage=grpo $SP $BF $OV2
MB1="algo.minibatches=1"  # one optimizer step an iteration: no policy forward in scoring (train.score_policy=auto)
run grpo-o0-sp-bf-mb1 algo.advantage=grpo $SP $BF $MB1
run grpo-o0-sp-bf-mb1-scored algo.advantage=grpo $SP $BF $MB1 train.score_policy=always
run grpo-o2-sp-bf-mb1 algo.advantage=grpo $SP $BF $OV2 $MB1
run ppo-o2-sp-bf-mb1 $SP $BF $OV2 $MB1
runs=""; for n in $LANES; do
  [ -e "$R/$n.done" ] && runs="$runs $R/$n"; done
python3 bench/iteration_result.py --runs $runs ${SAVE:+--save "$SAVE"} | tee "$R/iteration.jsonl"
finish; exit $?
