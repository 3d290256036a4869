"""The 13 read-only shell commands the sandbox runs, each a Python function over checked paths.

pwd, echo, ls, find, grep, wc, head, tail, cat, file, du, sort, uniq:
`COMMAND_TABLE` maps a name to `fn(call) -> (output text, [error lines])`,
where `call` (`Call`) holds one pipeline stage: the sandbox, the work
budget, argv and the previous stage's output. A command reaches files only
through the sandbox (`call.sb.locate`, `.read`, `.entries`), which does the
confining (r1/envs/sandbox.py); this file owns what each command prints and
which options it takes (the list and the deliberate differences from GNU
are in sandbox.py's docstring and docs/cli_task.md). Also here: the two
exceptions both layers raise and `show`, how a name or text is shown to
the model, so the sandbox imports this file and not the other way round.
"""
import fnmatch
import functools
import itertools
import math
import os
import re
import stat
from datetime import datetime, timezone

VIRTUAL_ROOT = "/sandbox"
LINK_HIDDEN = "[a path that leaves /sandbox; not shown]"  # what ls -l and file show for such a link's target
MAX_REPEAT_COUNT = 255
MAX_FACTORS = 16  # variable repetitions in one grep pattern; '.*' four times is already slow on a long line
MAX_CHOICES = 100_000  # ways a grep pattern's alternatives can be taken; -e x -e y -e z is 3
MAX_EXPANDED = 10_000  # items of a grep pattern once fixed counts are expanded ({255} of 40 items)
_CONTROL = {i: "?" for i in list(range(32)) + [127] if i not in (9, 10)}




class Refused(Exception):
    """An unsafe or unsupported command: nothing runs, the model reads 'refused: <reason>'."""


class CmdError(Exception):
    """A command that ran and failed (missing file, bad option): ends the pipeline."""


def show(name: str) -> str:
    """A file name or text as the model sees it: undecodable bytes as \\xNN, control characters as '?'."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte maps to
        raw = name.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace").translate(_CONTROL)




class Call:
    """One stage of a pipeline: the sandbox, the budget, argv and the previous stage's output."""

    def __init__(self, sb, budget, name: str, args: list, stdin):
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


def walk(c: Call, path: str, real: str, skip_dirs=(), maxdepth=None):
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


def _cmd_pwd(c: Call):
    c.flags("LP")
    return VIRTUAL_ROOT + "\n", c.errors


def _cmd_echo(c: Call):
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


def _cmd_ls(c: Call):
    opts, operands = c.flags("aAlhR1Strd")
    operands = operands or ["."]
    long, human, every = "l" in opts, "h" in opts, "a" in opts or "A" in opts

    def order(items):
        if "S" in opts:  # a link sorts by its size as shown (its target's length), not the host path's
            items.sort(key=lambda e: (-(len(os.fsencode(c.sb.link_text(e[2]))) if stat.S_ISLNK(e[1].st_mode)
                                        else _size(e[1])), e[0]))
        elif "t" in opts:
            items.sort(key=lambda e: (-e[1].st_mtime, e[0]))
        else:
            items.sort(key=lambda e: e[0])
        return items[::-1] if "r" in opts else items

    def line(name, st, real):
        if not long:
            return show(name)
        target = c.sb.link_text(real) if stat.S_ISLNK(st.st_mode) else None
        n = len(os.fsencode(target)) if target is not None else _size(st)  # a link's size is its target's length
        size = _human(n) if human else str(n)
        tail = f" -> {show(target)}" if target is not None else ""
        return f"{_mode(st)} 1 user user {size:>6} {_when(st)} {show(name)}{tail}"

    files, dirs = [], []
    for op in operands:
        real = c.sb.locate(op, follow=False)
        try:
            st = c.sb.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            c.error(f"cannot access '{show(op)}': No such file or directory")
            continue
        if stat.S_ISLNK(st.st_mode) and not long and "d" not in opts:
            real = c.sb.locate(op)  # followed, as GNU ls does; Refused if it leaves root
            try:
                st = c.sb.lstat(real)
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


