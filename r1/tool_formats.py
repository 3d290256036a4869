"""Tool-call formats: how a model writes a call, parsed out of its sampled text, one per template family.

  * hermes:  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Qwen3 and the fallback
             r1/tokenizer.py renders for templates without tools, SmolLM2's);
  * llama3:  the reply is `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; results
             come back under the template's `ipython` role (Llama 3.1-3.3);
  * mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`, or the newer
             `[TOOL_CALLS]name[ARGS]{...}`; results must carry the call's 9-character id.
`choose` picks the format from the chat template (or the env.tool_format override). A parser never
raises: a malformed call becomes an (error kind, message) pair the environment shows the model. Only
parsing lives here; the sampled ids themselves are never re-encoded (README, token-exact steps).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from r1.registry import Registry

MAX_CALL_CHARS = 16_384  # one call's JSON; a calculator call is tens of characters


class Call(tuple):
    """A parsed call: the pair (name, arguments), plus the id the model gave it (Mistral) as `.id`."""

    def __new__(cls, name: str, arguments: dict, id: str | None = None):
        call = super().__new__(cls, (name, arguments))
        call.id = id
        return call


@dataclass(frozen=True)
class ToolFormat:
    name: str
    parse: Callable[[str, int], tuple]
    """(sampled text, max_calls) -> (calls [Call], errors [(kind, message)]); never raises."""
    detect: Callable[[str], bool]
    """A chat template's source -> whether its model writes calls this way."""
    result: Callable[[Call | None, str, str], dict] = lambda call, name, content: {
        "role": "tool", "name": name, "content": content}
    """(the call answered or None for an error, tool name, text) -> the tool message the template renders."""
    markers: tuple = ()
    """Special tokens this format writes inside a reply (a reply's other special tokens are an error)."""


BAD = object()  # what the helpers below return for text that is not JSON (JSON's null is None)


def _arguments(name: str, args, errors: list):
    """A call's arguments (a JSON string is decoded, as some models write them; the env checks the rest), or
    BAD after appending the error."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            errors.append(("bad_json", f"arguments of {name[:40]!r} are not valid JSON"))
            return BAD
    return args


def _call(obj, key: str, errors: list, with_id: bool = False):
    """A decoded JSON object -> Call, or None after appending the error."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        errors.append(("bad_call", f'a tool call must be {{"name": ..., "{key}": {{...}}}}'))
        return None
    args = _arguments(obj["name"], obj.get(key, obj.get("arguments", {})), errors)
    if args is BAD:
        return None
    return Call(obj["name"], args, obj.get("id") if with_id and isinstance(obj.get("id"), str) else None)


def _loads(body: str, errors: list):
    """json.loads that appends an error instead of raising (BAD on failure)."""
    if len(body) > MAX_CALL_CHARS:
        errors.append(("bad_json", f"tool call is {len(body)} characters long; at most {MAX_CALL_CHARS}"))
        return BAD
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # ValueError also covers ints beyond Python's 4300-digit limit
        errors.append(("bad_json", f"tool call is not valid JSON ({str(e)[:80]})"))
        return BAD


def parse_hermes(text: str, max_calls: int = 8):
    """Every `<tool_call>...</tool_call>` in the text. Linear in len(text): each tag is found once from
    where the last one ended, at most max_calls bodies are parsed, a body over MAX_CALL_CHARS is refused."""
    open_, close = "<tool_call>", "</tool_call>"
    calls, errors, pos = [], [], 0
    while True:
        start = text.find(open_, pos)
        if start < 0:
            break
        end = text.find(close, start + len(open_))
        if end < 0:
            errors.append(("unclosed_tag", f"{open_} without {close}"))
            break
        body = text[start + len(open_):end].strip()
        pos = end + len(close)
        if len(calls) + len(errors) >= max_calls:
            errors.append(("too_many_calls", f"more than {max_calls} tool calls in one turn; the rest were ignored"))
            break
        call = _loads(body, errors)
        call = None if call is BAD else _call(call, "arguments", errors)
        if call is not None:
            calls.append(call)
    return calls, errors


def _json_objects(text: str, max_calls: int, errors: list, separators: str = "; \n\t\r,"):
    """Consecutive JSON values in the text (separated by any of `separators`) -> list; stops at the first
    undecodable one with a bad_json error, or after max_calls with too_many_calls."""
    decoder, out, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        if pos >= len(text):
            return out
        if len(out) >= max_calls:
            errors.append(("too_many_calls", f"more than {max_calls} tool calls in one turn; the rest were ignored"))
            return out
        try:
            value, end = decoder.raw_decode(text[:pos + MAX_CALL_CHARS], pos)
        except (ValueError, RecursionError) as e:
            errors.append(("bad_json", f"tool call is not valid JSON ({str(e)[:80]})"))
            return out
        out.append(value)
        pos = end


