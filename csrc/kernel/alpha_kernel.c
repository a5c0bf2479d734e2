/*
 * alpha_kernel.c -- see alpha_kernel.h for the contract (evaluation orders,
 * FiniteOrRefuse, aliasing). Build flags live in alpha_mpi/_kernel_build.py.
 *
 * Implementation notes
 * - Element loops are written so that GCC vectorizes them. SIMD lanes do the very same
 *   correctly rounded binary64 operation as scalar code, and nothing is reassociated
 *   (no -ffast-math / -fassociative-math), so vectorization never changes a bit.
 * - `#pragma GCC ivdep` tells GCC that the only possible aliasing is the exact,
 *   same-index kind (out == an input), which carries no dependence between iterations;
 *   partial overlaps are refused before any loop runs.
 * - Non-finite detection without branches: for the bit pattern u of a binary64,
 *   ((u & EXP) + 2^52) has bit 63 set iff the exponent field is all ones (Inf/NaN).
 *   OR-accumulating that value over a block is an integer reduction (vectorizable);
 *   only when the block's accumulator has bit 63 set do we rescan it element by element
 *   to find the first bad index.
 */
#include "alpha_kernel.h"

#include <fenv.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define AK_X86 1
#elif defined(__aarch64__)
#define AK_AARCH64 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define AK_IVDEP _Pragma("GCC ivdep")
#else
#define AK_IVDEP
#endif

/* Hot loops are compiled for several x86-64 ISA levels and picked at load time (GCC
 * target_clones, glibc ifunc). Wider SIMD lanes do the very same correctly rounded
 * operations (and -ffp-contract=off still forbids FMA contraction), so every clone gives
 * the same bits; only the speed differs (Adam is bound by the divider when in cache).
 * -DAK_NO_CLONES builds a single baseline version. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    defined(__GLIBC__) && !defined(AK_NO_CLONES)
#define AK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define AK_CLONES
#endif

#define AK_EXP64 UINT64_C(0x7FF0000000000000)
#define AK_ONE64 UINT64_C(0x0010000000000000)
#define AK_EXP32 UINT32_C(0x7F800000)
#define AK_ONE32 UINT32_C(0x00800000)

/* elements per block: 1024 doubles = 8 KiB per stream, L1-resident scratch */
#ifndef AK_BLOCK
#define AK_BLOCK 1024
#endif
/* scratch doubles on the stack for general tree programs (32 KiB) */
#ifndef AK_SCRATCH
#define AK_SCRATCH 4096
#endif

static inline uint64_t ak_bits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline uint32_t ak_bits32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* bit 63 set iff x is Inf or NaN */
static inline uint64_t ak_nf(double x) { return (ak_bits(x) & AK_EXP64) + AK_ONE64; }
static inline uint32_t ak_nf32(float x) { return (ak_bits32(x) & AK_EXP32) + AK_ONE32; }
static inline int ak_bad(double x) { return (int)(ak_nf(x) >> 63); }

/* [a, a+an) and [b, b+bn) (bytes) intersect */
static int ak_overlap(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (an == 0 || bn == 0) return 0;
    return x < y + bn && y < x + an;
}

/* identical start, or disjoint: fine for same-index element loops of equal length */
static int ak_same_or_disjoint(const double *a, const double *b, size_t n) {
    return a == b || !ak_overlap(a, n * sizeof(double), b, n * sizeof(double));
}

/* ------------------------------------------------------------------ add */

AK_CLONES static void ak_add2(double *out, const double *l, const double *r, size_t n) {
    AK_IVDEP
    for (size_t i = 0; i < n; i++) out[i] = l[i] + r[i];
}

int ak_add(double *out, const double *l, const double *r, size_t n) {
    if (n == 0) return AK_OK;
    if (!out || !l || !r) return AK_ERR_BAD_ARGUMENT;
    if (!ak_same_or_disjoint(out, l, n) || !ak_same_or_disjoint(out, r, n))
        return AK_ERR_BAD_ARGUMENT;
    ak_add2(out, l, r, n);
    return AK_OK;
}

/* ------------------------------------------------------------------ chains */

/* dst[i] = ((q0[i] + q1[i]) + q2[i]) + ... for cnt operands (1 <= cnt <= 8). Each
 * case is one per-element register loop: every operand read once, dst written once. */
