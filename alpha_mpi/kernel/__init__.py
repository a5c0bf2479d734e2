"""The kernel layer (3): fixed-order binary64 arithmetic in C (csrc/, built by cffi), as one package.

What a caller imports is this package, `alpha_mpi.kernel` (or `from .. import kernel`); its
names are those of api.py, which re-exports the rest. The modules, one concern each:

    api.py       combines (add, tree programs, fold), finiteness, the conversion sites
    dense.py     the fixed-order dense kernels (products, column sums, ReLU, softmax
                 cross-entropy, exp, log) and the ISA path they run on (`isa_path()`)
    updates.py   the optimizer updates (Adam, SGD) over proposal buffers
    buffers.py   the float64/float32 buffer checks every C call is wrapped with
    env.py       the floating-point environment check and the build identity
    identity.py  the compute identity of this process (numpy, its BLAS, torch; model/compute.py)
    compiled.py  the compiled module `alpha_mpi.kernel._alpha_kernel`, loaded once (`ffi`, `lib`)
    build.py     its cffi build (setup.py `cffi_modules`), with the flags in one place

`ffi` and `lib` (the cffi objects) are importable from here for the layers that call C
directly (the array reductions); they are not part of `__all__`.
"""

from .api import (  # noqa: F401 -- the package's names are api.py's
    MAX_DEPTH,
    OP_ADD,
    adam_step,
    adam_step_inplace_checked,
    adamw_step,
    add,
    build_info,
    check_program,
    compute_identity,
    first_nonfinite,
    fold,
    fpenv_check,
    fpenv_state,
    round_binary64,
    sgd_step,
    tree_eval,
    widen_binary32,
)
from .api import __all__ as _api_names
from .compiled import ffi, lib  # noqa: F401 -- for `from ..kernel import ffi, lib`
from .dense import (  # noqa: F401 -- the dense kernels
    ISA_ENV,
    col_sum,
    exp,
    isa_path,
    isa_paths,
    log,
    matmul,
    matmul_nt,
    matmul_tn,
    relu,
    relu_backward,
    select_isa_path,
    softmax_xent,
)
from .dense import __all__ as _dense_names

__all__ = list(_api_names) + list(_dense_names)  # 0.1's names, then the dense kernels
