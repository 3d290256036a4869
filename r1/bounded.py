"""Bounded reading: every file the project reads back is a regular file, has a size cap, and stays inside
the folder it was named from.

A FIFO given as a config blocks `open()`; `/dev/zero` never ends; a 3 MB `.jsonl.gz` can inflate to
gigabytes; a model folder's index can name `../../x.safetensors`. Each is one `ValueError` naming the
file, printed by the commands as one `error:` line with exit status 2 (`r1.exits.USER_ERRORS`).
Checked at open, not before: a file is opened non-blocking, then `fstat`-ed, so what is checked is what
is read; a path inside a named folder is resolved (symlinks followed) and must stay inside it. The caps,
each with its reason, sit beside the code that reads the file. stdlib only: the trajectory and plot
commands import it.
"""
import gzip
import io
import json
import os
import stat
from pathlib import Path

MiB = 1 << 20


def size_text(n: int) -> str:
    """2147483648 -> '2 GiB', 300000 -> '293 KiB' (for messages)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, what: str = "file"):
    """`path` opened for binary reading; ValueError if it is not a regular file (FIFO, device, folder).

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; the flag is cleared
    again once fstat says the file is regular (where it changes nothing anyway)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; refusing to read it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def too_large(path, cap: int, what: str, why: str = "") -> str:
    return f"{what} {path} is larger than {size_text(cap)}, the most this reads{why}; refusing to read it"


def check_file(path, cap: int, what: str = "file") -> int:
    """For a file another library reads (safetensors, transformers' tokenizer files, parquet): regular and
    at most `cap` bytes. Returns its size."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
    if size > cap:
        raise ValueError(too_large(path, cap, what))
    return size


def read_bytes(path, cap: int, what: str = "file") -> bytes:
    """The whole file, at most `cap` bytes (one byte more is read to know it is larger)."""
    with open_regular(path, what) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise ValueError(too_large(path, cap, what))
    return data


def read_text(path, cap: int, what: str = "file") -> str:
    data = read_bytes(path, cap, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_json(path, cap: int, what: str = "file"):
    text = read_text(path, cap, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{what} {path}: JSON nested too deeply") from None


class _Counted(io.RawIOBase):
    """A binary stream that raises once more than `cap` bytes came out of it (an inflating gzip)."""

    def __init__(self, inner, cap: int, message: str):
        self.inner, self.cap, self.message, self.total = inner, cap, message, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = self.inner.readinto(b)
        self.total += n or 0
        if self.total > self.cap:
            raise ValueError(self.message)
        return n


def text_lines(path, max_line: int, max_bytes: int, what: str = "file", gz: bool | None = None,
               ratio: int | None = None):
    """(line number, line) of a UTF-8 text file, plain or gzip (`gz`; None: by a `.gz` name), newlines as text mode
    reads them. A line longer than `max_line` characters, or more than `max_bytes` of text (decompressed),
    is a ValueError naming the file; so is a file that is not regular. With `ratio`, a gzip file may also
    inflate to `ratio` times its compressed size where that is more than `max_bytes`.

    Memory stays about one line: lines are read with a limit, never whole."""
    raw = open_regular(path, what)
    with raw:
        stream, cap, how = raw, max_bytes, ""
        if gz or (gz is None and str(path).endswith(".gz")):
            size = os.fstat(raw.fileno()).st_size
            if ratio:
                cap = max(max_bytes, ratio * size)
            how = f" decompressed ({size_text(size)} compressed)"
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        counted = _Counted(stream, cap, f"{what} {path} holds more than {size_text(cap)} of text{how}, the most "
                                        f"this reads; refusing to read further")
        f = io.TextIOWrapper(io.BufferedReader(counted), encoding="utf-8")
        n = 0
        while True:
            line = f.readline(max_line + 1)
            if not line:
                return
            n += 1
            if len(line) > max_line and not (len(line) == max_line + 1 and line.endswith("\n")):
                raise ValueError(f"{what} {path}:{n}: line longer than {size_text(max_line)}, the most this reads "
                                 f"in one line; refusing to read it")
            yield n, line


# --- paths under a folder the user named -------------------------------------------------------------

def plain_name(name, where: str) -> str:
    """A file name that can only mean a file directly inside a folder: no `/`, `\\`, `..`, NUL, not absolute."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
            or os.path.isabs(name)):
        raise ValueError(f"{where}: {name!r:.300} is not a plain file name inside the folder; refused")
    return name


def confinement_root(folder) -> Path:
    """The folder whose inside a model folder's links may point to: the folder itself, or for a Hugging Face
    cache snapshot (`models--org--name/snapshots/<rev>`, whose files link to `../../blobs/<sha>`), the
    cached repository's folder."""
    root = Path(folder).resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent
    return root


def inside(folder, name: str, where: str, what: str = "file") -> Path:
    """`folder/name` resolved, refusing a name that is not a plain file name and a link that leads out of
    the folder (see confinement_root). The result is what to open."""
    plain_name(name, where)
    return confined(folder, Path(folder) / name, what)


def confined(folder, path, what: str = "file") -> Path:
    """`path`, found under `folder` (a listing, a glob), resolved; a link out of the folder is refused."""
    real = Path(path).resolve()
    root = confinement_root(folder)
    if real != root and root not in real.parents:
        raise ValueError(f"{what} {path} leads to {real}, outside the folder {root}; refused (copy the file "
                         f"into the folder instead of linking to it)")
    return real
