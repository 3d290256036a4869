"""The command-line sandbox: read-only shell commands over one folder, in pure Python.

`Sandbox(root).run(command)` returns a `ShellResult(text, ok, refused)`, a
`ToolResult` that also says whether the command was refused. The command is
parsed, never handed to a shell, and every command is our own Python code
working on paths it has checked; no program is ever executed. That is the
only way to guarantee confinement: a real `grep` or `find` has options
(`find -exec`, `grep -r /`, symlink following) that a filter on argv would
have to anticipate one by one, while here a feature that is not written
does not exist. Nothing outside `root` is read, listed, written, deleted or
executed, whatever the command, and there is nothing to write with.

Parsing. A quote-aware scan of the raw text refuses, with a one-line reason
the model can read, everything a shell would give a meaning we do not
implement: `;`, `&`, `&&`, `||`, `>`, `<`, `(`, `)`, `{a,b}`, backticks,
`$(...)`, `$VAR`, `~`, `#` comments and newlines. Unquoted `|` splits a pipeline (at
most 4 stages): each stage's output is the next one's input, as text in
memory. Each stage's argv comes from `shlex.split`. Unquoted `*`, `?` and
`[` are globs and are expanded by us against the sandbox (no match: the word
stays as written, as in bash); quoted ones are literal.

Paths. The sandbox appears to the model as the folder `/sandbox`, its working
directory (`pwd`); output never shows the real location, so it is the same
in every episode. A path is resolved component by component from the root:
`..` may not climb above it, an absolute path must start with `/sandbox`,
and a symbolic link is followed only if its target stays inside (its target
is read with `readlink`; nothing it points to outside is ever touched).
Only regular files are opened, with O_NOFOLLOW | O_NONBLOCK and a check of
the opened file's type, so fifos, sockets and device files are refused and
never block; a file with more than one hard link is not read (it may be a
file outside the root, linked in). Recursive commands (find, grep -r, du,
ls -R) never follow symbolic links they meet.

Limits: the command is at most 4,000 characters and 1,024 words per stage
after glob expansion; a file read is at most 4 MB; each command has a work
budget (bytes read, directory entries visited, lines sorted, the estimated
backtracking cost of a grep pattern per line) and, as a last line of
defence, a 10 s deadline checked as work is done; text between pipeline
stages is at most 4M characters; what the model sees is cut at `max_output`
characters (default 2,000) with a note saying how much was left out. Control
characters are shown as `?`, bytes that are not UTF-8 as `\\xNN`. grep
refuses patterns that can backtrack exponentially in Python's `re`: a
repetition of a group that holds a repetition or an alternation, and
back-references. There is no network code and no environment variable is
read (`$HOME` is refused, not expanded).

Commands and options (docs/cli_task.md has the table): pwd; echo [-n];
ls [-a -A -l -h -R -1 -S -t -r -d]; find PATH... with -name -iname -path
-ipath -type f|d|l -size [+-]N[ckMG] -maxdepth -mindepth -empty -newer
-print, ! / -not, -a; grep [-r -R -i -n -c -l -L -v -w -x -F -E -G -o -h -H
-s -m N -e PAT --include= --exclude= --exclude-dir=]; wc [-l -w -c -m];
head / tail [-n N, -N, -c N, tail -n +N, -q -v]; cat [-n]; file; du [-s -a
-h -b -k -c -d N --max-depth=N --apparent-size]; sort [-n -h -r -u -f -k
N[,M] -t C]; uniq [-c -d -u -i]. Deliberate differences from GNU: listings
are sorted by code point (the C locale); `ls -l` shows `user user`, a
directory size of 4096 and UTC times as `YYYY-MM-DD HH:MM`; `du` counts the
bytes of files only (apparent size, directories add nothing), in 1K units
rounded up unless -b or -h.
"""
import fnmatch
import itertools
import math
import os
import re
import shlex
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from r1.envs.tools import TOOLS, Tool, ToolResult, register_tool

VIRTUAL_ROOT = "/sandbox"
MAX_COMMAND = 4000
MAX_ARGS = 1024
MAX_STAGES = 4
MAX_FILE_BYTES = 4_000_000
MAX_PIPE_CHARS = 4_000_000
MAX_WORK = 20_000_000
MAX_REGEX_STEPS = 1_000_000_000  # estimated; Python's re does ~4e8 of these a second
TIME_LIMIT_S = 10.0
MAX_OUTPUT = 2000
MAX_SYMLINK_HOPS = 40
MAX_REPEAT_COUNT = 255

COMMANDS = ("pwd", "echo", "ls", "find", "grep", "wc", "head", "tail", "cat", "file", "du", "sort", "uniq")
WRITERS = {"rm", "rmdir", "mv", "cp", "touch", "mkdir", "chmod", "chown", "chgrp", "ln", "dd", "tee", "truncate",
           "shred", "unlink", "install", "rsync", "tar", "zip", "unzip", "gzip", "gunzip", "mkfifo", "mknod",
           "patch", "split"}
RUNNERS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "python", "python3", "perl", "ruby", "node", "php",
           "lua", "env", "sudo", "su", "doas", "xargs", "exec", "eval", "source", ".", "nohup", "timeout", "nice",
           "watch", "time", "command", "builtin", "awk", "gawk", "sed", "vi", "vim", "nano", "less", "more",
           "make", "parallel", "script", "strace", "gdb", "kill", "pkill", "killall"}
NETWORK = {"curl", "wget", "nc", "ncat", "netcat", "ssh", "scp", "sftp", "ftp", "telnet", "ping", "git", "pip",
           "apt", "apt-get", "npm", "dig", "nslookup", "host", "socat"}
SHELL_STATE = {"cd", "pushd", "popd", "export", "set", "unset", "alias", "declare", "local", "read", "history",
               "exit", "ulimit", "umask", "trap"}

# Unquoted glob characters are swapped for private-use characters before shlex.split,
# so after splitting we still know which ones the shell would have expanded.
_GLOB_MARK = {"*": "\ue000", "?": "\ue001", "[": "\ue002"}
_GLOB_UNMARK = {v: k for k, v in _GLOB_MARK.items()}
_CONTROL = {i: "?" for i in list(range(32)) + [127] if i not in (9, 10)}


class Refused(Exception):
    """An unsafe or unsupported command: nothing runs, the model reads 'refused: <reason>'."""


class CmdError(Exception):
    """A command that ran and failed (missing file, bad option): ends the pipeline."""


class _Budget:
    """Work done by one command line: plain work (bytes read, entries listed, lines sorted) and the
    estimated backtracking steps of grep's regular expressions, each with its own limit."""

    def __init__(self, limit: int, regex_limit: int, seconds: float):
        self.used, self.limit, self.deadline = 0, limit, time.monotonic() + seconds
        self.regex, self.regex_limit = 0, regex_limit

    def spend(self, n: int = 1, regex: int = 0):
        self.used += n
        self.regex += regex
        if self.used > self.limit:
            raise CmdError("stopped: the command did too much work (files read, entries listed); narrow it down")
        if self.regex > self.regex_limit:
            raise CmdError("stopped: the grep pattern is too costly on these lines (it can backtrack a lot); "
                           "simplify it (fewer .* or +) or use -F")
        if time.monotonic() > self.deadline:
            raise CmdError("stopped: the command ran past the time limit; narrow it down")


