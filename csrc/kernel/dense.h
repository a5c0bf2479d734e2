/*
 * dense.h -- fixed-order dense kernels of alpha_mpi: what a dense layer's forward and
 * backward pass and a softmax cross-entropy compute (the embedded model, alpha_mpi.ops).
 *
 * Built with the flags of alpha_kernel.c (alpha_mpi/kernel/build.py BASE_CFLAGS, among
 * them -ffp-contract=off): every +, -, *, / below is one correctly rounded binary64
 * operation, a product is rounded before it is added (no fused multiply-add), nothing is
 * reassociated. Each output has ONE evaluation order, written down here; the SIMD paths
 * vectorize across independent outputs only (columns j of C, blocks of rows i), never
 * inside one sum, so every path gives the same bits: AVX-512, AVX2, SSE2, AArch64 NEON and
 * the generic C loops. No threads. No MPI, no allocation (tiles live on the stack).
 *
 * Arrays are row-major and contiguous: X (m x k) holds X[i,l] at X[i*k + l].
 *
 * ------------------------------------------------------------------------------
 * DECLARED ORDERS (the one place they are written down; tests/dense_oracle.py mirrors them)
 * ------------------------------------------------------------------------------
 * PRODUCTS. For each output C[i,j] on its own, with a(i,l) and b(l,j) as below:
 *       s = +0.0
 *       s = s + (a(i,l) * b(l,j))        for l = 0, 1, ..., k-1 (ascending)
 *       C[i,j] = s                       without a bias
 *       C[i,j] = s + bias[j]             with one: the bias enters once, after the whole sum
 *   ak_matmul     C (m x n) = A . B      a(i,l) = A[i,l], A (m x k); b(l,j) = B[l,j], B (k x n)
 *   ak_matmul_tn  C (m x n) = A^T . B    a(i,l) = A[l,i], A (k x m); b(l,j) = B[l,j], B (k x n)
 *                 (a layer's weight gradient X^T . G: the sum over samples l, ascending)
 *   ak_matmul_nt  C (m x n) = A . B^T    a(i,l) = A[i,l], A (m x k); b(l,j) = B[j,l], B (n x k)
 *                 (the gradient passed back, G . W^T)
 *   k == 0 gives C[i,j] = +0.0 (+ bias[j]).
 *
 * COLUMN SUMS (a bias gradient, the sum over samples):
 *       out[j] = +0.0;  out[j] = out[j] + A[i,j]   for i = 0, 1, ..., m-1 (ascending)
 *
 * RELU and its backward mask (a selection, no arithmetic):
 *       relu:           out[i] = z[i]  if z[i] > 0 or z[i] is NaN,  else +0.0
 *       relu_backward:  out[i] = g[i]  if z[i] > 0,                 else +0.0
 *   (z is the layer's input before the ReLU; -0.0 and negatives give +0.0.)
 *
 * SOFTMAX CROSS-ENTROPY over logits Z (m x c) and labels y (m, int64 in [0, c)), per row i
 * ascending, for j ascending in each loop:
 *       mx   = Z[i,0];  mx = Z[i,j] if Z[i,j] > mx        (j = 1 .. c-1; the first maximum)
 *       t_j  = Z[i,j] - mx
 *       e_j  = ak_exp(t_j)                                 (EXP below)
 *       s    = +0.0;  s = s + e_j
 *       L_i  = ak_log(s) - t_{y_i}                         (LOG below)
 *       G[i,j] = e_j / s,  and at j = y_i:  (e_j / s) - 1.0   (probabilities - onehot)
 *   *loss = +0.0;  *loss = *loss + L_i   for i = 0, 1, ..., m-1 (ascending)
 *   A NaN or Inf in Z propagates to NaN in G and the loss (no refusal here: the learner's
 *   update refuses non-finite gradients).
 *
 * EXP and LOG: one fixed algorithm each, +, -, *, / and bit manipulation only (no libm):
 * the argument reductions and polynomial coefficients of fdlibm's e_exp.c and e_log.c
 * (Sun Microsystems, 1993/2004: "Permission to use, copy, modify, and distribute this
 * software is freely granted, provided that this notice is preserved."), whose error is
 * below 1 ulp. Written out, with the code, in dense.c. Special values: exp(NaN) = NaN,
 * exp(+Inf) = +Inf, exp(-Inf) = +0, exp(x) = +Inf for x > 709.782712893383973096,
 * exp(x) = +0 for x < -745.133219101941108420, subnormal results rounded once;
 * log(NaN) = NaN, log(x < 0) = NaN, log(+-0) = -Inf, log(+Inf) = +Inf, log(1) = +0.
 *
 * ALIASING: the products refuse an output overlapping an input (AK_ERR_BAD_ARGUMENT);
 * col_sum likewise; relu, relu_backward, exp and log accept out == an input exactly,
 * softmax_xent accepts grad == logits exactly; any other overlap is refused.
 *
 * ISA PATHS. Which vector width runs the products, chosen once on first use (the fastest
 * this CPU supports, __builtin_cpu_supports), or set with ak_isa_select. All paths give
 * the same bits; the choice changes speed only. It is the only global state of the kernel.
 */
