/*
 * pairwise.c -- the pairwise tree over global indices (see pairwise.h for the tree, the
 * summaries and the merge; that comment is the specification, this file follows it).
 */
#include "pairwise.h"

#include <string.h>

#if AP_BLOCK < 4 || (AP_BLOCK & (AP_BLOCK - 1))
#error "AP_BLOCK must be a power of two >= 4"
#endif

static inline double ap_get(const int64_t *w) {
    double v;
    memcpy(&v, w, sizeof v);
    return v;
}

static inline void ap_set(int64_t *w, double v) { memcpy(w, &v, sizeof v); }

static inline int ap_is_nonfinite(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return ((u >> 52) & 0x7ff) == 0x7ff;
}

/* Largest power of two <= v (v >= 1). */
static inline uint64_t ap_floor_pow2(uint64_t v) {
    return (uint64_t)1 << (63 - __builtin_clzll(v));
}

/* [lo, hi) is a node of the tree over [0, n) whose split is at mid. */
static inline int ap_is_split(int64_t lo, int64_t mid, int64_t hi, int64_t n) {
    uint64_t s = (uint64_t)(hi - lo), left = (uint64_t)(mid - lo);
    if (mid <= lo || hi <= mid || (left & (left - 1)) || s > 2 * left) return 0;
    if ((uint64_t)lo & (2 * left - 1)) return 0;
    return s == 2 * left || hi == n;
}

/* Levels above a buffer of h = 2^i partial values (in a; b is scratch of h/2). */
static double ap_levels(double *restrict a, double *restrict b, int64_t h) {
    while (h > 1) {
        h >>= 1;
        for (int64_t i = 0; i < h; i++) b[i] = a[2 * i] + a[2 * i + 1];
        double *t = a;
        a = b;
        b = t;
    }
    return a[0];
}

/* The balanced tree over s = 2^j <= AP_BLOCK terms, level by level; a and b are
 * scratch of AP_BLOCK/2 and AP_BLOCK/4 doubles. Portable C (SSE2 / NEON lanes). */
