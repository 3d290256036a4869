"""Tokenizer and chat rendering to token ids, whole conversations and one turn at a time.

The step-level MDP never re-tokenizes what the model sampled: a conversation grows as ids (the sampled
response, the forced ids that close the turn, `close_turn_ids`, then the next turns rendered alone,
`render_next`), and this module makes those pieces agree with the chat template token for token:
`render(prefix) + render_next(new) == render(prefix + new)`. `render_next` renders a dummy user and
assistant turn before the new messages and keeps what follows the dummy turn's closing text; the
boundary must touch a special token, so no BPE merge crosses it. Tools: a template that renders tool
schemas, calls and `tool` messages itself (Qwen, Llama 3, Mistral) is used as is; otherwise the Hermes
convention is written as plain messages (`_hermes_messages`). Parsing calls out of sampled text is
r1/tool_formats.py's. Special-token text inside message content is marked (`mark_literals`) and encoded
as plain text, so content can never forge a turn; `model.thinking` sets Qwen3's `enable_thinking`.
GGUF tokenizers come from r1/gguf_tokenizer.py (converted once, cached, special tokens fixed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from r1.bounded import check_file, inside, read_json
from r1.gguf_tokenizer import gguf_tokenizer
from r1.weights import gguf_header, resolve

ROLES = ("system", "user", "assistant", "tool")
# Markers for the dummy turns and the tool-support probe: strings no real conversation contains.
DUMMY_USER = "r1-dummy-user-8f3c"
DUMMY_ASSISTANT = "r1-dummy-assistant-5b1e"
PROBE = {"tool": "r1_probe_tool_2d7a", "call": "r1_probe_call_9e41", "arg": "r1-probe-arg-77c0",
         "result": "r1-probe-result-0a6d"}
PROBE_ID = "r1probe01"

PIECE_CACHE_MIN = 512  # characters: texts and pieces shorter than this are encoded as they come
PIECE_CACHE_SIZE = 256  # pieces kept (cleared when full)
NEXT_CACHE_SIZE = 4096  # render_next results kept (cleared when full)


def _added_token_splitter(hf):
    """(regex splitting a text at added tokens, leftmost-longest as the tokenizer matches them, and each
    added token's id), or None where a piece's ids could depend on where it sits: added tokens that strip,
    match single words or match after normalisation; a normaliser; a pre-tokenizer that treats the text's
    start apart (Metaspace prepend_scheme "first": "▁" before the first piece only); truncation or padding
    set on the backend. Then a probe must encode alike both ways; otherwise texts are encoded whole."""
    backend = getattr(hf, "backend_tokenizer", None)
    added = list(getattr(hf, "added_tokens_decoder", {}).items())
    if backend is None or not added or backend.truncation is not None or backend.padding is not None:
        return None
    if backend.normalizer is not None and str(backend.normalizer) != "Sequence(normalizers=[])":
        return None
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for _, t in added):
        return None
    if '"Metaspace"' in backend.to_str() and '"prepend_scheme":"always"' not in backend.to_str().replace(" ", ""):
        return None
    token_ids = {t.content: i for i, t in added}
    pattern = re.compile("(" + "|".join(re.escape(c) for c in sorted(token_ids, key=len, reverse=True)) + ")")
    for t in list(token_ids)[:8]:  # a probe: pieces before, between and after added tokens, spaces at the edges
        probe = f"a b{t} x\n y{t}{t}z "
        parts = [p for p in pattern.split(probe) if p]
        split = [i for p in parts
                 for i in ([token_ids[p]] if p in token_ids else backend.encode(p, add_special_tokens=False).ids)]
        if split != hf.encode(probe, add_special_tokens=False):
            return None
    return pattern, token_ids


# A special-token string from message content, marked: LIT_OPEN + its index in ChatTokenizer.literals + LIT_CLOSE;
# a LIT_OPEN of the content itself: LIT_OPEN + "e" + LIT_CLOSE (so every LIT_OPEN in marked text starts a mark).
LIT_OPEN, LIT_CLOSE = "\ue000", "\ue001"
LIT_ESCAPE = LIT_OPEN + "e" + LIT_CLOSE
_LIT_RE = re.compile(LIT_OPEN + r"(\d{1,4}|e)" + LIT_CLOSE)

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def load_tokenizer(path_or_name, thinking: bool | None = None) -> "ChatTokenizer":
    """An HF folder, a .gguf file or a short model name -> ChatTokenizer (cached per path and switch).

    thinking: Qwen3's chat-template switch `enable_thinking` (model.thinking); None leaves the template's
    default. A template without that switch is an error, not a silently ignored setting."""
    tok = _load(str(resolve(path_or_name).resolve()), thinking)
    if thinking is not None and "enable_thinking" not in (tok.hf.chat_template or ""):
        raise ValueError(f"model.thinking={str(thinking).lower()}: the chat template of {path_or_name} has no "
                         f"enable_thinking switch (Qwen3's); leave model.thinking unset")
    return tok


# The files transformers reads from a tokenizer folder. Each is checked before it does (regular, inside the
# folder, at most MAX_TOKENIZER_FILE bytes): a FIFO named tokenizer.json would block it forever. The largest
# real ones are tens of MB (Qwen2.5's tokenizer.json 7 MB, Gemma's about 33 MB), so 128 MiB.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
                   "chat_template.json", "config.json", "generation_config.json")
MAX_TOKENIZER_FILE = 128 << 20


@lru_cache(maxsize=None)
def _load(path: str, thinking: bool | None = None) -> "ChatTokenizer":
    from transformers import AutoTokenizer

    p = Path(path)
    if p.suffix == ".gguf":
        header = gguf_header(p)  # a damaged header or tokenizer array is one line here, not a numpy error
        tok = ChatTokenizer(gguf_tokenizer(p, header), path, thinking=thinking)
        embedding = header["tensors"].get("token_embd.weight")
        if embedding:  # GGUF dims are innermost first: (hidden, vocab)
            check_vocab(tok, int(embedding[0][-1]), path)
        return tok
    if not p.is_dir():
        raise ValueError(f"expected an HF tokenizer folder or a .gguf file, got {p}")
    for name in TOKENIZER_FILES:
        if os.path.lexists(p / name):
            check_file(inside(p, name, path, "tokenizer file"), MAX_TOKENIZER_FILE, "tokenizer file")
    hf = AutoTokenizer.from_pretrained(path)
    extra = []
    generation = p / "generation_config.json"
    if generation.is_file():  # e.g. Qwen2.5 stops on <|endoftext|> as well as <|im_end|>
        eos = read_json(generation, MAX_TOKENIZER_FILE, "generation config")
        eos = eos.get("eos_token_id") if isinstance(eos, dict) else None
        extra = [eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)]
    return ChatTokenizer(hf, path, extra_stop_ids=extra, thinking=thinking)


def check_vocab(tok: "ChatTokenizer", vocab_size: int, model, own: bool = False) -> None:
    """Every id the tokenizer can produce must have a row in the model's embedding, or the first prompt that
    holds one ends the run with an IndexError inside the first rollout. Called where a tokenizer meets its
    model: for a .gguf (the file holds both) when the tokenizer loads, and where a run builds its
    model (r1/run.py build_model), whether the tokenizer is the model folder's own or model.tokenizer's.
    `own`: the tokenizer is the model folder's own (the message then names the folder)."""
    n = max(len(tok.hf), 1 + max(tok.hf.added_tokens_decoder, default=-1))
    if n <= vocab_size:
        return
    if own:
        raise ValueError(f"model folder {model} holds a tokenizer with {n} token ids but its embedding has "
                         f"{vocab_size} rows (vocab_size in its config.json): ids {vocab_size}..{n - 1} would fail in "
                         f"the first rollout")
    raise ValueError(f"tokenizer {tok.name} has {n} token ids but the model {model} has {vocab_size} embedding "
                     f"rows: ids {vocab_size}..{n - 1} would fail in the first rollout; use the model's own "
                     f"tokenizer or one of at most {vocab_size} ids")


class ChatTokenizer:
    """An HF tokenizer plus exact, incremental chat rendering to ids."""

    def __init__(self, hf, name: str, extra_stop_ids=(), thinking: bool | None = None):
        self.hf = hf
        self.name = name  # the path, for error messages
        # chat-template variables every render passes: Qwen3's enable_thinking (load_tokenizer's `thinking`)
        self.template_vars = {} if thinking is None else {"enable_thinking": bool(thinking)}
        self._split = _added_token_splitter(hf)  # None: encode whole texts (always exact)
        self._pieces: dict = {}  # long text between added tokens -> its ids (a system prompt with tools)
        self.eos_id: int = hf.eos_token_id
        self.pad_id: int = hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id
        self._closes: dict = {}  # tools (as JSON) -> the template's closing text: one render, not one per turn
        self._next: dict = {}  # [new messages, tools, add_generation_prompt] as JSON -> render_next's ids
        self._close_ids = None  # encode(_close_text()), for close_turn_ids
        special = {i: t.content for i, t in hf.added_tokens_decoder.items() if t.special}
        self.special_tokens = set(special.values())
        self.literals = sorted(self.special_tokens, key=len, reverse=True)  # longest first: none hides another
        self._fingerprint = None
        stops = {self.eos_id, *extra_stop_ids}
        if hf.chat_template is not None:  # the end-of-turn token(s) the template closes turns with
            stops |= {i for i in self.encode(self._close_text()) if i in special}
        self.stop_ids: list[int] = sorted(i for i in stops if i is not None)
        self._native = None  # does the template render tools itself? probed on first use

    def encode(self, text: str) -> list[int]:
        """Text -> ids, no BOS/EOS added. Special-token text (`<|im_end|>`) becomes that token, except where
        render_text marked it as content: then it is the plain tokens of its text. A marked U+E000 of the
        content goes back into the text around it, which is encoded whole (as the tokenizer would)."""
        if LIT_OPEN not in text:
            return self._encode(text)
        out, plain = [], []
        for i, piece in enumerate(_LIT_RE.split(text)):
            if i % 2 == 0:
                plain.append(piece)
            elif piece == "e":
                plain.append(LIT_OPEN)
            elif int(piece) < len(self.literals):
                if any(plain):
                    out += self._encode("".join(plain))
                plain = []
                out += self.hf.encode(self.literals[int(piece)], add_special_tokens=False, split_special_tokens=True)
            else:
                plain.append(LIT_OPEN + piece + LIT_CLOSE)
        if any(plain):
            out += self._encode("".join(plain))
        return out

    def _encode(self, text: str) -> list[int]:
        """hf.encode(text, add_special_tokens=False), id for id, reusing the ids of long pieces seen before.

        The tokenizer splits a text at its added tokens before anything else runs, then encodes each
        piece alone; so the ids of a piece do not depend on its neighbours, and the long system prompt
        every episode of a task starts with (its tool schemas) is encoded once. Short texts take the
        same path, skipping transformers' batch machinery (encode_batch). Only for
        tokenizers where that split is all that added tokens do (_added_token_splitter);
        tests/test_tokenizer.py checks it against hf.encode."""
        if self._split is None:
            return self.hf.encode(text, add_special_tokens=False)
        pattern, token_ids = self._split
        parts = [p for p in pattern.split(text) if p]
        out, encode = [], self.hf.backend_tokenizer.encode  # not encode_batch: its thread pool costs per call
        for p in parts:
            if p in token_ids:
                out.append(token_ids[p])
                continue
            ids = self._pieces.get(p)
            if ids is None:
                ids = encode(p, add_special_tokens=False).ids
                if len(p) >= PIECE_CACHE_MIN:
                    if len(self._pieces) >= PIECE_CACHE_SIZE:
                        self._pieces.clear()
                    self._pieces[p] = ids
            out += ids
        return out

    def mark_literals(self, text: str) -> str:
        """Content text with every special-token string marked as literal text, and every U+E000 marked as
        itself. `encode` turns a marked string into the plain tokens of its text (`split_special_tokens`) and
        puts a marked U+E000 back into the text around it, so content reaches the model as written."""
        if LIT_OPEN in text:
            text = text.replace(LIT_OPEN, LIT_ESCAPE)
        for k, t in enumerate(self.literals):
            if t in text:
                text = text.replace(t, f"{LIT_OPEN}{k}{LIT_CLOSE}")
        return text

    def fingerprint(self) -> dict:
        """What identifies this tokenizer's ids: name, vocabulary size and a sha256 of the vocabulary."""
        if self._fingerprint is None:
            vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
            digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
            self._fingerprint = {"name": Path(self.name).name, "vocab_size": len(self.hf), "sha256": digest}
        return self._fingerprint

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render(self, messages, tools=None, add_generation_prompt=True) -> list[int]:
        """A whole OpenAI-style conversation -> ids, through the model's chat template."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt))

    def render_text(self, messages, tools=None, add_generation_prompt=True) -> str:
        messages, tools = _normalize_messages(messages), _normalize_tools(tools)
        if self.hf.chat_template is None:
            raise ValueError(f"tokenizer {self.name} has no chat template")
        uses_tools = bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
        if uses_tools and not self._native_tools():
            messages, tools = _hermes_messages(messages, tools), None
        messages = [{**m, "content": self.mark_literals(m["content"])} for m in messages]
        return self.hf.apply_chat_template(messages, tools=tools or None, tokenize=False, **self.template_vars,
                                           add_generation_prompt=add_generation_prompt)

    def render_next(self, new_messages, tools=None, add_generation_prompt=True) -> list[int]:
        """Ids of the next turn(s), to append after held ids that end with a closed assistant turn.

        "Closed" means the sampled response ids followed by `close_turn_ids(response)`.

        Memoised: an environment's observations repeat (a calculator's results are mostly numbers seen
        before), and the chat template and encoding are most of an environment step's host time
        (docs/decisions.md, "The agent loop's chunks"). The ids depend only on the key.
        """
        new_messages = _normalize_messages(new_messages)
        try:  # key order kept (a template may render arguments or schemas in their order); no default=
            key = json.dumps([new_messages, tools, bool(add_generation_prompt)])
        except (TypeError, ValueError):  # values JSON cannot hold: render without the memo
            return self._render_next(new_messages, tools, add_generation_prompt)
        ids = self._next.get(key)
        if ids is None:
            ids = tuple(self._render_next(new_messages, tools, add_generation_prompt))
            if len(self._next) >= NEXT_CACHE_SIZE:
                self._next.clear()
            self._next[key] = ids
        return list(ids)

    def _render_next(self, new_messages, tools, add_generation_prompt) -> list[int]:
        dummy = [{"role": "user", "content": DUMMY_USER}, {"role": "assistant", "content": DUMMY_ASSISTANT}]
        close = self._close_text(tools)
        full = self.render_text(dummy + new_messages, tools, add_generation_prompt)
        anchor = DUMMY_ASSISTANT + close
        at = full.find(anchor)
        if at < 0:
            raise ValueError(f"chat template of {self.name} is not append-only: an assistant turn followed by "
                             f"{[m['role'] for m in new_messages]} no longer ends with {close!r}")
        suffix = full[at + len(anchor):]
        if suffix and not (_ends_with_any(close, self.special_tokens) or _starts_with_any(suffix, self.special_tokens)):
            raise ValueError(f"chat template of {self.name}: no special token at the turn boundary "
                             f"({close!r} | {suffix[:20]!r}), so encoding the next turn alone could merge across it")
        return self.encode(suffix)

    def close_turn_ids(self, response_ids) -> list[int]:
        """Forced ids that finish an assistant turn after `response_ids` (loss mask 0).

        The template's closing text (`<|im_end|>\\n` for ChatML) minus whatever part of it the
        response already ends with: all of it after a stop string like `</tool_call>`, just the
        `\\n` after a sampled `<|im_end|>`, nothing when the whole closing text is there.
        """
        if self._close_ids is None:
            self._close_ids = self.encode(self._close_text())
        close = self._close_ids
        response = list(response_ids)
        for k in range(min(len(close), len(response)), 0, -1):
            if response[-k:] == close[:k]:
                return close[k:]
        return close

    def _close_text(self, tools=None) -> str:
        """What the template writes after an assistant message's content (cached per tool list)."""
        key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
        close = self._closes.get(key)
        if close is None:
            dummy = [{"role": "user", "content": DUMMY_USER}, {"role": "assistant", "content": DUMMY_ASSISTANT}]
            text = self.render_text(dummy, tools, add_generation_prompt=False)
            if text.count(DUMMY_ASSISTANT) != 1:
                raise ValueError(f"chat template of {self.name} does not render assistant content verbatim")
            close = self._closes[key] = text.split(DUMMY_ASSISTANT)[1]
        return close

    def _native_tools(self) -> bool:
        if self._native is None:
            schema = {"type": "function", "function": {"name": PROBE["tool"], "description": "probe",
                                                       "parameters": {"type": "object", "properties": {}}}}
            # ids of 9 letters and digits: Mistral's templates refuse a call or result without one
            call = {"type": "function", "id": PROBE_ID,
                    "function": {"name": PROBE["call"], "arguments": {"x": PROBE["arg"]}}}
            probe = [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "content": PROBE["result"], "tool_call_id": PROBE_ID}]
            try:
                text = self.hf.apply_chat_template(probe, tools=[schema], tokenize=False)
            except Exception:  # a template that chokes on tools/tool_calls does not support them
                text = ""
            self._native = all(marker in text for marker in PROBE.values())
        return self._native


