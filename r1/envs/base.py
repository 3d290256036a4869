"""The Env API and the context policies an environment owns.

One MDP step = the prompt ids the model saw -> the response ids it sampled
-> the environment's observation, reward and done flag. The environment,
not the trainer, decides what the model sees next (`next_prompt`):

- append (default): prompt_{t+1} = prompt_t + response_t + obs_t, joined as
  token ids, never re-encoded, so later steps score exactly the tokens the
  model produced;
- window: keep the first prompt (system + task) and drop the oldest whole
  turns until the step fits the budget;
- truncate: keep the first prompt and the most recent tokens (cutting a turn
  if it must);
- `summarize()`: a hook a subclass overrides to replace old turns with a
  summary it writes.

A step's prompt plus `max_new_tokens` must fit `max_context`; when it cannot
(append, or a first prompt that is already too long), the episode ends
cleanly with reason `context_budget` instead of running out of memory.

An Observation is either messages (rendered incrementally with the chat
template: only the new turns are encoded) or raw token ids.
"""
from dataclasses import dataclass


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
        if policy not in ("append", "window", "truncate"):
            raise ValueError(f"unknown context policy {policy!r}; expected append, window or truncate")
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
        """Override to write a summary of old turns when the budget is hit (None = no summary)."""
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
        summary = self.summarize(self.chunks)
        if summary is not None:
            # The first prompt ends with an open assistant turn (the generation prompt);
            # close it, as after a response, so the summary turn renders where a turn may start.
            closing = self.tok.close_turn_ids([]) if summary.ids is None else []
            ids = self.chunks[0] + closing + self.obs_ids(summary)
            self.chunks = [self.chunks[0], ids[len(self.chunks[0]):]]
            return (ids, None) if len(ids) <= self.budget else (None, "context_budget")
        if self.policy == "append":
            return None, "context_budget"
        first = self.chunks[0]
        room = self.budget - len(first)
        if self.policy == "window":
            kept = []
            for chunk in reversed(self.chunks[1:]):
                if sum(map(len, kept)) + len(chunk) > room:
                    break
                kept.insert(0, chunk)
            if not kept:
                return None, "context_budget"
            self.chunks = [first] + kept
            return [t for c in self.chunks for t in c], None
        if room <= 0:  # truncate
            return None, "context_budget"
        tail = [t for c in self.chunks[1:] for t in c][-room:]
        return first + tail, None