def _size_test(spec: str, c: Call):
    m = re.fullmatch(r"([+-]?)(\d{1,12})([ckMGwb]?)", spec)
    if not m:
        c.fail(f"invalid -size {show(spec[:30])!r} (expected [+-]N with c, k, M or G)")
    sign, n, unit = m.group(1), int(m.group(2)), m.group(3) or "b"
    scale = {"c": 1, "w": 2, "b": 512, "k": 1024, "M": 1024**2, "G": 1024**3}[unit]

    def test(st):
        units = math.ceil(st.st_size / scale)
        return units > n if sign == "+" else units < n if sign == "-" else units == n
    return test


def _cmd_find(c: Call):
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
                                        else stat.S_ISDIR(st.st_mode) and not c.sb.entries(r, c.budget))
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
                ref = c.sb.kind(c.sb.locate(v)) and c.sb.lstat(c.sb.locate(v))
                if not ref:
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
            st = c.sb.lstat(real)
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


def _translate(pattern: str, extended: bool, c: Call) -> str:
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


def _pattern_shape(py: str, c: Call):
    """(factors, choices, weight) of a translated pattern; CmdError for shapes that backtrack exponentially.

    factors: [(min, max)] of its variable repetitions, each counted as often as a fixed count repeats it
    ((a*){3} is three); choices: how many ways its alternations can be taken, multiplied along a sequence
    and by a fixed count ((a|aa){40} is 2**40); weight: the items one try from one position can visit, with
    fixed counts expanded (1 for a plain string, which `re` finds with a linear prefix scan). Refused:
    a variable repetition of anything that repeats or alternates ((a+)+, (a|b)*), back-references and
    look-arounds, more than MAX_FACTORS repetitions, more than MAX_CHOICES choices, and fixed counts that
    expand the pattern past MAX_EXPANDED items."""
    try:
        import re._parser as sre_parse  # Python >= 3.11
    except ImportError:  # pragma: no cover
        import sre_parse  # type: ignore
    try:
        tree = sre_parse.parse(py)
    except Exception as e:  # re.error, RecursionError, OverflowError
        c.fail(f"invalid pattern ({show(str(e)[:80])})")
    repeats = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")

    def check(factors, choices, size):
        if len(factors) > MAX_FACTORS:
            c.fail(f"the pattern has more than {MAX_FACTORS} variable repetitions (counting those a fixed count "
                   "like {20} repeats); the sandbox refuses it because it can take exponential time")
        if choices > MAX_CHOICES:
            c.fail(f"the pattern's alternatives can be taken more than {MAX_CHOICES} ways (like (a|aa){{40}} or "
                   "(a|aa)(a|aa)...); the sandbox refuses it because it can take exponential time")
        if size > MAX_EXPANDED:
            c.fail(f"the pattern's repeat counts expand it past {MAX_EXPANDED} items; use smaller counts")

    def walk(items, inside_repeat):
        factors, choices, size = [], 1, 0
        for op, av in items:
            name = str(op)
            if name in repeats:
                lo, hi, sub = av
                if inside_repeat and hi != lo:
                    c.fail("the pattern repeats a group that itself repeats or alternates (like (a+)+ or (a|b)*);"
                           " the sandbox refuses it because it can take exponential time")
                f, ch, sz = walk(sub, inside_repeat or hi != lo)
                if hi != lo:
                    factors.append((lo, hi))
                    size += sz
                else:  # a fixed count repeats what is inside: its repetitions and its choices
                    for _ in range(lo):
                        factors, choices, size = factors + f, choices * ch, size + sz
                        check(factors, choices, size)
            elif name == "SUBPATTERN":
                f, ch, sz = walk(av[-1], inside_repeat)
                factors, choices, size = factors + f, choices * ch, size + sz
            elif name == "BRANCH":
                if inside_repeat:
                    c.fail("the pattern repeats an alternation (like (a|b)*); the sandbox refuses it because it "
                           "can take exponential time")
                total = 0
                for alt in av[1]:
                    f, ch, sz = walk(alt, inside_repeat)
                    factors, total, size = factors + f, total + ch, size + sz
                choices *= total
            elif name in ("GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT"):
                c.fail("back-references and look-arounds are not supported")
            else:
                size += 1
            check(factors, choices, size)
        return factors, choices, size
    factors, choices, size = walk(list(tree), False)
    literal = all(str(op) == "LITERAL" for op, _ in tree)
    return factors, choices, 1 if literal else max(size, 1)


