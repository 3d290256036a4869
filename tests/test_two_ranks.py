"""World 2 (torchrun, gloo, FSDP2) equals world 1 on the same global batch, for every estimator and
aggregation mode, with the batch statistics on: whitening, REINFORCE++'s batch normalisation, reward
normalisation.

tests/two_ranks_worker.py rewrites rewards by group parity, so at world 2 one rank's groups all succeed
and the other's do not: a statistic taken per rank instead of over the global batch changes the
advantages (REINFORCE++ on one rank's all-equal scores gives 0 everywhere). All configs run in one
torchrun launch and one world-1 process, side by side.
"""
import json
import os
import subprocess
import sys

import pytest

from test_trainer import free_port, read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "two_ranks_worker.py")

RUNS = {
    "reinforce_pp": ["algo.advantage=reinforce_pp"],
    "reinforce_pp_baseline_seq_sum": ["algo.advantage=reinforce_pp_baseline", "algo.loss_agg=seq_mean_token_sum"],
    "grpo_whiten_seq_mean": ["algo.advantage=grpo", "algo.whiten=true", "algo.loss_agg=seq_mean_token_mean"],
    "rloo_whiten_step_mean": ["algo.advantage=rloo", "algo.whiten=true", "algo.loss_agg=step_mean"],
    "grpo_step_rewards_gspo": ["algo.advantage=grpo", "algo.reward_level=step", "algo.whiten=true",
                               "algo.ratio_level=step", "algo.loss_agg=seq_mean_token_mean"],
    "step_gae_whiten": ["algo.advantage=step_gae", "algo.whiten=true", "algo.loss_agg=seq_mean_token_sum"],
    "token_gae_whiten": ["algo.advantage=token_gae", "algo.whiten=true", "algo.loss_agg=token_mean"],
    "reinforce_pp_reward_norm_cispo": ["algo.advantage=reinforce_pp", "algo.normalize_reward=mean_std",
                                       "algo.policy_loss=cispo"],
    "step_gae_vf_epochs": ["algo.advantage=step_gae", "algo.normalize_reward=std", "algo.vf_epochs=2",
                           "algo.whiten=true"],
    # a group's prompt packed once (train.share_prefix): micro-batches big enough for a group to meet
    "step_gae_share_prefix": ["algo.advantage=step_gae", "train.share_prefix=true", "train.micro_tokens=100000"],
    # the sampler's logprobs as the old ones (train.score_policy=sampler): no policy scoring, the gap from the update
    "step_gae_score_sampler": ["algo.advantage=step_gae", "train.score_policy=sampler"],
}
KEYS = ("pg_loss", "grad_norm", "entropy", "reward_mean")
CRITIC_KEYS = ("value_loss", "critic_grad_norm")


def run_both(tmp_path, tok_dir, runs):
    base = [f"model.tokenizer={tok_dir}", "rollout.prompts=4", "rollout.n=2", "rollout.max_new_tokens=8",
            "data.train_size=16", "train.steps=1", "algo.minibatches=1", "algo.kl_coef=0", "train.micro_tokens=1",
            "train.grad_clip=0", "log.tensorboard=false", "log.trajectories=false"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    procs = {}
    for world in (1, 2):
        spec = tmp_path / f"spec{world}.json"
        spec.write_text(json.dumps({"out": str(tmp_path / f"w{world}"), "base": base, "runs": runs}))
        launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   f"--master_port={free_port()}"] if world == 2 else [sys.executable])
        procs[world] = subprocess.Popen(launch + [WORKER, str(spec)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
    for world, p in procs.items():
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, f"world {world}:\n{out[-3000:]}"
    return {name: (read_metrics(tmp_path / "w1" / name), read_metrics(tmp_path / "w2" / name)) for name in runs}


def test_world2_equals_world1_with_batch_statistics(tmp_path, tok_dir):
    results = run_both(tmp_path, tok_dir, RUNS)
    for name, (one, two) in results.items():
        assert len(one) == len(two) == 1, name
        a, b = one[0], two[0]
        assert a["n"] == b["n"] == 8 and a["grad_norm"] > 0, name
        for k in KEYS + (CRITIC_KEYS if "gae" in name else ()):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (name, k)
        # one mini-batch, no reference: scoring left the old logprobs to the update (train.score_policy=auto,
        # or sampler), which logged the sampler gap at both world sizes (its max through an all-reduce)
        assert all(0 <= r["logprob_gap_mean"] <= r["logprob_gap_max"] for r in (a, b)), name
        if "share_prefix" in name:  # the prompts were shared, at both world sizes
            assert a["shared_prefix_frac"] > 0.2 and b["shared_prefix_frac"] > 0.2, (name, a, b)
