"""train.overlap: 2 (r1/rollout_process.py): the rollout process plays what the trainer's own actor would, on
the weights the trainer last refreshed; its failures come back as one error (a traceback, or the exit code of
a process that died), never a hang; a cancelled play raises Cancelled and the next play works; what it
cannot do is refused before anything starts. The token-for-token match with the synchronous loop one update
back is in tests/test_overlap.py (overlap 2)."""
import os
import re
import signal
import time

import pytest
import torch

from r1.actor import Actor
from r1.config import ConfigError, load_config
from r1.distributed import Dist
from r1.generate import Sampling
from r1.rollout import Cancelled
from r1.rollout_process import RemoteActor, RolloutProcessError
from r1.run import build_model, run_tokenizer
from r1.tasks.registry import TaskError
from r1.tasks.data import load_rows
from test_overlap import episodes
from test_trainer import SMOKE, TINY

CPU = Dist(0, 1, 0, torch.device("cpu"))


def pieces(tmp_path, *more):
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *TINY, "algo.policy_loss=decoupled_ppo",
                              "train.overlap=2", *more])
    tok = run_tokenizer(cfg)
    model = build_model(cfg.model.path, cfg, tok, CPU.device, seed=0).eval().requires_grad_(False)
    return cfg, tok, model, load_rows(cfg, "train")[:2]


@pytest.fixture
def remote(tmp_path, one_thread):
    cfg, tok, model, rows = pieces(tmp_path)
    actor = RemoteActor(cfg, tok, model, 4, CPU)
    yield actor, cfg, tok, model, rows
    actor.close()


def test_the_process_plays_what_an_actor_in_this_process_plays_on_the_refreshed_weights(remote):
    actor, cfg, tok, model, rows = remote
    here = Actor(cfg, tok, model, 4, CPU)
    sampling = Sampling(1.0, seed=7)
    assert episodes(actor.play(rows, 2, sampling, uid_prefix="a-")) == episodes(here.play(rows, 2, sampling,
                                                                                          uid_prefix="a-"))
    policy = build_model(cfg.model.path, cfg, tok, CPU.device, seed=1)  # other weights, copied in by refresh
    actor.refresh(policy)  # writes the copy the process shares; `here` plays that same model object
    assert episodes(actor.play(rows, 2, sampling, uid_prefix="b-")) == episodes(here.play(rows, 2, sampling,
                                                                                          uid_prefix="b-"))
    handle = actor.start(rows, 2, sampling)
    assert handle.ok() and not actor._busy  # the reply is in, its episodes not yet decoded: the child is free
    played, graphs, deferred = handle.result()
    assert len(played) == 4 and graphs is None and deferred == 0 and handle.seconds > 0
    assert handle.result()[0] is played  # decoded once


def test_a_refresh_while_a_play_runs_waits_until_the_play_has_read_its_weights(remote):
    """The child reads the shared copy at the start of a play; a refresh right after the request (before the
    child has read it) waits for that, so the play runs on the weights it was asked with and the next play on
    the new ones. Without the wait the refresh overwrites the copy first (this test fails)."""
    actor, cfg, tok, model, rows = remote
    weights = [build_model(cfg.model.path, cfg, tok, CPU.device, seed=s).eval().requires_grad_(False)
               for s in (1, 2)]
    sampling = Sampling(1.0, seed=3)
    actor.refresh(weights[0])
    handle = actor.start(rows, 2, sampling, uid_prefix="a-")
    actor.refresh(weights[1])  # at once: the child has likely not taken the request yet
    assert actor._busy or handle.ok()
    after = actor.play(rows, 2, sampling, uid_prefix="b-")
    for played, w, prefix in ((handle.result()[0], weights[0], "a-"), (after, weights[1], "b-")):
        assert episodes(played) == episodes(Actor(cfg, tok, w, 4, CPU).play(rows, 2, sampling, uid_prefix=prefix))


