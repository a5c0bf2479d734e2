"""One exception base with stable kebab-case codes.

Every refusal says what was expected, what was found, and what to do. The codes are part of the
public contract: scripts and job wrappers match on them, so a code is never renamed, only added
(a code that covered several mistakes may be split; CHANGELOG.md lists which now raise what, and
the old name stays an alias of the split-off code for one release: FORMERLY).
`ADVICE` holds the "what to do" sentence for each code in one place, so the docs and the
exceptions say the same thing. `FORMERLY` names, for each code split off an older code that
meant several things, the code it was raised as before: the old name stays an alias of the new
code for one release (`refusal.matches(old)`, and the refusal's text names it). Where that sentence speaks the Python API, `CLI_ADVICE` holds the
same advice worded for the `alpha-mpi` command line (the options to change); `cli_advice(code)`
is what the command line prints.
"""

from __future__ import annotations

__all__ = [
    "ADVICE",
    "CLI_ADVICE",
    "FORMERLY",
    "ALIAS_UNTIL",
    "USAGE_CODES",
    "cli_advice",
    "Refusal",
    "ModelRefusal",
    "PlanRefusal",
    "KernelRefusal",
    "FrameRefusal",
    "PeerTimeout",
    "NumericalProfileMismatch",
    "NumericalOrderMismatch",
    "CheckpointRefusal",
]

