"""Exit codes of the commands (README): 0 done, 2 a user error in one `error:` line, 130 Ctrl-C, 141 a closed
pipe, 1 a crash with its traceback.

`run_main` wraps a command's main(); `USER_ERRORS` are what a bad path, model, tokenizer or data file raises
while a run is set up (an entry point turns them into its `error:` line); `says` decides which rank of a
torchrun group prints such a line, so a run of 8 ranks prints it once, not 8 times. Stdlib only: `--keys`
and the one-line errors must not wait for torch to load.
"""
import os

from r1.config_schema import ConfigError

# What a bad path, model, tokenizer or data file raises while a run is set up:
# entry points turn these into one `error:` line (exit 2) instead of a traceback.
USER_ERRORS = (ConfigError, FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, KeyError)


class NodeError(ConfigError):
    """A config error about the files this node sees (a run folder in the way, a missing path). Every rank of a
    node sees the same files, so under torchrun local rank 0 says it (once a node, not once a rank; `says`)
    and the other ranks leave with the same status without a word."""


def says(e: BaseException, run_wide: bool = False) -> bool:
    """Whether this rank prints the one-line error for `e`: one that every rank of the run meets alike
    (`run_wide`, a config error) on rank 0 only, a NodeError on local rank 0 only, the rest on every rank (they
    can differ by rank). A rank that keeps quiet waits 2 s first: torchrun stops every rank once one has
    failed, and the rank that says the error must not be stopped before it has."""
    rank = "RANK" if run_wide else "LOCAL_RANK" if isinstance(e, NodeError) else None
    if rank is None or int(os.environ.get(rank, "0")) == 0:
        return True
    import time

    time.sleep(2)
    return False


def node_error(message: str) -> SystemExit:
    """A NodeError for code that ends the command with SystemExit: its `error:` line where `says`, else a bare
    status 2 (run_main exits 2 either way)."""
    e = NodeError(message)
    return SystemExit(f"error: {e}" if says(e) else 2)


def run_main(main) -> None:
    """Run a command's main() under the README's exit codes: a user error, raised as SystemExit("error:
    ..."), prints that one line to stderr and exits with status 2; any other exit passes through. Output
    piped into a reader that stops early (`... | head`) ends the command quietly (status 141, as a shell's
    own tools), not with a traceback. A rank of a gloo group (torchrun on CPUs) then leaves through
    r1.distributed.leave, past the interpreter's teardown, which can abort it (that module says why)."""
    import sys

    try:
        main()
        sys.stdout.flush()  # a closed pipe shows here, or at exit where it could no longer be caught
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush succeeds
        _leave(141)
        sys.exit(141)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            _leave(2)
            sys.exit(2)
        if e.code is None or isinstance(e.code, int):
            _leave(e.code or 0)
        raise
    except BaseException as e:  # leaving: its traceback, as Python prints it, and the status Python gives it
        _leave(130 if isinstance(e, KeyboardInterrupt) else 1, print_error=True)
        raise
    _leave(0)


def _leave(code: int, print_error: bool = False) -> None:
    """r1.distributed.leave if that module was imported (no group can be open otherwise; importing it here
    would load torch for `--keys` and the one-line errors)."""
    import sys

    if "r1.distributed" in sys.modules:
        sys.modules["r1.distributed"].leave(code, print_error)
