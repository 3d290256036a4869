"""The command-line assistant task: answer questions about a folder of files with shell commands.

A row is a generated folder tree and a request about it in plain language ("How many lines does
notes/todo.txt have?"), with the ground truth computed from the tree in memory. Each episode materialises
the tree in a fresh temporary folder, offers the `shell` tool bound to an `r1.envs.sandbox.Sandbox` over
it, and removes the folder when the episode ends (a `weakref.finalize` is the backstop for episodes cut
short), on a background thread (`remove_later`; `drain()` waits): env steps run on the rollout loop's
thread, which must not wait for a disk. Rows are drawn from an RNG keyed by "cli:<seed>:<level>:<i>",
the same on every machine whatever the split size; levels 1-3 grow the trees and the requests.
The model ends with `#### <answer>` (a number, a path, or comma-separated paths); `score` compares
numbers as integers and paths as sets. The scripted expert (`expert_messages`) solves each kind in a real
sandbox; tests check it equals the ground truth for every kind and level. docs/cli_task.md has the rest.
"""
import os
import random
import re
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from r1.envs.sandbox import MAX_OUTPUT, SHELL, Sandbox, shell_tool
from r1.envs.rewards import Reward, register_reward, well_formed
from r1.envs.tool_env import ToolEnv

MAX_LEVEL = 3
BASE_TIME = 1_704_067_200  # 2024-01-01 00:00 UTC: trees are dated in 2024
TEST_SEED_OFFSET = 1_000_003

SYSTEM_PROMPT = (
    "You are a command-line assistant. The user's files are in /sandbox, your working directory. Use the "
    "shell tool to run one read-only command at a time: ls, find, grep, wc, head, tail, cat, file, du, sort, "
    "uniq, pwd, echo, and pipes between them with |. There is no cd, no ; or &&, no redirection, and nothing "
    "can be changed. Read the output, then write the final answer on the last line as '#### <answer>': a "
    "number, a path, or several paths separated by commas, relative to /sandbox (for example "
    "'#### logs/app.log')."
)

TOP = {  # folder -> file kinds it holds
    "Downloads": ("pdf", "zip", "jpg", "txt"),
    "Documents": ("txt", "md", "csv", "pdf"),
    "notes": ("txt", "md"),
    "logs": ("log",),
    "photos": ("jpg", "png"),
    "reports": ("csv", "pdf", "txt"),
}
SUB = {"Downloads": ("old", "invoices", "installers"), "Documents": ("work", "personal", "taxes"),
       "notes": ("archive", "ideas", "meetings"), "logs": ("archive", "nginx", "worker"),
       "photos": ("2023", "trip", "family"), "reports": ("q1", "q2", "drafts")}
DEEP = ("old", "misc", "backup", "2022", "final")
STEMS = {
    "pdf": ("invoice", "manual", "ticket", "paper", "receipt", "contract", "statement", "guide"),
    "zip": ("backup", "photos", "project", "fonts", "archive"),
    "jpg": ("IMG", "photo", "scan", "beach", "portrait"),
    "png": ("screenshot", "diagram", "logo", "chart"),
    "txt": ("todo", "readme", "shopping", "ideas", "letter", "draft", "notes", "plan"),
    "md": ("journal", "meeting", "recipes", "books", "goals"),
    "csv": ("budget", "sales", "contacts", "expenses", "inventory"),
    "log": ("app", "error", "access", "worker", "backup", "sync"),
}
TEXT_KINDS = ("txt", "md", "csv", "log")
WORDS = ("apple", "river", "meeting", "garden", "window", "letter", "coffee", "travel", "budget", "friday",
         "paper", "green", "market", "train", "orange", "summer", "music", "office", "bridge", "table",
         "simple", "quiet", "yellow", "phone", "dinner", "morning", "ticket", "street", "winter", "camera",
         "silver", "pencil", "forest", "planet", "island", "doctor", "plan", "call", "buy", "send", "check",
         "fix", "read", "write", "clean", "book", "pay", "visit", "update", "review")
PLANTED = ("zanzibar", "quokka", "marzipan", "obsidian", "kumquat", "zeppelin", "gazebo", "narwhal",
           "tamarind", "xylophone", "juniper", "origami", "saffron", "walrus", "paprika", "vortex")
