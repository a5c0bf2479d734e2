/* Prototype (a): the round in C driven from Python. Python starts and waits the persistent
 * mpi4py requests; one call per round checks the received frame, evaluates, checks finiteness
 * and patches the next outgoing header (here, the p = 2 butterfly: one round, so pr_pack writes
 * the first outgoing frame and pr_round finishes). No MPI here. */
#include "proto_common.h"

typedef struct {
    uint8_t *sframe, *rframe;   /* framed: header + payload; split: header only */
    double *spay, *rpay;        /* payloads (split: rpay separate, spay = x itself) */
    const uint8_t *stmpl, *rexpect;
    size_t n;
    int me_left, split;
    uint64_t step;
} pr_round;

int pr_pack(pr_round *r, const double *x) {
    if (!r->split) memcpy(r->spay, x, r->n * 8);
    ph_patch(r->sframe, r->stmpl, r->step, 0);
    return 0;
}

int pr_round_finish(pr_round *r, const double *x, double *out) {
    int f = ph_check(r->rframe, r->rexpect, r->step);
    uint64_t step = r->step++;
    (void)step;
    if (f < 0) return -1;
    const double *l = r->me_left ? x : r->rpay, *rr = r->me_left ? r->rpay : x;
    return ph_add_finite(out, l, rr, r->n) | f;
}
