"""The reward terms (the `REWARDS` registry): name -> a function of one step, weighted by the config.

A step's reward is the task's score of a final answer (0 on a tool step) plus the rubric: each term's
weight times `fn(env, action, info)` (the env after the step, what the model sampled, the step's
record), so a reward that needs more than the text and the gold answer is a term here, not a subclass
of `ToolEnv.step`.

Weights come from `env.rewards`, a mapping of term to weight (`{malformed: -0.1, format: 0.05}`).
ToolEnv sums malformed, format and tool_success first, then the others in the mapping's order; a
weight of 0 skips its term (not even called). A term's `sign` bounds its weight (-1: a penalty, <= 0;
+1: a bonus, >= 0). A term only some envs can pay (`general=False`) is accepted only for a task that
lists it in `Task.rewards`. The config reads this table live: a term added here is a valid
`env.rewards` name (docs/tasks.md walks through adding one). Stdlib only (config validation imports it).
"""
from dataclasses import dataclass
from typing import Callable

from r1.registry import Registry


@dataclass(frozen=True)
class Reward:
    fn: Callable  # fn(env, action, info) -> float, before the weight
    doc: str = ""
    sign: int = 0  # -1: the weight must be <= 0 (a penalty); +1: >= 0 (a bonus); 0: either
    general: bool = True  # any ToolEnv pays it; False: only tasks listing it in Task.rewards
    paid_by: str = ""  # for a task-only term: who pays it, as the config error says it


def well_formed(info) -> bool:
    """Every tool call of the step parsed and named a tool with valid arguments (a call that ran and
    failed was well formed)."""
    return all(k == "tool_error" for k in info["errors"])


def malformed(env, action, info) -> float:
    return float(bool(info["errors"]))


def format_ok(env, action, info) -> float:
    if info["final"]:
        return float(env.answer_format is not None and bool(env.answer_format(env.reply_text(action.text))))
    return float(well_formed(info))


def tool_success(env, action, info) -> float:
    return float(not info["final"] and not info["errors"])


REWARDS = Registry("reward term", {
    "malformed": Reward(malformed, "a step with a malformed tool call or reply (use a negative weight)",
                        sign=-1),
    "format": Reward(format_ok, "tool calls all well formed, or a final answer in the task's answer format",
                     sign=1),
    "tool_success": Reward(tool_success, "a tool step whose calls all ran without error",
                           sign=1),
}, kind=Reward)
register_reward = REWARDS.register  # (name, reward, replace=False): a task module's task-only terms, on import


class Rubric:
    """{term: weight} (summing order) bound to the terms' functions; zero weights are left out."""

    def __init__(self, weights: dict):
        unknown = [n for n in weights if n not in REWARDS]
        if unknown:
            raise ValueError(f"unknown reward {unknown[0]!r}; known: {', '.join(REWARDS)}")
        self.terms = [(REWARDS[n].fn, float(w)) for n, w in weights.items() if w]

    def __call__(self, env, action, info) -> float:
        total = 0.0
        for fn, weight in self.terms:
            total += weight * fn(env, action, info)
        return total
