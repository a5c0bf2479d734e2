# Metadata lives in pyproject.toml; this file hooks the cffi kernel build in (API mode) and maps the
# C sources of the engine's round into the package (csrc/ stays the one source tree).
from setuptools import find_packages, setup

# The round is built at first use by the MPI's own mpicc (alpha_mpi/execution/native.py), so a
# wheel ships its sources as package data: csrc/round/ and the kernel headers it includes.
CSRC = {
    "alpha_mpi._csrc": "csrc",
    "alpha_mpi._csrc.kernel": "csrc/kernel",
    "alpha_mpi._csrc.round": "csrc/round",
}

setup(
    # alpha_mpi is the product; alpha_mpi_verify (mutants, ISA driver, FTZ/DAZ hook) is the
    # verification package beside it, installed too so that tests and jobs can import it. The
    # product never imports it (tests/test_layers.py).
    packages=find_packages(include=["alpha_mpi", "alpha_mpi.*", "alpha_mpi_verify", "alpha_mpi_verify.*"])
    + list(CSRC),
    package_dir=CSRC,
    package_data={
        "alpha_mpi": ["py.typed"],
        "alpha_mpi._csrc": ["*.h"],
        "alpha_mpi._csrc.kernel": ["*.h"],
        "alpha_mpi._csrc.round": ["*.c", "*.h"],
    },
    # The kernel is compiled into the wheel (cffi_modules): its own C sources stay out of it.
    exclude_package_data={"alpha_mpi._csrc.kernel": ["*.c", "*.inc"]},
    cffi_modules=["alpha_mpi/kernel/build.py:ffi"],
)