@dataclass(frozen=True)
class ShellResult(ToolResult):
    """A ToolResult that also says whether the command was refused (unsafe or not whitelisted)."""

    refused: bool = False


def show(name: str) -> str:
    """A file name or text as the model sees it: undecodable bytes as \\xNN, control characters as '?'."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte maps to
        raw = name.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace").translate(_CONTROL)


class Sandbox:
    """Read-only commands confined to `root`; see the module docstring for what is refused and why."""

    def __init__(self, root, max_output: int = MAX_OUTPUT, max_work: int = MAX_WORK,
                 time_limit: float = TIME_LIMIT_S):
        real = os.path.realpath(os.fspath(root))
        if not os.path.isdir(real):
            raise ValueError(f"sandbox root {root!r} is not a directory")
        self.root, self.max_output, self.max_work, self.time_limit = real, max_output, max_work, time_limit

    # ------------------------------------------------------------ entry point
    def run(self, command) -> ShellResult:
        """Run one command line; never raises for anything the command says."""
        budget = _Budget(self.max_work, MAX_REGEX_STEPS, self.time_limit)
        try:
            stages = self.parse(command)
            out, errors = None, []
            for k, argv in enumerate(stages):
                argv = [argv[0]] + self.expand(argv[1:], budget)
                if len(argv) > MAX_ARGS:
                    raise Refused(f"argument list too long ({len(argv)} words; the limit is {MAX_ARGS})")
                out, errs = _RUNNERS[argv[0]](_Call(self, budget, argv[0], argv[1:], out))
                errors += errs
                if len(out) > MAX_PIPE_CHARS and k < len(stages) - 1:  # the last is capped when shown
                    raise CmdError(f"{argv[0]}: output over {MAX_PIPE_CHARS} characters; narrow it down")
        except Refused as e:
            return ShellResult(f"refused: {show(str(e))}", ok=False, refused=True)
        except CmdError as e:
            return ShellResult(self.cap(show(str(e))), ok=False)
        except RecursionError:
            return ShellResult("error: the command nests too deeply", ok=False)
        except OSError as e:  # e.g. a folder without read permission; the real path is not shown
            return ShellResult(f"error: {e.strerror or type(e).__name__}", ok=False)
        text = out + "".join(f"{show(e)}\n" for e in errors)
        return ShellResult(self.cap(show(text)) if text else "(no output)", ok=not errors)

    def cap(self, text: str) -> str:
        text = text.rstrip("\n")
        if len(text) <= self.max_output:
            return text
        cut = text[: self.max_output]
        return f"{cut}\n[output truncated: {len(text) - len(cut)} more characters; narrow the command, e.g. | head]"

    # ------------------------------------------------------------ parsing
    def parse(self, command) -> list:
        """Command text -> [argv, ...] (one per pipeline stage); Refused for anything unsafe."""
        if not isinstance(command, str):
            raise Refused(f"the command must be a string, got {type(command).__name__}")
        if len(command) > MAX_COMMAND:
            raise Refused(f"command is {len(command)} characters long; the limit is {MAX_COMMAND}")
        if not command.strip():
            raise Refused("the command is empty")
        bad = next((c for c in command if c in _GLOB_UNMARK or (ord(c) < 32 and c not in "\t\n") or c == "\x7f"
                    or "\ud800" <= c <= "\udfff"), None)
        if bad is not None:
            raise Refused(f"control, private or surrogate character {ascii(bad)} in the command")
        forbidden = _FIND_ACTIONS.search(command) if _FIND_COMMAND.search(command) else None
        if forbidden:  # before the scan, whose first complaint would be the ';' that ends -exec
            raise Refused(f"find {forbidden.group(1)} is not allowed: the sandbox is read-only and runs no programs")
        segments = _split_pipeline(command)
        if len(segments) > MAX_STAGES:
            raise Refused(f"a pipeline of {len(segments)} commands; the limit is {MAX_STAGES}")
        stages = []
        for segment in segments:
            try:
                argv = shlex.split(segment)
            except ValueError as e:
                raise Refused(f"cannot parse the command ({e})") from None
            if not argv:
                raise Refused("empty command in a pipeline (nothing before or after a '|')")
            if len(argv) > MAX_ARGS:
                raise Refused(f"argument list too long ({len(argv)} words; the limit is {MAX_ARGS})")
            stages.append([_check_name(argv[0])] + argv[1:])
        for argv in stages:
            if argv[0] == "find":
                _check_find(argv[1:])
        return stages

    # ------------------------------------------------------------ paths
    def locate(self, arg: str, follow: bool = True) -> str:
        """A path as the model wrote it -> the real path inside root; Refused if it would leave root.

        Components are resolved one at a time; a symlink is replaced by its target (read
        with readlink, never followed by the OS), which must stay inside root."""
        if arg == "":
            raise CmdError("'': No such file or directory")
        if arg.startswith("~"):
            raise Refused(f"{arg[:60]!r}: '~' (a home folder) is outside the sandbox; use paths relative to "
                          f"{VIRTUAL_ROOT}")
        if arg.startswith("/"):
            if arg != VIRTUAL_ROOT and not arg.startswith(VIRTUAL_ROOT + "/"):
                raise Refused(f"absolute path {arg[:60]!r} is outside the sandbox; use paths relative to "
                              f"{VIRTUAL_ROOT} (the working directory)")
            arg = arg[len(VIRTUAL_ROOT):]
        todo = [p for p in arg.split("/") if p not in ("", ".")]
        todo.reverse()
        done, hops = [], 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    raise Refused(f"{show(arg[:60])!r}: " + ("a symbolic link in it points outside the sandbox"
                                                            if hops else "'..' would leave the sandbox"))
                done.pop()
                continue
            path = os.path.join(self.root, *done, part)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                done.append(part)  # does not exist: the command reports it
                continue
            except OSError as e:
                raise CmdError(f"{show(part)}: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode) and (todo or follow):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise CmdError(f"{arg[:60]!r}: too many levels of symbolic links")
                target = os.readlink(path)
                if target.startswith("/"):
                    if target != self.root and not target.startswith(self.root + "/"):
                        raise Refused(f"{show(arg[:60])!r}: a symbolic link in it points outside the sandbox")
                    done, target = [], target[len(self.root):]
                todo += reversed(target.split("/"))
                continue
            done.append(part)
        return os.path.join(self.root, *done)

    def read(self, real: str, name: str, budget: _Budget, limit: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of a regular file inside root (first `limit` bytes); CmdError/Refused otherwise."""
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            raise CmdError(f"{name}: No such file or directory") from None
        if stat.S_ISDIR(st.st_mode):
            raise CmdError(f"{name}: Is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{name[:60]}: not a regular file (device, fifo, socket or link); it is not opened")
        if st.st_nlink > 1:  # a hard link planted in the tree may be a file that lives outside it
            raise CmdError(f"{name}: the file has {st.st_nlink} hard links; it is not read")
        if st.st_size > MAX_FILE_BYTES and limit >= MAX_FILE_BYTES:
            raise CmdError(f"{name}: file is {st.st_size} bytes; the sandbox reads at most {MAX_FILE_BYTES}")
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(f"{name[:60]}: not a regular file; it is not read")
            chunks, left = [], min(limit, MAX_FILE_BYTES)
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 16))
                if not chunk:
                    break
                budget.spend(len(chunk))
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def entries(self, real: str, budget: _Budget) -> list:
        """[(name, lstat)] of a directory inside root, sorted by code point; symlinks not followed."""
        out = []
        with os.scandir(real) as it:
            for entry in it:
                budget.spend(1)
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue
        out.sort(key=lambda e: e[0])
        return out

    # ------------------------------------------------------------ globs
    def expand(self, words: list, budget: _Budget) -> list:
        out = []
        for word in words:
            if not any(c in _GLOB_UNMARK for c in word):
                out.append(word)
                continue
            matches = self.glob(word, budget)
            out += matches if matches else [word.translate({ord(k): v for k, v in _GLOB_UNMARK.items()})]
            if len(out) > MAX_ARGS:
                raise Refused(f"the globs expand to more than {MAX_ARGS} words")
        return out

    def glob(self, word: str, budget: _Budget) -> list:
        """Paths matching a marked glob word, as the model would write them; confined like locate.

        As in bash: `*` skips dot files, a trailing '/' keeps folders only (a symlink counts if it
        resolves to a folder inside root; one that leaves root is skipped, never looked at)."""
        prefix = "/" if word.startswith("/") else ""
        parts = [p for p in word.split("/") if p != ""]
        trailing = word.endswith("/")
        found = [prefix]
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            if not any(c in _GLOB_UNMARK for c in part):
                found = [f + part + ("/" if not last else "") for f in found]
                continue
            pattern = "".join(_GLOB_UNMARK.get(c) or ("[" + c + "]" if c in "*?[" else c) for c in part)
            nxt = []
            for base in found:
                real = self.locate(base or ".")
                if not os.path.isdir(real) or os.path.islink(real):
                    continue
                for name, st in self.entries(real, budget):
                    if name.startswith(".") and not pattern.startswith("."):
                        continue
                    if not fnmatch.fnmatchcase(name, pattern):
                        continue
                    if (not last or trailing) and not self.is_dir(base + name):
                        continue
                    nxt.append(base + name + ("/" if not last else ""))
                    if len(nxt) > MAX_ARGS:
                        raise Refused(f"{show(part)!r} matches more than {MAX_ARGS} paths")
            found = nxt
        return sorted(f + ("/" if trailing else "") for f in found if f != prefix)

    def is_dir(self, path: str) -> bool:
        """Whether a path is a folder inside root, following symlinks only while they stay inside."""
        try:
            return os.path.isdir(self.locate(path))
        except (Refused, CmdError):
            return False