AK_CLONES static void ak_sum_group(double *dst, const double *const *q, int cnt, size_t len) {
    const double *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    const double *q4 = q[4], *q5 = q[5], *q6 = q[6], *q7 = q[7];
    switch (cnt) {
    case 1:
        if (dst != q0) memmove(dst, q0, len * sizeof(double));
        break;
    case 2:
        AK_IVDEP
        for (size_t i = 0; i < len; i++) dst[i] = q0[i] + q1[i];
        break;
    case 3:
        AK_IVDEP
        for (size_t i = 0; i < len; i++) dst[i] = (q0[i] + q1[i]) + q2[i];
        break;
    case 4:
        AK_IVDEP
        for (size_t i = 0; i < len; i++) dst[i] = ((q0[i] + q1[i]) + q2[i]) + q3[i];
        break;
    case 5:
        AK_IVDEP
        for (size_t i = 0; i < len; i++)
            dst[i] = (((q0[i] + q1[i]) + q2[i]) + q3[i]) + q4[i];
        break;
    case 6:
        AK_IVDEP
        for (size_t i = 0; i < len; i++)
            dst[i] = ((((q0[i] + q1[i]) + q2[i]) + q3[i]) + q4[i]) + q5[i];
        break;
    case 7:
        AK_IVDEP
        for (size_t i = 0; i < len; i++)
            dst[i] = (((((q0[i] + q1[i]) + q2[i]) + q3[i]) + q4[i]) + q5[i]) + q6[i];
        break;
    default: /* 8 */
        AK_IVDEP
        for (size_t i = 0; i < len; i++)
            dst[i] = ((((((q0[i] + q1[i]) + q2[i]) + q3[i]) + q4[i]) + q5[i]) + q6[i]) + q7[i];
        break;
    }
}

#define AK_GROUP 8

/* operand j of a chain: inputs[j] (fold) or inputs[prog[j ? 2j-1 : 0]] (tree chain) */
static inline const double *ak_chain_operand(const double *const *inputs, const int32_t *prog,
                                             size_t j) {
    return prog ? inputs[prog[j ? 2 * j - 1 : 0]] : inputs[j];
}

/* Left-deep chain over m >= 1 operands. Short chains (m <= 8) are one fused element
 * loop straight into out; longer ones go block by block through an L1 accumulator. */
static void ak_chain(double *out, const double *const *inputs, const int32_t *prog, size_t m,
                     size_t n) {
    const double *q[AK_GROUP];
    if (m <= AK_GROUP) {
        for (size_t j = 0; j < AK_GROUP; j++) q[j] = j < m ? ak_chain_operand(inputs, prog, j) : 0;
        ak_sum_group(out, q, (int)m, n);
        return;
    }
    double acc[AK_BLOCK];
    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t len = n - b0 < AK_BLOCK ? n - b0 : AK_BLOCK;
        for (size_t j = 0; j < AK_GROUP; j++) q[j] = ak_chain_operand(inputs, prog, j) + b0;
        ak_sum_group(acc, q, AK_GROUP, len);
        size_t j = AK_GROUP;
        while (j < m) {
            size_t cnt = m - j < AK_GROUP - 1 ? m - j : AK_GROUP - 1;
            q[0] = acc;
            for (size_t t = 0; t < cnt; t++) q[1 + t] = ak_chain_operand(inputs, prog, j + t) + b0;
            for (size_t t = cnt + 1; t < AK_GROUP; t++) q[t] = 0;
            j += cnt;
            ak_sum_group(j == m ? out + b0 : acc, q, (int)(cnt + 1), len);
        }
    }
}

int ak_fold(double *out, const double *const *inputs, size_t k, size_t n) {
    if (k == 0 || !inputs) return AK_ERR_BAD_ARGUMENT;
    if (n == 0) return AK_OK;
    if (!out) return AK_ERR_BAD_ARGUMENT;
    for (size_t j = 0; j < k; j++)
        if (!inputs[j] || !ak_same_or_disjoint(out, inputs[j], n)) return AK_ERR_BAD_ARGUMENT;
    ak_chain(out, inputs, 0, k, n);
    return AK_OK;
}

/* ------------------------------------------------------------------ tree programs */

/* Validate and size a program: *max_depth = stack depth, *n_scratch = block scratch
 * buffers needed (intermediates alive at once, the final add writes out directly). */