LOG_LEVELS = ("INFO", "INFO", "INFO", "WARN", "WARN", "ERROR")
COMPONENTS = ("db", "http", "cache", "auth", "queue", "disk")
MAGIC = {"jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
         "zip": b"PK\x03\x04\x14\x00\x00\x00\x08\x00"}


# ================================================================ trees


# Levels: 1 = one folder level (no subfolders), 2 = subfolders (requests about "under X" search
# recursively; adds total_size), 3 = deeper and larger trees and a two-step request (the line count of the
# largest file in a folder). Request kinds: list_ext, count_lines, largest, newest, count_files,
# find_word, count_matches, total_size (L>=2), lines_of_largest (L3). The held-out split uses seed +
# 1_000_003. The tree spec is small (names, kinds, sizes, mtimes, a per-file content seed); `file_bytes`
# turns a file spec into its bytes, the same in rows() (for the ground truth) and at reset (on disk).
# `score` reads what follows the last `####` (up to a special token such as <|im_end|>) in one linear
# pass: thousands commas allowed and trailing words ignored for numbers; order, duplicates, surrounding
# quotes and a trailing period ignored for paths; `./` and `/sandbox/` prefixes accepted.
def file_bytes(f: dict) -> bytes:
    """The content of a file spec {"kind", "seed", "size", "plant"?}: deterministic."""
    rng = random.Random(f"cli-file:{f['seed']}")
    kind, n = f["kind"], f["size"]
    if kind in MAGIC:
        return (MAGIC[kind] + rng.randbytes(n))[:n]
    if kind == "log":
        lines = [f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:"
                 f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} {rng.choice(LOG_LEVELS)} "
                 f"{rng.choice(COMPONENTS)}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
                 for _ in range(n)]
    elif kind == "csv":
        lines = ["date,item,amount"] + [f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
                                        f"{rng.choice(WORDS)},{rng.randint(1, 999)}" for _ in range(n - 1)]
    elif kind == "pdf":
        lines = ["%PDF-1.4"] + [f"% {' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))}"
                                for _ in range(n - 2)] + ["%%EOF"]
    else:  # txt, md
        lines = [("# " if kind == "md" else "") + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
                 for _ in range(n)]
    if f.get("plant"):  # only text, md and log files get one (make_tree)
        k = rng.randrange(len(lines))
        lines[k] = f"{lines[k]} {f['plant']}"
    return "".join(line + "\n" for line in lines).encode()


def make_tree(rng: random.Random, level: int) -> dict:
    """{"dirs": [...], "files": [{"path", "kind", "seed", "size", "mtime"}, ...]} for one level."""
    tops = list(TOP) if level > 1 else rng.sample(list(TOP), rng.randint(4, 6))
    dirs, files = [], []
    per_dir = (2, 5) if level < 3 else (3, 6)

    def fill(path: str, kinds: tuple, n: int):
        taken = set()
        for _ in range(n):
            kind = rng.choice(kinds)
            for _ in range(20):
                stem = rng.choice(STEMS[kind])
                name = f"{stem}.{kind}" if rng.random() < 0.4 else f"{stem}_{rng.randint(1, 99)}.{kind}"
                if name not in taken:
                    break
            else:
                continue
            taken.add(name)
            size = rng.randint(200, 4000) if kind in MAGIC else rng.randint(2 if kind != "pdf" else 3, 30)
            files.append({"path": f"{path}/{name}", "kind": kind, "seed": rng.getrandbits(32), "size": size})

    for top in sorted(tops):
        dirs.append(top)
        fill(top, TOP[top], rng.randint(*per_dir))
        if level == 1:
            continue
        for sub in rng.sample(SUB[top], rng.randint(0 if level == 2 else 1, 2)):
            dirs.append(f"{top}/{sub}")
            fill(f"{top}/{sub}", TOP[top], rng.randint(1, 4))
            if level >= 3 and rng.random() < 0.6:
                deep = f"{top}/{sub}/{rng.choice(DEEP)}"
                dirs.append(deep)
                fill(deep, TOP[top], rng.randint(1, 3))
    minutes = rng.sample(range(300 * 24 * 60), len(files))  # distinct mtimes: "newest" has one answer
    for f, m in zip(files, minutes):
        f["mtime"] = BASE_TIME + 60 * m + rng.randint(0, 59)
    texts = [f for f in files if f["kind"] in ("txt", "md", "log")]
    if texts:
        rng.choice(texts)["plant"] = rng.choice(PLANTED)
    return {"dirs": sorted(dirs), "files": sorted(files, key=lambda f: f["path"])}


