/*
 * dense.c -- the fixed-order dense kernels declared in dense.h (orders written down there).
 *
 * The products run on one of several ISA paths (dense_path.inc, included once per path);
 * everything else here is plain C with one order per output, which the compiler may
 * vectorize only across outputs (it never reassociates: no -ffast-math, contraction off).
 */
#include "dense.h"

#include <string.h>

#include "alpha_kernel.h"

/* ----------------------------------------------------------------------------- helpers */

static inline uint64_t bits_of(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline double of_bits(uint64_t u) {
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* [p, p + pn) and [q, q + qn) (in doubles or bytes, as the caller counts) share memory */
static int overlap(const void *p, size_t pbytes, const void *q, size_t qbytes) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return pbytes && qbytes && a < b + qbytes && b < a + pbytes;
}

/* out may be exactly x, or disjoint from it */
static int exact_or_disjoint(const double *out, const double *x, size_t n) {
    return out == x || !overlap(out, n * sizeof(double), x, n * sizeof(double));
}

/* m * n without overflow of the byte count */
static int size_ok(size_t m, size_t n) {
    return n == 0 || m <= ((size_t)-1 / sizeof(double)) / n;
}

/* ----------------------------------------------------------------------------- EXP and LOG
 *
 * fdlibm's algorithms (e_exp.c, e_log.c; Sun Microsystems, 1993/2004: "Permission to use,
 * copy, modify, and distribute this software is freely granted, provided that this notice
 * is preserved."), written out for binary64 bit patterns. Each line below is one rounded
 * operation per operator, evaluated left to right as parenthesised; the oracle in
 * tests/dense_oracle.py evaluates the same lines with Python floats.
 */

static const double
    EXP_OVER = 7.09782712893383973096e+02,   /* 0x40862E42FEFA39EF: above, +Inf */
    EXP_UNDER = -7.45133219101941108420e+02, /* 0xC0874910D52D3051: below, +0 */
    LN2_HI = 6.93147180369123816490e-01,     /* 0x3FE62E42FEE00000 */
    LN2_LO = 1.90821492927058770002e-10,     /* 0x3DEA39EF35793C76 */
    INV_LN2 = 1.44269504088896338700e+00,    /* 0x3FF71547652B82FE */
    TWOM1000 = 9.33263618503218878990e-302,  /* 2^-1000 */
    TWO54 = 1.80143985094819840000e+16,      /* 2^54 */
    P1 = 1.66666666666666019037e-01, P2 = -2.77777777770155933842e-03,
    P3 = 6.61375632143793436117e-05, P4 = -1.65339022054652515390e-06,
    P5 = 4.13813679705723846039e-08,
    LG1 = 6.666666666666735130e-01, LG2 = 3.999999999940941908e-01,
    LG3 = 2.857142874366239149e-01, LG4 = 2.222219843214978396e-01,
    LG5 = 1.818357216161805012e-01, LG6 = 1.531383769920937332e-01,
    LG7 = 1.479819860511658591e-01;

#define BITS_INF UINT64_C(0x7FF0000000000000)
#define BITS_NAN UINT64_C(0x7FF8000000000000)

/* exp(x) = 2^k * exp(r), r = x - k*ln2 in [-ln2/2, ln2/2] (ln2 in two parts, k*LN2_HI exact),
 * exp(r) = 1 + r + r*c/(2 - c) with c = r - r^2*(P1 + r^2*(P2 + ... + r^2*P5)), then 2^k
 * by adding k to the exponent field (via 2^-1000 for subnormal results: one rounding). */
double ak_exp1(double x) {
    const uint64_t ux = bits_of(x);
    const uint32_t hx = (uint32_t)(ux >> 32) & 0x7fffffffu;
    const int neg = (int)(ux >> 63);
    double hi = 0.0, lo = 0.0;
    int k = 0;
    if (hx >= 0x40862E42u) { /* |x| >= 709.78 */
        if (hx >= 0x7ff00000u) {
            if (ux & UINT64_C(0x000FFFFFFFFFFFFF)) return x + x; /* NaN */
            return neg ? 0.0 : x;                                                  /* -Inf, +Inf */
        }
        if (x > EXP_OVER) return of_bits(BITS_INF);
        if (x < EXP_UNDER) return 0.0;
    }
    if (hx > 0x3fd62e42u) {     /* |x| > ln2/2 */
        if (hx < 0x3FF0A2B2u) { /* and |x| < 1.5 ln2: k = +-1 */
            hi = neg ? x + LN2_HI : x - LN2_HI;
            lo = neg ? -LN2_LO : LN2_LO;
            k = neg ? -1 : 1;
        } else {
            k = (int)((INV_LN2 * x) + (neg ? -0.5 : 0.5)); /* truncation: round to nearest */
            const double t = (double)k;
            hi = x - (t * LN2_HI);
            lo = t * LN2_LO;
        }
        x = hi - lo;
    } else if (hx < 0x3e300000u) { /* |x| < 2^-28 */
        return 1.0 + x;
    }
    const double t = x * x;
    const double c = x - (t * (P1 + (t * (P2 + (t * (P3 + (t * (P4 + (t * P5)))))))));
    if (k == 0) return 1.0 - (((x * c) / (c - 2.0)) - x);
    const double y = 1.0 - ((lo - ((x * c) / (2.0 - c))) - hi);
    if (k >= -1021) return of_bits(bits_of(y) + ((uint64_t)(int64_t)k << 52));
    return of_bits(bits_of(y) + ((uint64_t)(int64_t)(k + 1000) << 52)) * TWOM1000;
}

/* log(x) = k*ln2 + log(1 + f), x = 2^k * (1 + f) with sqrt(2)/2 < 1 + f < sqrt(2);
 * log(1 + f) = f - s*(f - R) with s = f/(2 + f), R the Lg1..Lg7 polynomial in s^2. */
double ak_log1(double x) {
    uint64_t ux = bits_of(x);
    int32_t hx = (int32_t)(ux >> 32);
    const uint32_t lx = (uint32_t)ux;
    int k = 0;
    if (hx < 0x00100000) { /* x < 2^-1022, or negative, or -0 */
        if (((hx & 0x7fffffff) | (int32_t)lx) == 0) return -of_bits(BITS_INF); /* log(+-0) */
        if (hx < 0) return of_bits(BITS_NAN);                                  /* log(x < 0) */
        k -= 54;
        x = x * TWO54; /* subnormal: scale up (exact) */
        ux = bits_of(x);
        hx = (int32_t)(ux >> 32);
    }
    if (hx >= 0x7ff00000) return x + x; /* +Inf, NaN */
    k += (hx >> 20) - 1023;
    hx &= 0x000fffff;
    const int32_t i = (hx + 0x95f64) & 0x100000;
    /* normalize x or x/2 into [sqrt(2)/2, sqrt(2)) */
    x = of_bits(((uint64_t)(uint32_t)(hx | (i ^ 0x3ff00000)) << 32) | (ux & 0xffffffffu));
    k += (i >> 20);
    const double f = x - 1.0;
    const double dk = (double)k;
    if ((0x000fffff & (2 + hx)) < 3) { /* -2^-20 <= f < 2^-20 */
        if (f == 0.0) return k == 0 ? 0.0 : (dk * LN2_HI) + (dk * LN2_LO);
        const double r = (f * f) * (0.5 - (0.33333333333333333 * f));
        if (k == 0) return f - r;
        return (dk * LN2_HI) - ((r - (dk * LN2_LO)) - f);
    }
    const double s = f / (2.0 + f);
    const double z = s * s;
    const double w = z * z;
    const int32_t j = (hx - 0x6147a) | (0x6b851 - hx);
    const double t1 = w * (LG2 + (w * (LG4 + (w * LG6))));
    const double t2 = z * (LG1 + (w * (LG3 + (w * (LG5 + (w * LG7))))));
    const double r = t2 + t1;
    if (j > 0) {
        const double hfsq = (0.5 * f) * f;
        if (k == 0) return f - (hfsq - (s * (hfsq + r)));
        return (dk * LN2_HI) - ((hfsq - ((s * (hfsq + r)) + (dk * LN2_LO))) - f);
    }
    if (k == 0) return f - (s * (f - r));
    return (dk * LN2_HI) - (((s * (f - r)) - (dk * LN2_LO)) - f);
}

int ak_exp(double *out, const double *x, size_t n) {
    if (!size_ok(n, 1) || !exact_or_disjoint(out, x, n)) return AK_ERR_BAD_ARGUMENT;
    for (size_t i = 0; i < n; i++) out[i] = ak_exp1(x[i]);
    return AK_OK;
}

int ak_log(double *out, const double *x, size_t n) {
    if (!size_ok(n, 1) || !exact_or_disjoint(out, x, n)) return AK_ERR_BAD_ARGUMENT;
    for (size_t i = 0; i < n; i++) out[i] = ak_log1(x[i]);
    return AK_OK;
}

/* ----------------------------------------------------------------------------- element-wise */

int ak_col_sum(double *out, const double *a, size_t m, size_t n) {
    if (!size_ok(m, n) || overlap(out, n * sizeof(double), a, m * n * sizeof(double)))
        return AK_ERR_BAD_ARGUMENT;
    for (size_t j = 0; j < n; j++) out[j] = 0.0;
    for (size_t i = 0; i < m; i++) { /* ascending i for every j; vectorized across j only */
        const double *row = a + i * n;
        for (size_t j = 0; j < n; j++) out[j] = out[j] + row[j];
    }
    return AK_OK;
}

/* The selects below load both operands and pick one: a vector blend, no branch to mispredict
 * (a branch per element on random signs costs more than the arithmetic of a whole layer).
 * restrict, and one loop per aliasing case, so that the compiler vectorizes each. */
static void relu_to(double *restrict out, const double *restrict z, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = z[i] <= 0.0 ? 0.0 : z[i]; /* z > 0 or NaN: z */
}

static void relu_in(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] <= 0.0 ? 0.0 : x[i];
}

