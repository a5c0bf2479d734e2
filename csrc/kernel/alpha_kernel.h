/*
 * alpha_kernel.h -- fixed-order binary64 kernels of alpha_mpi (layer 3 of DESIGN.md).
 *
 * No MPI, no allocation, no global state. Every function returns an int status
 * (AK_OK or one of the AK_ERR_* codes below); the Python layer (alpha_mpi/kernel.py)
 * maps each code to a named refusal.
 *
 * Build contract (alpha_mpi/_kernel_build.py holds the flags in one place):
 *   -O3 -ffp-contract=off -fno-fast-math -fno-unsafe-math-optimizations (never fast-math)
 *   -fexcess-precision=standard -fno-math-errno -std=c11
 * so there is no fused multiply-add, no reciprocal approximation and no x87 excess
 * precision: every +, -, *, /, sqrt below is one correctly rounded binary64 operation
 * (round to nearest, ties to even), and x86-64 and AArch64 produce the same bits.
 * The process must run with FTZ/DAZ off and rounding to nearest (ak_fpenv_check).
 *
 * ------------------------------------------------------------------------------
 * ADAM EVALUATION ORDER (the one place it is written down; oracle.py mirrors it)
 * ------------------------------------------------------------------------------
 *   scalars, computed once per call in binary64:
 *       c1  = 1 - b1          c2  = 1 - b2
 *       bc1 = 1 - b1t         bc2 = 1 - b2t
 *     where b1t = b1^t and b2t = b2^t are carried as state by the caller and
 *     updated by one multiplication per step (b1t *= b1), never with pow().
 *   per element i, each line one rounding per operation, left to right:
 *       m'   = (b1 * m) + (c1 * g)
 *       v'   = (b2 * v) + (c2 * (g * g))
 *       mhat = m' / bc1
 *       vhat = v' / bc2
 *       p'   = p - ((lr * mhat) / (sqrt(vhat) + eps))
 *   A square root, then an add, then a true divide: a reciprocal square root
 *   (rsqrt, or 1/sqrt then multiply) rounds twice and is not this formula.
 *
 * ------------------------------------------------------------------------------
 * ADAMW EVALUATION ORDER (decoupled weight decay wd, torch.optim.AdamW's order:
 * the parameter is decayed first, then the Adam step above runs on the decayed value)
 * ------------------------------------------------------------------------------
 *   scalars, computed once per call in binary64 (b1t, b2t carried as for Adam):
 *       c1  = 1 - b1          c2  = 1 - b2
 *       bc1 = 1 - b1t         bc2 = 1 - b2t
 *       dec = 1 - (lr * wd)
 *   per element i, each line one rounding per operation, left to right:
 *       pd   = p * dec
 *       m'   = (b1 * m) + (c1 * g)
 *       v'   = (b2 * v) + (c2 * (g * g))
 *       mhat = m' / bc1
 *       vhat = v' / bc2
 *       p'   = pd - ((lr * mhat) / (sqrt(vhat) + eps))
 *   torch: param.mul_(1 - lr * weight_decay), then the Adam step on param. Adam is this
 *   formula at wd = 0 bit for bit (dec = 1 exactly and p * 1 = p), so ak_adam runs it.
 *   Not an L2 penalty: wd never enters g, m or v.
 *
 * SGD WITH MOMENTUM (PyTorch convention, no dampening, no Nesterov):
 *   mu != 0:  buf' = (mu * buf) + g ;  p' = p - (lr * buf')
 *   mu == 0:  p'   = p - (lr * g)       (buf is neither read nor written)
 *
 * FiniteOrRefuse (Adam, AdamW, SGD, round_binary64): the scalars, every input element and
 * every output element (for Adam also the intermediates g*g, mhat, vhat,
 * sqrt(vhat)+eps and lr*mhat, because e.g. vhat = +Inf yields a finite p' = p that
 * silently drops the update; for AdamW also pd, computed first) must be finite. Otherwise the call returns
 * AK_ERR_NONFINITE_INPUT or AK_ERR_NONFINITE_OUTPUT with
 *   *bad_index = the first element index i at which anything is non-finite
 *                (for a scalar: its position in the argument list, see AK_SCALAR_*),
 *   *bad_which = which array (AK_W_*); at one index an input wins over an output.
 * Scalars are checked before any element. The _out buffers may then hold garbage,
 * the input buffers are never written (out-of-place). Out buffers may be the very
 * same buffers as the inputs only with allow_inplace != 0, and then a refusal leaves
 * the state partly updated: the caller gives up the refusal guarantee. Partially
 * overlapping buffers are AK_ERR_BAD_ARGUMENT always.
 *
 * TREE PROGRAMS (ak_tree_eval): postfix int32 code. A value v >= 0 pushes inputs[v];
 * AK_OP_ADD (-1) pops right, then left, and pushes (left + right), left operand
 * first. Valid programs: every index < k, no underflow, at most AK_MAX_DEPTH values
 * on the stack, exactly one value at the end. The left-deep chain
 * ((x0 + x1) + x2) + ... is  [a0, a1, -1, a2, -1, ...]  and needs depth 2.
 * Addition is neither associated nor commuted: the bits are exactly the tree's.
 *
 * ALIASING: for add/tree_eval/fold, out may be the same buffer as any input (a block
 * of out depends only on the same block of the inputs); partial overlap is refused.
 */
