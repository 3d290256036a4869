"""The command-line sandbox: confinement, parsing and the `shell` tool, in pure Python.

`Sandbox(root).run(command)` returns a `ShellResult(text, ok, refused)`, a
`ToolResult` that also says whether the command was refused. The command is
parsed, never handed to a shell, and every command is our own Python code
working on paths it has checked; no program is ever executed. That is the
only way to guarantee confinement: a real `grep` or `find` has options
(`find -exec`, `grep -r /`, symlink following) that a filter on argv would
have to anticipate one by one, while here a feature that is not written
does not exist. Nothing outside `root` is read, listed, written, deleted or
executed, whatever the command, and there is nothing to write with.

`Sandbox` spells out the rules: parsing, paths, limits, and the commands
(r1/envs/shell_commands.py, one function each) with their options.
"""
import contextlib
import fnmatch
import os
import re
import shlex
import stat
import time
from dataclasses import dataclass

from r1.envs.shell_commands import COMMAND_TABLE, LINK_HIDDEN, VIRTUAL_ROOT, Call, CmdError, Refused, show
from r1.envs.tools import TOOLS, Tool, ToolResult, register_tool

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

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC  # a folder on the way
_O_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC  # a folder to list
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC  # a file to read

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


class Sandbox:
    """Read-only commands confined to `root` (module docstring: why no program runs).

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
    The check is not trusted at open time: every access (lstat, readlink, list,
    open) opens the root and walks to the path's folder with openat and
    O_NOFOLLOW | O_DIRECTORY per component, then acts on the last component
    relative to that folder without following it, so a folder swapped for a
    link after the check fails the open instead of being followed.
    Only regular files are opened, with O_NOFOLLOW | O_NONBLOCK and a check that
    the opened file is the one checked (same inode, still regular), so fifos,
    sockets and device files are refused and never block; a file with more than
    one hard link is not read (it may be a file outside the root, linked in).
    Recursive commands (find, grep -r, du, ls -R) never follow symbolic links
    they meet. `ls -l` and `file` show a link's target as stored when it is
    relative and stays inside, as `/sandbox/...` when it is an absolute path
    inside, and otherwise a placeholder: no output holds a host path.

    Limits: the command is at most 4,000 characters and 1,024 words per stage
    after glob expansion; a file read is at most 4 MB; each command has a work
    budget (bytes read, directory entries visited, lines sorted, the estimated
    backtracking cost of a grep pattern per line) and, as a last line of
    defence, a 10 s deadline checked as work is done; text between pipeline
    stages is at most 4M characters; what the model sees is cut at `max_output`
    characters (default 2,000) with a note saying how much was left out. Control
    characters are shown as `?`, bytes that are not UTF-8 as `\\xNN`. grep
    refuses patterns that can backtrack exponentially in Python's `re`: a
    variable repetition of a group that holds a repetition or an alternation,
    more than 16 repetitions (a fixed count like {20} counts what it repeats
    that many times), alternatives that can be taken more than 100,000 ways
    ((a|aa){40}, or (a|aa) forty times in a row), fixed counts that expand the
    pattern past 10,000 items, back-references and look-arounds, each with a
    one-line error. What it accepts is charged, before each line is matched, a
    bound on its backtracking on that line (the ways its repetitions can split
    the line, times the ways its alternatives can be taken, times the items one
    try visits; a plain string counts one), and the command
    stops before a match that would take the total past the regex budget: the
    10 s deadline is only checked between lines, so this bound is what keeps one
    line's match short. find's and glob's wildcards go through fnmatch, whose
    patterns use atomic groups and do not backtrack. There is no network code and no environment variable is
    read (`$HOME` is refused, not expanded).

    The commands themselves are in r1/envs/shell_commands.py (one function
    each, reaching files only through this sandbox). Commands and options
    (docs/cli_task.md has the table): pwd; echo [-n];
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
                out, errs = COMMAND_TABLE[argv[0]](Call(self, budget, argv[0], argv[1:], out))
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
                st = self.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                done.append(part)  # does not exist: the command reports it
                continue
            except OSError as e:
                raise CmdError(f"{show(part)}: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode) and (todo or follow):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise CmdError(f"{arg[:60]!r}: too many levels of symbolic links")
                target = self.readlink(path)
                if target.startswith("/"):
                    if target != self.root and not target.startswith(self.root + "/"):
                        raise Refused(f"{show(arg[:60])!r}: a symbolic link in it points outside the sandbox")
                    done, target = [], target[len(self.root):]
                todo += reversed(target.split("/"))
                continue
            done.append(part)
        return os.path.join(self.root, *done)

    # Every access below opens the root and walks to the path's folder one component at a time with
    # O_NOFOLLOW | O_DIRECTORY, relative to the folder before (openat), then acts on the last component
    # relative to that folder without following it. A component that is a link when it is opened (a
    # folder swapped for a link after `locate` checked it) fails the open (ENOTDIR / ELOOP) instead of
    # being followed: there is no moment between a check and an open in which a path can be redirected.
    @contextlib.contextmanager
    def _at(self, real: str):
        """(fd of the folder holding real's last component, that component, or None for the root)."""
        if real == self.root:
            parts = []
        elif real.startswith(self.root + "/"):
            parts = real[len(self.root) + 1:].split("/")
        else:  # pragma: no cover - locate only returns paths below root
            raise Refused("a path outside the sandbox")
        if any(p in ("", ".", "..") for p in parts):  # pragma: no cover - locate normalises them away
            raise Refused("a path with '.' or '..' left in it")
        fd = os.open(self.root, _O_WALK)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, _O_WALK, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd, (parts[-1] if parts else None)
        finally:
            os.close(fd)

    def lstat(self, real: str) -> os.stat_result:
        """lstat of a path inside root, no link in it followed (see `_at`)."""
        with self._at(real) as (fd, name):
            return os.stat(fd) if name is None else os.stat(name, dir_fd=fd, follow_symlinks=False)

    def readlink(self, real: str) -> str:
        with self._at(real) as (fd, name):
            if name is None:
                raise CmdError("the sandbox folder is not a link")
            return os.readlink(name, dir_fd=fd)

    def link_text(self, real: str) -> str:
        """A link's target as the model may see it: as stored when it is relative and stays inside root
        (read lexically from the link's folder), as /sandbox/... when it is an absolute path inside root,
        otherwise a placeholder; a host path is never shown."""
        target = self.readlink(real)
        if target.startswith("/"):
            if target == self.root or target.startswith(self.root + "/"):
                return VIRTUAL_ROOT + target[len(self.root):]
            return LINK_HIDDEN
        depth = real[len(self.root) + 1:].count("/")  # folders between root and the link
        for part in target.split("/"):
            depth += -1 if part == ".." else 0 if part in ("", ".") else 1
            if depth < 0:
                return LINK_HIDDEN
        return target

    def read(self, real: str, name: str, budget: _Budget, limit: int = MAX_FILE_BYTES) -> bytes:
        """The bytes of a regular file inside root (first `limit` bytes); CmdError/Refused otherwise.

        The file is checked (lstat) and then opened relative to its folder with O_NOFOLLOW | O_NONBLOCK;
        the opened file must be the one checked (same device and inode), still regular and single-linked."""
        try:
            st = self.lstat(real)
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
        try:
            with self._at(real) as (dir_fd, last):
                fd = os.open(last, _O_FILE, dir_fd=dir_fd)
        except OSError as e:
            raise CmdError(f"{name}: changed while it was read ({e.strerror}); not read") from None
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) \
                    or now.st_nlink > 1:
                raise CmdError(f"{name}: changed while it was read; not read")
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
        """[(name, lstat)] of a directory inside root, sorted by code point; symlinks not followed.

        The folder is opened relative to its parent with O_NOFOLLOW | O_DIRECTORY and listed from that
        descriptor, so a folder swapped for a link is not listed."""
        out = []
        with self._at(real) as (dir_fd, name):
            fd = os.open("." if name is None else name, _O_LIST, dir_fd=dir_fd)
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    budget.spend(1)
                    try:
                        out.append((entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:
                        continue
        finally:
            os.close(fd)
        out.sort(key=lambda e: e[0])
        return out

    def kind(self, real: str) -> int:
        """st_mode of a path inside root (links not followed), or 0 if it is not there."""
        try:
            return self.lstat(real).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return 0

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
                if not stat.S_ISDIR(self.kind(real)):
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
            return stat.S_ISDIR(self.kind(self.locate(path)))
        except (Refused, CmdError, OSError):
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
    if name in COMMAND_TABLE:
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
