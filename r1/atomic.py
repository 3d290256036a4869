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


def refuse_links(folder: str):
    """ValueError naming the first symbolic link inside `folder` (at any depth; links are not followed).

    A run folder holds only what r1 wrote there; a link inside it (a dangling `metrics.jsonl`, an `hf` pointing
    at another folder) would have a run create, overwrite or empty files outside run.dir."""
    if os.path.islink(folder):
        raise ValueError(f"run.dir {folder} is a symbolic link; name the real folder")
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            if os.path.islink(os.path.join(top, name)):
                raise ValueError(f"{os.path.join(top, name)} is a symbolic link; r1 writes only real files inside "
                                 f"run.dir (remove the link, or choose another run.dir)")


_LOCKS = {}  # real path -> open fd: a lock lives as long as the process that writes the folder


def lock_folder(folder: str):
    """Hold an exclusive lock on `folder` for the rest of this process, or a one-line ValueError naming the pid
    that holds it: two processes appending to one run's metrics and checkpoints (two resumes of the same
    run.dir) would each believe they are the run. This process may take a folder's lock again (a resume in
    the same process, as tests do)."""
    import fcntl

    key = os.path.realpath(folder)
    if key in _LOCKS:
        return
    path = os.path.join(folder, ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ValueError(f"run.dir {folder} is in use by another process (pid {holder}); wait for it to end, "
                         f"or choose another run.dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _LOCKS[key] = fd
