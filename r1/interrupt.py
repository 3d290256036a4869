"""Ctrl-C while a command starts: one line on stderr and exit status 130, whatever it interrupts.

A command's first seconds are imports (torch, transformers) and checks; a KeyboardInterrupt there would
print the traceback of whichever import it hit. train.py and eval.py, run as scripts, call `quiet_start`
before their other imports and `started` once the work whose Ctrl-C they handle themselves begins (a run
to resume, results to keep). Under torchrun every rank gets the signal and only rank 0 says the line. Stdlib only.
"""
import os
import signal

_quiet = False  # whether quiet_start's handler is in place


def quiet_start(what: str = "nothing was written") -> None:
    """Until `started`: Ctrl-C prints `interrupted while starting: <what>` (rank 0) and exits 130 at once."""
    line = f"interrupted while starting: {what}\n".encode()

    def stop(signum, frame):
        if os.environ.get("RANK", "0") == "0":
            os.write(2, line)
        os._exit(130)  # at once: no import half-done is finished, no teardown of a library half-loaded

    global _quiet
    signal.signal(signal.SIGINT, stop)
    _quiet = True


def started() -> None:
    """Ctrl-C raises KeyboardInterrupt again, for the command's own handling (a no-op without quiet_start:
    a test that calls main() keeps its own handler)."""
    global _quiet
    if _quiet:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _quiet = False