static void mask_to(double *restrict out, const double *g, const double *z, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double gv = g[i]; /* loaded whatever z says: the select needs no branch */
        out[i] = z[i] > 0.0 ? gv : 0.0;
    }
}

static void mask_in_g(double *g, const double *restrict z, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = z[i] > 0.0 ? g[i] : 0.0;
}

static void mask_in_z(double *z, const double *restrict g, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double gv = g[i];
        z[i] = z[i] > 0.0 ? gv : 0.0;
    }
}

static void mask_self(double *x, size_t n) { /* g == z: x where x > 0 (NaN is not): +0.0 */
    for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0 ? x[i] : 0.0;
}

int ak_relu(double *out, const double *z, size_t n) {
    if (!size_ok(n, 1) || !exact_or_disjoint(out, z, n)) return AK_ERR_BAD_ARGUMENT;
    if (out == z)
        relu_in(out, n);
    else
        relu_to(out, z, n);
    return AK_OK;
}

int ak_relu_backward(double *out, const double *g, const double *z, size_t n) {
    if (!size_ok(n, 1) || !exact_or_disjoint(out, g, n) || !exact_or_disjoint(out, z, n))
        return AK_ERR_BAD_ARGUMENT;
    if (out == g && out == z)
        mask_self(out, n);
    else if (out == g)
        mask_in_g(out, z, n);
    else if (out == z)
        mask_in_z(out, g, n);
    else
        mask_to(out, g, z, n);
    return AK_OK;
}

