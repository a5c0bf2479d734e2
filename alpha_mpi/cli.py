"""The `alpha-mpi` command: a registry of subcommands, each in its own module under tools/.

Every subcommand module has `run(argv) -> int`. The exit status means the same for every command
(the table is in alpha_mpi/tools/_args.py and docs/exit-codes.md): 0 done, 1 a bug,
2 a usage error, 3 a refusal by a stable code, 70 a job aborted after a failed combine, 99 train
preempted, 130 interrupted, 141 output closed. A refusal prints its code, message and the advice
worded for the command line (alpha_mpi.refusals.cli_advice). Under MPI (more than one rank) a
failure on one rank aborts the whole job with that status, so no rank is left waiting for a peer
that is gone. Imports run one way: this module imports the commands, never the reverse.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .refusals import USAGE_CODES, Refusal, cli_advice
from .tools._args import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_REFUSAL,
    EXIT_USAGE,
)

COMMANDS = {
    "plan": ("alpha_mpi.tools.plan_cmd", "print a combine tree's per-rank schedule and traffic (no MPI)"),
    "train": ("alpha_mpi.tools.train_cmd", "data-parallel training with declared-order gradient combines"),
    "bench": ("alpha_mpi.tools.bench", "benchmarks against MPI_Allreduce (run under mpiexec)"),
    "checkpoint": ("alpha_mpi.tools.checkpoint_cmd", "verify or inspect a sharded checkpoint"),
    "env": (
        "alpha_mpi.tools.env_cmd",
        "what this process runs on: MPI, numpy/BLAS, torch, kernel, compute identity",
    ),
    "native": ("alpha_mpi.tools.native_cmd", "show or build the engine's C round for this MPI (mpicc)"),
}

EXAMPLES = (
    "alpha-mpi plan --slots 8 --ranks 4 --topology hierarchy:2",
    "mpiexec -n 4 alpha-mpi train --steps 50",
    "mpiexec -n 2 alpha-mpi bench allreduce --sizes 8,1M",
    "alpha-mpi checkpoint verify ckpt --all",
)


def _parser() -> argparse.ArgumentParser:
    """The top-level parser, for --help and --version (main dispatches the command itself)."""
    width = max(len(name) for name in COMMANDS) + 2
    p = argparse.ArgumentParser(
        prog="alpha-mpi",
        description="Reductions as declared binary64 expression trees: the same bits on every run and "
        "rank count.\n\ncommands:\n"
        + "".join(f"  {name:<{width}s}{help_text}\n" for name, (_, help_text) in COMMANDS.items()),
        epilog="examples:\n"
        + "".join(f"  {e}\n" for e in EXAMPLES)
        + "\nRun `alpha-mpi COMMAND --help` for a command's options and examples.\n\nexit status:\n"
        + "".join(f"  {code:>3d}  {meaning}\n" for code, meaning in EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"alpha_mpi {__version__}")
    p.add_argument("command", metavar="COMMAND", help="one of the commands above")
    p.add_argument("args", metavar="...", nargs=argparse.REMAINDER, help="the command's options")
    return p


def _world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.COMM_WORLD.Get_size() if mpi is not None and mpi.Is_initialized() else 1


def _abort_others(code: int) -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        # Every rank refuses at once: abort_job lets the launcher forward what each printed
        # before the first Abort tears the job (and its output pipes) down.
        from .execution.abort import abort_job

        abort_job(code)


def main(argv=None) -> int:
    """Run `alpha-mpi ARGV` (default sys.argv[1:]); returns the exit status (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv:  # no command: the help, as a usage error (a script that forgot its command fails)
        parser.print_help()
        return EXIT_USAGE
    if argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv[:1])
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.print_usage(sys.stderr)
        print(
            f"alpha-mpi: error [usage] unknown command {name!r}; choose from {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.run(rest) or 0)
    except Refusal as e:
        # A library refusal coded `usage` or `options-conflict` is a usage error (2); every other
        # code is a refusal (3).
        status = EXIT_USAGE if e.code in USAGE_CODES else EXIT_REFUSAL
        formerly = f" (formerly [{e.former_code}])" if e.former_code else ""  # refusals.FORMERLY
        _say_whole(
            f"alpha-mpi{_rank_prefix()}: error [{e.code}] {e.message}{formerly}\n"
            f"  what to do: {cli_advice(e.code, name)}"
        )
        _abort_others(status)
        return status
    except KeyboardInterrupt:
        _abort_others(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`alpha-mpi plan | head`): stop quietly, as a shell reports SIGPIPE.
        # Later writes (the interpreter's flush at exit) go to /dev/null instead of raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        _abort_others(EXIT_BROKEN_PIPE)
        return EXIT_BROKEN_PIPE
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        _abort_others(EXIT_INTERNAL)
        return EXIT_INTERNAL


def _say_whole(text: str) -> None:
    """Write `text` and its newline to stderr in one write(2). Under mpiexec every rank refuses
    at once into the launcher's pipes, and print's two writes (the text, then the newline) let
    another rank's report land between them, on the same line; one write of up to PIPE_BUF
    bytes (4096 on Linux) reaches a pipe whole."""
    data = (text + "\n").encode(errors="replace")
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (a test's)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    sys.stderr.flush()
    while data:
        data = data[os.write(fd, data) :]


def _rank_prefix() -> str:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        return f" (rank {mpi.COMM_WORLD.Get_rank()})"
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