def _check_path(path: str):
    parts = path.split("/") if isinstance(path, str) else [""]
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise ValueError(f"cli tree: path {path!r} must be relative, without '.', '..' or empty parts")


def materialize(tree: dict, root: str):
    """Write a tree spec under root (an existing empty folder): folders, bytes, modes and mtimes."""
    for d in tree["dirs"]:
        _check_path(d)
        os.makedirs(os.path.join(root, d), mode=0o755, exist_ok=True)
    newest = {}
    for f in tree["files"]:
        _check_path(f["path"])
        path = os.path.join(root, f["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(file_bytes(f))
        os.chmod(path, 0o644)
        os.utime(path, (f["mtime"], f["mtime"]))
        parent = os.path.dirname(f["path"])
        while parent:
            newest[parent] = max(newest.get(parent, 0), f["mtime"])
            parent = os.path.dirname(parent)
    for d in sorted(tree["dirs"], key=lambda d: -d.count("/")):  # deepest first: setting a child's time
        path = os.path.join(root, d)  # leaves the parent's alone, writing a file into it does not
        os.chmod(path, 0o755)
        t = newest.get(d, BASE_TIME)
        os.utime(path, (t, t))


_REMOVER, _PENDING, _LOCK = None, [], threading.Lock()


def remove_later(root: str):
    """Delete a sandbox folder on a background thread; at interpreter exit (no more threads), at once."""
    global _REMOVER
    try:
        with _LOCK:
            if _REMOVER is None:
                _REMOVER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="r1-cli-remove")
            _PENDING[:] = [f for f in _PENDING if not f.done()]
            _PENDING.append(_REMOVER.submit(shutil.rmtree, root, True))
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        shutil.rmtree(root, ignore_errors=True)


def drain():
    """Wait until every sandbox folder handed to remove_later is gone."""
    with _LOCK:
        pending = list(_PENDING)
    for f in pending:
        f.result()


@contextmanager
def sandbox_for(tree: dict, max_output: int = MAX_OUTPUT):
    """A Sandbox over a fresh temporary copy of the tree, removed on exit."""
    root = tempfile.mkdtemp(prefix="r1-cli-")
    try:
        materialize(tree, root)
        yield Sandbox(root, max_output=max_output)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ================================================================ requests


def _under(tree, d: str, recursive: bool) -> list:
    return [f for f in tree["files"]
            if f["path"].startswith(d + "/") and (recursive or "/" not in f["path"][len(d) + 1:])]


def _leaf_dirs(tree) -> list:
    return [d for d in tree["dirs"] if not any(o.startswith(d + "/") for o in tree["dirs"])]


def _unique_max(files, key):
    if len(files) < 2:
        return None
    best = sorted(files, key=key, reverse=True)
    return best[0] if key(best[0]) != key(best[1]) else None


def _request(rng, tree, level, data) -> dict | None:
    """One request of a random kind for this tree, or None if the kind does not fit it."""
    kinds = ["list_ext", "count_lines", "largest", "newest", "count_files", "find_word", "count_matches"]
    if level >= 2:
        kinds.append("total_size")
    if level >= 3:
        kinds.append("lines_of_largest")
    kind = rng.choice(kinds)
    sizes = {p: len(b) for p, b in data.items()}
    recursive = level >= 2
    deep = ", including its subfolders" if recursive else ""
    tops = [d for d in tree["dirs"] if "/" not in d and _under(tree, d, True)]
    if kind == "list_ext":
        d = rng.choice(tops)
        ext = rng.choice(sorted({f["kind"] for f in _under(tree, d, recursive)}))
        paths = sorted(f["path"] for f in _under(tree, d, recursive) if f["kind"] == ext)
        q = rng.choice([f"List every .{ext} file under {d}{deep}.", f"Which .{ext} files are in {d}{deep}? "
                        "List them all."])
        return dict(kind=kind, question=q, answer=", ".join(paths), params={"dir": d, "ext": ext})
    if kind == "count_lines":
        texts = [f for f in tree["files"] if f["kind"] in TEXT_KINDS]
        if not texts:
            return None
        f = rng.choice(texts)
        q = rng.choice([f"How many lines does {f['path']} have?", f"Count the lines in {f['path']}."])
        return dict(kind=kind, question=q, answer=str(data[f["path"]].count(b"\n")), params={"path": f["path"]})
    if kind in ("largest", "newest", "lines_of_largest"):
        text_only = kind == "lines_of_largest"
        key = (lambda f: f["mtime"]) if kind == "newest" else (lambda f: sizes[f["path"]])
        options = [(d, _unique_max(_under(tree, d, False), key)) for d in _leaf_dirs(tree)
                   if not text_only or all(f["kind"] in TEXT_KINDS for f in _under(tree, d, False))]
        options = [(d, f) for d, f in options if f is not None]
        if not options:
            return None
        d, f = rng.choice(options)
        if kind == "largest":
            q = rng.choice([f"Which file in {d} is the largest?", f"What is the biggest file in {d}?"])
            return dict(kind=kind, question=q, answer=f["path"], params={"dir": d})
        if kind == "newest":
            q = rng.choice([f"Which file in {d} was modified most recently?", f"What is the newest file in {d}?"])
            return dict(kind=kind, question=q, answer=f["path"], params={"dir": d})
        q = f"How many lines does the largest file in {d} have?"
        return dict(kind=kind, question=q, answer=str(data[f["path"]].count(b"\n")), params={"dir": d})
    if kind == "count_files":
        d = rng.choice(tops)
        q = (f"How many files are there under {d}, counting its subfolders?" if recursive
             else rng.choice([f"How many files are in {d}?", f"Count the files in {d}."]))
        return dict(kind=kind, question=q, answer=str(len(_under(tree, d, True))), params={"dir": d})
    if kind == "find_word":
        planted = [f for f in tree["files"] if f.get("plant")]
        if not planted:
            return None
        f = planted[0]
        top = f["path"].split("/")[0]
        where = rng.choice([top, "."]) if level >= 2 else top
        q = (f"Which file under {top} contains the word '{f['plant']}'?" if where != "." else
             f"One of my files mentions '{f['plant']}'. Which one?")
        return dict(kind=kind, question=q, answer=f["path"], params={"dir": where, "word": f["plant"]})
    if kind == "count_matches":
        logs = [f for f in tree["files"] if f["kind"] == "log"]
        if not logs:
            return None
        f = rng.choice(logs)
        word = rng.choice(["ERROR", "WARN"])
        n = sum(word in line for line in data[f["path"]].decode().splitlines())
        q = rng.choice([f"How many lines in {f['path']} contain {word}?", f"Count the {word} lines in {f['path']}."])
        return dict(kind=kind, question=q, answer=str(n), params={"path": f["path"], "word": word})
    d = rng.choice(tops)  # total_size
    total = sum(sizes[f["path"]] for f in _under(tree, d, True))
    q = f"What is the total size in bytes of all files under {d}{deep}?"
    return dict(kind=kind, question=q, answer=str(total), params={"dir": d})


def make_row(seed: int, level: int, index: int) -> dict:
    rng = random.Random(f"cli:{seed}:{level}:{index}")
    tree = make_tree(rng, level)
    data = {f["path"]: file_bytes(f) for f in tree["files"]}
    req = None
    while req is None:
        req = _request(rng, tree, level, data)
    return {"id": f"cli-L{level}-{seed}-{index}", "level": level, "tree": tree, **req}


def make_dataset(n: int, seed: int, level: int) -> list:
    if type(n) is not int or n < 0:
        raise ValueError(f"data.train_size/test_size must be a non-negative int, got {n!r}")
    if type(level) is not int or not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"data.level={level!r}: the cli task has levels 1 to {MAX_LEVEL}")
    return [make_row(seed, level, i) for i in range(n)]