int ak_softmax_xent(double *grad, double *loss, const double *logits, const int64_t *labels,
                    size_t m, size_t c, int64_t *bad_index) {
    if (c == 0 || !size_ok(m, c) || !exact_or_disjoint(grad, logits, m * c) ||
        overlap(grad, m * c * sizeof(double), labels, m * sizeof(int64_t)) ||
        overlap(loss, sizeof(double), grad, m * c * sizeof(double)) ||
        overlap(loss, sizeof(double), logits, m * c * sizeof(double)))
        return AK_ERR_BAD_ARGUMENT;
    for (size_t i = 0; i < m; i++) /* labels first: a refusal writes nothing */
        if (labels[i] < 0 || (uint64_t)labels[i] >= (uint64_t)c) {
            *bad_index = (int64_t)i;
            return AK_ERR_BAD_ARGUMENT;
        }
    double total = 0.0;
    for (size_t i = 0; i < m; i++) {
        const double *z = logits + i * c;
        double *g = grad + i * c;
        const size_t y = (size_t)labels[i];
        double mx = z[0];
        for (size_t j = 1; j < c; j++)
            if (z[j] > mx) mx = z[j];
        const double ty = z[y] - mx; /* read before g (which may be z) is written */
        double s = 0.0;
        for (size_t j = 0; j < c; j++) {
            const double e = ak_exp1(z[j] - mx);
            g[j] = e;
            s = s + e;
        }
        total = total + (ak_log1(s) - ty);
        for (size_t j = 0; j < c; j++) g[j] = g[j] / s;
        g[y] = g[y] - 1.0;
    }
    *loss = total;
    return AK_OK;
}