def _split_pipeline(command: str) -> list:
    """Split on unquoted '|'; refuse shell syntax we do not implement; mark unquoted globs."""
    segments, cur, quote, i, n = [], [], None, 0, len(command)
    word_start = True
    while i < n:
        c = command[i]
        nxt = command[i + 1] if i + 1 < n else ""
        if quote == "'":
            quote = None if c == "'" else quote
            cur.append(c)
        elif quote == '"':
            if c == "\\" and nxt:
                cur.append(c + nxt)
                i += 2
                continue
            if c == "`" or (c == "$" and (nxt == "(" or nxt == "{" or nxt.isalnum() or nxt in "_?!@*#$-")):
                raise Refused(_expansion(c, nxt))
            quote = None if c == '"' else quote
            cur.append(c)
        else:
            if c == "\\" and nxt:
                if nxt == "\n":
                    raise Refused("a newline separates commands; run one command (pipes with | are allowed)")
                cur.append(c + nxt)
                i += 2
                word_start = False
                continue
            if c in "'\"":
                quote = c
            elif c == "|":
                if nxt == "|":
                    raise Refused("'||' runs commands one after another; run one command (pipes with | are allowed)")
                if nxt == "&":
                    raise Refused("'|&' redirects errors; it is not supported")
                segments.append("".join(cur))
                cur, word_start = [], True
                i += 1
                continue
            elif c == ";":
                raise Refused("';' runs commands one after another; run one command per call (pipes with | are "
                              "allowed)")
            elif c == "&":
                raise Refused("'&&' runs commands one after another; run one command per call"
                              if nxt == "&" else "'&' (background jobs and fd redirection) is not supported")
            elif c in "<>":
                raise Refused(f"redirection '{c}' is not allowed: the sandbox is read-only and there is no shell")
            elif c == "`" or (c == "$" and nxt and (nxt in "({_?!@*#$-" or nxt.isalnum())):
                raise Refused(_expansion(c, nxt))
            elif c in "()":
                raise Refused("subshells and grouping with ( ) are not supported")
            elif c == "{" and _brace_expansion(command[i:]):
                raise Refused("brace expansion {a,b} is not supported; write each name")
            elif c == "\n" or c == "\r":
                raise Refused("a newline separates commands; run one command (pipes with | are allowed)")
            elif c == "~" and word_start:
                raise Refused("'~' (a home folder) is outside the sandbox; use paths relative to /sandbox")
            elif c == "#" and word_start:
                raise Refused("'#' starts a shell comment; quote it if you mean the character")
            elif c in _GLOB_MARK:
                c = _GLOB_MARK[c]
            word_start = c in " \t"
            cur.append(c)
            i += 1
            continue
        word_start = False
        i += 1
    if quote:
        raise Refused(f"unterminated {quote} quote")
    segments.append("".join(cur))
    return segments


def _brace_expansion(rest: str) -> bool:
    """Whether an unquoted word starting with '{' is one bash would expand ({a,b} or {1..3})."""
    word = rest.split(None, 1)[0] if rest.strip() else rest
    body = word[1:word.find("}")] if "}" in word else ""
    return "," in body or ".." in body


def _expansion(c: str, nxt: str) -> str:
    if c == "`" or nxt == "(":
        return "command substitution ($(...) or backticks) is not supported: there is no shell; run one command"
    return "variable expansion ($NAME) is not supported: there is no shell and no environment variables"