def _normalize_messages(messages) -> list[dict]:
    """Check an OpenAI-style message list; copies with tool-call arguments as dicts, content as str."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"message {i}: expected a dict with role in {ROLES}, got {m!r:.80}")
        m = dict(m)
        if m.get("content") is None and m["role"] == "assistant" and m.get("tool_calls"):
            m["content"] = ""
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} ({m['role']}): content must be a string, got {m.get('content')!r:.80}")
        if m.get("tool_calls"):
            if m["role"] != "assistant":
                raise ValueError(f"message {i} ({m['role']}): only assistant messages have tool_calls")
            m["tool_calls"] = [_normalize_call(call, f"message {i} tool call {j}") for j, call in enumerate(m["tool_calls"])]
        out.append(m)
    return out


def _normalize_call(call, where: str) -> dict:
    """{"function": {"name", "arguments"}} or {"name", "arguments"} -> OpenAI form, arguments a dict."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"{where}: expected {{'function': {{'name': str, 'arguments': dict}}}}, got {call!r:.80}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: arguments are not valid JSON ({e}): {arguments!r:.80}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}: arguments must be a JSON object, got {arguments!r:.80}")
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if "id" in call:
        out["id"] = call["id"]
    return out


def _normalize_tools(tools) -> list[dict]:
    """OpenAI tool schemas, or bare function schemas, -> [{"type": "function", "function": {...}}]."""
    out = []
    for i, tool in enumerate(tools or []):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"tool {i}: expected an OpenAI function schema with a 'name', got {tool!r:.80}")
        out.append({"type": "function", "function": function})
    return out