ADVICE: dict[str, str] = {
    # model / coverage
    "tree-malformed": "build trees from Leaf and Branch only (or the star/hierarchy builders)",
    "tree-too-large": "split the reduction into several trees or raise the limit deliberately",
    "slot-invalid": "slots are non-negative integers naming logical contributions",
    "owner-out-of-range": "place every leaf and branch on a rank in 0..size-1 of the communicator",
    "coverage-missing-leaf": "add a leaf for every member of the declared coverage",
    "coverage-duplicate-leaf": "each member must appear exactly once in the tree",
    "coverage-unknown-leaf": "remove leaves that are not members of the declared coverage",
    "coverage-order-mismatch": "order the leaves exactly as the OrderedMembers list declares",
    "coverage-invalid": "declare coverage as OrderedMembers([...]) or ParticipantGroup(range(...))",
    "topology-invalid": "use 'pairwise', 'star', 'star:HUB' or 'hierarchy:K' with K >= 1",
    "placement-invalid": "give owners as a rank count, a list with one rank per slot, or a slot->rank mapping",
    # delivery / planning
    "delivery-target-not-owner": "DeliverTo must name a rank that owns at least one leaf",
    "delivery-invalid": "use ReplicateAll() or DeliverTo(rank)",
    "layout-invalid": "a payload layout is a non-empty list of (name, element count >= 1) pairs",
    "plan-rank-mismatch": "plan for the communicator you execute on (plan(..., size=comm.size))",
    "step-parse-error": "an op reads like 'P3', 'S3', 'W3', 'E2' (planning.program.Op); an array exchange round like 'R1 >3 <0 g2' (planning.array_program.Round)",
    "plan-simulation-failed": "the plan is inconsistent; this is a planner bug, please report it",
    "internal-error": "alpha_mpi found its own state inconsistent while running (a bug, not your input): report it with the message and the rank count; the call returned no result, so call it again only after a fix",
    "data-parallel-assembly-overlap": "give each coordinate to exactly one owner (ranges must not overlap)",
    "data-parallel-assembly-coverage": "the owners' ranges must cover 0..n-1 with no hole",
    "plan-size-invalid": "give the rank count as an int >= 1 (size=comm.size)",
    "rank-out-of-range": "ask for a rank in 0..size-1 of the plan",
    "rank-order-invalid": "give the exchange order as a permutation of 0..size-1 that contains this rank",
    "plan-kind-mismatch": "give each runner the plan it runs: Combiner a tree Plan (plan()), ScatterCombiner plan_scatter(), Engine any realize() Program",
    "segment-invalid": "give the scatter segment as an int >= 1 (elements per frame), or leave it out",
    # kernel / numerics
    "kernel-bad-argument": "check the array lengths and dtypes passed to the kernel",
    "kernel-bad-program": "the fused tree program is malformed; build it with the planner",
    "kernel-unavailable": "reinstall with `pip install -e .` so the cffi kernel is compiled",
    "kernel-isa-unavailable": "unset ALPHA_MPI_ISA or name a path the message lists as available "
    "(every path gives the same bits; the choice changes speed only)",
    "native-build-failed": "the engine's C round is built at first use by the MPI's own mpicc: make that mpicc (and Python's headers) available, or set ALPHA_MPI_MPICC to it and ALPHA_MPI_NATIVE_CACHE to a writable directory; `alpha-mpi native` shows what it uses",
    "native-mpi-mismatch": "the engine's C round was linked against another MPI library than the one mpi4py loaded: delete the cached module `alpha-mpi native` names (or set ALPHA_MPI_MPICC to the mpicc of the MPI mpi4py uses) and run again",
    "non-finite-input": "a NaN or Inf reached an update input; the state was left unchanged; find its source (learning rate, data)",
    "non-finite-output": "an update overflowed to Inf/NaN; the state was left unchanged; lower the learning rate or rescale",
    "non-finite-contribution": "a contribution holds NaN/Inf; nothing was combined or applied; check the values the message names (the slot or block, and the index) and where they came from",
    "non-finite-combined": "the combined value overflowed; nothing was applied; rescale the contributions",
    "fp-environment-off-profile": "something switched the FPU to flush-to-zero/denormals-are-zero or a non-nearest rounding mode (a library built with fast-math start-up code, which alpha_mpi never accepts?); remove it or reset the FP environment",
    "fast-math-refused": "alpha_mpi never builds with fast-math/FMA contraction; remove the flag from ALPHA_MPI_CFLAGS",
    "dtype-invalid": "contributions are float64 arrays: convert with numpy (astype(np.float64); exact for integers up to 2**53), or float32 exactly with alpha_mpi.kernel.widen_binary32",
    # frames / execution
    "frame-magic": "the peer is not an alpha_mpi peer of this format version; run the same alpha_mpi on every rank",
    "frame-version": "every rank must run the same alpha_mpi frame format version",
    "frame-checksum": "a frame header was corrupted in transit or by a peer; rerun and check the interconnect",
    "frame-identity-mismatch": "every rank must execute the same plan (same tree, placement, delivery, layout, realization, rank count)",
    "frame-contract-mismatch": "build every rank's executor under the same numerical contract (the same optimizer, alpha_mpi build and compute identity, or the same contract= digest); `alpha-mpi env` on each node shows what differs",
    "frame-sequence-mismatch": "build and run the same executors in the same order on every rank of a communicator (no rank may skip or add one), and give each executor its own duplicate (leave dup=True)",
    "frame-order-mismatch": "every rank must combine with the same declared order (tree order id)",
    "frame-topology-mismatch": "every rank must use the same topology (star vs hierarchy are different contracts)",
    "frame-size-mismatch": "every rank must use the same payload layout and element count",
    "frame-routing-mismatch": "a frame arrived with another sender/receiver/edge/phase than planned; run the same plan everywhere",
    "frame-step-mismatch": "the ranks are out of step (one skipped or repeated a combine); call combine the same number of times on every rank",
    "contribution-missing": "pass a payload for every slot this rank owns",
    "contribution-unexpected": "pass payloads only for the slots this rank owns in the tree",
    "contribution-shape": "each contribution must have the layout's element count",
    "contribution-size-mismatch": "pass payloads of one size on every rank in one call (the message says which rank passed which size); the sizes may change from call to call, alike on every rank",
    "layout-missing": "pass layout= (a Layout, or each contribution's element count) on every rank when you give a tree; a Plan carries its own layout",
    "contributions-not-mapping": "pass a dict {slot: array} (e.g. {comm.rank: x}), or call alpha_mpi.allreduce(comm, x) with no tree for one contribution per rank; an Assembler takes a dict {(start, stop): array} of the ranges this rank owns",
    "peer-timeout": "a peer did not send within the bound; check the peer's log (it may have crashed) or raise ALPHA_MPI_TIMEOUT",
    "peer-failed": "MPI reported an error on a frame with a peer: that peer's process ended or the interconnect failed; look first for a traceback or a refusal in that rank's output (a rank that stopped on an error of its own and exited is the commonest cause: act on that error), and only when it printed none did it die (the launcher's output says how: a signal, out of memory)",
    "realization-inapplicable": "choose one of the realizations the message lists (tree, scatter and replicate apply to every tree), or realization='auto'",
    "peer-refused": "another rank refused (the message names that rank and its code: see its error); every rank completed the round, nothing was applied, and the next call works",
    "frame-payload-corrupt": "a frame's payload checksum failed (corrupted in transit or in memory); nothing was applied; rerun and check the interconnect and memory",
    "out-invalid": "pass out= as a writeable C-contiguous float64 array of the result's length, or leave it out",
    "calibration-invalid": "write the file with `alpha-mpi bench calibrate --out FILE` (JSON with alpha, beta, gamma in seconds), or unset ALPHA_MPI_CALIBRATION",
    "plan-delivery-mismatch": "give the delivery the plan was made with (or none), and use reduce_scatter / mode='reduce-scatter' for chunks",
    "executor-reentrant": "wait for one combine to finish before starting another on the same plan",
    "executor-freed": "this executor was freed (.free()): build a new one on every rank; free it on every rank only once no rank runs it again",
    "combiner-broken": "this executor (combiner, assembler, or the arrays' exchanges of this communicator) failed earlier and frames may still be in flight; build a new one on every rank (arrays: alpha_mpi.arrays.reset(comm) on every rank; the convenience calls: alpha_mpi.execution.reset(comm) on every rank), or restart the job",
    # protocol under mistakes (issue 22): executor identity agreed at construction
    "executor-identity-mismatch": "every rank must build the same executors (same tree, placement, delivery, layout, realization, contract, ALPHA_MPI_PAYLOAD_CHECK) in the same order on a communicator, and run them in the same order; the message names the ranks that differ (after a mismatch found during a run, reset(comm) on every rank, then build anew)",
    "tag-space-exhausted": "free the executors you no longer use on this communicator (.free() on every rank) so that their MPI tags can be handed out again, or build fewer at once (an MPI whose MPI_TAG_UB is 32767 holds fewer)",
    # distributed arrays (alpha_mpi.arrays)
    "array-block-invalid": "pass this rank's block as a float64 array x (and y of the same shape): 1-D with integers 0 <= offset, offset + len(x) <= n, or an N-d tile (at most 4 dimensions) with tuples offset and shape, inside the shape in every dimension",
    "array-batch-invalid": "pass dots() a list of 1..4096 (x, y) pairs of blocks, the same number on every rank",
    "array-length-mismatch": "every rank must pass the same global length n (or the same global shape, as a tuple)",
    "array-coverage-hole": "the ranks' blocks must cover the global array without a gap (empty blocks are fine); check each rank's offset and block shape",
    "array-coverage-overlap": "each global index must belong to exactly one rank's block; check each rank's offset and block shape",
    # contracts
    "numerical-profile-mismatch": "both sides must use the same numerical profile; adopt the new contract explicitly",
    "numerical-order-mismatch": "both sides must use the same operation order (tree order id, optimizer formula)",
    "bounded-difference-without-evidence": "record conformance evidence (ulp/abs error over a named suite) before running a BoundedDifference contract",
    "evidence-outside-tolerance": "the recorded error exceeds the tolerance; widen it deliberately or fix the kernel",
    "unchecked-claimed-equal": "an Unchecked contract may run but is never claimed equal to anything",
    "evidence-build-mismatch": "conformance evidence names the kernel build it was measured on; measure it again with this build (measure_evidence)",
    "conformance-suite-unknown": "name a registered conformance suite (alpha_mpi.numerics.SUITES)",
    "numerical-contract-invalid": "build contracts with contract_for_plan() or from a dict written by NumericalContract.to_dict()",
    "oracle-mismatch": "the executed result is not the declared tree's result; the order that ran differs from the declared one (mutant, planner or kernel bug)",
    "mutant-not-applicable": "this tree has no place for that mutation (too few leaves or ranks); use a larger tree",
    "mutant-unobservable": "the data gives the mutant the declared bits, so it proves nothing; use order-sensitive data",
    # checkpoints
    "checkpoint-exists": "a published step is immutable; save under a new step",
    "checkpoint-missing": "no checkpoint there; check the path (restore(..., missing_ok=True) starts from scratch instead)",
    "checkpoint-corrupt": "a file of the step differs from the sha256 that covers it; restore an earlier step that verifies (pass its directory DIR/step-NNNNNNNN to restore) and save into a new directory (in DIR the damaged step would collide with the next saves: checkpoint-exists)",
    "checkpoint-shard-missing": "a file named by the manifest is absent; restore an earlier step (pass its directory DIR/step-NNNNNNNN to restore) and save into a new directory (in DIR the damaged step would collide with the next saves)",
    "checkpoint-path-escape": "a manifest entry points outside the checkpoint directory; refuse this checkpoint",
    "checkpoint-format-version": "this checkpoint was written by another format version; use a matching alpha_mpi",
    "checkpoint-manifest": "the manifest is malformed; restore an earlier step (pass its directory DIR/step-NNNNNNNN to restore) and save into a new directory (in DIR the damaged step would collide with the next saves)",
    "checkpoint-config-mismatch": "restore with the configuration the checkpoint was saved with (the message names what differs: a config key, the model, the optimizer, a registered object), or save into a fresh directory",
    "checkpoint-latest-invalid": "`latest` must be a regular file that alpha_mpi wrote (`step-NNNNNNNN <sha256>`); delete it to resume from the newest step that verifies, or restore a step directory DIR/step-NNNNNNNN",
    "checkpoint-shard-invalid": "a shard's safetensors header disagrees with its manifest entry (dtype, shape, size); restore an earlier step (pass its directory DIR/step-NNNNNNNN to restore) and save into a new directory",
    "checkpoint-data-mismatch": "resume with the data the checkpoint was trained on; start a fresh run for other data",
    "checkpoint-locked": "another trainer holds this checkpoint directory; wait for it to end, stop it, or use another directory",
    "checkpoint-write-failed": "free disk space or fix permissions on the checkpoint directory; the previous published step is intact",
    "checkpoint-config-invalid": "a checkpoint's config holds JSON scalars only (string, finite number, true/false, null) under names like `batch` or `model_name`",
    "checkpoint-dir-is-step": "give the checkpoint directory (the parent of step-NNNNNNNN); to restore one step, pass its step directory to restore",
    "model-invalid": "give a model with at least one input feature, hidden unit and class, small enough for memory",
    # user models (alpha_mpi.learning.Model, alpha_mpi.torch)
    "model-protocol": "implement alpha_mpi.learning.Model: n_params (int >= 1), init(seed) -> float64 array (n_params,), loss_and_grad_sum(params, X, y, grad_out) -> float (see help(alpha_mpi.learning.Model))",
    "model-nondeterministic": "a slot's gradient must have the same bits on every call with the same inputs: draw randomness (dropout, noise) from the generator the learner passes (accept the keyword `rng` in loss_and_grad_sum and draw from it), never from np.random or torch's global generator; fix the BLAS / intra-op threads (threadpoolctl, torch.set_num_threads) and use deterministic kernels only",
    # every rank starts from the same state (alpha_mpi.learning.same_start)
    "initial-params-mismatch": "every rank must start from the same parameters: make Model.init(seed) a function of seed alone (np.random.default_rng([seed, ...]), no rank, no global random state), or pass the same init_params on every rank",
    "model-rank-dependent": "a slot's gradient must not depend on the rank that computes it: read no rank, rank count, hostname or global random state in loss_and_grad_sum, and fix the BLAS / intra-op threads (threadpoolctl, torch.set_num_threads)",
    "bench-document-invalid": "give `alpha-mpi bench summary` the JSON files `alpha-mpi bench allreduce --json` wrote (or a sweep merged from them with --merge)",
    "model-factory": "give --model as module:factory with the module importable from the working directory or PYTHONPATH; factory(inputs, classes) returns a Model or a torch.nn.Module",
    "torch-unavailable": "install the PyTorch extra: pip install 'alpha_mpi[mpich,torch]' (or 'alpha_mpi[torch]' where your cluster's MPI module is loaded)",
    "mpi-unavailable": "install an MPI: pip install 'alpha_mpi[mpich,torch]' (the MPICH wheel, with its mpiexec), or load your cluster's MPI (e.g. `module load openmpi`) before starting Python; MPI4PY_LIBMPI names a libmpi explicitly",
    "torch-module-unsupported": "alpha_mpi.torch trains CPU modules whose trainable parameters all have one dtype, float32 or float64",
    "torch-buffers-refused": "the module has buffers (e.g. BatchNorm running statistics): pass buffers='slot-mean' to combine them by the documented rule, or use a buffer-free normalisation (LayerNorm, GroupNorm)",
    "torch-environment-changed": "keep torch.set_num_threads and torch.use_deterministic_algorithms as DataParallel set them for the whole run (they are in its contract)",
    "torch-loss-invalid": "loss_fn(output, target) must return a finite scalar tensor, the SUM of the slot's losses (reduction='sum'), or a pair (loss_sum, mass) with a finite mass >= 0; a module's own loss is declared with alpha_mpi.torch.ModuleLoss(mass=...)",
    "torch-optimizer-state": "checkpoints hold optimizer state made of per-parameter tensors shaped like their parameter, and scalars (Adam, AdamW, SGD, RMSprop, ...)",
    # alpha_mpi.torch: the promise for users' scripts (issue 20)
    "torch-loss-undeclared": "declare what loss_fn returns: the SUM of the slot's per-sample losses (a torch loss with reduction='sum', alpha_mpi.torch.summed(fn), or dp.step(..., reduction='sum')), or return the pair (loss_sum, mass)",
    "mpi-thread-level": "initialise MPI with MPI_THREAD_SERIALIZED or more (mpi4py's default asks for MULTIPLE; check mpi4py.rc.thread_level), or build DataParallel without bucket_mb",
    "slot-cut-mismatch": "give every rank the same global batch (step) or exactly its own slots of one global batch (step_local over a DataLoader with batch_sampler=alpha_mpi.torch.SlotSampler(...), or with sizes=); nothing was applied and the next step works",
    "batch-mismatch": "give every rank the same global batch: the same data set, SlotSampler(batch_size, seed, shuffle), sampler.set_epoch(epoch) and, on a resume, set_epoch(epoch, start) on every rank (step: the same X, y everywhere, not a per-rank share; a batch made on each rank by torch.randn and the like differs between CPU types, whose vectorized kernels give other bits: make it on one rank and broadcast it, or draw it from uniform bits, e.g. numpy Generator.random or .integers); nothing was applied and the next step works",
    "step-mismatch": "run the step alike on every rank: the same DataParallel(seed=), module.train()/eval() on every rank, and no_sync()/accumulate= on every rank; nothing was applied and the next step works",
    "mass-zero": "a step needs a total mass > 0: give it at least one item its loss counts (not a batch of padding only), or skip that batch on every rank",
    "torch-compile-refused": "build DataParallel over the eager module (not torch.compile(module), nor module.compile()); its slot passes are what the contract names",
    "torch-module-changed": "add, replace, freeze or unfreeze parameters before building DataParallel (its payload, checkpoints and digests are laid out then); to change the model mid-run, save, build a new DataParallel over the changed module, and restore what still fits",
    "torch-slot-failed": "a slot's forward, loss or backward raised an exception on the rank named (its own traceback says what); fix the module, loss or data there: every rank refused the step and the next step works",
    "torch-optimizer-failed": "a sharded optimizer's step raised on the rank named (its own traceback says what); every rank put its shard of the parameters and optimizer state back as before the step, so fix the cause there and call opt.step() again",
    "torch-autocast-refused": "declare the forward's precision when building DataParallel (autocast=torch.bfloat16 or torch.float16, which the step then enters itself and the contract names), and enter no other autocast around DataParallel.step",
    "torch-module-mismatch": "build the same module (architecture, parameter names, shapes and dtypes) on every rank; print alpha_mpi.torch.architecture_digest(module) on each to find the odd one",
    "accumulation-pending": "save or restore after the update: the step after the no_sync() block divides the carried sums into .grad (docs/pytorch.md, gradient accumulation)",
    "torch-backward-refused": "delete loss.backward(): dp.step already ran each slot's backward and wrote .grad; call opt.step() next (the step's value is the loss, a number for logging)",
    "torch-state-unsupported": "register only objects whose state_dict() holds numbers, strings, booleans, None, lists, tuples and dicts with string keys (LR schedulers do); keep other state yourself",
    # alpha_mpi.torch: sharded state (issue 43)
    "torch-partition-unknown": "give DataParallel(partition=) one of 'none' (every rank holds the whole optimizer state), 'state' (each rank holds its shard: ZeRO-1), 'grads' (each rank holds its shard of the optimizer state and of the combined gradient: ZeRO-2) or 'params' (the parameters sharded too, gathered per unit: ZeRO-3)",
    "torch-partition-change": "a DataParallel keeps its partition mode for life: save a checkpoint, build a new DataParallel with the other partition=, and restore into it (any mode restores any mode's checkpoint)",
    "torch-units-unknown": "name units of partition='params' by submodules of the module or their names in module.named_modules() (or leave units out: the elements of every nn.ModuleList, else the children holding parameters)",
    "torch-units-order": "in partition='params' every unit runs at most once per forward, in the order of units=, and its parameters are used inside its own forward only (tie a parameter that two units use: it is then gathered for the whole slot); give units in forward order, or fewer, larger units",
    "torch-params-sharded": "in partition='params' the parameters are shards between steps: run the module (inference, eval) inside `with dp.full_parameters():`, or train it through dp.step",
    "torch-clip-sharded": "in partition='grads' and 'params' .grad is None (a rank holds its shard of the gradient, dp.grads.flat), so torch's clip_grad_norm_ would clip nothing: call dp.clip_grad_norm_(max_norm) after dp.step and before opt.step() (value clipping: dp.grads.flat.clamp_(-v, v))",
    "torch-optimizer-unsharded": "in a sharded partition use an optimizer whose update on a shard is measured to keep the whole tensor's bits (torch.optim.AdamW, Adam, SGD; not fused SGD, capturable or differentiable), or partition='none' for any other",
    # tools
    "usage": "an argument is outside what the function accepts: the message names it and what it accepts (see help() of the function)",
    "options-conflict": "two arguments that are each valid cannot go together (or one needs more ranks than the communicator has): the message names both; change one of them",
    "data-invalid": "give float features X of shape (n, d) and integer labels y of shape (n,)",
    "output-unwritable": "give the output option (--json, --plot) a path to a file in an existing, writable directory",
    "plot-unavailable": "install the plot extra, pip install 'alpha_mpi[plot]', or leave out --plot",
    # audit: silent data corruption (issue 24)
    "sdc-detected": "a recomputed slot payload differs from the original: silent data corruption on the named rank(s); nothing was applied; resume on other nodes (exclude the named host) from the last state known clean: the one `alpha-mpi train` saved, or a checkpoint at or before the refusal's clean_step (with audit_slots < slots the steps before were audited in part)",
    "sdc-undetermined": "the audit's words differ but no rank is shown wrong (the words changed on the way, two faults at once, or no third rank to say which of two is wrong): nothing was applied and no rank or host is named; retry the step (`alpha-mpi train` retries it once); if it recurs, run with 3 or more ranks (4 or more against two faults at once) so that referees can name the rank",
    "replica-diverged": "replicas that must hold the same parameters and optimizer state do not; the named rank(s) differ from the majority; resume from the last checkpoint every audit passed on other nodes (exclude the named host)",
    "replay-mismatch": "the recomputed state differs from the stored step: the stored run (or this replay's hardware) met silent data corruption; the message names the first component and coordinate that differ",
    # the compute identity (issue 32): the same bits on every machine, or the product says where not
    "compute-mismatch": "ranks whose compute identities differ (`alpha-mpi env` shows each rank's: numpy and its BLAS kernel and threads, torch's CPU capability) compute a model's slots with other bits: run every rank with the same builds and settings (OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS, ATEN_CPU_CAPABILITY, ...), or compute the model with alpha_mpi's fixed-order functions only and declare machine_independent; a machine_independent declaration found false (no rank is blamed) must be withdrawn",
    "compute-changed": "the checkpoint was computed under another compute identity (the message names the old and the new field by field): resume where the saved identity holds, or accept the change explicitly with restore(..., accept_compute_change=True) (recorded in the manifests saved after it)",
}