#ifndef ALPHA_KERNEL_H
#define ALPHA_KERNEL_H

#include <stddef.h>
#include <stdint.h>

/* status codes */
#define AK_OK 0
#define AK_ERR_BAD_ARGUMENT 1
#define AK_ERR_BAD_PROGRAM 2
#define AK_ERR_NONFINITE_INPUT 3
#define AK_ERR_NONFINITE_OUTPUT 4

/* tree program opcode and limits */
#define AK_OP_ADD (-1)
#define AK_MAX_DEPTH 64
#define AK_EVAL_CHECK_BLOCK 16384    /* elements per block of ak_tree_eval_finite (128 KiB) */
#define AK_EVAL_CHECK_MAX_INPUTS 4096

/* which array a FiniteOrRefuse status names (*bad_which) */
#define AK_W_P 0            /* p (input) or p_out (output) */
#define AK_W_M 1            /* m or m_out */
#define AK_W_V 2            /* v or v_out */
#define AK_W_G 3            /* g */
#define AK_W_BUF 4          /* SGD momentum buffer buf or buf_out */
#define AK_W_SCALAR 5       /* a scalar argument; *bad_index = AK_SCALAR_* */
#define AK_W_INTERMEDIATE 6 /* Adam g*g, mhat, vhat, sqrt(vhat)+eps or lr*mhat; AdamW pd */
#define AK_W_X 7            /* the single input/output of a conversion */

/* scalar positions reported in *bad_index when *bad_which == AK_W_SCALAR */
#define AK_SCALAR_LR 0
#define AK_SCALAR_B1 1      /* SGD: momentum */
#define AK_SCALAR_B2 2
#define AK_SCALAR_EPS 3
#define AK_SCALAR_B1T 4
#define AK_SCALAR_B2T 5
#define AK_SCALAR_WD 6      /* AdamW's weight decay */

/* ak_fpenv_check flags */
#define AK_FPENV_ROUNDING 1 /* rounding mode is not round-to-nearest-even */
#define AK_FPENV_FTZ 2      /* flush-to-zero (x86 MXCSR.FZ bit 15, AArch64 FPCR.FZ bit 24) */
#define AK_FPENV_DAZ 4      /* denormals-are-zero (x86 MXCSR.DAZ bit 6; AArch64 FZ also flushes inputs) */

/* out = l + r, element by element. out may be l or r. */
int ak_add(double *out, const double *l, const double *r, size_t n);

/* Evaluate a postfix tree program over k inputs of n elements each, in one sweep. */
int ak_tree_eval(double *out, const double *const *inputs, size_t k, size_t n,
                 const int32_t *prog, size_t prog_len);

