/*
 * conformance_driver.c -- instruction-set conformance driver for the alpha_mpi kernel
 * (DESIGN.md "Instruction sets").
 *
 * Built from the very same csrc/kernel/alpha_kernel.c, csrc/kernel/dense.c and csrc/kernel/frame.c with the very
 * same flags as the Python extension (alpha_mpi/_kernel_build.py BASE_CFLAGS), once for x86-64 and once for
 * AArch64 (run under qemu-user). It generates its inputs itself from a fixed portable
 * PRNG (splitmix64) by bit manipulation only -- no libm, no multiply-add shaped
 * expressions, so the inputs are the same bits on every target and under every
 * negative-control build -- runs every kernel function on them and writes all output
 * bits to a file (the format of conformance_io.h).
 *
 * usage: conformance_driver OUT_FILE [N] [SEED]   (N defaults to 1048576)
 *
 * Compile-time variant for the negative control (driver only, never the kernel):
 *   -DAK_CONFORMANCE_RSQRT   Adam's p' computed as p - (lr*mhat) * (1/(sqrt(vhat)+eps)),
 *                            a reciprocal-then-multiply route that rounds twice; and AdamW's
 *                            decay applied after the Adam step, (p - step) * (1 - lr*wd),
 *                            instead of before it (torch.optim.AdamW's order).
 */
#include "alpha_kernel.h"
#include "conformance_io.h"
#include "dense.h"
#include "frame.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sm_state;