def rows(cfg, split: str) -> list:
    d = cfg.data
    if split == "train":
        return make_dataset(d.train_size, cfg.run.seed, d.level)
    return make_dataset(d.test_size, cfg.run.seed + TEST_SEED_OFFSET, d.level)


# ================================================================ answers

_NUMBER = re.compile(r"[-+]?\d[\d,]*")
_STRIP = "'\"`*()[]<>"


def extract_answer(text: str) -> str | None:
    """What follows the last ####, up to a special token such as <|im_end|> (a decoded response ends
    with its stop token), stripped; None if there is no #### or nothing after it."""
    if not isinstance(text, str) or "####" not in text:
        return None
    after = text.rsplit("####", 1)[1].split("<|", 1)[0].strip()
    return after or None


def answer_items(text: str) -> list:
    """Paths in an answer: split on commas and whitespace, quotes, './' and '/sandbox/' dropped."""
    out = []
    for item in re.split(r"[,\s]+", text):
        item = item.strip(_STRIP).rstrip(".;:").strip(_STRIP)
        if item.startswith("/sandbox/"):
            item = item[len("/sandbox/"):]
        while item.startswith("./"):
            item = item[2:]
        if item:
            out.append(item)
    return out


def score(text: str, gold: str) -> float:
    """1.0 if the answer after the last #### equals the gold answer (see the module docstring), else 0.0."""
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    if gold.isascii() and gold.isdigit():
        m = _NUMBER.search(answer)
        try:
            return float(m is not None and int(m.group(0).replace(",", "")) == int(gold))
        except ValueError:  # a number beyond Python's 4300-digit int limit
            return 0.0
    return float(set(answer_items(answer)) == set(answer_items(gold)))