def _grep_matcher(c: Call, patterns: list, opts: dict):
    """(compiled pattern, cost(line) -> estimated backtracking steps, an upper bound)."""
    fixed, extended, icase = "F" in opts, "E" in opts, "i" in opts
    parts = [re.escape(p) if fixed else _translate(p, extended, c) for p in patterns]
    body = "|".join(f"(?:{p})" for p in parts) if len(parts) > 1 else parts[0]
    if fixed:  # one string is found by a prefix scan; several are tried in turn from every position
        factors, choices, weight = [], 1, 1 if len(parts) == 1 and not icase else sum(map(len, patterns)) + 1
    else:
        factors, choices, weight = _pattern_shape(body, c)
        weight = len(body) if weight == 1 and icase else weight  # no prefix scan for an -i string
    if "w" in opts:
        body = rf"(?<!\w)(?:{body})(?!\w)"
    if "x" in opts:
        body = rf"^(?:{body})$"
    try:
        rx = re.compile(body, re.IGNORECASE if icase else 0)
    except (re.error, RecursionError, OverflowError) as e:
        c.fail(f"invalid pattern ({show(str(e)[:80])})")
    k = len(factors)

    @functools.lru_cache(maxsize=1024)
    def cost(n: int) -> int:
        # A search tries each of the n + 1 start positions; from one, backtracking tries every way the k
        # repetitions can split what follows, each way once per choice of alternatives, and each try visits
        # at most `weight` items. The splits from one start are at most the product of the repetitions'
        # ranges, and over all starts at most C(n + k + 1, k + 1) (k + 1 parts of at most n characters:
        # about n**(k+1)/(k+1)!; measured: '.*.*.*z' on 1,000 characters, 4e10 of these, took 99 s;
        # '((a.){255}){100}b', 51,000 items, on 150,000 characters took 23 s).
        n += 1
        ranges = 1
        for lo, hi in factors:
            ranges *= max(1, min(hi, n) - lo + 1)
        return choices * min(n * ranges, math.comb(n + k, k + 1)) * weight + n
    return rx, lambda line: cost(len(line))


def _cmd_grep(c: Call):
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
            st = c.sb.lstat(real)
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
            if max_count is not None and count >= max_count:  # at the top: -m 0 reads no line, as GNU grep
                break
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


def _cmd_wc(c: Call):
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


def _cmd_head_tail(c: Call):
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


def _cmd_cat(c: Call):
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


def _cmd_file(c: Call):
    _, operands = c.flags("bL")
    if not operands:
        c.fail("missing file operand")
    out = []
    for op in operands:
        real = c.sb.locate(op, follow=False)
        try:
            st = c.sb.lstat(real)
        except (FileNotFoundError, NotADirectoryError):
            out.append(f"{show(op)}: cannot open (No such file or directory)")
            c.errors.append(f"file: {show(op)}: No such file or directory")
            continue
        if stat.S_ISDIR(st.st_mode):
            kind = "directory"
        elif stat.S_ISLNK(st.st_mode):
            kind = f"symbolic link to {show(c.sb.link_text(real))}"
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


def _cmd_du(c: Call):
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
            st = c.sb.lstat(real)
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


def _cmd_sort(c: Call):
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


def _cmd_uniq(c: Call):
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


COMMAND_TABLE = {"pwd": _cmd_pwd, "echo": _cmd_echo, "ls": _cmd_ls, "find": _cmd_find, "grep": _cmd_grep,
            "wc": _cmd_wc, "head": _cmd_head_tail, "tail": _cmd_head_tail, "cat": _cmd_cat, "file": _cmd_file,
            "du": _cmd_du, "sort": _cmd_sort, "uniq": _cmd_uniq}