static int ak_program_scan(const int32_t *prog, size_t prog_len, size_t k, size_t *max_depth,
                           size_t *n_scratch) {
    if (!prog || prog_len == 0) return AK_ERR_BAD_PROGRAM;
    int tag[AK_MAX_DEPTH];       /* -1: an input; >= 0: scratch slot */
    unsigned char used[AK_MAX_DEPTH];
    memset(used, 0, sizeof used);
    size_t sp = 0, depth = 0, live = 0, peak = 0;
    for (size_t pc = 0; pc < prog_len; pc++) {
        int32_t op = prog[pc];
        if (op >= 0) {
            if ((uint64_t)op >= (uint64_t)k) return AK_ERR_BAD_PROGRAM;
            if (sp == AK_MAX_DEPTH) return AK_ERR_BAD_PROGRAM;
            tag[sp++] = -1;
        } else if (op == AK_OP_ADD) {
            if (sp < 2) return AK_ERR_BAD_PROGRAM;
            int r = tag[--sp], l = tag[--sp];
            int d;
            if (pc + 1 == prog_len) {
                d = -1; /* final add: straight into out */
                if (l >= 0) { used[l] = 0; live--; }
                if (r >= 0) { used[r] = 0; live--; }
            } else if (l >= 0) {
                d = l;
                if (r >= 0) { used[r] = 0; live--; }
            } else if (r >= 0) {
                d = r;
            } else {
                d = 0;
                while (used[d]) d++;
                used[d] = 1;
                live++;
                if (live > peak) peak = live;
            }
            tag[sp++] = d;
        } else {
            return AK_ERR_BAD_PROGRAM;
        }
        if (sp > depth) depth = sp;
    }
    if (sp != 1) return AK_ERR_BAD_PROGRAM;
    if (max_depth) *max_depth = depth;
    if (n_scratch) *n_scratch = peak;
    return AK_OK;
}

int ak_program_check(const int32_t *prog, size_t prog_len, size_t k, size_t *max_depth) {
    return ak_program_scan(prog, prog_len, k, max_depth, 0);
}

/* [a0, a1, -1, a2, -1, ...] */
static int ak_is_chain(const int32_t *prog, size_t prog_len) {
    if (prog_len % 2 == 0 || prog[0] < 0) return 0;
    for (size_t j = 1; j < prog_len; j += 2)
        if (prog[j] < 0 || prog[j + 1] != AK_OP_ADD) return 0;
    return 1;
}

int ak_tree_eval(double *out, const double *const *inputs, size_t k, size_t n,
                 const int32_t *prog, size_t prog_len) {
    size_t depth = 0, n_scratch = 0;
    int st = ak_program_scan(prog, prog_len, k, &depth, &n_scratch);
    if (st != AK_OK) return st;
    if (n == 0) return AK_OK;
    if (!out || !inputs) return AK_ERR_BAD_ARGUMENT;
    for (size_t j = 0; j < k; j++)
        if (!inputs[j] || !ak_same_or_disjoint(out, inputs[j], n)) return AK_ERR_BAD_ARGUMENT;

    if (ak_is_chain(prog, prog_len)) {
        ak_chain(out, inputs, prog, (prog_len + 1) / 2, n);
        return AK_OK;
    }

    /* General tree: block by block, a stack of pointers into the inputs or into
     * block-sized scratch buffers; the final add writes out's block directly.
     * Measured: this path runs at ~0.6-0.8x the chain's bandwidth for 8 inputs at 1e7
     * elements, because each add reads only two memory streams at a time (less
     * memory-level parallelism than the 8-stream chain loop); prefetching the next block
     * of every input or larger blocks did not help. Star chains and the hierarchy's
     * per-node folds take the chain path above. */
    double scratch[AK_SCRATCH];
    size_t bs = AK_SCRATCH / (n_scratch ? n_scratch : 1);
    if (bs > AK_BLOCK) bs = AK_BLOCK;
    bs -= bs % 8; /* AK_MAX_DEPTH = 64 keeps bs >= 64 */
    const double *stk[AK_MAX_DEPTH];
    int tag[AK_MAX_DEPTH];
    unsigned char used[AK_MAX_DEPTH];
    for (size_t b0 = 0; b0 < n; b0 += bs) {
        size_t len = n - b0 < bs ? n - b0 : bs;
        size_t sp = 0;
        memset(used, 0, sizeof used);
        for (size_t pc = 0; pc < prog_len; pc++) {
            int32_t op = prog[pc];
            if (op >= 0) {
                stk[sp] = inputs[op] + b0;
                tag[sp++] = -1;
                continue;
            }
            sp -= 2;
            const double *l = stk[sp], *r = stk[sp + 1];
            int tl = tag[sp], tr = tag[sp + 1], d;
            double *dst;
            if (pc + 1 == prog_len) {
                dst = out + b0;
                d = -1;
            } else {
                if (tl >= 0) {
                    d = tl;
                    if (tr >= 0) used[tr] = 0;
                } else if (tr >= 0) {
                    d = tr;
                } else {
                    d = 0;
                    while (used[d]) d++;
                    used[d] = 1;
                }
                dst = scratch + (size_t)d * bs;
            }
            ak_add2(dst, l, r, len);
            stk[sp] = dst;
            tag[sp++] = d;
        }
        if (prog_len == 1 && out + b0 != stk[0]) memmove(out + b0, stk[0], len * sizeof(double));
    }
    return AK_OK;
}

