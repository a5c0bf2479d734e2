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
/* Two levels over four vectors of four consecutive partial values each: lane i of the result
 * is ((v0 + v1) + (v2 + v3)) of the i-th vector's lanes, so the result's lanes are again four
 * consecutive subtrees, one level of 4^k above the inputs. Every add is the tree's own add
 * (its left operand first), so the bits are ap_small_c's. */
__attribute__((target("avx2"))) static inline __m256d ap_quad(__m256d a, __m256d b, __m256d c,
                                                             __m256d d) {
    const __m256d ab = _mm256_add_pd(_mm256_unpacklo_pd(a, b), _mm256_unpackhi_pd(a, b));
    const __m256d cd = _mm256_add_pd(_mm256_unpacklo_pd(c, d), _mm256_unpackhi_pd(c, d));
    return _mm256_add_pd(_mm256_permute2f128_pd(ab, cd, 0x20), _mm256_permute2f128_pd(ab, cd, 0x31));
}

__attribute__((target("avx2"))) static inline __m256d ap_terms4(const double *x, const double *y) {
    const __m256d v = _mm256_loadu_pd(x);
    return y ? _mm256_mul_pd(v, _mm256_loadu_pd(y)) : v;
}

/* The same tree for s >= 64 terms with the lanes holding neighbouring subtrees (no horizontal
 * step until four values are left): 64 terms become one vector of four 16-term sums in
 * registers, stored in a (s / 16 doubles, which AP_BLOCK / 2 holds); four such vectors become
 * one of four 64-term sums in place, and so on; the last one or two vectors by ap_levels. The
 * horizontal form above costs a shuffle chain per 16 terms and a scalar level per pair. */
__attribute__((target("avx2"))) static double ap_wide_avx2(const double *restrict x,
                                                          const double *restrict y, int64_t s,
                                                          double *restrict a,
                                                          double *restrict b) {
    int64_t count = s >> 6; /* vectors of 16-term sums */
    for (int64_t i = 0; i < count; i++) {
        const double *xi = x + 64 * i, *yi = y ? y + 64 * i : NULL;
        __m256d q[4];
        for (int g = 0; g < 4; g++) {
            const int64_t o = 16 * g;
            q[g] = ap_quad(ap_terms4(xi + o, yi ? yi + o : NULL),
                           ap_terms4(xi + o + 4, yi ? yi + o + 4 : NULL),
                           ap_terms4(xi + o + 8, yi ? yi + o + 8 : NULL),
                           ap_terms4(xi + o + 12, yi ? yi + o + 12 : NULL));
        }
        _mm256_storeu_pd(a + 4 * i, ap_quad(q[0], q[1], q[2], q[3]));
    }
    for (; count >= 4; count >>= 2)
        for (int64_t i = 0; i < count / 4; i++) {
            const double *ai = a + 16 * i;
            _mm256_storeu_pd(a + 4 * i, ap_quad(_mm256_loadu_pd(ai), _mm256_loadu_pd(ai + 4),
                                                _mm256_loadu_pd(ai + 8), _mm256_loadu_pd(ai + 12)));
        }
    return ap_levels(a, b, 4 * count);
}
#endif

typedef double (*ap_small_fn)(const double *restrict, const double *restrict, int64_t,
                              double *restrict, double *restrict);

