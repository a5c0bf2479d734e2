"""The kernel layer (3): fixed-order binary64 arithmetic in C (csrc/, built by cffi), as one package.

What a caller imports is this package, `alpha_mpi.kernel` (or `from .. import kernel`); its
names are those of api.py, which re-exports the rest. The modules, one concern each:

    api.py       combines (add, tree programs, fold), finiteness, the conversion sites
    dense.py     the fixed-order dense kernels (products, column sums, ReLU, softmax
                 cross-entropy, exp, log) and the ISA path they run on (`isa_path()`)
    updates.py   the optimizer updates (Adam, SGD) over proposal buffers
    buffers.py   the float64/float32 buffer checks every C call is wrapped with
    vectors.py   a new array's checks and data pointer in one C call (the prepared runs' binding)
    env.py       the floating-point environment check and the build identity
    identity.py  the compute identity of this process (numpy, its BLAS, torch; model/compute.py)
    compiled.py  the compiled module `alpha_mpi.kernel._alpha_kernel`, loaded once (`ffi`, `lib`)
    build.py     its cffi build (setup.py `cffi_modules`), with the flags in one place

`ffi` and `lib` (the cffi objects) are importable from here for the layers that call C
directly (the array reductions); they are not part of `__all__`.
"""

from .._lazy import lazy_attributes as _lazy_attributes

# Every name loads on first use: the executor and the arrays call C through `ffi` and `lib`
# alone, and need none of the optimizer, dense or compute-identity modules (nor numpy's BLAS
# probe) to start.
_LAZY = {
    "add": ".api",
    "tree_eval": ".api",
    "fold": ".api",
    "check_program": ".api",
    "first_nonfinite": ".api",
    "adam_step": ".api",
    "adam_step_inplace_checked": ".api",
    "adamw_step": ".api",
    "sgd_step": ".api",
    "widen_binary32": ".api",
    "round_binary64": ".api",
    "fpenv_check": ".api",
    "fpenv_state": ".api",
    "build_info": ".api",
    "compute_identity": ".api",
    "OP_ADD": ".api",
    "MAX_DEPTH": ".api",
    "ISA_ENV": ".dense",
    "matmul": ".dense",
    "matmul_tn": ".dense",
    "matmul_nt": ".dense",
    "col_sum": ".dense",
    "relu": ".dense",
    "relu_backward": ".dense",
    "softmax_xent": ".dense",
    "exp": ".dense",
    "log": ".dense",
    "isa_path": ".dense",
    "isa_paths": ".dense",
    "select_isa_path": ".dense",
    "ffi": ".compiled",  # for `from ..kernel import ffi, lib`; not in __all__
    "lib": ".compiled",
}

#: api.py's names (0.1's), then the dense kernels.
__all__ = [
    "add",
    "tree_eval",
    "fold",
    "check_program",
    "first_nonfinite",
    "adam_step",
    "adam_step_inplace_checked",
    "adamw_step",
    "sgd_step",
    "widen_binary32",
    "round_binary64",
    "fpenv_check",
    "fpenv_state",
    "build_info",
    "compute_identity",
    "OP_ADD",
    "MAX_DEPTH",
    "ISA_ENV",
    "matmul",
    "matmul_tn",
    "matmul_nt",
    "col_sum",
    "relu",
    "relu_backward",
    "softmax_xent",
    "exp",
    "log",
    "isa_path",
    "isa_paths",
    "select_isa_path",
]

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())