/* ------------------------------------------------------------------ finiteness */

int ak_tree_eval_finite(double *out, const double *const *inputs, size_t k, size_t n,
                        const int32_t *prog, size_t prog_len, int32_t *nonfinite) {
    if (!nonfinite || k > AK_EVAL_CHECK_MAX_INPUTS) return AK_ERR_BAD_ARGUMENT;
    *nonfinite = 0;
    if (n <= AK_EVAL_CHECK_BLOCK) { /* one block: the two calls, the output still in cache */
        int st = ak_tree_eval(out, inputs, k, n, prog, prog_len);
        if (st == AK_OK && n) *nonfinite = ak_first_nonfinite(out, n) >= 0;
        return st;
    }
    /* Validate over the whole range first, as ak_tree_eval does: per block, an output that
     * overlaps an input further on would pass and read values already overwritten. */
    size_t depth = 0, n_scratch = 0;
    int st0 = ak_program_scan(prog, prog_len, k, &depth, &n_scratch);
    if (st0 != AK_OK) return st0;
    if (!out || !inputs) return AK_ERR_BAD_ARGUMENT;
    for (size_t j = 0; j < k; j++)
        if (!inputs[j] || !ak_same_or_disjoint(out, inputs[j], n)) return AK_ERR_BAD_ARGUMENT;
    const double *shifted[AK_EVAL_CHECK_MAX_INPUTS];
    for (size_t b0 = 0; b0 < n; b0 += AK_EVAL_CHECK_BLOCK) {
        size_t len = n - b0 < AK_EVAL_CHECK_BLOCK ? n - b0 : AK_EVAL_CHECK_BLOCK;
        for (size_t j = 0; j < k; j++) shifted[j] = inputs[j] + b0;
        int st = ak_tree_eval(out + b0, shifted, k, len, prog, prog_len);
        if (st != AK_OK) return st;
        if (!*nonfinite && ak_first_nonfinite(out + b0, len) >= 0) *nonfinite = 1;
    }
    return AK_OK;
}

int64_t ak_first_nonfinite(const double *x, size_t n) {
    if (!x) return -1;
    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t e = n - b0 < AK_BLOCK ? n : b0 + AK_BLOCK;
        uint64_t acc = 0;
        for (size_t i = b0; i < e; i++) acc |= ak_nf(x[i]);
        if (acc >> 63)
            for (size_t i = b0; i < e; i++)
                if (ak_bad(x[i])) return (int64_t)i;
    }
    return -1;
}

/* ------------------------------------------------------------------ Adam */

typedef struct {
    double lr, b1, b2, eps, c1, c2, bc1, bc2, dec;
} ak_adam_k;

/* THE Adam/AdamW element formula (orders documented in alpha_kernel.h). Every path below
 * calls this one function, so the single-pass, the locate and the two-pass variants
 * cannot disagree. *acc collects the non-finite marks of outputs and intermediates.
 * Adam is AdamW at wd = 0: dec = 1 exactly, and pd = p * 1 = p for every finite p. */
static inline void ak_adam_elem(const ak_adam_k *K, double p, double m, double v, double g,
                                double *po, double *mo, double *vo, uint64_t *acc) {
    double pd = p * K->dec;
    double m1 = K->b1 * m + K->c1 * g;
    double gg = g * g;
    double v1 = K->b2 * v + K->c2 * gg;
    double mhat = m1 / K->bc1;
    double vhat = v1 / K->bc2;
    double den = sqrt(vhat) + K->eps;
    double num = K->lr * mhat;
    double p1 = pd - num / den;
    *acc |= ak_nf(pd) | ak_nf(m1) | ak_nf(gg) | ak_nf(v1) | ak_nf(mhat) | ak_nf(vhat) |
            ak_nf(den) | ak_nf(num) | ak_nf(p1);
    *po = p1;
    *mo = m1;
    *vo = v1;
}