def has_answer(text: str) -> bool:
    """The answer format: something after a ####."""
    answer = extract_answer(text)
    return answer is not None and bool(answer_items(answer))


# ================================================================ episodes


def make_prompt(row: dict, tools: bool = True) -> list:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}]


class CliEnv(ToolEnv):
    """A ToolEnv whose `shell` tool is bound, per episode, to a sandbox over the row's tree.

    The sandbox folder is created at reset and removed (in the background, see remove_later) when the
    episode ends (a final answer or max_steps), at the next reset, on close(), or when the env is
    garbage collected.
    `command_reward` (the config's env.rewards: {command: w}, default 0) is the weight of the `command`
    reward term (`commands_accepted`), paid after the task-wide terms."""

    def __init__(self, tokenizer, tools=("shell",), command_reward: float = 0.0, max_output: int = MAX_OUTPUT,
                 rewards: dict | None = None, **kwargs):
        if "shell" not in tools:
            raise ValueError(f"data.task=cli needs the shell tool, but env.tools={list(tools)}; leave env.tools unset")
        super().__init__(tokenizer, make_prompt, score, tools=tuple(tools), answer_format=has_answer,
                         rewards={"command": command_reward, **(rewards or {})}, **kwargs)
        self.command_reward, self.max_output = command_reward, max_output
        self.tool_fns["shell"] = SHELL  # ours, even if the registry's "shell" is a user's tool of that name
        self.tools = [t.schema for t in self.tool_fns.values()]
        self.root, self._cleanup, self.shell_results = None, None, []

    def reset(self, sample):
        self.close()
        self.root = tempfile.mkdtemp(prefix="r1-cli-")
        self._cleanup = weakref.finalize(self, remove_later, self.root)
        materialize(sample["tree"], self.root)
        self.tool_fns["shell"] = shell_tool(Sandbox(self.root, max_output=self.max_output), self.shell_results.append)
        return super().reset(sample)

    def step(self, action):
        self.shell_results.clear()
        obs, reward, done, info = super().step(action)
        info["refused"] = sum(r.refused for r in self.shell_results)
        if done:
            self.close()
        return obs, reward, done, info

    def close(self):
        """Remove this episode's sandbox folder, in the background (idempotent; `drain()` waits)."""
        if self._cleanup is not None:
            self._cleanup()
        self.root, self._cleanup = None, None
        self.tool_fns["shell"] = SHELL  # unbound: answers that no sandbox is there