#: The advice of ADVICE worded for the `alpha-mpi` command line, for the codes whose ADVICE speaks
#: the Python API (keyword arguments, classes) and that a command can raise; every other code's
#: ADVICE reads right on the command line already. `{command}` is the command that refused.
CLI_ADVICE: dict[str, str] = {
    "usage": "see `alpha-mpi {command} --help` for the options and the values they take",
    "options-conflict": "two options that are each valid cannot go together (or one needs more ranks than "
    "mpiexec -n started): the message names both; change one of them (`alpha-mpi {command} --help`)",
    "placement-invalid": "run on at most --slots ranks: raise --slots to the rank count (mpiexec -n N) or more, "
    "or start fewer ranks",
    "slot-invalid": "give --slots an integer >= 1",
    "topology-invalid": "give --topology pairwise, star, star:HUB or hierarchy:K with K >= 1",
    "layout-invalid": "give --elements an integer >= 1",
    "delivery-target-not-owner": "give --deliver-to a rank that owns a slot (the plan without --deliver-to "
    "lists each rank's slots), or leave it out to replicate to every rank",
    "realization-inapplicable": "choose a --realization the message lists (tree, scatter and replicate apply "
    "to every tree); `alpha-mpi plan --cost` shows which apply",
    "peer-timeout": "a peer did not send within the bound; check the peer's log (it may have crashed) or raise "
    "--timeout (or ALPHA_MPI_TIMEOUT)",
    "non-finite-output": "an update overflowed to Inf/NaN; the state was left unchanged; lower --lr or rescale "
    "the data",
    "numerical-order-mismatch": "resume with the --topology, --slots and --optimizer the checkpoint was saved "
    "with (`alpha-mpi checkpoint inspect DIR` shows them), or pass --adopt-contract to continue under this "
    "run's order (recorded in later checkpoints)",
    "numerical-profile-mismatch": "resume with the alpha_mpi build the checkpoint was saved with, or pass "
    "--adopt-contract to continue under this run's profile (recorded in later checkpoints)",
    "initial-params-mismatch": "make the initial parameters of your --model a function of --seed alone: the same "
    "bits on every rank (seed its generator with the seed, never with the rank or the global random state)",
    "model-invalid": "lower --hidden to fit the limit the message names (the built-in MLP; --data needs at "
    "least one feature column and one class)",
    # checkpoints and data: ADVICE speaks restore()/the arrays; the command line names its options
    "checkpoint-missing": "no checkpoint there; check the path (`--resume` on a directory with no step at all "
    "starts at step 0 and says so)",
    "checkpoint-corrupt": "a file of the step differs from the sha256 that covers it; resume from an earlier step "
    "into a new directory: --resume-from DIR/step-NNNNNNNN --checkpoint-dir NEWDIR (`alpha-mpi checkpoint verify "
    "DIR --all` shows which steps verify; in DIR itself the damaged step would collide with the resumed run's saves)",
    "checkpoint-shard-missing": "a file named by the manifest is absent; resume from an earlier step into a new "
    "directory: --resume-from DIR/step-NNNNNNNN --checkpoint-dir NEWDIR (in DIR the damaged step would collide "
    "with the resumed run's saves)",
    "checkpoint-manifest": "the manifest is malformed; resume from an earlier step into a new directory: "
    "--resume-from DIR/step-NNNNNNNN --checkpoint-dir NEWDIR (in DIR the damaged step would collide with the "
    "resumed run's saves)",
    "checkpoint-config-mismatch": "resume with the saved run's --slots/--batch/--seed/--hidden/--data/--model/"
    "--optimizer/--lr (see `alpha-mpi checkpoint inspect`)",
    "checkpoint-latest-invalid": "`latest` must be a regular file that alpha_mpi wrote (`step-NNNNNNNN "
    "<sha256>`); delete it to resume from the newest step that verifies, or pass --resume-from DIR/step-NNNNNNNN",
    "checkpoint-shard-invalid": "a shard's safetensors header disagrees with its manifest entry (dtype, shape, "
    "size); resume from an earlier step into a new directory: --resume-from DIR/step-NNNNNNNN --checkpoint-dir "
    "NEWDIR",
    "checkpoint-data-mismatch": "resume with the data the checkpoint was trained on (the same --data file, or "
    "the same --seed for the synthetic task); start a fresh run for other data",
    "checkpoint-locked": "another trainer holds this checkpoint directory; wait for it to end, stop it, or use "
    "another --checkpoint-dir",
    "checkpoint-dir-is-step": "give the checkpoint directory (the parent of step-NNNNNNNN) as --checkpoint-dir; "
    "choose a step with --resume-from",
    "data-invalid": "give --data an .npz with float arrays X (n, d) and integer labels y (n,)",
    "compute-changed": "the checkpoint was computed under another compute identity (the message names the old "
    "and the new field by field): resume where the saved identity holds (`alpha-mpi env` shows this node's), or "
    "pass --accept-compute-change to continue under this one (recorded in later checkpoints)",
}


