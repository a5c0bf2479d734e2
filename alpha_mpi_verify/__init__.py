"""alpha_mpi_verify: the code that proves alpha_mpi's results, kept apart from the product.

Like NCCL-tests' `verifiable/`, it lives beside both the library (`alpha_mpi`) and the test
harness (`tests/`): the product never imports it; tests and the conformance jobs do.

- `mutants`: executed mutants, wrong realizations of a declared plan that run their
  communication to completion and must be refused by the independent oracle;
- `isa`: the instruction-set conformance drivers built for x86-64 and AArch64 (qemu-user) and
  compared bit for bit (needs a source checkout): csrc/verify/conformance_driver.c, the kernel's
  functions on generated data, and csrc/verify/train_driver.c, whole training steps of the embedded
  model from a case the product's learner trained on x86-64;
- `faults`: `BitFlip`, the fault hook a learner accepts (`fault_hook=`) to flip one bit of one
  rank's slot payload, for the audit's tests (issue 24);
- `fpenv`: switches FTZ/DAZ on so that the product's refusal of an off-profile floating-point
  environment can be exercised in-process.

Hooks into the product are explicit and few: `fpenv` calls the kernel's verification hook
`alpha_mpi.kernel.env._set_ftz_daz` (documented there; no product code calls it); `mutants` builds
`alpha_mpi.planning.Plan` objects directly and runs them through the public
`alpha_mpi.execution.Combiner`. The independent oracle (`alpha_mpi.oracle`) imports nothing
from the planner or the kernel.
"""

__all__ = ["mutants", "isa", "fpenv", "faults"]
