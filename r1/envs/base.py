"""The Env API: what one MDP step is, and the context machinery every env shares.

One MDP step = the prompt ids the model saw -> the response ids it sampled
-> the environment's observation, reward and done flag. The environment,
not the trainer, decides what the model sees next (`next_prompt`): the
step is appended as token ids, never re-encoded, so later steps score
exactly the tokens the model produced; when that does not fit the budget,
the env's summary hook (`summarize`) or its context policy
(r1/envs/context.py: append, window, truncate) decides what is kept, or ends the episode cleanly with reason
`context_budget` instead of running out of memory.

An Observation is either messages (rendered incrementally with the chat
template: only the new turns are encoded) or raw token ids.
"""
from dataclasses import dataclass

from r1.envs.context import CONTEXT_POLICIES, summary


@dataclass
class Observation:
    messages: list | None = None  # new chat turns to render and append
    ids: list | None = None  # or raw token ids to append


@dataclass
class Action:
    ids: list  # sampled token ids, exactly as sampled
    text: str  # their decoded text (for parsing only; never re-encoded)
    finish: str = "eos"  # eos | stop | length


class Env:
    """Subclass and implement `reset` and `step`; the context machinery is here."""

    tools: list = []  # OpenAI function schemas the template renders (ToolEnv fills it)

    def __init__(self, tokenizer, max_context: int = 2048, max_new_tokens: int = 256, policy: str = "append"):
        if policy not in CONTEXT_POLICIES:
            raise ValueError(f"unknown context policy {policy!r}; expected one of {', '.join(CONTEXT_POLICIES)}")
        if not 0 < max_new_tokens < max_context:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be positive and below max_context={max_context}: "
                             "a step's prompt plus its response must fit the context")
        self.tok = tokenizer
        self.max_context, self.max_new_tokens, self.policy = max_context, max_new_tokens, policy
        self.chunks: list = []  # the first prompt, then each (response + observation) as ids

    # -- to implement ------------------------------------------------------
    def reset(self, sample) -> Observation:
        raise NotImplementedError

    def step(self, action: Action):
        """-> (Observation | None, reward: float, done: bool, info: dict)."""
        raise NotImplementedError

    def close(self):
        """Release what the episode holds (a sandbox folder, a connection); the rollout loop calls it
        once when the episode ends, whatever ended it. Override it if your env holds anything."""

    def summarize(self, chunks: list) -> Observation | None:
        """Override to write a summary of old turns when the budget is hit (None = no summary: the context
        policy decides); tried before any policy (r1/envs/context.py)."""
        return None

    # -- context -----------------------------------------------------------
    @property
    def budget(self) -> int:
        return self.max_context - self.max_new_tokens

    def obs_ids(self, obs: Observation, add_generation_prompt: bool = True) -> list:
        if obs.ids is not None:
            return list(obs.ids)
        return self.tok.render_next(obs.messages, tools=self.tools or None, add_generation_prompt=add_generation_prompt)

    def first_prompt(self, obs: Observation) -> tuple:
        """The first step's prompt ids -> (ids, None) or (None, 'context_budget')."""
        ids = list(obs.ids) if obs.ids is not None else self.tok.render(obs.messages, tools=self.tools or None)
        self.chunks = [ids]
        return (ids, None) if len(ids) <= self.budget else (None, "context_budget")

    def next_prompt(self, prompt: list, action: Action, obs: Observation) -> tuple:
        """-> (next prompt ids, None) or (None, reason) when the episode must end."""
        closing = self.tok.close_turn_ids(action.ids) if obs.ids is None else []
        new = list(action.ids) + closing + self.obs_ids(obs)
        self.chunks.append(new)
        ids = prompt + new
        if len(ids) <= self.budget:
            return ids, None
        summarized = summary(self)
        if summarized is not None:
            ids, fits = summarized
            return (ids, None) if fits else (None, "context_budget")
        ids = CONTEXT_POLICIES[self.policy](self)
        return (ids, None) if ids is not None else (None, "context_budget")
