"""The `alpha-mpi` command: a registry of subcommands, each in its own module under tools/.

Every subcommand is `run(args) -> int`. A Refusal prints its code and what to do, and exits 3;
usage errors exit 2. Under MPI (more than one rank) an unhandled failure on one rank aborts the
whole job, so no rank is left waiting for a peer that is gone.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .refusals import Refusal

COMMANDS = {
    "plan": ("alpha_mpi.tools.plan_cmd", "print a combine tree's per-rank schedule and traffic (no MPI)"),
    "train": ("alpha_mpi.tools.train_cmd", "data-parallel training with declared-order gradient combines"),
    "bench": ("alpha_mpi.tools.bench", "benchmarks against MPI_Allreduce (run under mpiexec)"),
    "checkpoint": ("alpha_mpi.tools.checkpoint_cmd", "verify or inspect a sharded checkpoint"),
}

EXIT_USAGE = 2
EXIT_REFUSAL = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="alpha-mpi",
        description="Reductions as declared binary64 expression trees: the same bits on every run and rank count.",
        epilog="Run `alpha-mpi COMMAND --help` for a command's options. Refusals exit 3 with a stable code.",
    )
    p.add_argument("--version", action="version", version=f"alpha_mpi {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def _world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.COMM_WORLD.Get_size() if mpi is not None and mpi.Is_initialized() else 1


def _abort_others(code: int) -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        # Every rank refuses at once: give the launcher a moment to forward what each printed
        # before the first Abort tears the job (and its output pipes) down.
        import time

        time.sleep(0.3)
        mpi.COMM_WORLD.Abort(code)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv or ["--help"])
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.print_usage(sys.stderr)
        print(
            f"alpha-mpi: error [usage] unknown command {name!r}; choose from {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.run(rest) or 0)
    except Refusal as e:
        rank = _rank_prefix()
        print(f"alpha-mpi{rank}: error [{e.code}] {e.message}\n  what to do: {e.advice}", file=sys.stderr)
        _abort_others(EXIT_REFUSAL)
        return EXIT_REFUSAL
    except KeyboardInterrupt:
        _abort_others(130)
        return 130
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        _abort_others(1)
        return 1


def _rank_prefix() -> str:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        return f" (rank {mpi.COMM_WORLD.Get_rank()})"
    return ""


def subparser(name: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"alpha-mpi {name}", description=description)


if __name__ == "__main__":
    raise SystemExit(main())
