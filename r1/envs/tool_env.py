"""ToolEnv: a task solved with tool calls over several MDP steps.

The model writes calls in its chat template's format (r1/tool_formats.py; env.tool_format overrides),
several per turn if it likes. Each step runs the calls and returns their results as `tool` messages. A turn
without any call is the final answer, scored by the task on its text without the stop token that ended
the turn. A malformed call (bad JSON, unknown tool, wrong argument types, unclosed tag, too many calls) or
reply (empty, or holding a special token such as `<|im_start|>` before its end) becomes an error result
the model can read, an optional penalty and an entry in the step's info; it never raises. Observation
text never carries special-token text: a result or an error that quotes the model is defanged
(`< |im_end|>`), so an echoed name cannot forge a turn boundary.

Rewards: the task's score of the final answer (info's `score`; `correct` = score > 0, so accuracy
never counts a bonus) plus the rubric of r1/envs/rewards.py, each term off by default and paid at
most once a step (docs/tasks.md says how each can be gamed).
"""
from r1.envs.base import Action, Env, Observation
from r1.envs.rewards import Rubric
from r1.envs.tools import get_tool, validate_arguments
from r1.tool_formats import MAX_CALL_CHARS, choose
from r1.tool_formats import parse_hermes as parse_tool_calls  # noqa: F401  (the Hermes parser, by its old name)

ERROR_KINDS = ("empty_response", "special_token", "unclosed_tag", "bad_json", "bad_call", "unknown_tool",
               "bad_arguments", "too_many_calls", "tool_error")

MAX_ERROR_CHARS = 1_000  # one error observation; the longest written here is about 200
RESULT_CHARS_PER_TOKEN = 16  # a tool result's cap is this times max_context characters (see above)


def cap_error(text: str) -> str:
    """An error observation cut to MAX_ERROR_CHARS, saying how much was left out."""
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:MAX_ERROR_CHARS]}... [error cut: {len(text) - MAX_ERROR_CHARS} more characters]"


