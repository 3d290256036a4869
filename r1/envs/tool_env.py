"""ToolEnv: a task solved with tool calls over several MDP steps.

The model writes Hermes/Qwen-style calls, `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, several per turn if it likes. Each step runs the calls and
returns their results as `tool` messages (the chat template renders them in its
tool-response form). A turn without any call is the final answer and is scored
by the task. A malformed call (bad JSON, unknown tool, wrong argument types,
unclosed tag, too many calls) or a malformed reply (empty, or holding a
special token such as `<|im_start|>` before its end) becomes an error result
the model can read, an optional penalty, and an entry in the step's info; it
never raises. Observation text never carries special-token text: a tool
result or an error that quotes the model is defanged (`< |im_end|>`), so an
echoed name cannot forge a turn boundary when the template encodes it.

With `tools=()` and `max_steps=1` the same class is the single-step task.
"""
import json

from r1.envs.base import Action, Env, Observation
from r1.envs.tools import get_tool, validate_arguments

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ERROR_KINDS = ("empty_response", "special_token", "unclosed_tag", "bad_json", "bad_call", "unknown_tool",
               "bad_arguments", "too_many_calls", "tool_error")


def parse_tool_calls(text: str, max_calls: int = 8):
    """Text -> (calls [(name, arguments)], errors [(kind, message)]). Never raises."""
    calls, errors, pos = [], [], 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            errors.append(("unclosed_tag", f"{OPEN} without {CLOSE}"))
            break
        body = text[start + len(OPEN):end].strip()
        pos = end + len(CLOSE)
        if len(calls) + len(errors) >= max_calls:
            errors.append(("too_many_calls", f"more than {max_calls} tool calls in one turn; the rest were ignored"))
            break
        try:
            call = json.loads(body)
        except (ValueError, RecursionError) as e:  # ValueError also covers ints beyond Python's 4300-digit limit
            errors.append(("bad_json", f"tool call is not valid JSON ({str(e)[:80]})"))
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append(("bad_call", 'a tool call must be {"name": ..., "arguments": {...}}'))
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):  # some models emit arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                errors.append(("bad_json", f"arguments of {call['name'][:40]!r} are not valid JSON"))
                continue
        calls.append((call["name"], args))
    return calls, errors


class ToolEnv(Env):
    def __init__(self, tokenizer, make_prompt, score, tools=("calculator",), max_steps: int = 4,
                 malformed_penalty: float = 0.0, max_calls: int = 8, **context):
        super().__init__(tokenizer, **context)
        self.make_prompt, self.score = make_prompt, score
        self.tool_fns = {name: get_tool(name) for name in tools}
        self.tools = [t.schema for t in self.tool_fns.values()]
        self.max_steps, self.penalty, self.max_calls = max_steps, malformed_penalty, max_calls
        self.specials = sorted(getattr(tokenizer, "special_tokens", ()), key=len, reverse=True)
        self.stop_texts = [tokenizer.decode([i]) for i in getattr(tokenizer, "stop_ids", ())]

    def reset(self, sample) -> Observation:
        self.sample, self.t = sample, 0
        return Observation(messages=self.make_prompt(sample, tools=bool(self.tools)))

    def step(self, action: Action):
        self.t += 1
        calls, errors = parse_tool_calls(action.text, self.max_calls) if self.tools else ([], [])
        if self.tools:
            errors = self.reply_errors(action.text) + errors
        info = {"tool_calls": len(calls), "errors": [k for k, _ in errors], "final": False}
        if not calls and not errors:
            info["final"] = True
            return None, float(self.score(action.text, self.sample["answer"])), True, info
        results = []
        for name, args in calls:
            tool = self.tool_fns.get(name)
            if tool is None:
                info["errors"].append("unknown_tool")
                text = f"error: unknown tool {name[:40]!r}; available: {', '.join(self.tool_fns)}"
            elif (problem := validate_arguments(tool.schema["function"]["parameters"], args)) is not None:
                info["errors"].append("bad_arguments")
                text = f"error: {problem}"
            else:
                out = tool(args)
                if not out.ok:
                    info["errors"].append("tool_error")
                text = out.text
            results.append({"role": "tool", "name": self.defang(name[:40]), "content": self.defang(text)})
        for kind, message in errors:
            results.append({"role": "tool", "name": "error", "content": self.defang(f"error ({kind}): {message}")})
        reward = self.penalty if info["errors"] else 0.0
        if self.t >= self.max_steps:
            info["reason"] = "max_steps"
            return None, reward, True, info
        return Observation(messages=results), reward, False, info

    def reply_errors(self, text: str) -> list:
        """[(kind, message)] for a reply that is empty or holds a special token before its end."""
        body = text.rstrip()
        # The one stop token that ended the turn is how a reply ends, not an error; a second one is.
        end = next((s for s in self.stop_texts if s and body.endswith(s)), "")
        body = body[: len(body) - len(end)]
        if not body.strip():
            return [("empty_response", "the reply is empty; call a tool or write the final answer")]
        found = next((s for s in self.specials if s in body), None)
        if found is not None:
            return [("special_token", f"the reply contains the special token {found!r} before its end; "
                                      "special tokens only end a turn")]
        return []

    def defang(self, text: str) -> str:
        """Text with every special-token string split by a space, so encoding it gives plain tokens."""
        for s in self.specials:
            text = text.replace(s, s[:1] + " " + s[1:])
        return text


def make_env(cfg, tokenizer):
    """The env factory for a config's task (used by the trainer and eval.py)."""
    from r1.tasks import gsm8k

    task = cfg.data.task
    tools = tuple(cfg.env.tools) if task in ("gsm8k_tool", "synthetic") else ()
    return lambda: ToolEnv(tokenizer, gsm8k.make_prompt, gsm8k.score, tools=tools,
                           max_steps=cfg.env.max_steps if tools else 1, malformed_penalty=cfg.env.malformed_penalty,
                           max_context=cfg.env.max_context, max_new_tokens=cfg.rollout.max_new_tokens,
                           policy=cfg.env.context_policy)

