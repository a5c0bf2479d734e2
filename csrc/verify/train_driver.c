/*
 * train_driver.c -- instruction-set conformance of whole training steps of the embedded model
 * (issue 32 item 4; DESIGN.md "Instruction sets", "The same bits on every machine").
 *
 * Built from the kernel's own sources (alpha_kernel.c, dense.c) with the kernel's flags
 * (alpha_mpi/kernel/build.py BASE_CFLAGS), once for x86-64 and once for AArch64 (run under
 * qemu-user), by alpha_mpi_verify/isa.py. It reads a training case that the product wrote on
 * x86-64 (the initial parameters and every slot's samples, as `alpha-mpi train` cuts them),
 * runs the steps exactly as the product's learner does, and writes the final state. The
 * Python side compares it with the state the product's learner reached on x86-64.
 *
 * One step, as alpha_mpi.learning (learner.py, mlp.py, optim.py) computes it:
 *   per slot s: the MLP's forward and backward pass (mlp.py MLP.loss_and_grad_sum, the same
 *     kernel calls in the same order) into the payload [sum of gradients (n), samples, loss, 0];
 *   the payloads combined by the pairwise tree over slots ([lo, hi) split at
 *     lo + 2^floor(log2(hi - lo - 1)), left operand first; ak_add, element by element);
 *   g = numerator / samples (one division per element);
 *   Adam (ak_adam, csrc/kernel/alpha_kernel.h's order) with b1t, b2t carried: b1t = b1 at step 1,
 *     then b1t *= b1 after each step (optim.py); or, for a case of magic "AKTRAIN2", AdamW
 *     (ak_adamw, the ADAMW EVALUATION ORDER: decoupled weight decay wd, optim.py AdamW).
 * The steps run once per ISA path this CPU offers (ak_isa_select); every path must give the
 * first path's bits (the output counts the paths that do not).
 *
 * Input (little endian):  "AKTRAIN1" (Adam) or "AKTRAIN2" (AdamW), int64 d, h, c, slots, steps,
 *   double lr, b1, b2, eps, with AKTRAIN2 double wd, then double params[n] (n = d*h + h + h*c + c:
 *   W1, b1, W2, b2), then per step and slot: int64 k, double X[k*d], int64 y[k].
 * Output: a section file (conformance_io.h): "fpenv_flags", "params", "adam_m", "adam_v"
 *   (n doubles, the first path's), "losses" (the mean loss of each step, as train_step returns
 *   it), "paths_differ" (how many paths gave other bits than the first); and on stderr the
 *   line "train_driver: S steps on P ISA paths, D differ".
 *
 * usage: train_driver IN_FILE OUT_FILE
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alpha_kernel.h"
#include "conformance_io.h" /* also: little endian only */
#include "dense.h"

static void die(const char *what) {
    fprintf(stderr, "train_driver: %s\n", what);
    exit(4);
}

static void *alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory");
    return p;
}

static void check(int st, const char *what) {
    if (st != AK_OK) {
        fprintf(stderr, "train_driver: %s returned status %d\n", what, st);
        exit(4);
    }
}

static void read_exact(FILE *f, void *p, size_t bytes) {
    if (bytes && fread(p, 1, bytes, f) != bytes) die("truncated case file");
}

static int64_t read_i64(FILE *f) {
    int64_t v;
    read_exact(f, &v, 8);
    return v;
}

static double read_f64(FILE *f) {
    double v;
    read_exact(f, &v, 8);
    return v;
}

typedef struct {
    int64_t d, h, c, slots, steps;
    double lr, b1, b2, eps;
    int adamw;            /* AKTRAIN2: AdamW with decoupled weight decay wd */
    double wd;
    size_t n;             /* parameters */
    double *params0;      /* initial parameters */
    int64_t *k;           /* [steps * slots] samples of each slot */
    double **X;           /* [steps * slots] -> k * d */
    int64_t **y;          /* [steps * slots] -> k */
} Case;