/* one block [b0, e): compute, store, return the OR of all non-finite marks */
AK_CLONES static uint64_t ak_adam_block(const ak_adam_k *K, const double *p, const double *m,
                                        const double *v, const double *g, double *p_out,
                                        double *m_out, double *v_out, size_t b0, size_t e) {
    uint64_t acc = 0;
    AK_IVDEP
    for (size_t i = b0; i < e; i++) {
        acc |= ak_nf(p[i]) | ak_nf(m[i]) | ak_nf(v[i]) | ak_nf(g[i]);
        ak_adam_elem(K, p[i], m[i], v[i], g[i], &p_out[i], &m_out[i], &v_out[i], &acc);
    }
    return acc;
}

/* one block [b0, e): compute and check only, store nothing */
AK_CLONES static uint64_t ak_adam_block_check(const ak_adam_k *K, const double *p,
                                              const double *m, const double *v,
                                              const double *g, size_t b0, size_t e) {
    uint64_t acc = 0;
    for (size_t i = b0; i < e; i++) {
        double po, mo, vo;
        acc |= ak_nf(p[i]) | ak_nf(m[i]) | ak_nf(v[i]) | ak_nf(g[i]);
        ak_adam_elem(K, p[i], m[i], v[i], g[i], &po, &mo, &vo, &acc);
    }
    return acc;
}

static int ak_adam_scalars(ak_adam_k *K, double lr, double b1, double b2, double eps,
                           double b1t, double b2t, double wd, int64_t *bad_index,
                           int *bad_which) {
    const double s[7] = {lr, b1, b2, eps, b1t, b2t, wd};
    for (int j = 0; j < 7; j++)
        if (ak_bad(s[j])) {
            *bad_index = j;
            *bad_which = AK_W_SCALAR;
            return AK_ERR_NONFINITE_INPUT;
        }
    K->lr = lr;
    K->b1 = b1;
    K->b2 = b2;
    K->eps = eps;
    K->c1 = 1.0 - b1;
    K->c2 = 1.0 - b2;
    K->bc1 = 1.0 - b1t;
    K->bc2 = 1.0 - b2t;
    K->dec = 1.0 - lr * wd;
    return AK_OK;
}

/* First bad element in [b0, e): inputs first (p, m, v, g), then the computed values
 * in the order they are computed. Returns AK_OK if there is none. */
static int ak_adam_locate(const ak_adam_k *K, const double *p, const double *m, const double *v,
                          const double *g, size_t b0, size_t e, int64_t *bad_index,
                          int *bad_which) {
    for (size_t i = b0; i < e; i++) {
        const double in[4] = {p[i], m[i], v[i], g[i]};
        static const int win[4] = {AK_W_P, AK_W_M, AK_W_V, AK_W_G};
        for (int j = 0; j < 4; j++)
            if (ak_bad(in[j])) {
                *bad_index = (int64_t)i;
                *bad_which = win[j];
                return AK_ERR_NONFINITE_INPUT;
            }
        double pd = p[i] * K->dec;
        double m1 = K->b1 * m[i] + K->c1 * g[i];
        double gg = g[i] * g[i];
        double v1 = K->b2 * v[i] + K->c2 * gg;
        double mhat = m1 / K->bc1;
        double vhat = v1 / K->bc2;
        double den = sqrt(vhat) + K->eps;
        double num = K->lr * mhat;
        double p1 = pd - num / den;
        const double outv[9] = {pd, m1, gg, v1, mhat, vhat, den, num, p1};
        static const int wout[9] = {AK_W_INTERMEDIATE, AK_W_M, AK_W_INTERMEDIATE, AK_W_V,
                                    AK_W_INTERMEDIATE, AK_W_INTERMEDIATE, AK_W_INTERMEDIATE,
                                    AK_W_INTERMEDIATE, AK_W_P};
        for (int j = 0; j < 9; j++)
            if (ak_bad(outv[j])) {
                *bad_index = (int64_t)i;
                *bad_which = wout[j];
                return AK_ERR_NONFINITE_OUTPUT;
            }
    }
    return AK_OK;
}