#: The release until which the old names in FORMERLY stay aliases (they go in the next one).
ALIAS_UNTIL = "0.3.0"

#: Codes split off an older code that meant several things (issue 37): new code -> the code it
#: was raised as before 0.2.0. Until ALIAS_UNTIL the old name stays an alias of the new code:
#: `refusal.matches(old)` is True and the refusal's text ends "(formerly [old])", so a script or
#: a log search that matches the old name still finds it. The old names keep their own, narrower
#: meaning (each is a code of ADVICE); docs/errors.md lists the aliases under both codes.
FORMERLY: dict[str, str] = {
    "layout-missing": "contribution-shape",
    "contributions-not-mapping": "contribution-shape",
    "internal-error": "plan-simulation-failed",
    "frame-contract-mismatch": "frame-identity-mismatch",
    "frame-sequence-mismatch": "frame-identity-mismatch",
    "options-conflict": "usage",
}

#: Codes the command line reports as usage errors (exit status 2, docs/exit-codes.md).
USAGE_CODES = frozenset({"usage", "options-conflict"})


def cli_advice(code: str, command: str = "COMMAND") -> str:
    """What to do about refusal `code`, worded for the `alpha-mpi` command line: CLI_ADVICE where
    the Python advice would name Python API, else ADVICE. `command` names the refusing command."""
    return CLI_ADVICE.get(code, ADVICE[code]).replace("{command}", command)


