/*
 * entry.c -- the round's ABI (see native.h): an executor's life cycle (an_new, an_prepare with
 * its persistent requests, an_run and an_resume, the cancels and frees of a failure or an end)
 * and what the loader asks (the library's version, its error strings, the kernel table's
 * size). Built by the MPI library's own mpicc at first use (alpha_mpi/execution/native.py).
 */
#define AN_ROUND_SOURCES
#include "native.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

an_exec *an_new(const void *kernel) {
    an_exec *e = calloc(1, sizeof *e);
    an_state *s = calloc(1, sizeof *s);
    if (!e || !s || !kernel) {
        free(e);
        free(s);
        return NULL;
    }
    s->comm = MPI_COMM_NULL;
    s->k = kernel;
    an_wait_reset(s);
    e->state = s;
    e->run.refused = -1;
    return e;
}

int an_prepare(an_exec *e, int32_t fcomm) {
    an_state *s = e->state;
    s->comm = MPI_Comm_f2c((MPI_Fint)fcomm);
    int64_t largest = 0;
    for (int32_t i = 0; i < e->program.nmsgs; i++)
        if (e->program.msgs[i].split && e->program.msgs[i].count > largest) largest = e->program.msgs[i].count;
    s->grace = e->policy.sleep_after + (double)(8 * largest) / AN_FLOWING_RATE;
    int n = e->program.nmsgs > 0 ? e->program.nmsgs : 1;
    s->hreq = malloc(n * sizeof *s->hreq);
    s->preq = malloc(n * sizeof *s->preq);
    s->ppersist = calloc((size_t)n, 1);
    if (!s->hreq || !s->preq || !s->ppersist) return MPI_ERR_NO_MEM;
    for (int i = 0; i < e->program.nmsgs; i++) s->hreq[i] = s->preq[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < e->program.nmsgs; i++) {
        const an_msg *m = &e->program.msgs[i];
        if (m->hbytes > INT_MAX || m->count > INT_MAX) return MPI_ERR_COUNT;
        int rc = MPI_SUCCESS, statik = m->split && m->payload.buf >= e->program.first_static;
        if (m->sending) {
            rc = MPI_Send_init(m->hbuf, (int)m->hbytes, MPI_BYTE, m->peer, m->tag, s->comm, &s->hreq[i]);
            if (rc == MPI_SUCCESS && statik)
                rc = MPI_Send_init(an_ptr(e, m->payload), (int)m->count, MPI_DOUBLE, m->peer, m->tag + 1, s->comm,
                                   &s->preq[i]);
        } else if (!e->program.probe) {
            rc = MPI_Recv_init(m->hbuf, (int)m->hbytes, MPI_BYTE, m->peer, m->tag, s->comm, &s->hreq[i]);
            if (rc == MPI_SUCCESS && statik)
                rc = MPI_Recv_init(an_ptr(e, m->payload), (int)m->count, MPI_DOUBLE, m->peer, m->tag + 1, s->comm,
                                   &s->preq[i]);
        }
        if (rc != MPI_SUCCESS) return rc;
        s->ppersist[i] = (uint8_t)statik;
    }
    return MPI_SUCCESS;
}

int an_run(an_exec *e, uint64_t step, double timeout, int32_t flags, int32_t refused, uint32_t code) {
    an_state *s = e->state;
    e->run.step = step;
    e->run.timeout = timeout;
    e->run.flags = flags;
    e->run.refused = refused;
    memcpy(e->run.code, &code, 4);
    e->run.bad_kind = 0;
    e->run.delivered = 0;
    s->pc = s->phase = 0;
    s->cancelled = NULL;
    an_wait_reset(s);
    return an_loop(e);
}

int an_resume(an_exec *e) { return an_loop(e); }

int an_cancel_receives(an_exec *e) {
    an_state *s = e->state;
    int first = MPI_SUCCESS;
    if (!s || !s->hreq) return first;
    for (int i = 0; i < e->program.nmsgs; i++) {
        if (e->program.msgs[i].sending) continue;
        MPI_Request *rs[2] = {&s->hreq[i], &s->preq[i]};
        for (int j = 0; j < 2; j++)
            if (an_active(rs[j])) {
                int rc = MPI_Cancel(rs[j]);
                if (rc == MPI_SUCCESS) rc = MPI_Wait(rs[j], MPI_STATUS_IGNORE); /* a cancelled receive completes locally */
                if (rc != MPI_SUCCESS && first == MPI_SUCCESS) first = rc;
            }
    }
    return first;
}

int an_cancel_awaited(an_exec *e) {
    an_state *s = e->state;
    int32_t i = e->run.at_msg;
    if (!s || !s->hreq || e->program.probe || i < 0 || i >= e->program.nmsgs || e->program.msgs[i].sending)
        return MPI_SUCCESS;
    /* the request the run waits for: started, maybe matched, maybe complete (a cancel then
     * has no effect: it completes as usual) */
    MPI_Request *r = e->run.at_payload ? &s->preq[i] : &s->hreq[i];
    if (s->cancelled == r || *r == MPI_REQUEST_NULL) return MPI_SUCCESS;
    int rc = MPI_Cancel(r);
    if (rc == MPI_SUCCESS) s->cancelled = r;
    return rc;
}

int an_pending_sends(an_exec *e) {
    an_state *s = e->state;
    int pending = 0;
    if (!s || !s->hreq) return 0;
    for (int i = 0; i < e->program.nmsgs; i++)
        if (e->program.msgs[i].sending) pending += an_active(&s->hreq[i]) + an_active(&s->preq[i]);
    return pending;
}

int an_free(an_exec *e) {
    int first = MPI_SUCCESS;
    if (!e) return first;
    an_state *s = e->state;
    if (s && s->hreq) {
        first = an_cancel_receives(e); /* never free a posted receive: MPI would write into freed memory */
        for (int i = 0; i < e->program.nmsgs; i++) {
            int rc = MPI_SUCCESS;
            if (s->hreq[i] != MPI_REQUEST_NULL) rc = MPI_Request_free(&s->hreq[i]);
            if (rc == MPI_SUCCESS && s->preq[i] != MPI_REQUEST_NULL) rc = MPI_Request_free(&s->preq[i]);
            if (rc != MPI_SUCCESS && first == MPI_SUCCESS) first = rc;
        }
    }
    if (s) {
        free(s->hreq);
        free(s->preq);
        free(s->ppersist);
        free(s);
    }
    free(e);
    return first;
}

int an_library_version(char *buf, int32_t len) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    int rc = MPI_Get_library_version(v, &n);
    if (rc != MPI_SUCCESS) return rc;
    if (len > 0) {
        int k = n < len - 1 ? n : len - 1;
        memcpy(buf, v, (size_t)k);
        buf[k] = 0;
    }
    return MPI_SUCCESS;
}

int an_error_string(int32_t code, char *buf, int32_t len, int32_t *cls) {
    char v[MPI_MAX_ERROR_STRING];
    int n = 0, c = 0;
    MPI_Error_class(code, &c);
    *cls = c;
    int rc = MPI_Error_string(code, v, &n);
    if (rc != MPI_SUCCESS) n = snprintf(v, sizeof v, "MPI error %d", code);
    if (len > 0) {
        int k = n < len - 1 ? n : len - 1;
        memcpy(buf, v, (size_t)k);
        buf[k] = 0;
    }
    return MPI_SUCCESS;
}

int32_t an_err_truncate(void) { return MPI_ERR_TRUNCATE; }

int64_t an_kernel_table_size(void) { return (int64_t)sizeof(ak_table); }