/* ----------------------------------------------------------------------------- products */

/* C[i*c_rs + j*c_cs] = sum over ascending l of a(i,l) * b(l,j) (+ bias[j]), where
 * a(i,l) = a[i*a_rs + l*a_cs] and b(l,j) = b[l*b_rs + j*b_cs]. */
typedef void (*gemm_fn)(size_t m, size_t n, size_t k, const double *a, size_t a_rs,
                        size_t a_cs, const double *b, size_t b_rs, size_t b_cs,
                        const double *bias, double *c, size_t c_rs, size_t c_cs);

/* The generic path: the declared order as plain loops, accumulating in C's row (i, l, j). */
static void gemm_generic(size_t m, size_t n, size_t k, const double *a, size_t a_rs,
                         size_t a_cs, const double *b, size_t b_rs, size_t b_cs,
                         const double *bias, double *c, size_t c_rs, size_t c_cs) {
    for (size_t i = 0; i < m; i++) {
        double *row = c + i * c_rs;
        for (size_t j = 0; j < n; j++) row[j * c_cs] = 0.0;
        for (size_t l = 0; l < k; l++) {
            const double x = a[i * a_rs + l * a_cs];
            const double *bl = b + l * b_rs;
            for (size_t j = 0; j < n; j++) row[j * c_cs] = row[j * c_cs] + (x * bl[j * b_cs]);
        }
        if (bias)
            for (size_t j = 0; j < n; j++) row[j * c_cs] = row[j * c_cs] + bias[j];
    }
}

#define DP_KC 128 /* rows of B per panel (a packed panel is at most 128 x 32 doubles, 32 KiB) */
#define NARROW 16 /* fewer columns than this may have the rows share the vectors instead */

#if defined(__x86_64__)
#define DP_NAME sse2
#define DP_TARGET
#define DP_VLEN 2
#define DP_MR 4 /* 12 accumulators of the 16 xmm registers */
#define DP_NV 3
#include "dense_path.inc"

#define DP_NAME avx2
#define DP_TARGET __attribute__((target("avx2")))
#define DP_VLEN 4
#define DP_MR 4 /* 8 accumulators of the 16 ymm registers (the products need temporaries) */
#define DP_NV 2
#include "dense_path.inc"

#define DP_NAME avx512
#define DP_TARGET __attribute__((target("avx512f")))
#define DP_VLEN 8
#define DP_MR 4 /* 12 accumulators of the 32 zmm registers: measured best of 4..8 x 2..4 */
#define DP_NV 3
#include "dense_path.inc"
#endif

#if defined(__aarch64__)
#define DP_NAME neon
#define DP_TARGET
#define DP_VLEN 2
#define DP_MR 4 /* 16 accumulators of the 32 q registers */
#define DP_NV 4
#include "dense_path.inc"
#endif

static gemm_fn path_fn(int32_t path) {
    switch (path) {
    case AK_ISA_GENERIC: return gemm_generic;
#if defined(__x86_64__)
    case AK_ISA_SSE2: return gemm_sse2;
    case AK_ISA_AVX2: return __builtin_cpu_supports("avx2") ? gemm_avx2 : NULL;
    case AK_ISA_AVX512: return __builtin_cpu_supports("avx512f") ? gemm_avx512 : NULL;
#endif
#if defined(__aarch64__)
    case AK_ISA_NEON: return gemm_neon;
#endif
    default: return NULL;
    }
}

/* The only global state: which path runs (relaxed atomics: two threads racing on the first
 * call choose the same path, and a path never changes bits, only speed). */
static int32_t current_path = -1;

int ak_isa_available(int32_t path) {
#if defined(__x86_64__)
    __builtin_cpu_init();
#endif
    return path_fn(path) != NULL;
}