static ap_small_fn ap_pick(int64_t s, int portable) {
#ifdef AP_HAVE_AVX2
    if (!portable && s >= 16 && __builtin_cpu_supports("avx2"))
        return s >= 64 ? ap_wide_avx2 : ap_small_avx2;
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

/* The record at L and the node [lo, hi) right after it are siblings: [L[0], hi) is a node
 * split at L[1] = lo (ap_is_split, cheapest test first: a right sibling has its left's
 * size unless it ends the tree). */
static inline int ap_joins(const int64_t *L, int64_t lo, int64_t hi, int64_t n) {
    const uint64_t left = (uint64_t)(L[1] - L[0]), right = (uint64_t)(hi - lo);
    if (L[1] != lo || (right != left && (hi != n || right > left))) return 0;
    return left && right && !(left & (left - 1)) && !((uint64_t)L[0] & (2 * left - 1));
}

/* While the last two records are adjacent siblings, replace them by their parent. */
static int64_t ap_carry(int64_t *out, int64_t m, int64_t n, int32_t k) {
    const int64_t w = 2 + (int64_t)k;
    while (m >= 2) {
        int64_t *L = out + (m - 2) * w;
        const int64_t *R = L + w;
        if (!ap_joins(L, R[0], R[1], n)) break;
        for (int32_t j = 0; j < k; j++) ap_set(L + 2 + j, ap_get(L + 2 + j) + ap_get(R + 2 + j));
        L[1] = R[1];
        m--;
    }
    return m;
}

/* The block decomposition of a run: the largest aligned power of two at pos inside [pos, end). */
static inline uint64_t ap_block_size(int64_t pos, int64_t end) {
    const uint64_t fits = ap_floor_pow2((uint64_t)(end - pos)); /* both powers of two: the */
    const uint64_t aligned = (uint64_t)pos & (~(uint64_t)pos + 1); /* smaller divides pos */
    return pos && aligned < fits ? aligned : fits;
}

/* Append the records of the global run [lo, lo + len) to the m records in out, carrying:
 * xs[j] (ys[j]) point at the run's first term. Returns the new count or AP_ERR_OVERFLOW.
 * *room (if given) rises to the most records out held at once (a block is written before
 * it joins its left sibling). */
static int64_t ap_run(const double *const *xs, const double *const *ys, int32_t k, int64_t lo,
                      int64_t len, int64_t n, int64_t *out, int64_t m, int64_t cap, double *a,
                      double *b, int64_t *room) {
    const int64_t w = 2 + (int64_t)k, end = lo + len;
    for (int64_t pos = lo; pos < end;) {
        const uint64_t size = ap_block_size(pos, end);
        if (m >= cap) return AP_ERR_OVERFLOW;
        if (room && m + 1 > *room) *room = m + 1;
        int64_t *r = out + m * w;
        r[0] = pos;
        r[1] = pos + (int64_t)size;
        for (int32_t j = 0; j < k; j++) {
            const double *x = xs[j] + (pos - lo);
            const double *y = (ys && ys[j]) ? ys[j] + (pos - lo) : NULL;
            ap_set(r + 2 + j, ap_block(x, y, (int64_t)size, a, b, 0));
        }
        m = ap_carry(out, m + 1, n, k);
        pos += (int64_t)size;
    }
    return m;
}

static void ap_flag_nonfinite(const int64_t *out, int64_t m, int32_t k, int32_t *nonfinite) {
    const int64_t w = 2 + (int64_t)k;
    for (int64_t i = 0; i < m; i++)
        for (int32_t j = 0; j < k; j++)
            if (ap_is_nonfinite(ap_get(out + i * w + 2 + j))) *nonfinite = 1;
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
    double a[AP_BLOCK / 2], b[AP_BLOCK / 4];
    const int64_t m = ap_run(xs, ys, k, offset, len, n, out, 0, cap, a, b, NULL);
    if (m > 0 && nonfinite) ap_flag_nonfinite(out, m, k, nonfinite);
    return m;
}

/* A tile's geometry, checked, and its row segments: dimensions after c are covered whole
 * (and, when strides are given, contiguous in memory), so a segment is len = extent[c] * g[c]
 * terms, one per index of the dimensions before c. */
typedef struct {
    int64_t n, g[AP_MAX_NDIM], len, idx[AP_MAX_NDIM];
    int64_t lo, at; /* the current segment's first global index, and its place in memory
                       along the first row of strides (ap_tile_next keeps both) */
    const int64_t *s0;
    int32_t ndim, c;
    int empty;
} ap_tile;

static int ap_tile_init(ap_tile *t, int32_t ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *extent, const int64_t *strides, int32_t arrays) {
    if (ndim < 1 || ndim > AP_MAX_NDIM || !shape || !offset || !extent) return 0;
    int64_t n = 1;
    t->empty = 0;
    t->ndim = ndim;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0 || offset[d] < 0 || extent[d] < 0 || offset[d] > shape[d] ||
            extent[d] > shape[d] - offset[d])
            return 0;
        t->g[d] = n;
        if (shape[d] && n > ((int64_t)1 << 62) / shape[d]) return 0;
        n *= shape[d];
        if (!extent[d]) t->empty = 1;
        t->idx[d] = 0;
    }
    t->n = n;
    /* Join dimension c to the segment while it is covered whole and, for every array, the
     * dimension before it steps over exactly what is joined (or holds one element). */
    int32_t c = ndim - 1;
    int64_t inner = extent[c];
    while (c > 0 && extent[c] == shape[c]) {
        int contiguous = 1;
        for (int32_t a = 0; strides && a < arrays; a++)
            if (extent[c - 1] != 1 && strides[(int64_t)a * ndim + c - 1] != inner) contiguous = 0;
        if (!contiguous) break;
        c--;
        inner *= extent[c];
    }
    t->c = c;
    t->len = extent[c] * t->g[c];
    t->lo = 0;
    for (int32_t d = 0; d <= c; d++) t->lo += offset[d] * t->g[d];
    t->at = 0;
    t->s0 = arrays ? strides : NULL;
    return 1;
}

/* The current segment's first term in an array of element strides s (one row of ndim). */
static inline int64_t ap_tile_at(const ap_tile *t, const int64_t *s) {
    int64_t at = 0;
    for (int32_t d = 0; d < t->c; d++) at += t->idx[d] * s[d];
    return at;
}

