"""The context policies (the `CONTEXT_POLICIES` registry): what an episode does when its next prompt
does not fit.

`Env.next_prompt` appends the step (response + observation, as ids) and, only
when the result is over the budget (`max_context - max_new_tokens`), asks the
env for a summary (`Env.summarize`, a hook; `summary` below), and without one
calls `policy(env) -> next prompt ids, or None` (the episode ends:
"context_budget"). A policy reads and may rewrite `env.chunks` (the first
prompt, then each step's response + observation ids) and never re-encodes
text, so the ids it keeps are the ones the model saw. Summaries are a hook,
not a policy name: writing one is task-specific, so a YAML switch would
select nothing. docs/tasks.md walks through adding a policy.
"""
from r1.registry import Registry


def append(env):
    """Token-exact concatenation only: the episode ends when the budget is reached."""
    return None


def window(env):
    """Keep the first prompt (system + task) and the latest whole turns that fit."""
    first = env.chunks[0]
    room = env.budget - len(first)
    kept = []
    for chunk in reversed(env.chunks[1:]):
        if sum(map(len, kept)) + len(chunk) > room:
            break
        kept.insert(0, chunk)
    if not kept:
        return None
    env.chunks = [first] + kept
    return [t for c in env.chunks for t in c]


def truncate(env):
    """Keep the first prompt and the most recent tokens (cutting a turn if it must)."""
    first = env.chunks[0]
    room = env.budget - len(first)
    if room <= 0:
        return None
    tail = [t for c in env.chunks[1:] for t in c][-room:]
    return first + tail


def summary(env):
    """Not a policy: the hook every policy comes after. An env that overrides `Env.summarize` replaces
    every turn after the first prompt with the summary it writes -> (ids, fits); None when it writes
    none, and the policy decides."""
    summary = env.summarize(env.chunks)
    if summary is None:
        return None
    # The first prompt ends with an open assistant turn (the generation prompt);
    # close it, as after a response, so the summary turn renders where a turn may start.
    closing = env.tok.close_turn_ids([]) if summary.ids is None else []
    ids = env.chunks[0] + closing + env.obs_ids(summary)
    env.chunks = [env.chunks[0], ids[len(env.chunks[0]):]]
    return ids, len(ids) <= env.budget


CONTEXT_POLICIES = Registry("context policy", {"append": append, "window": window, "truncate": truncate})