def _check_name(name: str) -> str:
    if name in _RUNNERS:
        return name
    if "=" in name and not name.startswith("="):
        raise Refused("setting environment variables is not supported: there are none")
    if "/" in name:
        raise Refused(f"{show(name[:60])!r}: only the built-in commands run ({', '.join(COMMANDS)}); "
                      "no program is executed")
    shown = show(name[:40])
    if name in WRITERS:
        raise Refused(f"{shown}: the sandbox is read-only (available: {', '.join(COMMANDS)})")
    if name in RUNNERS:
        raise Refused(f"{shown}: running other programs or shells is not allowed (available: {', '.join(COMMANDS)})")
    if name in NETWORK:
        raise Refused(f"{shown}: there is no network (available: {', '.join(COMMANDS)})")
    if name in SHELL_STATE:
        raise Refused(f"{shown}: there is no shell state; every command runs in {VIRTUAL_ROOT}, so use paths "
                      "relative to it (no cd)")
    raise Refused(f"unknown command {shown!r}; available: {', '.join(COMMANDS)}")


_FIND_ACTIONS = re.compile(r"(?:^|\s)(-(?:exec|execdir|ok|okdir|delete|fprint0?|fprintf|fls))(?=\s|$)")
_FIND_COMMAND = re.compile(r"(?:^|\|)\s*find(?:\s|$)")
_FIND_FORBIDDEN = {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"}


def _check_find(args: list):
    for a in args:
        if a in _FIND_FORBIDDEN:
            raise Refused(f"find {a} is not allowed: the sandbox is read-only and runs no programs")


# ================================================================ commands


class _Call:
    """One stage of a pipeline: the sandbox, the budget, argv and the previous stage's output."""

    def __init__(self, sb: Sandbox, budget: _Budget, name: str, args: list, stdin):
        self.sb, self.budget, self.name, self.args, self.stdin = sb, budget, name, args, stdin
        self.errors = []

    def error(self, message: str):
        self.errors.append(f"{self.name}: {message}")

    def fail(self, message: str):
        raise CmdError(f"{self.name}: {message}")

    def flags(self, booleans: str = "", values: str = "", longs: dict | None = None, numeric: bool = False):
        """getopt-style: (-abc, -n5, -n 5, --long[=v], --) -> (opts, operands); -N kept as 'n' if numeric."""
        opts, operands, args, i = {}, [], self.args, 0
        longs = longs or {}
        while i < len(args):
            a = args[i]
            if a == "--":
                operands += args[i + 1:]
                break
            if a.startswith("--") and len(a) > 2:
                key, eq, value = a[2:].partition("=")
                if key not in longs:
                    self.fail(f"unsupported option '--{show(key[:30])}' (see the list of supported options)")
                short, takes = longs[key]
                if takes and not eq:
                    i += 1
                    if i >= len(args):
                        self.fail(f"option '--{key}' needs a value")
                    value = args[i]
                opts.setdefault(short, []).append(value if takes else True)
            elif a.startswith("-") and len(a) > 1:
                if numeric and a[1:].isdigit():
                    opts.setdefault("n", []).append(a[1:])
                    i += 1
                    continue
                j = 1
                while j < len(a):
                    f = a[j]
                    if f in values:
                        value = a[j + 1:]
                        if not value:
                            i += 1
                            if i >= len(args):
                                self.fail(f"option '-{f}' needs a value")
                            value = args[i]
                        opts.setdefault(f, []).append(value)
                        break
                    if f not in booleans:
                        self.fail(f"unsupported option '-{show(f)}' (supported: "
                                  f"{' '.join('-' + c for c in booleans + values)})")
                    opts.setdefault(f, []).append(True)
                    j += 1
            else:
                operands.append(a)
            i += 1
        return opts, operands

    def number(self, text: str, what: str) -> int:
        if not re.fullmatch(r"[+-]?\d{1,12}", text or ""):
            self.fail(f"invalid number {show(text[:30])!r} for {what}")
        return int(text)

    def inputs(self, operands: list):
        """[(name, bytes or None on error)] of the operands, or stdin; per-file errors are recorded."""
        if not operands:
            if self.stdin is None:
                self.fail("no input: give a file name (there is no terminal to read from)")
            return [(None, self.stdin.encode("utf-8", "surrogateescape"))]
        out = []
        for op in operands:
            try:
                out.append((op, self.sb.read(self.sb.locate(op), show(op), self.budget)))
            except CmdError as e:
                self.error(str(e))
                out.append((op, None))
        return out


def _lines(text: str) -> list:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _join(lines) -> str:
    return "".join(line + "\n" for line in lines)


def _binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


def walk(c: _Call, path: str, real: str, skip_dirs=(), maxdepth=None):
    """Depth-first, sorted walk below a directory, never following symlinks: yields
    (shown path, name, real path, lstat, depth >= 1); `path` "" shows names without a prefix."""
    stack = [(path, real, iter(c.sb.entries(real, c.budget)), 1)]
    while stack:
        base, r, entries, depth = stack[-1]
        item = next(entries, None)
        if item is None:
            stack.pop()
            continue
        name, st = item
        shown = (base if base.endswith("/") or not base else base + "/") + name
        child = os.path.join(r, name)
        yield shown, name, child, st, depth
        if stat.S_ISDIR(st.st_mode) and (maxdepth is None or depth < maxdepth) and \
                not any(fnmatch.fnmatchcase(name, g) for g in skip_dirs):
            stack.append((shown, child, iter(c.sb.entries(child, c.budget)), depth + 1))


def _cmd_pwd(c: _Call):
    c.flags("LP")
    return VIRTUAL_ROOT + "\n", c.errors


def _cmd_echo(c: _Call):
    no_newline = bool(c.args and c.args[0] == "-n")
    words = c.args[1:] if no_newline else c.args
    return " ".join(words) + ("" if no_newline else "\n"), c.errors


def _mode(st) -> str:
    kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else \
        "-" if stat.S_ISREG(st.st_mode) else "p" if stat.S_ISFIFO(st.st_mode) else "?"
    return kind + stat.filemode(st.st_mode)[1:]


def _size(st) -> int:
    return 4096 if stat.S_ISDIR(st.st_mode) else st.st_size


def _human(n: int) -> str:
    if n < 1024:
        return str(n)
    for unit in "KMGTP":
        n /= 1024
        if n < 10:
            return f"{math.ceil(n * 10) / 10:.1f}{unit}"
        if n < 1024:
            return f"{math.ceil(n)}{unit}"
    return f"{math.ceil(n)}E"


def _when(st) -> str:
    return datetime.fromtimestamp(int(st.st_mtime), timezone.utc).strftime("%Y-%m-%d %H:%M")


def _cmd_ls(c: _Call):
    opts, operands = c.flags("aAlhR1Strd")
    operands = operands or ["."]
    long, human, every = "l" in opts, "h" in opts, "a" in opts or "A" in opts

    def order(items):
        if "S" in opts:
            items.sort(key=lambda e: (-_size(e[1]), e[0]))
        elif "t" in opts:
            items.sort(key=lambda e: (-e[1].st_mtime, e[0]))
        else:
            items.sort(key=lambda e: e[0])
        return items[::-1] if "r" in opts else items

    def line(name, st, real):
        if not long:
            return show(name)
        size = _human(_size(st)) if human else str(_size(st))
        tail = f" -> {show(os.readlink(real))}" if stat.S_ISLNK(st.st_mode) else ""
        return f"{_mode(st)} 1 user user {size:>6} {_when(st)} {show(name)}{tail}"

    files, dirs = [], []
    for op in operands:
        real = c.sb.locate(op, follow=False)
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            c.error(f"cannot access '{show(op)}': No such file or directory")
            continue
        if stat.S_ISLNK(st.st_mode) and not long and "d" not in opts:
            real = c.sb.locate(op)  # followed, as GNU ls does; Refused if it leaves root
            try:
                st = os.lstat(real)
            except (FileNotFoundError, NotADirectoryError):
                c.error(f"cannot access '{show(op)}': No such file or directory")
                continue
        (dirs if stat.S_ISDIR(st.st_mode) and "d" not in opts else files).append((op, st, real))
    out = [line(op, st, real) for op, st, real in order([(o, s, r) for o, s, r in files])]
    headers = len(operands) > 1 or "R" in opts
    todo = [(op, real) for op, _, real in order(dirs)]
    todo.reverse()
    while todo:
        op, real = todo.pop()
        items = [(n, s, os.path.join(real, n)) for n, s in c.sb.entries(real, c.budget)
                 if every or not n.startswith(".")]
        if out or headers:
            if out:
                out.append("")
            out.append(f"{show(op)}:")
        out += [line(n, s, r) for n, s, r in order(items)]
        if "R" in opts:
            subs = [(op.rstrip("/") + "/" + n, r) for n, s, r in order(items) if stat.S_ISDIR(s.st_mode)]
            todo += reversed(subs)
    return _join(out), c.errors


def _size_test(spec: str, c: _Call):
    m = re.fullmatch(r"([+-]?)(\d{1,12})([ckMGwb]?)", spec)
    if not m:
        c.fail(f"invalid -size {show(spec[:30])!r} (expected [+-]N with c, k, M or G)")
    sign, n, unit = m.group(1), int(m.group(2)), m.group(3) or "b"
    scale = {"c": 1, "w": 2, "b": 512, "k": 1024, "M": 1024**2, "G": 1024**3}[unit]

    def test(st):
        units = math.ceil(st.st_size / scale)
        return units > n if sign == "+" else units < n if sign == "-" else units == n
    return test


def _cmd_find(c: _Call):
    args, starts = list(c.args), []
    while args and args[0] in ("-P", "-H", "-L"):
        if args.pop(0) == "-L":
            c.fail("-L (following symbolic links) is not supported")
    while args and not (args[0].startswith("-") or args[0] in ("!", "(", ")")):
        starts.append(args.pop(0))
    starts = starts or ["."]
    tests, maxdepth, mindepth, negate = [], None, 0, False
    while args:
        a = args.pop(0)
        if a in ("!", "-not"):
            negate = not negate
            continue
        if a in ("-a", "-and", "-print"):
            continue
        if a in ("-o", "-or", "(", ")", ","):
            c.fail(f"'{a}' is not supported (predicates are joined by 'and'; use ! or -not to negate one)")
        if a in ("-empty",):
            test = lambda n, p, st, r: (st.st_size == 0 if stat.S_ISREG(st.st_mode)  # noqa: E731
                                        else stat.S_ISDIR(st.st_mode) and not os.listdir(r))
        elif a in ("-name", "-iname", "-path", "-ipath", "-type", "-size", "-maxdepth", "-mindepth", "-newer"):
            if not args:
                c.fail(f"missing argument to '{a}'")
            v = args.pop(0)
            if a == "-name":
                test = lambda n, p, st, r, v=v: fnmatch.fnmatchcase(n, v)  # noqa: E731
            elif a == "-iname":
                test = lambda n, p, st, r, v=v.lower(): fnmatch.fnmatchcase(n.lower(), v)  # noqa: E731
            elif a == "-path":
                test = lambda n, p, st, r, v=v: fnmatch.fnmatchcase(p, v)  # noqa: E731
            elif a == "-ipath":
                test = lambda n, p, st, r, v=v.lower(): fnmatch.fnmatchcase(p.lower(), v)  # noqa: E731
            elif a == "-type":
                kinds = {"f": stat.S_ISREG, "d": stat.S_ISDIR, "l": stat.S_ISLNK}
                if v not in kinds:
                    c.fail(f"-type {show(v[:10])!r} is not supported (f, d or l)")
                test = lambda n, p, st, r, k=kinds[v]: k(st.st_mode)  # noqa: E731
            elif a == "-size":
                size = _size_test(v, c)
                test = lambda n, p, st, r, size=size: stat.S_ISREG(st.st_mode) and size(st)  # noqa: E731
            elif a == "-newer":
                ref = os.stat(c.sb.locate(v)) if os.path.lexists(c.sb.locate(v)) else None
                if ref is None:
                    c.fail(f"'{show(v)}': No such file or directory")
                test = lambda n, p, st, r, t=ref.st_mtime: st.st_mtime > t  # noqa: E731
            else:
                depth = c.number(v, a)
                if a == "-maxdepth":
                    maxdepth = depth
                else:
                    mindepth = depth
                continue
        else:
            c.fail(f"unsupported predicate {show(a[:30])!r} (supported: -name -iname -path -ipath -type -size "
                   "-maxdepth -mindepth -empty -newer -print, ! or -not)")
        tests.append((negate, test))
        negate = False
    out = []
    for start in starts:
        real = c.sb.locate(start)
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            c.error(f"'{show(start)}': No such file or directory")
            continue
        first = [(start, os.path.basename(start.rstrip("/")) or start, real, st, 0)]
        below = walk(c, start, real, maxdepth=maxdepth) if stat.S_ISDIR(st.st_mode) and maxdepth != 0 else []
        for path, name, r, s, depth in itertools.chain(first, below):
            c.budget.spend(1)
            if depth >= mindepth and all(neg != bool(t(name, path, s, r)) for neg, t in tests):
                out.append(show(path))
    return _join(out), c.errors


_POSIX_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
                  "space": r" \t\n\r\f\v", "blank": r" \t", "punct": r"!-/:-@\[-`{-~", "xdigit": "0-9A-Fa-f",
                  "word": r"\w"}