def cap_result(text: str, limit: int) -> str:
    """A tool result of more than `limit` characters -> its head and tail around a marker (at most
    `limit` characters of it kept): the head for the append and window policies, the tail for truncate."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return (f"{text[:head]}\n[tool result cut: {len(text) - limit} characters left out here, more than the "
            f"context holds]\n{text[len(text) - tail:]}")


class ToolEnv(Env):
    """Tool calls over several MDP steps (module docstring).

    Sizes. An error observation is at most MAX_ERROR_CHARS whatever the call's
    size (it quotes at most a prefix of a name or a parser message). A tool
    result is cut to RESULT_CHARS_PER_TOKEN * max_context characters, keeping
    its head and its tail around a marker, before the template tokenises it: a
    tool returning megabytes costs a bounded encode, not one of megabytes that
    the context budget then throws away. Text this long cannot fit the context
    anyway: it would need more than 16 characters a token on average, where
    prose and code take about 3.5 (SmolLM2's tokenizer on r1's own source) and
    only long runs of one character (81 spaces or '#' at most in SmolLM2's
    vocabulary) take more.
    """

    def __init__(self, tokenizer, make_prompt, score, tools=("calculator",), max_steps: int = 4,
                 malformed_penalty: float = 0.0, max_calls: int = 8, format_reward: float = 0.0,
                 tool_success_reward: float = 0.0, answer_format=None, rewards: dict | None = None,
                 tool_format: str = "auto", **context):
        """The weights of the malformed, format and tool_success terms, summed first; `rewards` ({term:
        weight} of r1/envs/rewards.REWARDS, the config's env.rewards) sets them too and adds any other."""
        super().__init__(tokenizer, **context)
        self.make_prompt, self.score, self.answer_format = make_prompt, score, answer_format
        self.tool_fns = {name: get_tool(name) for name in tools}
        self.tools = [t.schema for t in self.tool_fns.values()]
        self.max_steps, self.max_calls = max_steps, max_calls
        self.format = choose(tokenizer, tool_format)
        self.rubric = Rubric({"malformed": malformed_penalty, "format": format_reward,
                              "tool_success": tool_success_reward, **(rewards or {})})
        self.specials = sorted(getattr(tokenizer, "special_tokens", ()), key=len, reverse=True)
        self.stop_texts = [tokenizer.decode([i]) for i in getattr(tokenizer, "stop_ids", ())]

    def reset(self, sample) -> Observation:
        self.sample, self.t = sample, 0
        return Observation(messages=self.make_prompt(sample, tools=bool(self.tools)))

    def step(self, action: Action):
        self.t += 1
        calls, errors = self.format.parse(action.text, self.max_calls) if self.tools else ([], [])
        if self.tools:
            errors = self.reply_errors(action.text) + errors
        info = {"tool_calls": len(calls), "errors": [k for k, _ in errors], "final": False}
        if not calls and not errors:
            score = float(self.score(self.reply_text(action.text), self.sample["answer"]))
            info.update(final=True, score=score, correct=score > 0)
            return None, score + self.rubric(self, action, info), True, info
        results = []
        for call in calls:
            (name, args), tool = call, self.tool_fns.get(call[0])
            if tool is None:
                info["errors"].append("unknown_tool")
                text = cap_error(f"error: unknown tool {name[:40]!r}; available: {', '.join(self.tool_fns)}")
            elif (problem := validate_arguments(tool.schema["function"]["parameters"], args)) is not None:
                info["errors"].append("bad_arguments")
                text = cap_error(f"error: {problem}")
            else:
                out = tool(args)
                if not out.ok:
                    info["errors"].append("tool_error")
                text = cap_result(out.text, RESULT_CHARS_PER_TOKEN * self.max_context)
            results.append(self.format.result(call, self.defang(name[:40]), self.defang(text)))
        for kind, message in errors:
            results.append(self.format.result(None, "error", self.defang(cap_error(f"error ({kind}): {message}"))))
        reward = self.rubric(self, action, info)
        if self.t >= self.max_steps:
            info["reason"] = "max_steps"
            return None, reward, True, info
        return Observation(messages=results), reward, False, info

    def reply_text(self, text: str) -> str:
        """The reply as the model wrote it, without the stop token that ended the turn (`<|im_end|>`)
        or trailing blanks: the text a task's score sees. The action's ids keep the token."""
        body = text.rstrip()
        end = next((s for s in self.stop_texts if s and body.endswith(s)), "")
        return body[: len(body) - len(end)].rstrip()

    def reply_errors(self, text: str) -> list:
        """[(kind, message)] for a reply that is empty or holds a special token before its end."""
        # The one stop token that ended the turn is how a reply ends, not an error; a second one is.
        body = self.reply_text(text)
        if not body.strip():
            return [("empty_response", "the reply is empty; call a tool or write the final answer")]
        found = next((s for s in self.specials if s in body and s not in self.format.markers), None)
        if found is not None:
            return [("special_token", f"the reply contains the special token {found!r} before its end; "
                                      "special tokens only end a turn")]
        return []

    def defang(self, text: str) -> str:
        """Text with every special-token string split by a space, so encoding it gives plain tokens."""
        for s in self.specials:
            text = text.replace(s, s[:1] + " " + s[1:])
        return text


def tool_env(cfg, tokenizer, tools, make_prompt, score, answer_format=None) -> ToolEnv:
    """A ToolEnv with the config's env.* and rollout.* settings: the env factory of most tasks."""
    e = cfg.env
    return ToolEnv(tokenizer, make_prompt, score, tools=tuple(tools), max_steps=e.max_steps if tools else 1,
                   answer_format=answer_format, rewards=e.rewards, tool_format=e.tool_format,
                   max_context=e.max_context, max_new_tokens=cfg.rollout.max_new_tokens, policy=e.context_policy)
