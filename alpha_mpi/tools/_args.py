"""What the `alpha-mpi` commands share: their parsers, option types and exit codes.

The commands (tools/*_cmd.py) import this module and cli.py imports the commands, so imports run
one way: cli -> tools/*_cmd -> tools/_args. Nothing here imports cli.py.

Exit codes, the same for every command (docs/exit-codes.md lists them):

    0    done
    1    a bug: an unexpected error (the traceback is printed) or `bench` results that are not
         bit-identical (BITS MISMATCH); please report it
    2    a usage error: an unknown command or option, an option value out of its range, options
         that contradict each other, or a library refusal coded `usage`
    3    a refusal: the library refused what was asked by a stable code (`[topology-invalid]`,
         `[checkpoint-corrupt]`, ...); `checkpoint verify` also exits 3 when a step fails
    70   a combine failed and the job could not end cleanly (a peer is gone or frames are in
         flight): alpha_mpi aborted the job (alpha_mpi.execution.abort.ABORT_STATUS)
    98   `train --audit-slots` detected silent data corruption (`sdc-detected`): nothing was applied,
         the last state known clean is saved with --checkpoint-dir (`latest` names it); resume
         without the named rank's node (jobs/train.sbatch requeues excluding it); also after
         `sdc-undetermined` recurs on the retried step (no rank shown wrong: no node is named)
    99   `train` stopped on SIGUSR1/SIGTERM after saving a checkpoint (requeue and --resume;
         alpha_mpi.learning.PREEMPTED)
    130  interrupted (Ctrl-C)
    141  the reader of the output went away (`alpha-mpi plan | head`), as a shell reports SIGPIPE
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import stat
import textwrap

from ..refusals import Refusal

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_REFUSAL = 3
EXIT_ABORTED = 70  # == alpha_mpi.execution.abort.ABORT_STATUS (a test holds them equal)
EXIT_SDC = 98  # silent data corruption detected by the audit (alpha_mpi.learning.audit)
EXIT_PREEMPTED = 99  # == alpha_mpi.learning.PREEMPTED (a test holds them equal)
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

#: (code, meaning) in the order the README lists them.
EXIT_CODES = (
    (EXIT_OK, "done"),
    (EXIT_INTERNAL, "a bug: an unexpected error (traceback printed) or bench results not bit-identical"),
    (EXIT_USAGE, "a usage error: unknown command or option, a value out of range, contradicting options"),
    (EXIT_REFUSAL, "a refusal by a stable code, e.g. [topology-invalid]; a failed `checkpoint verify`"),
    (EXIT_ABORTED, "a combine failed and the job could not end cleanly (a peer is gone): job aborted"),
    (EXIT_SDC, "`train` detected silent data corruption (sdc-detected); last audited state saved"),
    (EXIT_PREEMPTED, "`train` stopped by SIGUSR1/SIGTERM after saving a checkpoint"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_BROKEN_PIPE, "the reader of the output went away (| head)"),
)


def subparser(name: str, description: str, examples=()) -> argparse.ArgumentParser:
    """The parser of `alpha-mpi NAME`: the description wrapped, the examples kept as written."""
    return argparse.ArgumentParser(
        prog=f"alpha-mpi {name}",
        description=wrap(description),
        epilog=examples_epilog(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def wrap(text: str, width: int | None = None) -> str:
    """Paragraphs (separated by blank lines) wrapped to `width` columns (default: as argparse)."""
    width = width or max(40, min(100, shutil.get_terminal_size().columns - 2))
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width) for p in text.split("\n\n"))


def examples_epilog(examples) -> str | None:
    """An epilog listing example command lines (each a string), or None when there are none."""
    if not examples:
        return None
    return "examples:\n" + "\n".join(f"  {e}" for e in examples)


def at_least(lo: int):
    """An argparse type: an integer >= lo (argparse turns the refusal into exit 2)."""

    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}")
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse


def real(lo: float, hi: float = math.inf, lo_open: bool = True, hi_open: bool = True):
    """An argparse type: a finite float in the interval (or closed ends) from lo to hi."""

    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be a finite number in {span}, got {text}")
        return v

    return parse


def path(text: str) -> str:
    """An argparse type: a non-empty path. An empty string would name the working directory to
    some calls and nothing to others (`--checkpoint-dir ''` saved nothing), so it is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def write_output(path: str, text: str, flag: str = "--json") -> None:
    """Write a command's output file (`flag` names the option that gave `path`). Opened
    non-blocking, so a FIFO with no reader is refused instead of waited on; a directory, a full
    disk (/dev/full) or a missing folder are refused as `output-unwritable`, never a traceback."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NONBLOCK", 0), 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError as e:
        raise Refusal("output-unwritable", f"{flag} {path}: cannot write it: {e.strerror or e}")


def check_output(path: str, flag: str = "--json", make_folder: bool = False) -> None:
    """Refuse, before any work, an output path no result could be written to: a directory, a
    FIFO or socket (a write would wait for a reader), a missing or read-only folder. With
    `make_folder` (the writer creates missing folders, as the benchmarks' JSON does) a missing
    folder is fine when its nearest existing ancestor is a writable directory."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as e:
        raise Refusal("output-unwritable", f"{flag} {path}: {e.strerror}")
    if mode is not None and (stat.S_ISDIR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise Refusal("output-unwritable", f"{flag} {path}: a directory, FIFO or socket, not a file")
    if make_folder:
        while not os.path.lexists(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise Refusal("output-unwritable", f"{flag} {path}: the folder {folder} must exist and be writable")
    if mode is not None and not os.access(path, os.W_OK):
        raise Refusal("output-unwritable", f"{flag} {path}: the file is not writable")


def int_option(p: argparse.ArgumentParser, flag: str, default, help: str, lo: int = 1, **kw) -> None:
    """Add an integer option >= lo whose help ends with its default (so the two never differ)."""
    shown = "" if default is None else f" (default {default})"
    p.add_argument(flag, type=at_least(lo), default=default, help=help + shown, **kw)