def _translate(pattern: str, extended: bool, c: _Call) -> str:
    """A POSIX basic/extended regular expression -> Python `re` syntax (the subset grep users write)."""
    out, i, n = [], 0, len(pattern)
    quantifiable = False  # a quantifier at the start of the pattern or a group is literal (as in GNU grep)
    while i < n:
        ch = pattern[i]
        if ch == "[":
            j = i + 1
            body = []
            if j < n and pattern[j] == "^":
                body.append("^")
                j += 1
            if j < n and pattern[j] == "]":
                body.append(r"\]")
                j += 1
            while j < n and pattern[j] != "]":
                if pattern.startswith("[:", j):
                    end = pattern.find(":]", j + 2)
                    name = pattern[j + 2:end] if end > 0 else ""
                    if name not in _POSIX_CLASSES:
                        c.fail(f"unknown character class [:{show(name[:20])}:]")
                    body.append(_POSIX_CLASSES[name])
                    j = end + 2
                    continue
                # POSIX: a backslash is literal inside brackets; escape what Python's sets treat specially
                body.append("\\" + pattern[j] if pattern[j] in "\\[^&~|" else pattern[j])
                j += 1
            if j >= n:
                c.fail("unmatched [ in the pattern")
            out.append("[" + "".join(body) + "]")
            i, quantifiable = j + 1, True
            continue
        if ch == "\\" and i + 1 < n:
            e = pattern[i + 1]
            i += 2
            if not extended and e in "(){}|+?":
                ch, special = e, True
            elif e.isdigit():
                c.fail("back-references (\\1 ...) are not supported")
            elif e in "wWsSbB":
                out.append("\\" + e)
                quantifiable = e not in "bB"
                continue
            elif e in "<>":
                out.append(r"\b")
                quantifiable = False
                continue
            elif e == "d":
                out.append(r"\d")
                quantifiable = True
                continue
            else:
                out.append(re.escape(e))
                quantifiable = True
                continue
        else:
            i += 1
            special = extended and ch in "(){}|+?"
        if ch in "*" or (special and ch in "+?{"):
            if not quantifiable:
                out.append(re.escape(ch))
                quantifiable = True
                continue
            if ch == "{":
                close = pattern.find("\\}" if not extended else "}", i)
                body = pattern[i:close] if close >= 0 else ""
                if not re.fullmatch(r"\d{1,3}(,\d{0,3})?|,\d{1,3}", body):
                    c.fail("invalid interval {m,n} in the pattern")
                if any(int(x) > MAX_REPEAT_COUNT for x in body.split(",") if x):
                    c.fail(f"interval counts above {MAX_REPEAT_COUNT} are not supported")
                out.append("{" + body + "}")
                i = close + (1 if extended else 2)
            else:
                out.append(ch)
            quantifiable = False
        elif special and ch in "()|":
            out.append(ch if ch != "(" else "(?:")
            quantifiable = ch == ")"
        elif ch == "^" and (not out or out[-1] in ("(?:", "|")):
            out.append("^")
            quantifiable = False
        elif ch == "$" and (i == n or pattern.startswith("\\)" if not extended else ")", i) or
                            pattern.startswith("\\|" if not extended else "|", i)):
            out.append("$")
            quantifiable = False
        elif ch == ".":
            out.append(".")
            quantifiable = True
        else:
            out.append(re.escape(ch))
            quantifiable = True
    return "".join(out)


