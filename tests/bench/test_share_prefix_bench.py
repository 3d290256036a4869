"""bench/share_prefix_step.py on the CPU (a tiny model: the harness, not a measurement): both packings score the
same tokens, the shared one computes each group's prompt once, and every lane is timed, the peer's included."""
from bench import share_prefix_step


def test_the_harness_packs_each_prompt_once_and_times_every_lane():
    r = share_prefix_step.main(["--cpu", "--prompts", "3", "--n", "4", "--prompt-len", "40", "--own-mean", "20",
                                "--micro-tokens", "100000", "--reps", "1", "--peer-micro", "4"])
    assert r["episodes"] == 12 and r["micro_batches_whole"] == r["micro_batches_shared"] == 1
    assert r["tokens_whole"] - r["tokens_shared"] == 3 * (4 - 1) * 40  # three of four copies of each prompt
    assert r["scored_tokens"] < r["tokens_shared"]
    for k in ("ours_whole_score_s", "ours_whole_step_s", "ours_shared_score_s", "ours_shared_step_s",
              "peer_score_s", "peer_step_s"):
        assert r[k] > 0, k
    assert r["share_speedup_step"] > 0 and r["vs_peer_step"] > 0


def test_episodes_are_groups_of_one_prompt():
    trajs = share_prefix_step.episodes(2, 3, 10, 8.0, 512)
    assert [t.group for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert trajs[0].steps[0].prompt_ids == trajs[2].steps[0].prompt_ids != trajs[3].steps[0].prompt_ids
    assert all(len(t.steps[0].prompt_ids) == 10 and len(t.steps[0].response_ids) >= 16 for t in trajs)
