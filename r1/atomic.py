"""Durable file writes for everything a resume reads back: temp file, fsync, rename, fsync the folder.

`os.replace` alone is atomic against a crash of the process but not of the
machine: without fsync the rename can reach the disk before the data, and a
power cut leaves a complete-looking empty file. So a file is written to
`name.tmp`, flushed and fsynced, renamed over `name`, and the folder is
fsynced so the rename itself is durable. On any error the temp file is
removed and the old file is untouched. stdlib only (trajectory tools import it).
"""
import errno
import os


def fsync_dir(path: str):
    """Make renames and creations inside `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_bytes(path: str, data: bytes):
    """Replace `path` with `data`, atomically and durably."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(path))


def write_text(path: str, text: str):
    write_bytes(path, text.encode("utf-8"))


def describe_os_error(e: BaseException) -> str:
    """A short reason for a write failure, saying 'no space left on device' when that is the cause."""
    err = e
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return "no space left on device"
    if isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied ({err.strerror})"
    if isinstance(err, OSError):
        return f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
    text = str(e)
    if "No space left" in text:
        return "no space left on device"
    return text.splitlines()[0][:200] if text else type(e).__name__