/* Where an update reports a refusal: the caller's slots, or locals when it passed NULL
 * (both reset to -1, "nothing to report"). */
typedef struct {
    int64_t index;
    int which;
} ak_report_slots;

static void ak_report_init(int64_t **bad_index, int **bad_which, ak_report_slots *local) {
    if (!*bad_index) *bad_index = &local->index;
    if (!*bad_which) *bad_which = &local->which;
    **bad_index = -1;
    **bad_which = -1;
}

/* an output may touch no input except its own counterpart, and only exactly (in place) */
static int ak_outputs_ok(double *const *outs, int nout, const double *const *ins, int nin,
                         size_t n, int allow_inplace) {
    size_t bytes = n * sizeof(double);
    for (int o = 0; o < nout; o++) {
        if (!outs[o]) return 0;
        for (int o2 = o + 1; o2 < nout; o2++)
            if (ak_overlap(outs[o], bytes, outs[o2], bytes)) return 0;
        for (int j = 0; j < nin; j++) {
            if (!ins[j]) return 0;
            if (!ak_overlap(outs[o], bytes, ins[j], bytes)) continue;
            if (!(allow_inplace && j == o && outs[o] == ins[j])) return 0;
        }
    }
    return 1;
}

/* The start both Adam entry points share: where refusals are reported (ak_report_init), the
 * scalars checked into K (first, so a bad scalar is named even when n == 0), then the buffers
 * (outs may touch no input but, with allow_inplace, exactly its own counterpart). */
typedef struct {
    ak_adam_k K;
    ak_report_slots local;
} ak_adam_call;

static int ak_adam_begin(ak_adam_call *c, double lr, double b1, double b2, double eps, double b1t,
                         double b2t, double wd, int64_t **bad_index, int **bad_which,
                         double *const *outs, const double *const *ins, int nin, size_t n,
                         int allow_inplace) {
    ak_report_init(bad_index, bad_which, &c->local);
    int st = ak_adam_scalars(&c->K, lr, b1, b2, eps, b1t, b2t, wd, *bad_index, *bad_which);
    if (st != AK_OK || n == 0) return st;
    return ak_outputs_ok(outs, 3, ins, nin, n, allow_inplace) ? AK_OK : AK_ERR_BAD_ARGUMENT;
}

/*
 * Single pass, out-of-place: read p, m, v, g once, write p', m', v' once, and check as
 * we go; a refusal leaves the inputs untouched because nothing writes them.
 * Measured (benchmarks/bench_kernel.py, 1e6 and 1e7 elements, 2-core x86-64 VM): the
 * single pass is ~1.9-2.1x faster than ak_adam_inplace_checked (a check pass, then a
 * commit pass: 11 streams instead of 7 and every divide and sqrt done twice); in place
 * with two passes saves the three next-state buffers, at that price.
 */
int ak_adam(const double *p, const double *m, const double *v, const double *g,
            double *p_out, double *m_out, double *v_out, size_t n,
            double lr, double b1, double b2, double eps, double b1t, double b2t,
            int allow_inplace, int64_t *bad_index, int *bad_which) {
    return ak_adamw(p, m, v, g, p_out, m_out, v_out, n, lr, b1, b2, eps, b1t, b2t, 0.0,
                    allow_inplace, bad_index, bad_which);
}

int ak_adamw(const double *p, const double *m, const double *v, const double *g,
             double *p_out, double *m_out, double *v_out, size_t n,
             double lr, double b1, double b2, double eps, double b1t, double b2t, double wd,
             int allow_inplace, int64_t *bad_index, int *bad_which) {
    double *const outs[3] = {p_out, m_out, v_out};
    const double *const ins[4] = {p, m, v, g};
    ak_adam_call c;
    int st = ak_adam_begin(&c, lr, b1, b2, eps, b1t, b2t, wd, &bad_index, &bad_which, outs, ins, 4,
                           n, allow_inplace);
    if (st != AK_OK || n == 0) return st;

    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t e = n - b0 < AK_BLOCK ? n : b0 + AK_BLOCK;
        uint64_t acc = ak_adam_block(&c.K, p, m, v, g, p_out, m_out, v_out, b0, e);
        if (acc >> 63) {
            /* in place, the block may already hold new values: nothing to locate with */
            if (allow_inplace && (p_out == p || m_out == m || v_out == v)) {
                *bad_index = (int64_t)b0;
                *bad_which = AK_W_INTERMEDIATE;
                return AK_ERR_NONFINITE_OUTPUT;
            }
            st = ak_adam_locate(&c.K, p, m, v, g, b0, e, bad_index, bad_which);
            return st != AK_OK ? st : AK_ERR_NONFINITE_OUTPUT;
        }
    }
    return AK_OK;
}