#ifndef ALPHA_DENSE_H
#define ALPHA_DENSE_H

#include <stddef.h>
#include <stdint.h>

/* ISA paths of the products (ak_isa_*) */
#define AK_ISA_GENERIC 0  /* plain C loops, every architecture */
#define AK_ISA_SSE2 1     /* x86-64 baseline, 2 lanes */
#define AK_ISA_AVX2 2     /* x86-64 with AVX2, 4 lanes (no FMA: contraction is off) */
#define AK_ISA_AVX512 3   /* x86-64 with AVX-512F, 8 lanes */
#define AK_ISA_NEON 4     /* AArch64 Advanced SIMD, 2 lanes */
#define AK_ISA_COUNT 5

/* 1 when this build on this CPU can run `path`, else 0 (also for unknown numbers). */
int ak_isa_available(int32_t path);

/* The path the products run (chosen on first use: the fastest available). */
int32_t ak_isa_current(void);

/* Run the products on `path` from now on: AK_OK, or AK_ERR_BAD_ARGUMENT if unavailable. */
int ak_isa_select(int32_t path);

/* "generic", "sse2", "avx2", "avx512", "neon"; "unknown" for other numbers. */
const char *ak_isa_name(int32_t path);

/* C = A . B (+ bias), see PRODUCTS. bias may be NULL. */
int ak_matmul(double *c, const double *a, const double *b, const double *bias, size_t m,
              size_t k, size_t n);

/* C = A^T . B (+ bias), A stored (k x m). */
int ak_matmul_tn(double *c, const double *a, const double *b, const double *bias, size_t m,
                 size_t k, size_t n);

/* C = A . B^T (+ bias), B stored (n x k). */
int ak_matmul_nt(double *c, const double *a, const double *b, const double *bias, size_t m,
                 size_t k, size_t n);

/* out (n) = the column sums of A (m x n), see COLUMN SUMS. */
int ak_col_sum(double *out, const double *a, size_t m, size_t n);

/* out = relu(z), element by element; out may be z. */
int ak_relu(double *out, const double *z, size_t n);

/* out = g where z > 0, else +0.0; out may be g or z. */
int ak_relu_backward(double *out, const double *g, const double *z, size_t n);

/* Softmax cross-entropy of m rows of c logits (see SOFTMAX CROSS-ENTROPY): grad (m x c)
 * = probabilities - onehot, *loss = the sum of the rows' losses. A label outside [0, c):
 * AK_ERR_BAD_ARGUMENT with *bad_index = its row (grad and *loss untouched). */
int ak_softmax_xent(double *grad, double *loss, const double *logits, const int64_t *labels,
                    size_t m, size_t c, int64_t *bad_index);

/* out = exp(x) / log(x), element by element (EXP and LOG); out may be x. */
int ak_exp(double *out, const double *x, size_t n);
int ak_log(double *out, const double *x, size_t n);

/* One value, for the driver and tests: the same function the arrays use. */
double ak_exp1(double x);
double ak_log1(double x);

#endif /* ALPHA_DENSE_H */