/* ak_tree_eval and the finiteness check of its output in one pass: the output is
 * evaluated in blocks of AK_EVAL_CHECK_BLOCK elements and each block is checked while it
 * is still in cache. The bits of out are ak_tree_eval's (a block of out depends only on
 * the same block of the inputs); *nonfinite = 1 if any element of out is NaN or Inf,
 * else 0. Inputs beyond AK_EVAL_CHECK_MAX_INPUTS: AK_ERR_BAD_ARGUMENT (use the two calls). */
int ak_tree_eval_finite(double *out, const double *const *inputs, size_t k, size_t n,
                        const int32_t *prog, size_t prog_len, int32_t *nonfinite);

/* Check a program without evaluating; *max_depth receives the stack depth it needs. */
int ak_program_check(const int32_t *prog, size_t prog_len, size_t k, size_t *max_depth);

/* Left-deep chain ((inputs[0] + inputs[1]) + inputs[2]) + ... ; k == 1 copies. */
int ak_fold(double *out, const double *const *inputs, size_t k, size_t n);

/* Index of the first NaN/Inf in x, or -1. */
int64_t ak_first_nonfinite(const double *x, size_t n);

/* One Adam step, out-of-place (see ADAM EVALUATION ORDER above). */
int ak_adam(const double *p, const double *m, const double *v, const double *g,
            double *p_out, double *m_out, double *v_out, size_t n,
            double lr, double b1, double b2, double eps, double b1t, double b2t,
            int allow_inplace, int64_t *bad_index, int *bad_which);

/* One AdamW step, out-of-place (see ADAMW EVALUATION ORDER above); the arguments and the
 * refusals are ak_adam's, with wd after b2t (a non-finite wd: *bad_index = AK_SCALAR_WD). */
int ak_adamw(const double *p, const double *m, const double *v, const double *g,
             double *p_out, double *m_out, double *v_out, size_t n,
             double lr, double b1, double b2, double eps, double b1t, double b2t, double wd,
             int allow_inplace, int64_t *bad_index, int *bad_which);

/* The same step in place, keeping the refusal guarantee by checking first
 * (pass 1 computes and checks everything, stores nothing; pass 2 commits). */
int ak_adam_inplace_checked(double *p, double *m, double *v, const double *g, size_t n,
                            double lr, double b1, double b2, double eps, double b1t,
                            double b2t, int64_t *bad_index, int *bad_which);

/* One SGD-with-momentum step, out-of-place. buf/buf_out are ignored when momentum == 0
 * (they may then be NULL). */
int ak_sgd(const double *p, const double *buf, const double *g,
           double *p_out, double *buf_out, size_t n, double lr, double momentum,
           int allow_inplace, int64_t *bad_index, int *bad_which);

/* Exact binary32 -> binary64 widening (total: NaN stays NaN, Inf stays Inf). */
int ak_widen_binary32(double *out, const float *in, size_t n);

/* Nearest-even binary64 -> binary32 narrowing. Non-finite input -> NONFINITE_INPUT;
 * a finite value that rounds to +-Inf -> NONFINITE_OUTPUT (first index reported). */
int ak_round_binary64(float *out, const double *in, size_t n, int64_t *bad_index);

/* FP environment: returns AK_FPENV_* flags (0 = on profile); *raw = MXCSR / FPCR
 * (0 on other architectures, where only the rounding mode is checked). */
int ak_fpenv_check(uint32_t *raw);

/* Verification hook, never called by the product: switch FTZ/DAZ on or off in the
 * calling thread so that the refusal can be exercised in-process (reached only through
 * alpha_mpi.kernel_env._set_ftz_daz from alpha_mpi_verify.fpenv). Returns 0, or -1 where
 * unsupported. */
int ak_fpenv_set_ftz_daz(int ftz, int daz);

/* Build identity: compiler version string and target architecture name. */
const char *ak_compiler(void);
const char *ak_arch(void);

#endif /* ALPHA_KERNEL_H */