int32_t ak_isa_current(void) {
    int32_t now = __atomic_load_n(&current_path, __ATOMIC_RELAXED);
    if (now < 0) {
        static const int32_t fastest_first[] = {AK_ISA_AVX512, AK_ISA_AVX2, AK_ISA_SSE2,
                                                AK_ISA_NEON, AK_ISA_GENERIC};
        int32_t best = AK_ISA_GENERIC;
        for (size_t i = 0; i < sizeof fastest_first / sizeof fastest_first[0]; i++)
            if (ak_isa_available(fastest_first[i])) {
                best = fastest_first[i];
                break;
            }
        __atomic_store_n(&current_path, best, __ATOMIC_RELAXED);
        now = best;
    }
    return now;
}

int ak_isa_select(int32_t path) {
    if (!ak_isa_available(path)) return AK_ERR_BAD_ARGUMENT;
    __atomic_store_n(&current_path, path, __ATOMIC_RELAXED);
    return AK_OK;
}

const char *ak_isa_name(int32_t path) {
    static const char *const names[AK_ISA_COUNT] = {"generic", "sse2", "avx2", "avx512", "neon"};
    return path >= 0 && path < AK_ISA_COUNT ? names[path] : "unknown";
}

/* doubles per vector of each path: which way a narrow product fills its vectors better */
static const size_t path_lanes[AK_ISA_COUNT] = {1, 2, 4, 8, 2};

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static int gemm_checked(double *c, const double *a, size_t a_rows, size_t a_cols,
                        const double *b, size_t b_rows, size_t b_cols, const double *bias,
                        size_t m, size_t k, size_t n, size_t a_rs, size_t a_cs, size_t b_rs,
                        size_t b_cs) {
    if (!size_ok(m, n) || !size_ok(a_rows, a_cols) || !size_ok(b_rows, b_cols))
        return AK_ERR_BAD_ARGUMENT;
    const size_t cb = m * n * sizeof(double);
    if (overlap(c, cb, a, a_rows * a_cols * sizeof(double)) ||
        overlap(c, cb, b, b_rows * b_cols * sizeof(double)) ||
        (bias && overlap(c, cb, bias, n * sizeof(double))))
        return AK_ERR_BAD_ARGUMENT;
    if (m == 0 || n == 0) return AK_OK;
    const int32_t path = ak_isa_current();
    gemm_fn gemm = path_fn(path);
    const size_t lanes = path_lanes[path];
    /* lanes a row of C fills, rounded up to whole vectors, per useful lane: the rows share the
     * vectors when that wastes fewer (n = 10 on 8 lanes: 16 for 10; m = 32: 32 for 32) */
    const int rows_share = n < NARROW && m > n && round_up(n, lanes) * m > round_up(m, lanes) * n;
    if (!rows_share) {
        gemm(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, bias, c, n, 1);
        return AK_OK;
    }
    /* Few columns, more rows: vectorize across the rows instead, computing C^T = B^T . A^T
     * (the same products b(l,j) * a(i,l) = a(i,l) * b(l,j), the same sums in ascending l,
     * only which outputs share a vector changes), written through C's transposed strides;
     * then each output's bias, once, after its whole sum (the sum was stored exactly). */
    gemm(n, m, k, b, b_cs, b_rs, a, a_cs, a_rs, NULL, c, 1, n);
    if (bias)
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++) c[i * n + j] = c[i * n + j] + bias[j];
    return AK_OK;
}

int ak_matmul(double *c, const double *a, const double *b, const double *bias, size_t m,
              size_t k, size_t n) {
    return gemm_checked(c, a, m, k, b, k, n, bias, m, k, n, k, 1, n, 1);
}

int ak_matmul_tn(double *c, const double *a, const double *b, const double *bias, size_t m,
                 size_t k, size_t n) {
    return gemm_checked(c, a, k, m, b, k, n, bias, m, k, n, 1, m, n, 1);
}

int ak_matmul_nt(double *c, const double *a, const double *b, const double *bias, size_t m,
                 size_t k, size_t n) {
    return gemm_checked(c, a, m, k, b, n, k, bias, m, k, n, k, 1, 1, k);
}