static void read_case(const char *path, Case *cs) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the case file");
    char magic[8];
    read_exact(f, magic, 8);
    if (memcmp(magic, "AKTRAIN1", 8) != 0 && memcmp(magic, "AKTRAIN2", 8) != 0)
        die("not a training case (magic)");
    cs->adamw = memcmp(magic, "AKTRAIN2", 8) == 0;
    cs->d = read_i64(f);
    cs->h = read_i64(f);
    cs->c = read_i64(f);
    cs->slots = read_i64(f);
    cs->steps = read_i64(f);
    cs->lr = read_f64(f);
    cs->b1 = read_f64(f);
    cs->b2 = read_f64(f);
    cs->eps = read_f64(f);
    cs->wd = cs->adamw ? read_f64(f) : 0.0;
    if (cs->d < 1 || cs->h < 1 || cs->c < 1 || cs->slots < 1 || cs->steps < 0 || cs->d > 1 << 20 ||
        cs->h > 1 << 20 || cs->c > 1 << 16 || cs->slots > 1 << 16 || cs->steps > 1 << 20)
        die("case dimensions out of range");
    cs->n = (size_t)(cs->d * cs->h + cs->h + cs->h * cs->c + cs->c);
    cs->params0 = alloc(cs->n * 8);
    read_exact(f, cs->params0, cs->n * 8);
    size_t cells = (size_t)(cs->steps * cs->slots);
    cs->k = alloc(cells * 8);
    cs->X = alloc(cells * sizeof(double *));
    cs->y = alloc(cells * sizeof(int64_t *));
    for (size_t i = 0; i < cells; i++) {
        int64_t k = read_i64(f);
        if (k < 1 || k > 1 << 20) die("slot size out of range");
        cs->k[i] = k;
        cs->X[i] = alloc((size_t)(k * cs->d) * 8);
        read_exact(f, cs->X[i], (size_t)(k * cs->d) * 8);
        cs->y[i] = alloc((size_t)k * 8);
        read_exact(f, cs->y[i], (size_t)k * 8);
    }
    fclose(f);
}

/* mlp.py MLP.loss_and_grad_sum: the same kernel calls, in the same order, into grad; the loss. */
static double slot_gradient(const Case *cs, const double *p, const double *X, const int64_t *y,
                            size_t k, double *grad, double *z1, double *a1, double *logits) {
    const size_t d = (size_t)cs->d, h = (size_t)cs->h, c = (size_t)cs->c;
    const double *W1 = p, *b1 = p + d * h, *W2 = b1 + h, *b2 = W2 + h * c;
    double *gW1 = grad, *gb1 = grad + d * h, *gW2 = gb1 + h, *gb2 = gW2 + h * c;
    double loss = 0.0;
    int64_t bad = -1;
    check(ak_matmul(z1, X, W1, b1, k, d, h), "matmul X W1");
    check(ak_relu(a1, z1, k * h), "relu");
    check(ak_matmul(logits, a1, W2, b2, k, h, c), "matmul a1 W2");
    check(ak_softmax_xent(logits, &loss, logits, y, k, c, &bad), "softmax_xent");
    check(ak_matmul_tn(gW2, a1, logits, NULL, h, k, c), "matmul_tn a1 d");
    check(ak_col_sum(gb2, logits, k, c), "col_sum d");
    check(ak_matmul_nt(a1, logits, W2, NULL, k, c, h), "matmul_nt d W2"); /* da1 in a1's buffer */
    check(ak_relu_backward(a1, a1, z1, k * h), "relu_backward");
    check(ak_matmul_tn(gW1, X, a1, NULL, d, k, h), "matmul_tn X da1");
    check(ak_col_sum(gb1, a1, k, h), "col_sum da1");
    return loss;
}

/* The pairwise tree over slots [lo, hi) into out (words each): the learners' default order. */
static void pairwise(double *out, double *const *payload, int64_t lo, int64_t hi, size_t words) {
    if (hi - lo == 1) {
        memcpy(out, payload[lo], words * 8);
        return;
    }
    int64_t left = 1;
    while (left * 2 < hi - lo) left *= 2; /* 2^floor(log2(hi - lo - 1)) */
    double *l = alloc(words * 8), *r = alloc(words * 8);
    pairwise(l, payload, lo, lo + left, words);
    pairwise(r, payload, lo + left, hi, words);
    check(ak_add(out, l, r, words), "ak_add");
    free(l);
    free(r);
}

typedef struct {
    double *p, *m, *v, *losses;
} State;