class Refusal(Exception):
    """Base of every alpha_mpi refusal. `code` is stable; `advice` says what to do."""

    def __init__(self, code: str, message: str, **context: object) -> None:
        if code not in ADVICE:
            # A typo in a code would silently break users' matching; fail loudly instead.
            raise ValueError(f"unregistered refusal code {code!r}")
        self.code = code
        self.message = message
        self.advice = ADVICE[code]
        self.context = context
        #: The code this refusal was raised as before it was split off (FORMERLY), or None.
        self.former_code = FORMERLY.get(code)
        formerly = f" (formerly [{self.former_code}])" if self.former_code else ""
        super().__init__(f"[{code}] {message} -- {self.advice}{formerly}")

    def matches(self, code: str) -> bool:
        """Whether this refusal answers to `code`: its own, or the old name it was raised as
        before its code was split off (an alias until ALIAS_UNTIL, see FORMERLY). Match on this
        rather than on `.code ==` where a script must work across the split."""
        if code not in ADVICE:
            raise ValueError(f"unregistered refusal code {code!r}")
        return code in (self.code, self.former_code)


class ModelRefusal(Refusal):
    """A tree, coverage, placement or delivery that cannot be planned."""


class PlanRefusal(Refusal):
    """A plan that cannot be built or executed as asked."""


class KernelRefusal(Refusal):
    """The C kernel refused its inputs (non-finite values, bad arguments, FP environment)."""


class FrameRefusal(Refusal):
    """A received frame did not match the plan's expectation; nothing was combined."""


class PeerTimeout(Refusal):
    """A receive did not complete within the bound."""


class NumericalProfileMismatch(Refusal):
    """A peer, checkpoint or plan whose numerical profile (formats, rounding, subnormals, exceptional values, conversions) differ from ours."""

    def __init__(self, message: str, **context: object) -> None:
        super().__init__("numerical-profile-mismatch", message, **context)


class NumericalOrderMismatch(Refusal):
    """A peer, checkpoint or plan whose numerical operations (combine order id, formula ids and texts) differ from ours."""

    def __init__(self, message: str, **context: object) -> None:
        super().__init__("numerical-order-mismatch", message, **context)


class CheckpointRefusal(Refusal):
    """A checkpoint that cannot be written or restored safely."""