def _pattern_factors(py: str, c: _Call) -> list:
    """[(min, max)] of the pattern's variable repetitions; CmdError for exponential shapes."""
    try:
        import re._parser as sre_parse  # Python >= 3.11
    except ImportError:  # pragma: no cover
        import sre_parse  # type: ignore
    try:
        tree = sre_parse.parse(py)
    except Exception as e:  # re.error, RecursionError, OverflowError
        c.fail(f"invalid pattern ({show(str(e)[:80])})")
    repeats = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
    factors = []

    def walk(items, inside_repeat):
        for op, av in items:
            name = str(op)
            if name in repeats:
                lo, hi, sub = av
                if inside_repeat and hi != lo:
                    c.fail("the pattern repeats a group that itself repeats or alternates (like (a+)+ or (a|b)*);"
                           " the sandbox refuses it because it can take exponential time")
                if hi != lo:
                    factors.append((lo, hi))
                walk(sub, inside_repeat or hi != lo)
            elif name == "SUBPATTERN":
                walk(av[-1], inside_repeat)
            elif name == "BRANCH":
                if inside_repeat:
                    c.fail("the pattern repeats an alternation (like (a|b)*); the sandbox refuses it because it "
                           "can take exponential time")
                for alt in av[1]:
                    walk(alt, inside_repeat)
            elif name in ("GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT"):
                c.fail("back-references and look-arounds are not supported")
    walk(list(tree), False)
    return factors


def _grep_matcher(c: _Call, patterns: list, opts: dict):
    """(search(line) -> list of match spans or [], cost(line) -> int)."""
    fixed, extended, icase = "F" in opts, "E" in opts, "i" in opts
    parts = [re.escape(p) if fixed else _translate(p, extended, c) for p in patterns]
    factors = [] if fixed else [f for p in parts for f in _pattern_factors(p, c)]
    body = "|".join(f"(?:{p})" for p in parts) if len(parts) > 1 else parts[0]
    if "w" in opts:
        body = rf"(?<!\w)(?:{body})(?!\w)"
    if "x" in opts:
        body = rf"^(?:{body})$"
    try:
        rx = re.compile(body, re.IGNORECASE if icase else 0)
    except (re.error, RecursionError, OverflowError) as e:
        c.fail(f"invalid pattern ({show(str(e)[:80])})")

    def cost(line: str) -> int:
        # Backtracking over k independent repetitions tries at most ~n**(k+1)/(k+1)! splits of a line
        # of n characters (measured: '.*.*.*z' on 1,000 characters, 4e10 of these, took 99 s).
        n = len(line) + 1
        total = n
        for lo, hi in factors:
            total *= max(1, min(hi, n) - lo + 1)
        return total // math.factorial(len(factors) + 1) + n
    return rx, cost


