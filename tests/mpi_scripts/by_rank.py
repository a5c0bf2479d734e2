"""What the launched mixed-environment scripts share (compute_mix.py, torch_compute_mix.py): a
rank's number from the launcher's environment, before MPI or any numerical library is imported
(MPICH: PMI_RANK; Open MPI: OMPI_COMM_WORLD_RANK; no MPMD flag is the same in both), a variable
set from it, and each rank's result line written whole. Imports nothing but os."""

import os

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def set_from_rank(variable: str, choices: str, default: str) -> str:
    """Set `variable` to entry RANK mod k of the comma list in the environment variable `choices`
    (else `default`); returns the value. Call before the library that reads it is imported."""
    kinds = os.environ.get(choices, default).split(",")
    os.environ[variable] = kinds[RANK % len(kinds)]
    return os.environ[variable]


def say(case: str, line: str) -> None:
    """This rank's line, `rank R CASE LINE`: on stdout, and in RESULT_DIR/rank<R>-<CASE>.txt when
    RESULT_DIR is set (the launcher may interleave the ranks' stdout; the files keep lines whole)."""
    text = f"rank {RANK} {case} {line}"
    print(text, flush=True)
    if os.environ.get("RESULT_DIR"):
        with open(os.path.join(os.environ["RESULT_DIR"], f"rank{RANK}-{case}.txt"), "w") as f:
            f.write(text + "\n")
