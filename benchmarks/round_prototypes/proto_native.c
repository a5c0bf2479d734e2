/* Prototype (b): the whole program in C calling MPI point-to-point on the communicator mpi4py
 * made (MPI_Comm_f2c), built by the MPI's own mpicc. p = 2 butterfly: pack, start both, poll
 * with the idle policy's spin count, check, evaluate with the finiteness check. */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include "proto_common.h"

typedef struct pn_exec {
    MPI_Comm comm;
    MPI_Request req[4];
    int nreq;
    uint8_t *sframe, *rframe;
    double *spay, *rpay;
    const uint8_t *stmpl, *rexpect;
    size_t n;
    int me_left, split, before_yield;
    uint64_t step;
} pn_exec;

pn_exec *pn_new(int fcomm, int peer, int tag, uint8_t *sframe, uint8_t *rframe, double *spay, double *rpay,
                const uint8_t *stmpl, const uint8_t *rexpect, size_t n, int me_left, int split) {
    pn_exec *e = calloc(1, sizeof *e);
    e->comm = MPI_Comm_f2c(fcomm);
    e->sframe = sframe; e->rframe = rframe; e->spay = spay; e->rpay = rpay;
    e->stmpl = stmpl; e->rexpect = rexpect; e->n = n; e->me_left = me_left; e->split = split;
    e->before_yield = 200;
    if (!split) {
        int nb = PH_HEADER + (int)(8 * n);
        MPI_Recv_init(rframe, nb, MPI_BYTE, peer, tag, e->comm, &e->req[0]);
        MPI_Send_init(sframe, nb, MPI_BYTE, peer, tag, e->comm, &e->req[1]);
        e->nreq = 2;
    } else {
        MPI_Recv_init(rframe, PH_HEADER, MPI_BYTE, peer, tag, e->comm, &e->req[0]);
        MPI_Recv_init(rpay, (int)(8 * n), MPI_BYTE, peer, tag + 1, e->comm, &e->req[1]);
        MPI_Send_init(sframe, PH_HEADER, MPI_BYTE, peer, tag, e->comm, &e->req[2]);
        MPI_Send_init(spay, (int)(8 * n), MPI_BYTE, peer, tag + 1, e->comm, &e->req[3]);
        e->nreq = 4;
    }
    return e;
}

static int pn_wait(pn_exec *e) {
    int done = 0, polls = 0;
    for (;;) {
        MPI_Testall(e->nreq, e->req, &done, MPI_STATUSES_IGNORE);
        if (done) return 0;
        if (++polls >= e->before_yield) sched_yield();
    }
}

int pn_run(pn_exec *e, const double *x, double *out) {
    if (!e->split) memcpy(e->spay, x, e->n * 8);
    ph_patch(e->sframe, e->stmpl, e->step, 0);
    MPI_Startall(e->nreq, e->req);
    pn_wait(e);
    int f = ph_check(e->rframe, e->rexpect, e->step);
    e->step++;
    if (f < 0) return -1;
    const double *l = e->me_left ? x : e->rpay, *r = e->me_left ? e->rpay : x;
    return ph_add_finite(out, l, r, e->n) | f;
}

void pn_free(pn_exec *e) {
    for (int i = 0; i < e->nreq; i++) MPI_Request_free(&e->req[i]);
    free(e);
}
