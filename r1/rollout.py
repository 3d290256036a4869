"""AgentEnvLoop: many environments, one generator, every step recorded.

Each episode holds one generator slot for its whole life, so its KV cache
survives between steps and an append-policy step prefills only the new
observation tokens. The loop keeps at most `slots` episodes alive; when one
ends, the next pending episode takes its slot (continuous batching across
episodes), and when a step of an episode finishes, its next step joins the
running batch. Environment steps (tools) run in a thread pool, off the
decode path, so decoding continues while tools work.

`run(samples, n)` plays n episodes per sample (a group, for GRPO/RLOO) and
returns trajectories ordered by (sample, index), whatever order they ended
in. Results depend only on the samples, the sampling seed and the episode
uids, not on scheduling: greedy trivially, and sampled because the
generator's noise is keyed by (seed, uid, position) (r1/generate.py), so it
does not matter which rows share a decode step or when a tool finishes.
"""
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from r1.envs.base import Action
from r1.trajectory import Step, Trajectory


class AgentEnvLoop:
    def __init__(self, generator, tokenizer, make_env, max_new_tokens: int, workers: int = 4):
        self.gen, self.tok, self.make_env = generator, tokenizer, make_env
        self.max_new_tokens = max_new_tokens
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env")

    def run(self, samples: list, n: int = 1, policy_version: int = 0, uid_prefix: str = "", groups=None) -> list:
        """Play n episodes per sample. `groups` numbers the samples (default 0..len-1); a
        trainer passes global prompt indices so uids, and with them the sampling noise,
        do not depend on how prompts were dealt to ranks."""
        groups = list(range(len(samples))) if groups is None else list(groups)
        todo = [(groups[k], i, s) for k, s in enumerate(samples) for i in range(n)]
        todo.reverse()  # pop() from the end keeps sample order
        live, done, futures = {}, [], {}
        while todo or live:
            while todo and self.gen.free_slots() > 0 and len(live) < self.gen.slots:
                g, i, s = todo.pop()
                uid = f"{uid_prefix}{g}-{i}"
                env = self.make_env()
                traj = Trajectory(uid, g, str(s.get("id", g)), meta={"answer": s.get("answer")})
                obs = env.reset(s)
                prompt, reason = env.first_prompt(obs)
                if prompt is None:
                    traj.termination = reason
                    done.append(traj)
                    continue
                live[uid] = [env, traj, prompt]
                self.gen.submit(uid, prompt, self.max_new_tokens)
            completions = self.gen.step() if self.gen.busy() else []
            for c in completions:
                env, traj, prompt = live[c.key]
                action = Action(c.token_ids, self.tok.decode(c.token_ids), c.finish)
                futures[self.pool.submit(_env_step, env, prompt, action)] = (c, action)
            ready = [f for f in futures if f.done()]
            if not ready and futures and not self.gen.busy():
                ready = list(wait(futures, return_when=FIRST_COMPLETED).done)
            for f in ready:
                c, action = futures.pop(f)
                env, traj, prompt = live[c.key]
                reward, is_done, info, nxt, reason = f.result()
                traj.steps.append(Step(prompt, c.token_ids, c.logprobs, reward, is_done or nxt is None,
                                       c.finish, info, policy_version=policy_version))
                if is_done or nxt is None:
                    traj.termination = "answered" if info.get("final") else (info.get("reason") or reason or "done")
                    done.append(traj)
                    del live[c.key]
                    self.gen.release(c.key)
                else:
                    live[c.key][2] = nxt
                    self.gen.submit(c.key, nxt, self.max_new_tokens)
        done.sort(key=lambda t: (t.group, int(t.uid.rsplit("-", 1)[1])))
        return done


def _env_step(env, prompt, action):
    """Runs in the pool: the env's step and its next prompt. Exceptions propagate to run()."""
    obs, reward, is_done, info = env.step(action)
    if is_done:
        return reward, True, info, None, None
    nxt, reason = env.next_prompt(prompt, action, obs)
    if nxt is not None and len(nxt) >= env.max_context:
        nxt, reason = None, "context_budget"
    return reward, False, info, nxt, reason