def _cmd_grep(c: _Call):
    opts, operands = c.flags("rRinclLvwxFEGohHsq", "em", {
        "recursive": ("r", False), "ignore-case": ("i", False), "line-number": ("n", False),
        "count": ("c", False), "files-with-matches": ("l", False), "files-without-match": ("L", False),
        "invert-match": ("v", False), "word-regexp": ("w", False), "line-regexp": ("x", False),
        "fixed-strings": ("F", False), "extended-regexp": ("E", False), "only-matching": ("o", False),
        "no-filename": ("h", False), "with-filename": ("H", False), "max-count": ("m", True),
        "regexp": ("e", True), "include": ("include", True), "exclude": ("exclude", True),
        "exclude-dir": ("exclude-dir", True), "color": ("color", True), "colour": ("color", True)})
    if "q" in opts:
        c.fail("-q is not supported (it prints nothing); use -c or -l")
    patterns = list(opts.get("e", []))
    if not patterns:
        if not operands:
            c.fail("missing pattern: grep PATTERN [FILE...]")
        patterns = [operands.pop(0)]
    rx, cost = _grep_matcher(c, patterns, opts)
    recursive = "r" in opts or "R" in opts
    max_count = c.number(opts["m"][-1], "-m") if "m" in opts else None
    include, exclude = opts.get("include", []), opts.get("exclude", [])
    exclude_dir = opts.get("exclude-dir", [])

    files = []  # (display name or None for stdin, real path or None)
    if not operands and recursive:
        operands, strip = ["."], True
    else:
        strip = False
    if not operands:
        if c.stdin is None:
            c.fail("no input: give a file name (there is no terminal to read from)")
        files.append((None, None))
    for op in operands:
        real = c.sb.locate(op)
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            if "s" not in opts:
                c.error(f"{show(op)}: No such file or directory")
            continue
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                c.error(f"{show(op)}: Is a directory")
                continue
            for shown, name, r, cs, _ in walk(c, "" if strip else op, real, skip_dirs=exclude_dir):
                if not stat.S_ISREG(cs.st_mode):
                    continue
                if include and not any(fnmatch.fnmatchcase(name, g) for g in include):
                    continue
                if not any(fnmatch.fnmatchcase(name, g) for g in exclude):
                    files.append((shown, r))
        else:
            files.append((op, real))
    multi = (len(files) > 1 or recursive) and "h" not in opts or "H" in opts
    out = []
    for shown, real in files:
        if real is None:
            data = c.stdin.encode("utf-8", "surrogateescape")
            name = "(standard input)"
        else:
            try:
                data = c.sb.read(real, show(shown), c.budget)
            except CmdError as e:
                if "s" not in opts:
                    c.error(str(e))
                continue
            name = show(shown)
        text = data.decode("utf-8", "replace")
        binary = _binary(data)
        count, hits = 0, []
        for number, line in enumerate(_lines(text), start=1):
            c.budget.spend(1, regex=cost(line))
            spans = [m for m in rx.finditer(line)] if "o" in opts else None
            found = bool(spans) if spans is not None else rx.search(line) is not None
            if found == ("v" in opts):
                continue
            count += 1
            if not binary and not any(k in opts for k in "clL"):
                prefix = (f"{name}:" if multi else "") + (f"{number}:" if "n" in opts else "")
                if "o" in opts and "v" not in opts:
                    hits += [prefix + m.group(0) for m in spans if m.group(0)]
                else:
                    hits.append(prefix + line)
            if max_count is not None and count >= max_count:
                break
        if "l" in opts:
            out += [name] if count else []
        elif "L" in opts:
            out += [] if count else [name]
        elif "c" in opts:
            out.append((f"{name}:" if multi else "") + str(count))
        elif binary:
            out += [f"Binary file {name} matches"] if count else []
        else:
            out += hits
    return _join(out), c.errors


def _counts(data: bytes, flags: str) -> list:
    values = {"l": data.count(b"\n"), "w": len(data.split()), "c": len(data),
              "m": len(data.decode("utf-8", "replace"))}
    return [values[f] for f in flags]


def _cmd_wc(c: _Call):
    opts, operands = c.flags("lwcm", "", {"lines": ("l", False), "words": ("w", False), "bytes": ("c", False),
                                          "chars": ("m", False)})
    flags = "".join(f for f in "lwmc" if f in opts) or "lwc"
    rows = []
    for name, data in c.inputs(operands):
        if data is not None:
            rows.append((_counts(data, flags), name))
    if len(rows) > 1:
        rows.append(([sum(r[0][k] for r in rows) for k in range(len(flags))], "total"))
    width = 1 if len(flags) == 1 and len(rows) == 1 else max((len(str(v)) for r in rows for v in r[0]), default=1)
    out = [" ".join(f"{v:>{width}}" for v in values) + (f" {show(name)}" if name else "") for values, name in rows]
    return _join(out), c.errors


def _cmd_head_tail(c: _Call):
    opts, operands = c.flags("qv", "nc", {"lines": ("n", True), "bytes": ("c", True), "quiet": ("q", False),
                                          "verbose": ("v", False)}, numeric=True)
    tail = c.name == "tail"
    from_start, count, by_bytes = False, 10, False
    if "c" in opts:
        spec, by_bytes = opts["c"][-1], True
    else:
        spec = opts["n"][-1] if "n" in opts else "10"
    if tail and spec.startswith("+"):
        from_start, spec = True, spec[1:]
    count = c.number(spec, "-n" if not by_bytes else "-c")
    inputs = c.inputs(operands)
    headers = ("v" in opts or len(inputs) > 1) and "q" not in opts
    out = []
    for name, data in inputs:
        if data is None:
            continue
        if headers:
            out.append(("\n" if out else "") + f"==> {show(name or 'standard input')} <==\n")
        if by_bytes:
            piece = data[:count] if not tail else data[max(count - 1, 0):] if from_start else \
                data[-abs(count):] if count else b""
            out.append(piece.decode("utf-8", "replace"))
            continue
        if _binary(data):
            c.error(f"{show(name or 'standard input')}: binary file ({len(data)} bytes); not shown")
            continue
        lines = _lines(data.decode("utf-8", "replace"))
        if tail:
            part = lines[max(count - 1, 0):] if from_start else (lines[-abs(count):] if count else [])
        else:
            part = lines[:count] if count >= 0 else lines[:count]
        out.append(_join(part))
    return "".join(out), c.errors


def _cmd_cat(c: _Call):
    opts, operands = c.flags("n", "", {"number": ("n", False)})
    out, number = [], 0
    for name, data in c.inputs(operands):
        if data is None:
            continue
        if _binary(data):
            c.error(f"{show(name or 'standard input')}: binary file ({len(data)} bytes); not shown (try: file)")
            continue
        text = data.decode("utf-8", "replace")
        if "n" in opts:
            numbered = []
            for line in _lines(text):
                number += 1
                numbered.append(f"{number:>6}\t{line}")
            text = _join(numbered)
        out.append(text)
    return "".join(out), c.errors


_MAGIC = ((b"%PDF-", "PDF document"), (b"\x89PNG\r\n\x1a\n", "PNG image data"), (b"\xff\xd8\xff", "JPEG image data"),
          (b"PK\x03\x04", "Zip archive data"), (b"\x1f\x8b", "gzip compressed data"), (b"GIF8", "GIF image data"))


def _cmd_file(c: _Call):
    _, operands = c.flags("bL")
    if not operands:
        c.fail("missing file operand")
    out = []
    for op in operands:
        real = c.sb.locate(op, follow=False)
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            out.append(f"{show(op)}: cannot open (No such file or directory)")
            c.errors.append(f"file: {show(op)}: No such file or directory")
            continue
        if stat.S_ISDIR(st.st_mode):
            kind = "directory"
        elif stat.S_ISLNK(st.st_mode):
            kind = f"symbolic link to {show(os.readlink(real))}"
        elif stat.S_ISFIFO(st.st_mode):
            kind = "fifo (named pipe)"
        elif not stat.S_ISREG(st.st_mode):
            kind = "special file (not opened)"
        else:
            head = c.sb.read(real, show(op), c.budget, limit=8192)
            kind = next((k for m, k in _MAGIC if head.startswith(m)), None)
            if kind is None:
                if not head:
                    kind = "empty"
                elif _binary(head):
                    kind = "data"
                elif head.isascii():
                    kind = "ASCII text"
                else:
                    try:
                        head.decode("utf-8")
                        kind = "Unicode text, UTF-8 text"
                    except UnicodeDecodeError as e:
                        kind = "Unicode text, UTF-8 text" if e.start >= len(head) - 3 else "data"
        out.append(f"{show(op)}: {kind}")
    return _join(out), c.errors