/* On to the next segment (C order); 0 after the last. */
static inline int ap_tile_next(ap_tile *t, const int64_t *extent) {
    for (int32_t d = t->c - 1; d >= 0; d--) {
        const int64_t step = t->s0 ? t->s0[d] : 0;
        if (++t->idx[d] < extent[d]) {
            t->lo += t->g[d];
            t->at += step;
            return 1;
        }
        t->idx[d] = 0;
        t->lo -= (extent[d] - 1) * t->g[d];
        t->at -= (extent[d] - 1) * step;
    }
    return 0;
}

int64_t ap_summary_tile(const double *const *xs, const double *const *ys, int32_t k,
                        int32_t ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *extent, const int64_t *strides, int64_t *out,
                        int64_t cap, const double **scratch, int32_t *nonfinite, int64_t *room) {
    ap_tile t;
    if (nonfinite) *nonfinite = 0;
    if (room) *room = 0;
    const int32_t arrays = ys ? 2 * k : k;
    if (k < 1 || k > AP_MAX_K || cap < 0 || (!out && cap) || (!strides && ndim > 0) ||
        !ap_tile_init(&t, ndim, shape, offset, extent, strides, arrays))
        return AP_ERR_BAD_ARGUMENT;
    if (t.empty) return 0;
    if (!xs || !scratch) return AP_ERR_BAD_ARGUMENT;
    for (int32_t a = 0; a < arrays; a++)
        if ((a < k && !xs[a]) || strides[(int64_t)a * ndim + ndim - 1] != 1) return AP_ERR_BAD_ARGUMENT;
    /* Arrays laid out alike (the usual case: x and y of one shape and strides) share one
     * offset per segment. */
    int same = 1;
    for (int32_t a = 1; a < arrays; a++)
        for (int32_t d = 0; d < t.c; d++)
            if (strides[(int64_t)a * ndim + d] != strides[d]) same = 0;
    const double **sx = scratch, **sy = ys ? scratch + k : NULL;
    double a[AP_BLOCK / 2], b[AP_BLOCK / 4];
    int64_t m = 0;
    do {
        const int64_t at = t.at;
        for (int32_t j = 0; j < k; j++) {
            sx[j] = xs[j] + (same ? at : ap_tile_at(&t, strides + (int64_t)j * ndim));
            if (sy && ys[j]) sy[j] = ys[j] + (same ? at : ap_tile_at(&t, strides + (int64_t)(k + j) * ndim));
            else if (sy) sy[j] = NULL;
        }
        m = ap_run(sx, sy, k, t.lo, t.len, t.n, out, m, cap, a, b, room);
        if (m < 0) return m;
    } while (ap_tile_next(&t, extent));
    if (m > 0 && nonfinite) ap_flag_nonfinite(out, m, k, nonfinite);
    return m;
}

int64_t ap_tile_records(int32_t ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *extent, const int64_t *strides, int32_t arrays,
                        int64_t *room) {
    ap_tile t;
    if (room) *room = 0;
    if (arrays < 0 || (arrays && !strides) ||
        !ap_tile_init(&t, ndim, shape, offset, extent, strides, arrays))
        return AP_ERR_BAD_ARGUMENT;
    if (t.empty) return 0;
    /* ap_summary_tile's walk on ranges alone: the records of the current global run on a
     * stack (its maximal nodes so far, at most 2 * 63 + 1, and one block on top before it
     * joins), the earlier runs' records counted (they never join anything again). */
    int64_t los[2 * 64 + 2], his[2 * 64 + 2], m = 0, frozen = 0, peak = 0;
    do {
        const int64_t lo = t.lo, end = lo + t.len;
        for (int64_t pos = lo; pos < end;) {
            const int64_t size = (int64_t)ap_block_size(pos, end);
            if (m && his[m - 1] != pos) {
                frozen += m;
                m = 0;
            }
            los[m] = pos;
            his[m++] = pos + size;
            if (frozen + m > peak) peak = frozen + m;
            while (m >= 2 && his[m - 2] == los[m - 1] &&
                   ap_is_split(los[m - 2], his[m - 2], his[m - 1], t.n)) {
                his[m - 2] = his[m - 1];
                m--;
            }
            pos += size;
        }
    } while (ap_tile_next(&t, extent));
    if (room) *room = peak;
    return frozen + m;
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
        if (m > 0) { /* r the right sibling of the top: their parent in place (as ap_carry) */
            int64_t *L = out + (m - 1) * w;
            if (ap_joins(L, lo, hi, n)) {
                for (int32_t v = 0; v < k; v++) ap_set(L + 2 + v, ap_get(L + 2 + v) + ap_get(r + 2 + v));
                L[1] = hi;
                m = ap_carry(out, m, n, k);
                continue;
            }
        }
        if (m >= cap) return AP_ERR_OVERFLOW;
        int64_t *dst = out + m * w;
        if (k == 1) { /* the usual record: three words, no call */
            dst[0] = lo;
            dst[1] = hi;
            dst[2] = r[2];
        } else {
            memcpy(dst, r, (size_t)w * sizeof *r);
        }
        m = m + 1;
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