def parse_llama3(text: str, max_calls: int = 8, stops=("<|eot_id|>", "<|eom_id|>")):
    """A reply that is a JSON call (or calls separated by ';'), optionally after <|python_tag|>. A reply that
    does not open with `{` (or the tag) is an answer, not a call."""
    body = text.strip()
    for stop in stops:
        body = body.removesuffix(stop).rstrip()
    tagged = body.startswith("<|python_tag|>")
    body = body.removeprefix("<|python_tag|>").strip()
    if not (tagged or body.startswith("{")):
        return [], []
    errors: list = []
    calls = [c for obj in _json_objects(body, max_calls, errors)
             if (c := _call(obj, "parameters", errors)) is not None]
    if not calls and not errors:
        errors.append(("bad_call", 'a tool call must be {"name": ..., "parameters": {...}}'))
    return calls, errors


MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
MISTRAL_ERROR_ID = "r1error00"  # what an error result answers: Mistral's templates want a 9-character id on each


def parse_mistral(text: str, max_calls: int = 8):
    """After each `[TOOL_CALLS]`: a JSON list of calls (v3 tokenizers), or `name[ARGS]{json}` (newer ones,
    `[CALL_ID]id` allowed before `[ARGS]`). Text after a call's JSON is ignored."""
    calls, errors, found = [], [], []
    for part in text.split("[TOOL_CALLS]")[1:]:
        part = part.strip()
        if part.startswith("["):
            value = _first_json(part, errors)
            found += [(obj, None) for obj in (value if isinstance(value, list) else [] if value is BAD else [value])]
            continue
        name, sep, args = part.partition("[ARGS]")
        if not sep:
            errors.append(("bad_call", "[TOOL_CALLS] must be followed by a JSON list of calls or name[ARGS]{...}"))
            continue
        name, _, call_id = name.partition("[CALL_ID]")
        value = _first_json(args.strip(), errors)
        if value is not BAD:
            found.append(({"name": name.strip(), "arguments": value}, call_id.strip() or None))
    for obj, call_id in found:
        if len(calls) >= max_calls:
            errors.append(("too_many_calls", f"more than {max_calls} tool calls in one turn; the rest were ignored"))
            break
        call = _call(obj, "arguments", errors, with_id=True)
        if call is not None:
            calls.append(Call(call[0], call[1], call_id or call.id))
    return calls, errors


def _first_json(text: str, errors: list):
    """The JSON value at the start of the text (what follows it is left alone), or BAD after an error."""
    try:
        return json.JSONDecoder().raw_decode(text[:MAX_CALL_CHARS])[0]
    except (ValueError, RecursionError) as e:
        errors.append(("bad_json", f"tool call is not valid JSON ({str(e)[:80]})"))
        return BAD


def _mistral_result(call, name, content) -> dict:
    """Mistral's templates refuse a result without the 9-character id of the call it answers."""
    call_id = call.id if call is not None and call.id and MISTRAL_ID.fullmatch(call.id) else MISTRAL_ERROR_ID
    return {"role": "tool", "name": name, "content": content, "tool_call_id": call_id}


FORMATS = Registry("tool-call format", kind=ToolFormat)


def register(fmt: ToolFormat, replace: bool = False) -> ToolFormat:
    """Add a format under its name; another format of that name is an error unless replace=True."""
    return FORMATS.register(fmt.name, fmt, replace=replace)


def get(name: str) -> ToolFormat:
    if name not in FORMATS:
        raise ValueError(f"env.tool_format: unknown tool-call format {name!r}; known: {', '.join(FORMATS)}, or auto")
    return FORMATS[name]


def choose(tokenizer, override: str = "auto") -> ToolFormat:
    """The format of the tokenizer's chat template (the first registered one whose detect() matches), or the
    override. A template with no tool support gets hermes, the convention r1/tokenizer.py renders for it; one
    that renders tools in a format no parser knows is an error naming the override key."""
    if override != "auto":
        return get(override)
    template = getattr(getattr(tokenizer, "hf", None), "chat_template", None)
    if not isinstance(template, str):
        return FORMATS["hermes"]
    for fmt in FORMATS.values():
        if fmt.detect(template):
            return fmt
    if getattr(tokenizer, "_native_tools", lambda: False)():
        raise ValueError(f"the chat template of {getattr(tokenizer, 'name', 'the tokenizer')} renders tool calls in a "
                         f"format r1 has no parser for; set env.tool_format to one of {', '.join(FORMATS)}")
    return FORMATS["hermes"]


register(ToolFormat("mistral", parse_mistral, lambda t: "[TOOL_CALLS]" in t, _mistral_result,
                    markers=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")))
register(ToolFormat("llama3", parse_llama3, lambda t: "<|python_tag|>" in t or ("ipython" in t and '"parameters"' in t),
                    markers=("<|python_tag|>",)))
register(ToolFormat("hermes", parse_hermes, lambda t: "<tool_call>" in t))
