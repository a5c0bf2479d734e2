"""Switch FTZ / DAZ of the calling thread, to exercise the product's `fp-environment-off-profile`
refusal in-process (x86-64 MXCSR, AArch64 FPCR.FZ).

The product never sets these bits; it only checks them (`alpha_mpi.kernel.fpenv_check`). This
module reaches the one C entry point that sets them through the kernel's verification hook
`alpha_mpi.kernel.env._set_ftz_daz`.

    with ftz_daz(ftz=True, daz=False):
        ...  # fpenv_check() refuses in here
    # the previous FTZ/DAZ state is back
"""

from __future__ import annotations

import contextlib

from alpha_mpi import kernel
from alpha_mpi.kernel import env as kernel_env

__all__ = ["set_ftz_daz", "ftz_daz", "supported"]


def supported() -> bool:
    """True where this machine's FTZ/DAZ can be switched (x86-64, AArch64)."""
    return kernel.fpenv_state()["arch"] in ("x86_64", "aarch64")


def set_ftz_daz(ftz, daz) -> None:
    """Set FTZ and DAZ of the calling thread; refuses (`kernel-bad-argument`) where unsupported."""
    kernel_env._set_ftz_daz(ftz, daz)


@contextlib.contextmanager
def ftz_daz(ftz=True, daz=True):
    """Run the body with FTZ / DAZ set as given, then restore the state found on entry."""
    before = kernel.fpenv_state()
    set_ftz_daz(ftz, daz)
    try:
        yield
    finally:
        set_ftz_daz(before["ftz"], before["daz"])
