"""AgentEnvLoop: many environments, one generator, every step recorded.

Owns playing episodes: each holds one generator slot for its whole life, so
its KV cache survives between steps and an append-policy step prefills only
the new observation tokens; when one ends the next pending episode takes its
slot (continuous batching). Environment steps run on the loop's thread while
the generator decodes the next chunk (short chunks, `sync_every`, so a turn
that ends mid-chunk waits little); `workers > 0` keeps a thread pool for
environments that block on I/O. `run(samples, n)` returns trajectories
ordered by (sample, index) that depend only on the samples, the sampling
seed and the episode uids, not on scheduling: the generator's noise is keyed
by (seed, uid, position) (r1/generate.py). `stop` cancels a run between
chunks (`Cancelled`); `carry_tokens` pauses long episodes into the next run
(AgentEnvLoop). Measurements behind these choices: docs/decisions.md.
"""
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from r1.envs.base import Action
from r1.tokenizer import ChatTokenizer
from r1.trajectory import Step, Trajectory

_chat_decode = ChatTokenizer.decode


class Cancelled(Exception):
    """A run stopped by its loop's `stop` event: its episodes are dropped."""


class AgentEnvLoop:
    """Plays episodes with one generator. Without the generator's overlap (CPU, kernels.launch_ahead=false) the
    environments step between launch() and finish(); with it each `Generator.step` launches the next chunk
    and collects the previous one (4 decode steps a chunk). The trainer sets `stop` when it stops while
    train.overlap's next rollout still plays.

    `carry_tokens` (rollout.carry_tokens) cuts the rollout's tail: a rollout lasts about as many decode
    steps as its longest episode, while most rows ended long before. An episode that has sampled at least
    that many tokens in this run pauses at its next step boundary: its slot is freed (its cache was computed
    by these weights), and the environment, the trajectory and its next prompt wait for the next run with
    `carry`, which submits them first, on that run's weights. Every step stays a transition of exact token
    ids with the logprobs and `policy_version` of the weights that sampled it, so an episode may span
    rollouts of several versions (decoupled PPO weighs each token by its own sampler's logprob). The rule is
    per episode, so which episodes pause does not depend on batching. With `whole_groups` (a group
    baseline: GRPO, RLOO) an ended episode is held until every episode of its group has ended, and a run
    returns whole groups only; without it, an episode is returned when it ends. Groups must then be
    numbered uniquely across runs (the trainer offsets them by iteration). A run without `carry`
    (evaluation) neither resumes nor disturbs what waits; `drop_carried()` ends it (a run that raised
    drops it too)."""

    def __init__(self, generator, tokenizer, make_env, max_new_tokens: int, workers: int = 0,
                 sync_every: int | None = None):
        self.gen, self.tok, self.make_env = generator, tokenizer, make_env
        self.max_new_tokens = max_new_tokens
        # decode steps per launch; None = the generator's own (its sync_every)
        self.sync_every = sync_every or (4 if getattr(generator, "overlap", False) else None)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env") if workers > 0 else None
        self.stop = threading.Event()  # set: the run in progress ends at its next chunk (Cancelled)
        self.carried = []  # [env, traj, next prompt] of episodes paused by carry_tokens, oldest first
        self.held = {}  # group -> its ended episodes, while others of the group play on (whole_groups)
        self.group_left = {}  # group -> its episodes not ended yet (whole_groups)

    def run(self, samples: list, n: int = 1, policy_version: int = 0, uid_prefix: str = "", groups=None,
            carry_tokens: int = 0, whole_groups: bool = False) -> list:
        """Play n episodes per sample. `groups` numbers the samples (default 0..len-1); a
        trainer passes global prompt indices so uids, and with them the sampling noise,
        do not depend on how prompts were dealt to ranks. carry_tokens > 0: first resume the
        episodes earlier runs paused, and pause any episode that samples that many tokens in
        this run (the class docstring); whole_groups: return whole groups only."""
        groups = list(range(len(samples))) if groups is None else list(groups)
        todo = [(groups[k], i, s) for k, s in enumerate(samples) for i in range(n)]
        todo.reverse()  # pop() from the end keeps sample order
        self.live, self.done, self.version = {}, [], policy_version
        self.carry, self.whole_groups, self.spent = carry_tokens, whole_groups and carry_tokens > 0, {}
        if self.whole_groups:
            again = [g for g in groups if g in self.group_left or g in self.held]
            if again:
                raise ValueError(f"group {again[0]} is already playing in the loop: number groups uniquely across "
                                 "runs when episodes are carried")
            self.group_left.update((g, n) for g in groups)
        resumed, self.carried = (self.carried, []) if carry_tokens > 0 else ([], self.carried)
        futures, ended = {}, []
        overlap = getattr(self.gen, "overlap", False)  # a scripted generator in a test has none
        try:
            for env, traj, prompt in resumed:  # the paused episodes first, on this run's weights
                traj.meta["rollouts"] = traj.meta.get("rollouts", 1) + 1  # saved with it: read in its record
                self.live[traj.uid] = [env, traj, prompt]
                self.gen.submit(traj.uid, prompt, self.max_new_tokens)
            resumed = []
            while todo or self.live:
                if self.stop.is_set():
                    raise Cancelled("the rollout was cancelled")
                while todo and self.gen.free_slots() > 0 and len(self.live) < self.gen.slots:
                    self._start(*todo.pop(), uid_prefix)
                if todo and not self.live and not futures and self.gen.free_slots() <= 0:
                    raise RuntimeError(f"{len(todo)} episodes wait for a generator slot, but every slot is held by a "
                                       "key no live episode owns: release() them, or abort() the generator")
                if overlap:  # a chunk stays in flight; the older one's turns are stepped now
                    ended = self._actions(self.gen.step(self.sync_every))
                    self._step(ended, futures)
                else:  # step the last chunk's turns while this one decodes, then wait for it
                    self.gen.launch(self.sync_every) if self.sync_every else self.gen.launch()
                    self._step(ended, futures)
                    ended = self._actions(self.gen.finish())
                if self.pool is not None:
                    ready = [f for f in futures if f.done()]
                    if not ready and futures and not ended and not self.gen.busy():
                        ready = list(wait(futures, return_when=FIRST_COMPLETED).done)
                    for f in ready:
                        c = futures.pop(f)
                        self._record(c, self._stepped(c, f.result))
        except BaseException:  # an environment that raised: leave no chunk in flight and no slot held
            abort = getattr(self.gen, "abort", None)
            if abort is not None:
                abort()
            if carry_tokens > 0:  # what waited for this run goes with it
                envs = {id(e): e for e in [v[0] for v in self.live.values()] + [r[0] for r in resumed]}
                self.drop_carried(envs.values())
            raise
        finally:
            self.gen.finish()
        self.done.sort(key=lambda t: (t.group, int(t.uid.rsplit("-", 1)[1])))
        return self.done

    def drop_carried(self, also=()):
        """Forget the paused episodes and the held groups, then close their environments and those in `also`
        (the trainer stops, or a run raised); an environment whose close() raises is a warning, so that the
        error that brought us here, and the rest of the closing, go on."""
        envs = [env for env, _, _ in self.carried] + list(also)
        self.carried, self.held, self.group_left = [], {}, {}
        for env in envs:
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - the task's code
                warnings.warn(f"an environment's close() raised {type(e).__name__}: {e}")

    def _ended(self, traj):
        """An episode ended: returned by this run, or (whole_groups) held until its group has ended."""
        if not self.whole_groups:
            self.done.append(traj)
            return
        g = traj.group
        self.held.setdefault(g, []).append(traj)
        self.group_left[g] -= 1
        if self.group_left[g] == 0:
            del self.group_left[g]
            self.done.extend(self.held.pop(g))

    def _start(self, g, i, s, uid_prefix):
        """Reset a new episode's environment and queue its first prompt."""
        uid = f"{uid_prefix}{g}-{i}"
        env = self.make_env()
        traj = Trajectory(uid, g, str(s.get("id", g)), meta={"answer": s.get("answer")})
        try:
            prompt, reason = env.first_prompt(env.reset(s))
        except Exception as e:  # noqa: BLE001 - the task's code: one line naming it, the row and its file:line
            from r1.tasks.registry import task_error

            env.close()
            raise task_error(getattr(self.make_env, "task", type(env).__name__), "its env's reset()", s, e) from None
        if prompt is None:
            traj.termination = reason
            self._ended(traj)
            env.close()
            return
        self.live[uid] = [env, traj, prompt]
        self.gen.submit(uid, prompt, self.max_new_tokens)

    def _actions(self, completions):
        """(completion, Action) pairs: the response text is decoded here, for the environments' parsers."""
        return [(c, Action(c.token_ids, text, c.finish)) for c, text in zip(completions, self._decode_all(completions))]

    def _step(self, ended, futures):
        """Step the environments of these turns on the loop's thread, or hand them to the pool."""
        for c, action in ended:
            env, _, prompt = self.live[c.key]
            if self.pool is None:
                self._record(c, self._stepped(c, _env_step, env, prompt, action))
            else:
                futures[self.pool.submit(_env_step, env, prompt, action)] = c

    def _stepped(self, c, fn, *args):
        """fn(*args), an environment's step; what the task's code raises becomes one line naming the task,
        the episode's row and the user's file:line (a row missing a field its env reads, say)."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the task's code
            from r1.tasks.registry import task_error

            env, traj, _ = self.live[c.key]
            task = getattr(self.make_env, "task", type(env).__name__)
            raise task_error(task, "its env's step()", {"id": traj.sample_id}, e) from None

    def _decode_all(self, completions):
        """Response texts, for the environments' parsers only (never re-encoded)."""
        if not completions:
            return []
        batch = getattr(getattr(self.tok, "hf", None), "batch_decode", None)
        if batch is None or type(self.tok).decode is not _chat_decode:
            return [self.tok.decode(c.token_ids) for c in completions]
        return batch([c.token_ids for c in completions], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _record(self, c, result):
        """Record a finished step; end the episode or queue its next prompt."""
        env, traj, prompt = self.live[c.key]
        reward, is_done, info, nxt, reason = result
        traj.steps.append(Step(prompt, c.token_ids, c.logprobs, reward, is_done or nxt is None,
                               c.finish, info, policy_version=self.version))
        if is_done or nxt is None:
            traj.termination = "answered" if info.get("final") else (info.get("reason") or reason or "done")
            self._ended(traj)
            del self.live[c.key]
            self.gen.release(c.key)
            env.close()  # whatever ended it (answer, max_steps, context budget): the env frees what it holds
            return
        if self.carry:  # counted only when carrying: nothing added to the loop's step otherwise
            self.spent[c.key] = self.spent.get(c.key, 0) + len(c.token_ids)
        if self.carry and self.spent[c.key] >= self.carry:  # paused: the next run resumes it, on its own weights
            del self.live[c.key]
            self.gen.release(c.key)
            self.carried.append([env, traj, nxt])
        else:
            self.live[c.key][2] = nxt
            self.gen.submit(c.key, nxt, self.max_new_tokens)


def _env_step(env, prompt, action):
    """One environment step and the next prompt (inline, or in the pool). Exceptions propagate to run()."""
    obs, reward, is_done, info = env.step(action)
    if is_done:
        return reward, True, info, None, None
    nxt, reason = env.next_prompt(prompt, action, obs)
    if nxt is not None and len(nxt) >= env.max_context:
        nxt, reason = None, "context_budget"
    return reward, False, info, nxt, reason