static void train(const Case *cs, State *st) {
    const size_t n = cs->n, words = n + 3, S = (size_t)cs->slots;
    size_t kmax = 1;
    for (int64_t i = 0; i < cs->steps * cs->slots; i++)
        if ((size_t)cs->k[i] > kmax) kmax = (size_t)cs->k[i];
    double **payload = alloc(S * sizeof(double *));
    for (size_t s = 0; s < S; s++) payload[s] = alloc(words * 8);
    double *reduced = alloc(words * 8), *g = alloc(n * 8);
    double *pn = alloc(n * 8), *mn = alloc(n * 8), *vn = alloc(n * 8);
    double *z1 = alloc(kmax * (size_t)cs->h * 8), *a1 = alloc(kmax * (size_t)cs->h * 8);
    double *logits = alloc(kmax * (size_t)cs->c * 8);
    memcpy(st->p, cs->params0, n * 8);
    memset(st->m, 0, n * 8);
    memset(st->v, 0, n * 8);
    double b1t = cs->b1, b2t = cs->b2; /* optim.py Adam: b^t for the next step t = steps + 1 */
    for (int64_t t = 0; t < cs->steps; t++) {
        for (size_t s = 0; s < S; s++) {
            const size_t cell = (size_t)t * S + s, k = (size_t)cs->k[cell];
            double *buf = payload[s];
            buf[n + 1] = slot_gradient(cs, st->p, cs->X[cell], cs->y[cell], k, buf, z1, a1, logits);
            buf[n] = (double)k;
            buf[n + 2] = 0.0; /* the stop word */
        }
        pairwise(reduced, payload, 0, (int64_t)S, words);
        const double mass = reduced[n];
        for (size_t i = 0; i < n; i++) g[i] = reduced[i] / mass; /* learner.py: num / mass */
        int64_t bad_index = -1;
        int bad_which = -1;
        if (cs->adamw)
            check(ak_adamw(st->p, st->m, st->v, g, pn, mn, vn, n, cs->lr, cs->b1, cs->b2, cs->eps, b1t,
                           b2t, cs->wd, 0, &bad_index, &bad_which),
                  "ak_adamw");
        else
            check(ak_adam(st->p, st->m, st->v, g, pn, mn, vn, n, cs->lr, cs->b1, cs->b2, cs->eps, b1t,
                          b2t, 0, &bad_index, &bad_which),
                  "ak_adam");
        memcpy(st->p, pn, n * 8);
        memcpy(st->m, mn, n * 8);
        memcpy(st->v, vn, n * 8);
        b1t *= cs->b1;
        b2t *= cs->b2;
        st->losses[t] = reduced[n + 1] / mass;
    }
    for (size_t s = 0; s < S; s++) free(payload[s]);
    free(payload);
    free(reduced), free(g), free(pn), free(mn), free(vn), free(z1), free(a1), free(logits);
}

static FILE *out_file;

static void section(const char *name, const void *data, uint64_t count, uint64_t elem) {
    conformance_section(out_file, name, data, count, elem);
}

static State new_state(const Case *cs) {
    State st = {alloc(cs->n * 8), alloc(cs->n * 8), alloc(cs->n * 8), alloc((size_t)cs->steps * 8 + 8)};
    return st;
}

static int same(const State *a, const State *b, const Case *cs) {
    const size_t n = cs->n * 8;
    return !memcmp(a->p, b->p, n) && !memcmp(a->m, b->m, n) && !memcmp(a->v, b->v, n) &&
           !memcmp(a->losses, b->losses, (size_t)cs->steps * 8);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN_FILE OUT_FILE\n", argv[0]);
        return 2;
    }
    Case cs;
    read_case(argv[1], &cs);
    State first = new_state(&cs), other = new_state(&cs);
    int64_t paths = 0, differ = 0;
    for (int32_t path = 0; path < AK_ISA_COUNT; path++) {
        if (!ak_isa_available(path)) continue;
        check(ak_isa_select(path), "ak_isa_select");
        State *st = paths == 0 ? &first : &other;
        train(&cs, st);
        if (paths > 0 && !same(&first, &other, &cs)) {
            differ++;
            fprintf(stderr, "train_driver: path %s differs from the first path\n", ak_isa_name(path));
        }
        paths++;
    }
    out_file = conformance_open(argv[2]);
    if (!out_file) die("cannot open the output file");
    uint32_t raw = 0;
    int64_t env = ak_fpenv_check(&raw);
    section("fpenv_flags", &env, 1, 8);
    section("params", first.p, cs.n, 8);
    section("adam_m", first.m, cs.n, 8);
    section("adam_v", first.v, cs.n, 8);
    section("losses", first.losses, (uint64_t)cs.steps, 8);
    section("paths_differ", &differ, 1, 8);
    if (fclose(out_file) != 0) return 3;
    fprintf(stderr, "train_driver: %lld steps on %lld ISA paths, %lld differ\n", (long long)cs.steps,
            (long long)paths, (long long)differ);
    return 0;
}