int ak_adam_inplace_checked(double *p, double *m, double *v, const double *g, size_t n,
                            double lr, double b1, double b2, double eps, double b1t,
                            double b2t, int64_t *bad_index, int *bad_which) {
    double *const outs[3] = {p, m, v};
    const double *const ins[1] = {g};
    ak_adam_call c;
    int st = ak_adam_begin(&c, lr, b1, b2, eps, b1t, b2t, 0.0, &bad_index, &bad_which, outs, ins, 1, n, 0);
    if (st != AK_OK || n == 0) return st;
    /* pass 1: compute and check, store nothing */
    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t e = n - b0 < AK_BLOCK ? n : b0 + AK_BLOCK;
        uint64_t acc = ak_adam_block_check(&c.K, p, m, v, g, b0, e);
        if (acc >> 63) {
            st = ak_adam_locate(&c.K, p, m, v, g, b0, e, bad_index, bad_which);
            return st != AK_OK ? st : AK_ERR_NONFINITE_OUTPUT;
        }
    }
    /* pass 2: commit (same-index in place, see AK_IVDEP) */
    (void)ak_adam_block(&c.K, p, m, v, g, p, m, v, 0, n);
    return AK_OK;
}

/* ------------------------------------------------------------------ SGD */

int ak_sgd(const double *p, const double *buf, const double *g,
           double *p_out, double *buf_out, size_t n, double lr, double momentum,
           int allow_inplace, int64_t *bad_index, int *bad_which) {
    ak_report_slots local;
    ak_report_init(&bad_index, &bad_which, &local);
    if (ak_bad(lr) || ak_bad(momentum)) {
        *bad_index = ak_bad(lr) ? AK_SCALAR_LR : AK_SCALAR_B1;
        *bad_which = AK_W_SCALAR;
        return AK_ERR_NONFINITE_INPUT;
    }
    if (n == 0) return AK_OK;
    const double mu = momentum;
    const int mom = mu != 0.0;
    {
        double *const outs[2] = {p_out, buf_out};
        const double *const ins[3] = {p, buf, g};
        /* ins order p, buf, g lines up with outs p_out, buf_out for the in-place rule */
        if (mom ? !ak_outputs_ok(outs, 2, ins, 3, n, allow_inplace)
                : !ak_outputs_ok(outs, 1, (const double *const[]){p, g}, 2, n, allow_inplace))
            return AK_ERR_BAD_ARGUMENT;
    }
    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t e = n - b0 < AK_BLOCK ? n : b0 + AK_BLOCK;
        uint64_t acc = 0;
        if (mom) {
            AK_IVDEP
            for (size_t i = b0; i < e; i++) {
                double b1 = mu * buf[i] + g[i];
                double st = lr * b1;
                double p1 = p[i] - st;
                acc |= ak_nf(p[i]) | ak_nf(buf[i]) | ak_nf(g[i]) | ak_nf(b1) | ak_nf(st) |
                       ak_nf(p1);
                buf_out[i] = b1;
                p_out[i] = p1;
            }
        } else {
            AK_IVDEP
            for (size_t i = b0; i < e; i++) {
                double st = lr * g[i];
                double p1 = p[i] - st;
                acc |= ak_nf(p[i]) | ak_nf(g[i]) | ak_nf(st) | ak_nf(p1);
                p_out[i] = p1;
            }
        }
        if (!(acc >> 63)) continue;
        if (allow_inplace && (p_out == p || (mom && buf_out == buf))) {
            *bad_index = (int64_t)b0;
            *bad_which = AK_W_INTERMEDIATE;
            return AK_ERR_NONFINITE_OUTPUT;
        }
        /* locate: inputs p, buf, g; then buf', lr*buf' (or lr*g), p' */
        for (size_t i = b0; i < e; i++) {
            if (ak_bad(p[i])) { *bad_which = AK_W_P; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_INPUT; }
            if (mom && ak_bad(buf[i])) { *bad_which = AK_W_BUF; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_INPUT; }
            if (ak_bad(g[i])) { *bad_which = AK_W_G; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_INPUT; }
            double b1 = mom ? mu * buf[i] + g[i] : g[i];
            double st = lr * b1;
            double p1 = p[i] - st;
            if (mom && ak_bad(b1)) { *bad_which = AK_W_BUF; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_OUTPUT; }
            if (ak_bad(st)) { *bad_which = AK_W_INTERMEDIATE; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_OUTPUT; }
            if (ak_bad(p1)) { *bad_which = AK_W_P; *bad_index = (int64_t)i; return AK_ERR_NONFINITE_OUTPUT; }
        }
        return AK_ERR_NONFINITE_OUTPUT; /* not reached */
    }
    return AK_OK;
}