def _cmd_du(c: _Call):
    opts, operands = c.flags("sahbkc", "d", {"summarize": ("s", False), "all": ("a", False),
                                             "human-readable": ("h", False), "bytes": ("b", False),
                                             "total": ("c", False), "max-depth": ("d", True),
                                             "apparent-size": ("apparent", False)})
    depth = c.number(opts["d"][-1], "-d / --max-depth") if "d" in opts else None
    if "s" in opts:
        depth = 0
    operands = operands or ["."]

    def fmt(n: int) -> str:
        return _human(n) if "h" in opts else str(n) if "b" in opts else str(math.ceil(n / 1024))

    out, total = [], 0
    for op in operands:
        real = c.sb.locate(op)
        try:
            st = os.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            c.error(f"cannot access '{show(op)}': No such file or directory")
            continue
        lines = []

        def walk(path, r, s, level):  # iterative depth is bounded by the tree; recursion keeps it short
            c.budget.spend(1)
            if not stat.S_ISDIR(s.st_mode):
                size = s.st_size if stat.S_ISREG(s.st_mode) else 0
                if level == 0 or ("a" in opts and (depth is None or level <= depth)):
                    lines.append(f"{fmt(size)}\t{show(path)}")
                return size
            size = 0
            for name, cs in c.sb.entries(r, c.budget):
                size += walk((path if path.endswith("/") else path + "/") + name, os.path.join(r, name), cs, level + 1)
            if depth is None or level <= depth:
                lines.append(f"{fmt(size)}\t{show(path)}")
            return size
        total += walk(op, real, st, 0)
        out += lines
    if "c" in opts:
        out.append(f"{fmt(total)}\ttotal")
    return _join(out), c.errors


def _number_prefix(text: str) -> float:
    m = re.match(r"\s*([+-]?(?:\d+\.?\d*|\.\d+))", text)
    return float(m.group(1)) if m else 0.0


def _human_value(text: str) -> float:
    m = re.match(r"\s*([+-]?(?:\d+\.?\d*|\.\d+))([KMGTPE]?)", text)
    if not m:
        return 0.0
    return float(m.group(1)) * 1024 ** (" KMGTPE".index(m.group(2) or " "))


def _cmd_sort(c: _Call):
    opts, operands = c.flags("nhrufb", "kt", {"numeric-sort": ("n", False), "reverse": ("r", False),
                                              "unique": ("u", False), "ignore-case": ("f", False),
                                              "human-numeric-sort": ("h", False), "key": ("k", True),
                                              "field-separator": ("t", True)})
    sep = opts["t"][-1] if "t" in opts else None
    if sep is not None and len(sep) != 1:
        c.fail("the field separator (-t) must be one character")
    key_range = None
    if "k" in opts:
        m = re.fullmatch(r"(\d{1,4})(?:\.\d+)?[a-z]*(?:,(\d{1,4})(?:\.\d+)?[a-z]*)?", opts["k"][-1])
        if not m or int(m.group(1)) < 1:
            c.fail(f"invalid key {show(opts['k'][-1][:20])!r} (expected -k N or -k N,M)")
        key_range = (int(m.group(1)), int(m.group(2)) if m.group(2) else None)
    lines = []
    for _, data in c.inputs(operands):
        if data is not None:
            lines += _lines(data.decode("utf-8", "replace"))
    c.budget.spend(len(lines) * max(1, int(math.log2(len(lines) + 1))))

    def field(line):
        if key_range is None:
            return line
        parts = line.split(sep) if sep is not None else line.split()
        lo, hi = key_range
        chosen = parts[lo - 1:hi] if hi else parts[lo - 1:]
        return (sep if sep is not None else " ").join(chosen)

    def key(line):
        k = field(line)
        if "f" in opts:
            k = k.lower()
        if "n" in opts:
            return (_number_prefix(k), line)
        if "h" in opts:
            return (_human_value(k), line)
        return (k, line)
    lines.sort(key=key, reverse="r" in opts)
    if "u" in opts:
        seen, unique = set(), []
        for line in lines:
            k = key(line)[0]
            if k not in seen:
                seen.add(k)
                unique.append(line)
        lines = unique
    return _join(lines), c.errors


def _cmd_uniq(c: _Call):
    opts, operands = c.flags("cdui", "", {"count": ("c", False), "repeated": ("d", False),
                                          "unique": ("u", False), "ignore-case": ("i", False)})
    if len(operands) > 1:
        c.fail("writing to an output file is not allowed (uniq takes one input file)")
    lines = []
    for _, data in c.inputs(operands):
        if data is not None:
            lines = _lines(data.decode("utf-8", "replace"))
    c.budget.spend(len(lines))
    groups = []
    for line in lines:
        k = line.lower() if "i" in opts else line
        if groups and groups[-1][0] == k:
            groups[-1][2] += 1
        else:
            groups.append([k, line, 1])
    out = []
    for _, line, n in groups:
        if ("d" in opts and n < 2) or ("u" in opts and n > 1):
            continue
        out.append(f"{n:>7} {line}" if "c" in opts else line)
    return _join(out), c.errors


_RUNNERS = {"pwd": _cmd_pwd, "echo": _cmd_echo, "ls": _cmd_ls, "find": _cmd_find, "grep": _cmd_grep,
            "wc": _cmd_wc, "head": _cmd_head_tail, "tail": _cmd_head_tail, "cat": _cmd_cat, "file": _cmd_file,
            "du": _cmd_du, "sort": _cmd_sort, "uniq": _cmd_uniq}

# ================================================================ the tool

SHELL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": ("Run one read-only command in /sandbox, the user's files: ls, find, grep, wc, head, tail, "
                        "cat, file, du, sort, uniq, pwd, echo, and pipes between them with |. No cd, no ; or &&, "
                        "no redirection; use paths relative to /sandbox."),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string",
                                       "description": "The command line, for example: find Downloads -name '*.pdf'"}},
            "required": ["command"],
        },
    },
}


def _unbound(command: str) -> ToolResult:
    return ToolResult("error: the shell tool runs inside a cli episode's sandbox; none is bound here", ok=False)


# Registered so that configs and schemas can name it; a cli episode binds its own copy to its sandbox.
# A "shell" a user registered first is left alone (CliEnv uses this one whatever the registry holds).
SHELL = Tool("shell", SHELL_SCHEMA, _unbound)
if "shell" not in TOOLS:
    register_tool(SHELL)


def shell_tool(sandbox: Sandbox, on_result=None) -> Tool:
    """The `shell` tool bound to one sandbox (what a cli episode offers); on_result sees every result."""
    def run(command: str) -> ToolResult:
        result = sandbox.run(command)
        if on_result is not None:
            on_result(result)
        return result
    return Tool("shell", SHELL_SCHEMA, run)