static double ap_small_c(const double *restrict x, const double *restrict y, int64_t s,
                         double *restrict a, double *restrict b) {
    if (s == 1) return y ? x[0] * y[0] : x[0];
    int64_t h = s >> 1;
    if (y) {
        for (int64_t i = 0; i < h; i++) {
            double p = x[2 * i] * y[2 * i];         /* rounded */
            double q = x[2 * i + 1] * y[2 * i + 1]; /* rounded */
            a[i] = p + q;
        }
    } else {
        for (int64_t i = 0; i < h; i++) a[i] = x[2 * i] + x[2 * i + 1];
    }
    return ap_levels(a, b, h);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AP_HAVE_AVX2 1
/* The same tree with AVX2 lanes (no FMA: the target is avx2 alone, and -ffp-contract=off):
 * the first four levels of each 16 terms in registers, the rest by ap_levels. Every lane
 * operation is one correctly rounded binary64 mul or add of the same two operands as in
 * ap_small_c, so the bits are the same. */
__attribute__((target("avx2"))) static double ap_small_avx2(const double *restrict x,
                                                            const double *restrict y,
                                                            int64_t s, double *restrict a,
                                                            double *restrict b) {
    const int64_t h = s >> 4;
    for (int64_t i = 0; i < h; i++) {
        const double *xi = x + 16 * i;
        __m256d p0 = _mm256_loadu_pd(xi), p1 = _mm256_loadu_pd(xi + 4);
        __m256d p2 = _mm256_loadu_pd(xi + 8), p3 = _mm256_loadu_pd(xi + 12);
        if (y) {
            const double *yi = y + 16 * i;
            p0 = _mm256_mul_pd(p0, _mm256_loadu_pd(yi));
            p1 = _mm256_mul_pd(p1, _mm256_loadu_pd(yi + 4));
            p2 = _mm256_mul_pd(p2, _mm256_loadu_pd(yi + 8));
            p3 = _mm256_mul_pd(p3, _mm256_loadu_pd(yi + 12));
        }
        /* level 1: [t0+t1, t4+t5, t2+t3, t6+t7], i.e. pair sums s0 s2 s1 s3 */
        __m256d u0 = _mm256_add_pd(_mm256_unpacklo_pd(p0, p1), _mm256_unpackhi_pd(p0, p1));
        __m256d u1 = _mm256_add_pd(_mm256_unpacklo_pd(p2, p3), _mm256_unpackhi_pd(p2, p3));
        /* level 2: [s0+s1, s2+s3] = low half + high half */
        __m128d q0 = _mm_add_pd(_mm256_castpd256_pd128(u0), _mm256_extractf128_pd(u0, 1));
        __m128d q1 = _mm_add_pd(_mm256_castpd256_pd128(u1), _mm256_extractf128_pd(u1, 1));
        /* level 3: [q0+q1, q2+q3]; level 4: their sum */
        __m128d r = _mm_add_pd(_mm_unpacklo_pd(q0, q1), _mm_unpackhi_pd(q0, q1));
        a[i] = _mm_cvtsd_f64(_mm_add_sd(r, _mm_unpackhi_pd(r, r)));
    }
    return ap_levels(a, b, h);
}
#endif

typedef double (*ap_small_fn)(const double *restrict, const double *restrict, int64_t,
                              double *restrict, double *restrict);

static ap_small_fn ap_pick(int64_t s, int portable) {
#ifdef AP_HAVE_AVX2
    if (!portable && s >= 16 && __builtin_cpu_supports("avx2")) return ap_small_avx2;
#endif
    (void)s;
    (void)portable;
    return ap_small_c;
}

/* The balanced tree over s = 2^j terms: AP_BLOCK-term blocks combined by a binary carry,
 * which is the balanced tree above them (s / AP_BLOCK is a power of two). */
static double ap_block(const double *x, const double *y, int64_t s, double *a, double *b,
                       int portable) {
    if (s <= AP_BLOCK) return ap_pick(s, portable)(x, y, s, a, b);
    const ap_small_fn small = ap_pick(AP_BLOCK, portable);
    double stack[64];
    int top = 0;
    uint64_t count = 0;
    for (int64_t off = 0; off < s; off += AP_BLOCK) {
        double v = small(x + off, y ? y + off : NULL, AP_BLOCK, a, b);
        count++;
        for (uint64_t c = count; (c & 1) == 0; c >>= 1) v = stack[--top] + v; /* left first */
        stack[top++] = v;
    }
    return stack[0];
}

/* While the last two records are adjacent siblings, replace them by their parent. */
static int64_t ap_carry(int64_t *out, int64_t m, int64_t n, int32_t k) {
    const int64_t w = 2 + (int64_t)k;
    while (m >= 2) {
        int64_t *L = out + (m - 2) * w;
        const int64_t *R = out + (m - 1) * w;
        if (L[1] != R[0] || !ap_is_split(L[0], L[1], R[1], n)) break;
        for (int32_t j = 0; j < k; j++) ap_set(L + 2 + j, ap_get(L + 2 + j) + ap_get(R + 2 + j));
        L[1] = R[1];
        m--;
    }
    return m;
}

int64_t ap_summary(const double *const *xs, const double *const *ys, int32_t k,
                   int64_t offset, int64_t len, int64_t n, int64_t *out, int64_t cap,
                   int32_t *nonfinite) {
    if (nonfinite) *nonfinite = 0;
    if (k < 1 || k > AP_MAX_K || offset < 0 || len < 0 || n < 0 || offset > n ||
        len > n - offset || cap < 0 || (!out && cap) || (len && !xs))
        return AP_ERR_BAD_ARGUMENT;
    for (int32_t j = 0; len && j < k; j++)
        if (!xs[j]) return AP_ERR_BAD_ARGUMENT;
    const int64_t w = 2 + (int64_t)k, end = offset + len;
    double a[AP_BLOCK / 2], b[AP_BLOCK / 4];
    int64_t m = 0;
    for (int64_t pos = offset; pos < end;) {
        uint64_t size = pos ? ((uint64_t)pos & (~(uint64_t)pos + 1)) : ap_floor_pow2((uint64_t)end);
        while (size > (uint64_t)(end - pos)) size >>= 1;
        if (m >= cap) return AP_ERR_OVERFLOW;
        int64_t *r = out + m * w;
        r[0] = pos;
        r[1] = pos + (int64_t)size;
        for (int32_t j = 0; j < k; j++) {
            const double *x = xs[j] + (pos - offset);
            const double *y = (ys && ys[j]) ? ys[j] + (pos - offset) : NULL;
            ap_set(r + 2 + j, ap_block(x, y, (int64_t)size, a, b, 0));
        }
        m = ap_carry(out, m + 1, n, k);
        pos += (int64_t)size;
    }
    if (nonfinite)
        for (int64_t i = 0; i < m; i++)
            for (int32_t j = 0; j < k; j++)
                if (ap_is_nonfinite(ap_get(out + i * w + 2 + j))) *nonfinite = 1;
    return m;
}

int64_t ap_merge(const int64_t *a, int64_t ma, const int64_t *b, int64_t mb, int64_t *out,
                 int64_t cap, int64_t n, int32_t k) {
    if (k < 1 || k > AP_MAX_K || ma < 0 || mb < 0 || cap < 0 || n < 0 || (ma && !a) ||
        (mb && !b) || (!out && cap))
        return AP_ERR_BAD_ARGUMENT;
    const int64_t w = 2 + (int64_t)k;
    int64_t i = 0, j = 0, m = 0;
    while (i < ma || j < mb) {
        const int64_t *r;
        if (j >= mb) {
            r = a + (i++) * w;
        } else if (i >= ma) {
            r = b + (j++) * w;
        } else {
            const int64_t *ra = a + i * w, *rb = b + j * w;
            /* by lo, the larger node first at equal lo (the smaller is then dropped) */
            if (ra[0] < rb[0] || (ra[0] == rb[0] && ra[1] >= rb[1])) {
                r = ra;
                i++;
            } else {
                r = rb;
                j++;
            }
        }
        const int64_t lo = r[0], hi = r[1];
        if (lo < 0 || hi <= lo || hi > n) return AP_ERR_INVALID;
        if (m > 0) {
            const int64_t *top = out + (m - 1) * w;
            if (lo < top[0]) return AP_ERR_INVALID; /* an input was not sorted */
            if (lo < top[1]) {
                if (hi <= top[1]) continue; /* the same node again, or one inside it */
                return AP_ERR_INVALID;      /* partial overlap: not one tree's nodes */
            }
        }
        if (m >= cap) return AP_ERR_OVERFLOW;
        memcpy(out + m * w, r, (size_t)w * sizeof *r);
        m = ap_carry(out, m + 1, n, k);
    }
    return m;
}

int ap_node_value(const double *x, const double *y, int64_t lo, int64_t hi, int64_t n,
                  double *value) {
    if (!value || lo < 0 || hi <= lo || hi > n || !x) return AP_ERR_BAD_ARGUMENT;
    uint64_t s = (uint64_t)(hi - lo), p = ap_floor_pow2(s);
    if (p < s) p <<= 1;
    if (((uint64_t)lo & (p - 1)) || (s != p && hi != n)) return AP_ERR_BAD_ARGUMENT;
    int64_t rec[AP_CAPACITY * 3];
    const double *xs[1] = {x}, *ys[1] = {y};
    int64_t m = ap_summary(xs, ys, 1, lo, hi - lo, n, rec, AP_CAPACITY, NULL);
    if (m != 1 || rec[0] != lo || rec[1] != hi) return AP_ERR_BAD_ARGUMENT;
    *value = ap_get(rec + 2);
    return 0;
}

int ap_block_value(const double *x, const double *y, int64_t s, int32_t portable, double *value) {
    if (!x || !value || s < 1 || (s & (s - 1))) return AP_ERR_BAD_ARGUMENT;
    double a[AP_BLOCK / 2], b[AP_BLOCK / 4];
    *value = ap_block(x, y, s, a, b, portable != 0);
    return 0;
}