/* ------------------------------------------------------------------ conversions */

int ak_widen_binary32(double *out, const float *in, size_t n) {
    if (n == 0) return AK_OK;
    if (!out || !in || ak_overlap(out, n * sizeof(double), in, n * sizeof(float)))
        return AK_ERR_BAD_ARGUMENT;
    for (size_t i = 0; i < n; i++) out[i] = (double)in[i];
    return AK_OK;
}

int ak_round_binary64(float *out, const double *in, size_t n, int64_t *bad_index) {
    int64_t dummy_i;
    if (!bad_index) bad_index = &dummy_i;
    *bad_index = -1;
    if (n == 0) return AK_OK;
    if (!out || !in || ak_overlap(out, n * sizeof(float), in, n * sizeof(double)))
        return AK_ERR_BAD_ARGUMENT;
    for (size_t b0 = 0; b0 < n; b0 += AK_BLOCK) {
        size_t e = n - b0 < AK_BLOCK ? n : b0 + AK_BLOCK;
        uint64_t acc = 0;
        uint32_t acc32 = 0;
        for (size_t i = b0; i < e; i++) {
            float y = (float)in[i]; /* nearest-even under the checked FP environment */
            acc |= ak_nf(in[i]);
            acc32 |= ak_nf32(y);
            out[i] = y;
        }
        if (!(acc >> 63) && !(acc32 >> 31)) continue;
        for (size_t i = b0; i < e; i++) {
            if (ak_bad(in[i])) { *bad_index = (int64_t)i; return AK_ERR_NONFINITE_INPUT; }
            if (ak_nf32(out[i]) >> 31) { *bad_index = (int64_t)i; return AK_ERR_NONFINITE_OUTPUT; }
        }
    }
    return AK_OK;
}

/* ------------------------------------------------------------------ FP environment */

int ak_fpenv_check(uint32_t *raw) {
    int flags = 0;
    uint32_t r = 0;
    if (fegetround() != FE_TONEAREST) flags |= AK_FPENV_ROUNDING;
#if defined(AK_X86)
    r = (uint32_t)_mm_getcsr();
    if (r & (3u << 13)) flags |= AK_FPENV_ROUNDING; /* MXCSR.RC */
    if (r & (1u << 15)) flags |= AK_FPENV_FTZ;
    if (r & (1u << 6)) flags |= AK_FPENV_DAZ;
#elif defined(AK_AARCH64)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    r = (uint32_t)fpcr;
    if (r & (3u << 22)) flags |= AK_FPENV_ROUNDING; /* FPCR.RMode */
    if (r & (1u << 24)) flags |= AK_FPENV_FTZ | AK_FPENV_DAZ; /* FZ flushes inputs too */
#endif
    if (raw) *raw = r;
    return flags;
}

int ak_fpenv_set_ftz_daz(int ftz, int daz) {
#if defined(AK_X86)
    unsigned int r = _mm_getcsr();
    r = ftz ? (r | (1u << 15)) : (r & ~(1u << 15));
    r = daz ? (r | (1u << 6)) : (r & ~(1u << 6));
    _mm_setcsr(r);
    return 0;
#elif defined(AK_AARCH64)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    fpcr = (ftz || daz) ? (fpcr | (UINT64_C(1) << 24)) : (fpcr & ~(UINT64_C(1) << 24));
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
    return 0;
#else
    (void)ftz;
    (void)daz;
    return -1;
#endif
}

/* ------------------------------------------------------------------ identity */

const char *ak_compiler(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}

const char *ak_arch(void) {
#if defined(AK_X86)
    return "x86_64";
#elif defined(AK_AARCH64)
    return "aarch64";
#else
    return "other";
#endif
}