def commands_accepted(env, action, info) -> float:
    """The `command` term: the step ran shell commands and the sandbox accepted them all (whitelisted,
    inside the folder), whether or not they then succeeded."""
    results = getattr(env, "shell_results", ())
    return float(bool(results) and not any(r.refused for r in results) and well_formed(info))


register_reward("command", Reward(commands_accepted, "the sandbox accepted every shell command of the step",
                                  sign=1, general=False, paid_by="the cli task's shell sandbox"))


def cli_env(cfg, tokenizer, tools) -> CliEnv:
    """The env factory of the cli task: ToolEnv's config keys (env.*, rollout.max_new_tokens)."""
    e = cfg.env
    return CliEnv(tokenizer, tools=tuple(tools), max_steps=e.max_steps, rewards=e.rewards, max_context=e.max_context,
                  max_new_tokens=cfg.rollout.max_new_tokens, policy=e.context_policy,
                  tool_format=e.tool_format)


# ================================================================ the expert


def _first_int(text: str) -> str:
    m = re.search(r"\d+", text)
    return m.group(0) if m else "0"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def _solve(kind: str, p: dict, run):
    """Scripted commands for one request kind; `run(thought, command)` returns the sandbox's output."""
    if kind == "list_ext":
        out = run(f"I'll search {p['dir']} for .{p['ext']} files.", f"find {p['dir']} -name '*.{p['ext']}'")
        return "The files are listed above.", ", ".join(sorted(out.split("\n")))
    if kind == "count_lines":
        out = run(f"wc -l counts the lines of {p['path']}.", f"wc -l {p['path']}")
        return f"{p['path']} has {_first_int(out)} lines.", _first_int(out)
    if kind == "largest":
        name = _first_line(run(f"ls -S sorts {p['dir']} by size, largest first.", f"ls -S {p['dir']} | head -n 1"))
        return f"The largest file is {name}.", f"{p['dir']}/{name}"
    if kind == "newest":
        name = _first_line(run(f"ls -t sorts {p['dir']} by modification time, newest first.",
                               f"ls -t {p['dir']} | head -n 1"))
        return f"The most recently modified file is {name}.", f"{p['dir']}/{name}"
    if kind == "count_files":
        out = run(f"I'll count the files under {p['dir']}.", f"find {p['dir']} -type f | wc -l")
        return f"There are {_first_int(out)} files.", _first_int(out)
    if kind == "find_word":
        out = run(f"grep -rl lists the files that contain '{p['word']}'.", f"grep -rl {p['word']} {p['dir']}")
        path = answer_items(_first_line(out))[0] if _first_line(out) else ""
        return f"The word is in {path}.", path
    if kind == "count_matches":
        out = run(f"grep -c counts the lines of {p['path']} that contain {p['word']}.",
                  f"grep -c {p['word']} {p['path']}")
        return f"{_first_int(out)} lines contain {p['word']}.", _first_int(out)
    if kind == "total_size":
        out = run(f"du -sb gives the total size of {p['dir']} in bytes.", f"du -sb {p['dir']}")
        return f"The files under {p['dir']} take {_first_int(out)} bytes.", _first_int(out)
    if kind == "lines_of_largest":
        name = _first_line(run(f"First I find the largest file in {p['dir']}.", f"ls -S {p['dir']} | head -n 1"))
        out = run(f"The largest is {name}; now I count its lines.", f"wc -l {p['dir']}/{name}")
        return f"{p['dir']}/{name} has {_first_int(out)} lines.", _first_int(out)
    raise ValueError(f"cli row has an unknown request kind {kind!r}")


def expert_messages(row: dict, tools=None) -> list:
    """The SFT chat of one row: shell calls with the sandbox's real output, then '#### answer'."""
    messages = make_prompt(row)
    with sandbox_for(row["tree"]) as sandbox:
        def run(thought: str, command: str) -> str:
            call = {"type": "function", "function": {"name": "shell", "arguments": {"command": command}}}
            result = sandbox.run(command)
            messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
            messages.append({"role": "tool", "name": "shell", "content": result.text})
            return result.text
        summary, answer = _solve(row["kind"], row["params"], run)
    messages.append({"role": "assistant", "content": f"{summary}\n#### {answer}"})
    return messages


def expert(row, tools):
    return expert_messages(row, tools)