def test_a_play_queued_behind_another_starts_when_it_ends_with_nothing_from_the_trainer(remote):
    """One play may wait behind the one that runs (r1/overlap.Rollouts.get asks for the next before it
    waits): the child takes it as soon as the first is sent, while the trainer reads nothing; each Handle gets
    its own reply, whichever is waited for first, and the episodes are those of two plays one after the
    other. A third is refused, and so is a refresh, which would change the queued play's weights."""
    actor, cfg, tok, model, rows = remote
    first = actor.start(rows, 2, Sampling(1.0, seed=4), uid_prefix="a-")
    second = actor.start(rows, 2, Sampling(1.0, seed=5), uid_prefix="b-")
    with pytest.raises(RuntimeError, match="two at a time"):
        actor.start(rows, 2, Sampling(1.0, seed=6))
    with pytest.raises(RuntimeError, match="queued behind another"):
        actor.refresh(model)
    for _ in range(6000):  # both taken by the child, the trainer having read nothing (60 s at most)
        if actor._taken.value == 2:
            break
        time.sleep(0.01)
    assert actor._taken.value == 2 and len(actor._inflight) == 2
    assert second.ok() and first._msg is not None and not actor._busy
    here = Actor(cfg, tok, model, 4, CPU)
    assert episodes(second.result()[0]) == episodes(here.play(rows, 2, Sampling(1.0, seed=5), uid_prefix="b-"))
    assert episodes(first.result()[0]) == episodes(here.play(rows, 2, Sampling(1.0, seed=4), uid_prefix="a-"))
    assert second.idle_seconds is not None  # the time between the two: the first's pickling and sending


def test_close_with_a_play_queued_cancels_both(remote):
    actor, cfg, tok, model, rows = remote
    actor.start(rows * 64, 4, Sampling(1.0, seed=0))
    actor.start(rows * 64, 4, Sampling(1.0, seed=1))
    actor.close()
    assert actor._proc.exitcode == 0


def test_the_time_between_two_plays_is_reported_with_the_second(remote):
    """Handle.idle_seconds (the trainer's `rollout_idle_s`): the child's time from the end of its last play to
    the start of this one, None for its first play and for the one after a cancelled play. Here the trainer
    sleeps 0.3 s before the second request: the time between is at least that."""
    actor, cfg, tok, model, rows = remote
    first = actor.start(rows, 2, Sampling(1.0, seed=0))
    first.wait()
    assert first.idle_seconds is None
    time.sleep(0.3)
    second = actor.start(rows, 2, Sampling(1.0, seed=0))
    second.wait()
    assert second.idle_seconds >= 0.3
    actor.stop.set()
    with pytest.raises(Cancelled):
        actor.start(rows, 2, Sampling(1.0, seed=0)).result()
    actor.stop.clear()
    after = actor.start(rows, 2, Sampling(1.0, seed=0))
    after.wait()
    assert after.seconds > 0 and after.idle_seconds is None


def test_a_cancelled_play_raises_cancelled_and_the_next_one_plays(remote):
    actor, cfg, tok, model, rows = remote
    actor.stop.set()  # before the start: the process sees it at its first chunk
    handle = actor.start(rows, 2, Sampling(1.0, seed=0))
    with pytest.raises(Cancelled):
        handle.result()
    actor.stop.clear()
    assert len(actor.play(rows, 2, Sampling(1.0, seed=0))) == 4


def test_an_error_in_the_process_comes_back_as_itself_with_its_traceback(remote):
    """A task's env that raises is a TaskError here as in the trainer's process (train.py prints it as one
    line); the child's traceback is its cause. Ctrl-C is the trainer's: the child ignores it."""
    actor, cfg, tok, model, rows = remote
    handle = actor.start([{"no": "such row"}], 1, Sampling(1.0, seed=0))
    assert not handle.ok()  # the play failed: result() raises
    with pytest.raises(TaskError, match=r"^task synthetic: its env's reset\(\)") as e:
        handle.result()
    assert isinstance(e.value.__cause__, RolloutProcessError)
    assert re.match(r"(?s)the rollout process failed:\n.*Traceback", str(e.value.__cause__))
    os.kill(actor._proc.pid, signal.SIGINT)
    assert len(actor.play(rows, 1, Sampling(1.0, seed=0))) == 2  # and it goes on