def hermes_messages(messages, tools=None) -> list[dict]:
    """A conversation with tool schemas, calls and results as the plain system/user/assistant messages
    that a template without tool support renders (the Hermes convention, _hermes_messages); for a
    peer that must see our exact prompts through its own chat template (bench/peer_trl.py)."""
    return _hermes_messages(_normalize_messages(messages), _normalize_tools(tools))


def _hermes_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Tool schemas, calls and results as plain system/user/assistant text, the Hermes / Qwen2.5 convention:
    the schemas go into the system message after its content, inside `<tools></tools>` with the instruction
    to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (with no system message, the
    system turn holds only that block); an assistant call becomes `<tool_call>\\n{json}\\n</tool_call>` after
    its content; consecutive `tool` messages become one `user` turn of `<tool_response>` blocks."""
    out, tool_turn = [], False  # tool_turn: out[-1] is a user turn made of tool responses
    if tools:
        block = TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": messages[0]["content"] + "\n\n" + block})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": block})
    for m in messages:
        if m["role"] == "tool":
            response = f"<tool_response>\n{m['content']}\n</tool_response>"
            if tool_turn:
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
            tool_turn = True
            continue
        tool_turn = False
        content = m["content"]
        if m.get("tool_calls"):
            calls = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                ensure_ascii=False) for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + [f"<tool_call>\n{c}\n</tool_call>" for c in calls])
        out.append({"role": m["role"], "content": content})
    return out


def _ends_with_any(text: str, tokens) -> bool:
    return any(text.endswith(t) for t in tokens)


def _starts_with_any(text: str, tokens) -> bool:
    return any(text.startswith(t) for t in tokens)