static uint64_t sm_next(void) {
    uint64_t z = (sm_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double from_bits(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static uint64_t below(uint64_t n) { return sm_next() % n; }

/* (1 + f) * 2^e with a random 52-bit fraction, e in [emin, emax], random or + sign */
static double scaled(int emin, int emax, int random_sign) {
    uint64_t e = (uint64_t)(1023 + emin) + below((uint64_t)(emax - emin + 1));
    uint64_t s = random_sign ? (sm_next() & 1) : 0;
    return from_bits((s << 63) | (e << 52) | (sm_next() & UINT64_C(0xFFFFFFFFFFFFF)));
}

static double subnormal(int random_sign) {
    uint64_t s = random_sign ? (sm_next() & 1) : 0;
    uint64_t f = sm_next() & UINT64_C(0xFFFFFFFFFFFFF);
    return from_bits((s << 63) | (f ? f : 1));
}

/* combine data: every scale, subnormals, signed zeros, huge, tiny, near 1 */
static double mixed(void) {
    uint64_t s = sm_next() & 1;
    switch (below(16)) {
    case 0: case 1: case 2: case 3: case 4: case 5:
        return scaled(-30, 30, 1);
    case 6:
        return subnormal(1);
    case 7:
        return from_bits(s << 63); /* +-0 */
    case 8:
        return scaled(980, 1023, 1); /* huge: sums may overflow to +-Inf, then NaN */
    case 9:
        return scaled(-1022, -980, 1); /* tiny normals */
    case 10: case 11:
        return from_bits((s << 63) | (UINT64_C(1023) << 52) | (sm_next() & 0xFFFFF)); /* near 1 */
    default:
        return scaled(-1022, 1023, 1);
    }
}

/* Adam-like state: realistic scales plus zeros and subnormals */
static double adam_p(void) { return below(16) == 0 ? from_bits((sm_next() & 1) << 63) : scaled(-20, 4, 1); }
static double adam_m(void) { return below(32) == 0 ? subnormal(1) : scaled(-30, -1, 1); }
static double adam_v(void) {
    uint64_t k = below(32);
    return k == 0 ? 0.0 : k == 1 ? subnormal(0) : scaled(-60, -2, 0);
}
static double adam_g(void) {
    uint64_t k = below(32);
    return k == 0 ? 0.0 : k == 1 ? subnormal(1) : scaled(-40, 10, 1);
}

/* product operands: 2^-20 .. 2^20 both signs, with subnormals, signed zeros and a rare huge
 * value (some sums overflow to Inf, or to NaN when both signs do) */
static double product_value(void) {
    uint64_t k = below(4096);
    if (k == 0) return scaled(1000, 1023, 1);
    if (k < 256) return subnormal(1);
    if (k < 512) return from_bits((sm_next() & 1) << 63);
    return scaled(-20, 20, 1);
}

/* a binary64 near a binary32 value: exact ties, random fractions, float subnormal range */
static double narrow_input(void) {
    uint64_t s = sm_next() & 1;
    uint64_t k = below(8);
    if (k == 0) { /* binary32 subnormal range and below: [2^-160, 2^-126) */
        uint64_t e = (uint64_t)(1023 - 160) + below(34);
        uint64_t f = sm_next() & UINT64_C(0xFFFFFFFFFFFFF); /* one PRNG call per statement:
                                                              the order is then fixed */
        return from_bits((s << 63) | (e << 52) | f);
    }
    uint64_t e = 1023 - 126 + below(254); /* binary32 normal exponents -126..127 */
    uint64_t f23 = sm_next() & 0x7FFFFF;
    uint64_t low29 = k == 1 ? (UINT64_C(1) << 28) : k == 2 ? 0 : (sm_next() & 0x1FFFFFFF);
    if (e == 1023 + 127 && f23 == 0x7FFFFF && low29 >= (UINT64_C(1) << 28)) low29 = 0; /* no overflow */
    return from_bits((s << 63) | (e << 52) | (f23 << 29) | low29);
}

static FILE *out_file;

static void section(const char *name, const void *data, uint64_t count, uint64_t elem) {
    conformance_section(out_file, name, data, count, elem);
}

static void check(int st, const char *what) {
    if (st != AK_OK) {
        fprintf(stderr, "conformance_driver: %s returned status %d\n", what, st);
        exit(4);
    }
}

static double *alloc(size_t n) {
    double *p = malloc(n * sizeof(double));
    if (!p) {
        fprintf(stderr, "conformance_driver: out of memory\n");
        exit(5);
    }
    return p;
}

#ifdef AK_CONFORMANCE_RSQRT
/* NEGATIVE CONTROL ONLY: refused by the contract (rounds twice) */
static void adam_rsqrt(const double *p, const double *m, const double *v, const double *g,
                       double *po, double *mo, double *vo, size_t n, double lr, double b1,
                       double b2, double eps, double b1t, double b2t) {
    double c1 = 1.0 - b1, c2 = 1.0 - b2, bc1 = 1.0 - b1t, bc2 = 1.0 - b2t;
    for (size_t i = 0; i < n; i++) {
        double m1 = b1 * m[i] + c1 * g[i];
        double v1 = b2 * v[i] + c2 * (g[i] * g[i]);
        double mhat = m1 / bc1, vhat = v1 / bc2;
        double r = 1.0 / (__builtin_sqrt(vhat) + eps);
        po[i] = p[i] - (lr * mhat) * r;
        mo[i] = m1;
        vo[i] = v1;
    }
}

/* NEGATIVE CONTROL ONLY: AdamW with the decay after the step, not torch's order */
static void adamw_decay_after(const double *p, const double *m, const double *v, const double *g,
                              double *po, double *mo, double *vo, size_t n, double lr, double b1,
                              double b2, double eps, double b1t, double b2t, double wd) {
    double c1 = 1.0 - b1, c2 = 1.0 - b2, bc1 = 1.0 - b1t, bc2 = 1.0 - b2t, dec = 1.0 - lr * wd;
    for (size_t i = 0; i < n; i++) {
        double m1 = b1 * m[i] + c1 * g[i];
        double v1 = b2 * v[i] + c2 * (g[i] * g[i]);
        double mhat = m1 / bc1, vhat = v1 / bc2;
        po[i] = (p[i] - (lr * mhat) / (__builtin_sqrt(vhat) + eps)) * dec;
        mo[i] = m1;
        vo[i] = v1;
    }
}
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT_FILE [N] [SEED]\n", argv[0]);
        return 2;
    }
    size_t n = argc > 2 ? (size_t)strtoull(argv[2], 0, 10) : (size_t)1 << 20;
    sm_state = argc > 3 ? strtoull(argv[3], 0, 10) : UINT64_C(20240601);
    out_file = conformance_open(argv[1]);
    if (!out_file || n < 16384) {
        fprintf(stderr, "conformance_driver: cannot open %s (or N < 16384)\n", argv[1]);
        return 2;
    }

    /* FP environment (flags only: the raw registers differ by architecture) */
    uint32_t raw = 0;
    int64_t env = ak_fpenv_check(&raw);
    section("fpenv_flags", &env, 1, 8);

    enum { KC = 10 };
    double *x[KC];
    for (int j = 0; j < KC; j++) {
        x[j] = alloc(n);
        for (size_t i = 0; i < n; i++) x[j][i] = mixed();
    }
    double *out = alloc(n);

    check(ak_add(out, x[0], x[1], n), "ak_add");
    section("add", out, n, 8);

    /* (x0 + (x1 + x2)) + ((x3 + x4) + x5): the general (non-chain) tree path */
    static const int32_t prog[] = {0, 1, 2, -1, -1, 3, 4, -1, 5, -1, -1};
    check(ak_tree_eval(out, (const double *const *)x, KC, n, prog, sizeof prog / sizeof prog[0]),
          "ak_tree_eval");
    section("tree_eval", out, n, 8);

    /* the star chain over 10 inputs (blocked chain path) */
    check(ak_fold(out, (const double *const *)x, KC, n), "ak_fold");
    section("fold", out, n, 8);

    /* a chain program over a permutation with one input used twice (fused chain path) */
    static const int32_t chain[] = {7, 2, -1, 9, -1, 2, -1, 0, -1};
    check(ak_tree_eval(out, (const double *const *)x, KC, n, chain, sizeof chain / sizeof chain[0]),
          "ak_tree_eval chain");
    section("chain_prog", out, n, 8);

    int64_t first = ak_first_nonfinite(out, n);
    section("first_nonfinite", &first, 1, 8);

    /* Adam at step t = 10; the bias powers by repeated multiplication */
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double b1t = 1.0, b2t = 1.0;
    for (int t = 0; t < 10; t++) {
        b1t *= b1;
        b2t *= b2;
    }
    double *p = x[0], *m = x[1], *v = x[2], *g = x[3];
    for (size_t i = 0; i < n; i++) {
        p[i] = adam_p();
        m[i] = adam_m();
        v[i] = adam_v();
        g[i] = adam_g();
    }
    /* the state the updates start from, so that the oracle can recompute them */
    section("state_p", p, n, 8);
    section("state_m", m, n, 8);
    section("state_v", v, n, 8);
    section("state_g", g, n, 8);
    double *po = alloc(n), *mo = alloc(n), *vo = alloc(n);
    int64_t bad_index = -1;
    int bad_which = -1;
#ifdef AK_CONFORMANCE_RSQRT
    adam_rsqrt(p, m, v, g, po, mo, vo, n, lr, b1, b2, eps, b1t, b2t);
#else
    check(ak_adam(p, m, v, g, po, mo, vo, n, lr, b1, b2, eps, b1t, b2t, 0, &bad_index, &bad_which),
          "ak_adam");
#endif
    section("adam_p", po, n, 8);
    section("adam_m", mo, n, 8);
    section("adam_v", vo, n, 8);

    /* AdamW on the same state, decoupled weight decay 0.1 at lr 0.03 (so that the decay is
     * seen in most parameters' bits) */
    const double lrw = 0.03, wd = 0.1;
#ifdef AK_CONFORMANCE_RSQRT
    adamw_decay_after(p, m, v, g, po, mo, vo, n, lrw, b1, b2, eps, b1t, b2t, wd);
#else
    check(ak_adamw(p, m, v, g, po, mo, vo, n, lrw, b1, b2, eps, b1t, b2t, wd, 0, &bad_index, &bad_which),
          "ak_adamw");
#endif
    section("adamw_p", po, n, 8);
    section("adamw_m", mo, n, 8);
    section("adamw_v", vo, n, 8);

    /* SGD with and without momentum (buf = m) */
    check(ak_sgd(p, m, g, po, mo, n, 0.01, 0.9, 0, &bad_index, &bad_which), "ak_sgd");
    section("sgd_p", po, n, 8);
    section("sgd_buf", mo, n, 8);
    check(ak_sgd(p, 0, g, po, 0, n, 0.01, 0.0, 0, &bad_index, &bad_which), "ak_sgd mu=0");
    section("sgd0_p", po, n, 8);

    /* conversions */
    for (size_t i = 0; i < n; i++) x[4][i] = narrow_input();
    float *f = malloc(n * sizeof(float));
    if (!f) return 5;
    check(ak_round_binary64(f, x[4], n, &bad_index), "ak_round_binary64");
    section("round_binary64", f, n, 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)sm_next();
        memcpy(&f[i], &u, 4);
    }
    check(ak_widen_binary32(out, f, n), "ak_widen_binary32");
    section("widen_binary32", out, n, 8);

    /* the dense kernels (dense.h): exp over its whole range (overflow, subnormal results,
     * underflow), log over every binade (subnormal inputs, 0, negatives), and the products on
     * combine data (every scale, subnormals, signed zeros, overflow to Inf and NaN) */
    for (size_t i = 0; i < n; i++) { /* |x| in [2^-30, 2^10) both signs (exp's edges), or any bits */
        uint64_t k = below(4);
        x[5][i] = k == 0 ? mixed() : k == 3 ? from_bits(sm_next()) : scaled(-30, 9, 1);
    }
    check(ak_exp(out, x[5], n), "ak_exp");
    section("exp", out, n, 8);
    check(ak_log(out, x[5], n), "ak_log");
    section("log", out, n, 8);
    enum { PM = 37, PK = 300, PN = 45 }; /* edges of every tile; k above one panel (128) */
    for (size_t i = 0; i < (size_t)PK * PN; i++) {
        x[6][i] = product_value();
        x[7][i] = product_value();
        x[8][i] = product_value();
    }
    double *c = alloc(PM * PN);
    check(ak_matmul(c, x[6], x[7], x[8], PM, PK, PN), "ak_matmul");
    section("matmul", c, PM * PN, 8);
    check(ak_matmul_tn(c, x[6], x[7], NULL, PM, PK, PN), "ak_matmul_tn");
    section("matmul_tn", c, PM * PN, 8);
    check(ak_matmul_nt(c, x[6], x[7], x[8], PM, PK, PN), "ak_matmul_nt");
    section("matmul_nt", c, PM * PN, 8);
    check(ak_matmul(c, x[6], x[7], NULL, PN, PK, 9), "ak_matmul narrow"); /* the rows share vectors */
    section("matmul_narrow", c, PN * 9, 8);
    free(c);

    /* refusals: status, index and array must agree too */
    int64_t refusals[15];
    size_t at = n / 3;
    double keep = g[at];
    g[at] = from_bits(UINT64_C(0x7FF8000000000000)); /* NaN in g */
    refusals[0] = ak_adam(p, m, v, g, po, mo, vo, n, lr, b1, b2, eps, b1t, b2t, 0, &bad_index, &bad_which);
    refusals[1] = bad_index;
    refusals[2] = bad_which;
    g[at] = 1e200; /* g*g overflows */
    refusals[3] = ak_adam(p, m, v, g, po, mo, vo, n, lr, b1, b2, eps, b1t, b2t, 0, &bad_index, &bad_which);
    refusals[4] = bad_index;
    refusals[5] = bad_which;
    g[at] = keep;
    double big = x[4][at];
    x[4][at] = 3.4028235677973366e38; /* rounds beyond binary32 */
    refusals[6] = ak_round_binary64(f, x[4], n, &bad_index);
    refusals[7] = bad_index;
    x[4][at] = big;
    p[n - 1] = from_bits(UINT64_C(0xFFF0000000000000)); /* -Inf in p */
    refusals[8] = ak_sgd(p, m, g, po, mo, n, 0.01, 0.9, 0, &bad_index, &bad_which);
    refusals[9] = bad_index;
    refusals[10] = bad_which;
    refusals[11] = ak_first_nonfinite(p, n);
    p[n - 1] = 1.0;
    refusals[12] = ak_adamw(p, m, v, g, po, mo, vo, n, lrw, b1, b2, eps, b1t, b2t,
                            from_bits(UINT64_C(0x7FF8000000000000)), 0, &bad_index, &bad_which); /* NaN wd */
    refusals[13] = bad_index;
    refusals[14] = bad_which;
    section("refusals", refusals, 15, 8);

    /* CRC32C (frame.h) over the generated bytes at lengths around every path boundary, by the
     * instruction path (SSE4.2 / ARMv8 CRC32, three streams) and the table path, and a header
     * written by ak_frame_patch: the same values on every target */
    {
        static const size_t lens[] = {0, 1, 7, 8, 9, 4095, 4096, 12287, 12288, 12289, 36869};
        enum { NL = sizeof lens / sizeof lens[0] };
        uint64_t crcs[2 * NL + 1];
        const uint8_t *bytes = (const uint8_t *)x[5];
        size_t avail = n * sizeof(double);
        for (size_t i = 0; i < NL; i++) {
            size_t len = lens[i] + 3 < avail ? lens[i] : 0;
            crcs[2 * i] = ak_crc32c(0, bytes + 3, len); /* an unaligned start */
            crcs[2 * i + 1] = ak_crc32c_portable(0, bytes + 3, len);
        }
        crcs[2 * NL] = (uint64_t)ak_crc32c_hardware();
        section("crc32c", crcs, 2 * NL, 8); /* the instruction's availability may differ: not compared */
        uint8_t h[AK_FRAME_HEADER], expect[AK_FRAME_HEADER];
        memcpy(expect, bytes, sizeof expect);
        static const uint8_t code[4] = {1, 2, 3, 4};
        ak_frame_patch(h, expect, UINT64_C(0x0102030405060708), 0x0B, 41, code, 0xDEADBEEFu);
        section("frame_patch", h, AK_FRAME_HEADER / 4, 4);
    }

    if (fclose(out_file) != 0) return 3;
    return 0;
}