def test_close_during_a_play_cancels_it_and_the_process_ends_on_its_own(remote):
    actor, cfg, tok, model, rows = remote
    actor.start(rows * 64, 4, Sampling(1.0, seed=0))  # 512 episodes: a reply larger than the pipe's buffer
    actor.close()
    assert actor._proc.exitcode == 0  # not killed: it was not left blocked sending its episodes


def test_on_a_cpu_the_two_processes_split_the_threads_and_close_gives_them_back(tmp_path):
    """Both processes at torch's default (every core each, both busy at once) made an overlap-2 iteration
    twice the synchronous one on a CPU (docs/decisions.md, "The rollout in a process of its own"): the child takes half, the trainer the rest,
    until close()."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        cfg, tok, model, rows = pieces(tmp_path)
        actor = RemoteActor(cfg, tok, model, 4, CPU)
        try:
            assert (torch.get_num_threads(), actor.child_threads) == (2, 2)
        finally:
            actor.close()
        assert torch.get_num_threads() == 4
        torch.set_num_threads(1)  # one thread: both keep it
        actor = RemoteActor(cfg, tok, model, 4, CPU)
        actor.close()
        assert (actor.child_threads, torch.get_num_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before)


def test_the_memory_fraction_is_split_between_the_two_processes():
    """run.memory_fraction caps each process: the rollout process gets its planned bytes and a GiB, the
    trainer the rest, and never less than half."""
    from r1.memory import GiB, Plan, split_fraction

    plan = Plan("cuda", 100 * GiB, 1, 8, 512, 4096, False, True,
                {"policy": 10 * GiB, "kv cache": 6 * GiB, "cuda graphs": GiB, "rollout process": GiB}, 20 * GiB,
                GiB, 0)
    mine, child = split_fraction(plan, 0.5, 100 * GiB)
    assert child == pytest.approx(0.10) and mine == pytest.approx(0.40)
    assert split_fraction(plan, 0.1, 100 * GiB) == pytest.approx((0.05, 0.05))


def test_a_process_that_died_is_reported_with_its_exit_code_not_waited_for(remote):
    actor = remote[0]
    actor._proc.kill()
    with pytest.raises(RolloutProcessError, match=r"^the rollout process died \(exit code -9\)$"):
        actor.play(remote[4], 1, Sampling(1.0, seed=0))


def test_a_process_that_cannot_start_says_why(tmp_path):
    cfg, tok, model, _ = pieces(tmp_path)
    cfg.model.tokenizer = str(tmp_path / "no-such-tokenizer")  # the process builds its own tokenizer from cfg
    with pytest.raises(RolloutProcessError, match=r"(?s)could not start:\n.*no-such-tokenizer"):
        RemoteActor(cfg, tok, model, 4, CPU)


def test_what_the_process_cannot_do_is_refused_first(tmp_path):
    cfg, tok, model, _ = pieces(tmp_path)
    lora = r"^config key 'train.overlap' \(command line\)=2 .*model.lora_generator=merged"
    with pytest.raises(ConfigError, match=lora):
        load_config(SMOKE, [*TINY, "algo.policy_loss=decoupled_ppo", "train.overlap=2", "model.lora_rank=4"])


def _sigint_at_start(q):
    q.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_a_child_started_under_sigint_ignored_ignores_ctrl_c_from_its_first_line():
    """A Ctrl-C while the spawned child still imports torch printed its KeyboardInterrupt traceback under the
    trainer's one line (a user's walk, 3 of 7 tries): started inside sigint_ignored(), the child's Python never
    installs its handler. The trainer's own handler is back right after."""
    import multiprocessing

    from r1.rollout_process import sigint_ignored

    ctx = multiprocessing.get_context("spawn")
    # as in a terminal: a shell that starts a job in the background without job control (`cmd &`, the way
    # this suite once ran) has the job ignore SIGINT, so the control child would inherit that
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        seen = []
        for ignored in (True, False):
            q = ctx.Queue()
            p = ctx.Process(target=_sigint_at_start, args=(q,))
            if ignored:
                with sigint_ignored():
                    p.start()
                assert signal.getsignal(signal.SIGINT) is before
            else:
                p.start()
            seen.append(q.get(timeout=120))
            p.join(timeout=60)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert seen == [True, False]
