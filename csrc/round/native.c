/*
 * native.c -- see native.h (the engine's run in C over MPI point-to-point).
 *
 * Built by the MPI library's own mpicc at first use (alpha_mpi/execution/native.py); no
 * arithmetic of its own: evaluations, the finiteness checks, merges, CRC32C and the header
 * patch/check are the kernel's, called through the table it hands over (kernel_table.h).
 * Only point-to-point calls: MPI_Start/Isend/Irecv/Improbe/Mrecv/Test on the communicator
 * mpi4py created (MPI_Comm_f2c); no collective, no communicator of its own.
 */
#include "native.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frame.h"
#include "kernel_table.h"
#include "pairwise.h" /* AP_ERR_*, AP_MAX_NDIM */

#define AN_FOLDED (AK_FLAG_NONFINITE | AK_FLAG_REFUSED | AK_FLAG_VOTE) /* what a frame passes on */
#define AN_FLOWING_RATE 100e6 /* bytes/s: the slowest link a payload in flight is polled for (grace) */

typedef struct an_state {
    MPI_Comm comm;
    const ak_table *k;
    MPI_Request *hreq; /* per message: the header (or whole frame) request */
    MPI_Request *preq; /* per message: a split frame's payload request */
    uint8_t *ppersist; /* per message: 1 when preq is persistent (the payload is the engine's) */
    /* where the run is */
    int32_t pc, phase;
    /* the wait in progress */
    int64_t polls;
    double wait_start, slice_start, pause;
    /* Seconds a wait yields before it sleeps: sleep_after, plus the time this rank's largest
     * split payload takes at AN_FLOWING_RATE. Over a network the polls of both ends drive a
     * payload in flight, whichever request they wait for (a rank that slept while payloads
     * flowed halved the bandwidth of two emulated TCP nodes), so a program of large frames
     * yields longer before it sleeps; a slow or dead peer then costs a core that long, not
     * longer (the usual backoff follows). */
    double grace;
    /* the frame being received */
    int32_t hflags, hbad;
    MPI_Message mmsg;
} an_state;

static double an_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void an_log(const an_exec *e, const char *dir, const an_msg *m) {
    fprintf(stderr, "r%d | %s %d %s step %llu %lldB\n", e->rank, dir, m->peer, m->what,
            (unsigned long long)e->step, (long long)(AK_FRAME_HEADER + 8 * m->count));
    fflush(stderr);
}

static inline double *an_ptr(const an_exec *e, an_region r) { return e->bases[r.buf] + r.off; }

/* The payload memory of message m on this rank. */
static inline double *an_payload(const an_exec *e, const an_msg *m) {
    return m->split ? an_ptr(e, m->payload) : (double *)(m->hbuf + AK_FRAME_HEADER);
}

/* ------------------------------------------------------------------ the wait policy */
static void an_wait_reset(an_state *s) {
    s->polls = 0;
    s->wait_start = -1.0;
}

/* After a poll that found nothing: 0 to poll again, else AN_AGAIN (a slice of waiting is
 * over: return to Python, which handles signals, and resume) or AN_TIMEOUT. The policy of
 * waits.py: poll `before_yield` times, then yield the core between polls, after `grace`
 * seconds (sleep_after, longer for large frames: an_state) sleep between polls, 50 us doubling to 1 ms;
 * `spin`: never yield or sleep (the clock is read every 4096 polls). */
static int an_idle(an_exec *e, an_state *s) {
    s->polls++;
    if (s->polls < e->before_yield) return 0;
    if (e->spin && (s->polls & 4095)) return 0;
    double now = an_now();
    if (s->wait_start < 0) {
        s->wait_start = s->slice_start = now;
        s->pause = 50e-6;
    }
    if (now - s->wait_start > e->timeout) return AN_TIMEOUT;
    if (now - s->slice_start > e->slice) {
        s->slice_start = now;
        return AN_AGAIN;
    }
    if (e->spin) return 0;
    if (now - s->wait_start < s->grace) {
        sched_yield();
    } else {
        struct timespec t = {0, (long)(s->pause * 1e9)};
        nanosleep(&t, NULL);
        s->pause = s->pause * 2 < 1e-3 ? s->pause * 2 : 1e-3;
    }
    return 0;
}

/* Poll under the wait policy until request r completes (m NULL) or, probe mode, a message
 * from m's peer with `tag` is matched into s->mmsg: AN_DONE, AN_AGAIN, AN_TIMEOUT or
 * AN_MPI_ERROR. */
static int an_poll(an_exec *e, an_state *s, MPI_Request *r, const an_msg *m, int tag, MPI_Status *st) {
    for (;;) {
        int flag = 0;
        int rc = m ? MPI_Improbe(m->peer, tag, s->comm, &flag, &s->mmsg, st) : MPI_Test(r, &flag, st);
        if (rc != MPI_SUCCESS) {
            e->mpi_error = rc;
            return AN_MPI_ERROR;
        }
        if (flag) {
            an_wait_reset(s);
            return AN_DONE;
        }
        int idle = an_idle(e, s);
        if (idle) return idle;
    }
}

/* Wait for request r. */
static int an_wait(an_exec *e, an_state *s, MPI_Request *r, MPI_Status *st) {
    return an_poll(e, s, r, NULL, 0, st);
}

/* Match the next message from m's peer with `tag` (size-safe receives, probe mode). */
static int an_match(an_exec *e, an_state *s, const an_msg *m, int tag, MPI_Status *st) {
    return an_poll(e, s, NULL, m, tag, st);
}

/* Receive the matched message: into `buf` when it has exactly `want` bytes, else whole into
 * scratch, its first bytes kept in bad_header. *got: its bytes. 1 when it went into buf. */
static int an_take(an_exec *e, an_state *s, MPI_Status *st, void *buf, int64_t want, MPI_Datatype type,
                   int64_t *got) {
    MPI_Count n = 0;
    int rc = MPI_Get_elements_x(st, MPI_BYTE, &n);
    if (rc != MPI_SUCCESS) {
        e->mpi_error = rc;
        return -1;
    }
    *got = (int64_t)n;
    if (n == want) {
        int count = type == MPI_BYTE ? (int)want : (int)(want / 8);
        rc = MPI_Mrecv(buf, count, type, &s->mmsg, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            e->mpi_error = rc;
            return -1;
        }
        return 1;
    }
    uint8_t *scratch = malloc(n > 0 ? (size_t)n : 1);
    if (!scratch) {
        e->mpi_error = MPI_ERR_NO_MEM;
        return -1;
    }
#if MPI_VERSION >= 4
    rc = MPI_Mrecv_c(scratch, n, MPI_BYTE, &s->mmsg, MPI_STATUS_IGNORE);
#else
    rc = n <= INT_MAX ? MPI_Mrecv(scratch, (int)n, MPI_BYTE, &s->mmsg, MPI_STATUS_IGNORE) : MPI_ERR_COUNT;
#endif
    if (rc == MPI_SUCCESS) memcpy(e->bad_header, scratch, n < 128 ? (size_t)n : 128);
    free(scratch);
    if (rc != MPI_SUCCESS) {
        e->mpi_error = rc;
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ ops */
/* Start message i's requests: the header's (persistent), and a split frame's payload's
 * (persistent where the payload is the engine's, else Isend/Irecv on the caller's memory). */
static int an_start(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->msgs[i];
    int rc = MPI_Start(&s->hreq[i]);
    if (rc == MPI_SUCCESS && m->split) {
        if (s->ppersist[i])
            rc = MPI_Start(&s->preq[i]);
        else if (m->sending)
            rc = MPI_Isend(an_ptr(e, m->payload), (int)m->count, MPI_DOUBLE, m->peer, m->tag + 1, s->comm,
                           &s->preq[i]);
        else
            rc = MPI_Irecv(an_ptr(e, m->payload), (int)m->count, MPI_DOUBLE, m->peer, m->tag + 1, s->comm,
                           &s->preq[i]);
    }
    if (rc != MPI_SUCCESS) {
        e->mpi_error = rc;
        e->at_msg = i;
        return AN_MPI_ERROR;
    }
    return AN_DONE;
}

static int an_post(an_exec *e, an_state *s, int32_t i) {
    if (e->probe) return AN_DONE; /* nothing is posted: the wait matches the frame first */
    return an_start(e, s, i);
}

static int an_send(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->msgs[i];
    if (s->phase == 0) {
        uint32_t pcrc = 0;
        int32_t flags = e->flags;
        if (e->check_payload && m->count) {
            pcrc = s->k->crc32c(0, an_payload(e, m), (size_t)(8 * m->count));
            flags |= AK_FLAG_PAYLOAD_CRC;
        }
        /* from the template: the buffer may have held a received header */
        s->k->frame_patch(m->hbuf, m->expect, e->step, flags, e->refused, e->code, pcrc);
        if (e->hook) {
            s->phase = 1;
            e->at_msg = i;
            return AN_HOOK;
        }
    }
    int r = an_start(e, s, i);
    if (r == AN_DONE && e->debug) an_log(e, "send ->", m);
    return r;
}

static int an_done(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->msgs[i];
    int r;
    e->at_msg = i;
    if (s->phase == 0) {
        e->at_payload = 0;
        r = an_wait(e, s, &s->hreq[i], MPI_STATUS_IGNORE);
        if (r != AN_DONE) return r;
        s->phase = 1;
    }
    if (m->split) {
        e->at_payload = 1;
        r = an_wait(e, s, &s->preq[i], MPI_STATUS_IGNORE);
        if (r != AN_DONE) return r;
    }
    return AN_DONE;
}

/* W: phase 0 the header (or whole frame), phase 1 a split frame's payload, then the verdict. */
static int an_recv(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->msgs[i];
    MPI_Status st;
    int r;
    e->at_msg = i;
    if (s->phase == 0) {
        e->at_payload = 0;
        s->hbad = 0;
        if (e->probe) {
            r = an_match(e, s, m, m->tag, &st);
            if (r != AN_DONE) return r;
            int64_t got = 0;
            int into = an_take(e, s, &st, m->hbuf, m->hbytes, MPI_BYTE, &got);
            if (into < 0) return AN_MPI_ERROR;
            e->bad_got = got;
            if (!into) s->hbad = AN_BAD_SIZE;
        } else {
            r = an_wait(e, s, &s->hreq[i], &st);
            if (r != AN_DONE) return r;
            int got = 0, rc = MPI_Get_count(&st, MPI_BYTE, &got);
            if (rc != MPI_SUCCESS) {
                e->mpi_error = rc;
                return AN_MPI_ERROR;
            }
            e->bad_got = got;
            if (got != m->hbytes) {
                s->hbad = AN_BAD_SIZE;
                memcpy(e->bad_header, m->hbuf, got < 128 ? (size_t)(got > 0 ? got : 0) : 128);
            }
        }
        if (!s->hbad) {
            s->hflags = s->k->frame_check(m->hbuf, m->expect, e->step);
            if (s->hflags < 0) s->hbad = AN_BAD_HEADER;
        }
        s->phase = 1;
        if (m->split && s->hbad == AN_BAD_SIZE && !e->probe) {
            /* the peer is not sending this frame (another program): no payload is coming */
            int rc = MPI_Cancel(&s->preq[i]);
            if (rc == MPI_SUCCESS) rc = MPI_Wait(&s->preq[i], MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) {
                e->mpi_error = rc;
                return AN_MPI_ERROR;
            }
        }
    }
    if (s->phase == 1 && m->split && s->hbad != AN_BAD_SIZE) {
        e->at_payload = 1;
        double *pay = an_ptr(e, m->payload);
        if (e->probe) {
            r = an_match(e, s, m, m->tag + 1, &st);
            if (r != AN_DONE) return r;
            int64_t got = 0;
            int into = an_take(e, s, &st, pay, 8 * m->count, MPI_DOUBLE, &got);
            if (into < 0) return AN_MPI_ERROR;
            e->bad_pgot = got;
            if (!into && !s->hbad) s->hbad = AN_BAD_PAYLOAD_SIZE;
        } else {
            r = an_wait(e, s, &s->preq[i], &st);
            if (r != AN_DONE) return r;
            int got = 0, rc = MPI_Get_count(&st, MPI_DOUBLE, &got);
            if (rc != MPI_SUCCESS) {
                e->mpi_error = rc;
                return AN_MPI_ERROR;
            }
            e->bad_pgot = 8 * (int64_t)got;
            if (got != m->count && !s->hbad) s->hbad = AN_BAD_PAYLOAD_SIZE;
        }
        s->phase = 2;
    }
    int32_t f = s->hflags;
    if (!s->hbad && (f & AK_FLAG_PAYLOAD_CRC) && m->count) {
        uint32_t want;
        memcpy(&want, m->hbuf + AK_FRAME_PCRC_OFF, 4);
        if (s->k->crc32c(0, an_payload(e, m), (size_t)(8 * m->count)) != want) s->hbad = AN_BAD_CRC;
    }
    if (s->hbad) {
        /* refused here: zeros in place of its payload (no arithmetic reads it), flagged on */
        if (m->count) memset(an_payload(e, m), 0, (size_t)(8 * m->count));
        e->flags |= AK_FLAG_REFUSED;
        e->bad_kind = s->hbad;
        return AN_BAD_FRAME;
    }
    if (f & AK_FLAG_REFUSED) {
        /* the first refusal seen is named; a flag-round frame's names the lowest refusing rank
         * its sender knows, so that every rank ends the flag rounds naming the same one */
        uint32_t who;
        memcpy(&who, m->hbuf + AK_FRAME_REFUSED_OFF, 4);
        int32_t r = (int32_t)who - 1;
        if (e->refused < 0 || (m->merge_min && r >= 0 && r < e->refused)) {
            e->refused = r;
            memcpy(e->code, m->hbuf + AK_FRAME_CODE_OFF, 4);
        }
    }
    e->flags |= f & AN_FOLDED;
    if (e->debug) an_log(e, "recv <-", m);
    return AN_DONE;
}

static int an_evaluate(an_exec *e, an_state *s, const an_eval *ev) {
    for (int32_t j = 0; j < ev->nin; j++) ev->ptrs[j] = an_ptr(e, ev->inputs[j]);
    double *out = an_ptr(e, ev->out);
    int status;
    if (ev->finite) {
        int32_t nf = 0;
        status = s->k->tree_eval_finite(out, ev->ptrs, (size_t)ev->nin, (size_t)ev->count, ev->prog,
                                        (size_t)ev->plen, &nf);
        if (nf) e->flags |= AK_FLAG_NONFINITE;
    } else {
        status = s->k->tree_eval(out, ev->ptrs, (size_t)ev->nin, (size_t)ev->count, ev->prog, (size_t)ev->plen);
    }
    if (status) {
        e->kernel_status = status;
        return AN_KERNEL_ERROR;
    }
    return AN_DONE;
}

/* M: the union of two node summaries into a third (engine_ops.py says what the flags mean). */
static void an_merge_op(an_exec *e, an_state *s, const an_merge *mg) {
    int64_t *ah = (int64_t *)an_ptr(e, mg->a_head), *bh = (int64_t *)an_ptr(e, mg->b_head);
    int64_t *oh = (int64_t *)an_ptr(e, mg->out_head);
    int64_t n = *(int64_t *)an_ptr(e, mg->n_word), cap = mg->capacity, am = ah[0], bm = bh[0], m;
    if (0 <= am && am <= cap && 0 <= bm && bm <= cap)
        m = s->k->merge((const int64_t *)an_ptr(e, mg->a_nodes), am, (const int64_t *)an_ptr(e, mg->b_nodes), bm,
                        (int64_t *)an_ptr(e, mg->out_nodes), cap, n, mg->k);
    else
        m = AP_ERR_INVALID;
    int64_t flags = ah[1] | (bh[1] & (AN_MERGE_OVERFLOW | AN_MERGE_INVALID));
    if (m < 0) {
        flags |= m == AP_ERR_OVERFLOW ? AN_MERGE_OVERFLOW : AN_MERGE_INVALID;
        m = 0;
    }
    oh[0] = m;
    oh[1] = flags;
}

/* A: the arrays' summary (native.h an_summary). */
static int an_summary_op(an_exec *e, an_state *s, const an_summary *sm) {
    const int64_t *g = (const int64_t *)e->bases[sm->geometry];
    if (!g) return AN_DONE; /* the caller wrote this run's summary itself */
    const double *const *xs = (const double *const *)&e->bases[sm->x0];
    const double *const *ys = sm->y0 == AN_NO_BUFFER ? NULL : (const double *const *)&e->bases[sm->y0];
    int64_t *nodes = (int64_t *)an_ptr(e, sm->nodes), *row = (int64_t *)an_ptr(e, sm->row);
    int64_t *res = (int64_t *)an_ptr(e, sm->result), m, n = 0, room = 0;
    int32_t nonfinite = 0;
    if (!sm->tiles) {
        n = g[2];
        m = s->k->summary(xs, ys, sm->k, g[0], g[1], n, nodes, sm->capacity, &nonfinite);
    } else {
        int32_t d = (int32_t)g[1];
        if (d < 1 || d > AP_MAX_NDIM) {
            m = AP_ERR_BAD_ARGUMENT;
        } else {
            const int64_t *shape = g + 2;
            n = g[0];
            m = s->k->summary_tile(xs, ys, sm->k, d, shape, shape + d, shape + 2 * d, shape + 3 * d, nodes,
                                   sm->capacity, sm->scratch, &nonfinite, &room);
        }
    }
    res[0] = m;
    res[1] = nonfinite;
    if (m < 0 || nonfinite) return AN_STOP;
    if (!sm->tiles) {
        row[0] = g[0];
        row[1] = g[1];
        row[2] = n;
        row[3] = 0;
    } else {
        int32_t d = (int32_t)g[1], arrays = sm->y0 == AN_NO_BUFFER ? sm->k : 2 * sm->k;
        row[0] = 0;
        row[1] = m;
        row[2] = room;
        memcpy(row + 3, g + 2 + 3 * d + (int64_t)arrays * d, (size_t)(8 * (sm->row_words - 3)));
    }
    int64_t *head = (int64_t *)an_ptr(e, sm->head);
    head[0] = m;
    head[1] = 0;
    *(int64_t *)an_ptr(e, sm->n_word) = n;
    return AN_DONE;
}

/* R: the arrays' root check (native.h an_root). */
static void an_root_op(an_exec *e, an_state *s, const an_root *r) {
    int64_t *verdict = (int64_t *)an_ptr(e, r->verdict);
    const int64_t *valid = (const int64_t *)an_ptr(e, r->valid), *f = (const int64_t *)an_ptr(e, r->final);
    int64_t n = *(const int64_t *)an_ptr(e, r->n_word);
    double *values = an_ptr(e, r->values);
    *verdict = 1;
    if (e->flags || valid[0] != 1 || memcmp(an_ptr(e, r->table), valid + 1, (size_t)(8 * r->table_words)))
        return;
    if (f[1]) return; /* the merges' flags */
    if (f[0] == 1 && f[2] == 0 && f[3] == n)
        memcpy(values, f + 4, (size_t)(8 * r->k));
    else if (n == 0 && f[0] == 0)
        memset(values, 0, (size_t)(8 * r->k));
    else
        return;
    if (s->k->first_nonfinite(values, (size_t)r->k) >= 0) return;
    *verdict = 0;
}

static int an_loop(an_exec *e) {
    an_state *s = e->state;
    while (s->pc < e->nops) {
        const an_op *op = &e->ops[s->pc];
        int r = AN_DONE;
        switch (op->kind) {
        case AN_OP_POST:
            r = an_post(e, s, op->index);
            break;
        case AN_OP_SEND:
            r = an_send(e, s, op->index);
            break;
        case AN_OP_WAIT:
            r = an_recv(e, s, op->index);
            break;
        case AN_OP_DONE:
            r = an_done(e, s, op->index);
            break;
        case AN_OP_EVAL:
            r = an_evaluate(e, s, &e->evals[op->index]);
            break;
        case AN_OP_COPY: {
            const an_copy *c = &e->copies[op->index];
            memmove(an_ptr(e, c->dst), an_ptr(e, c->src), (size_t)(8 * c->count));
            break;
        }
        case AN_OP_CHECK: {
            const an_check *c = &e->checks[op->index];
            if (s->k->first_nonfinite(an_ptr(e, c->at), (size_t)c->count) >= 0) e->flags |= AK_FLAG_NONFINITE;
            break;
        }
        case AN_OP_MERGE:
            an_merge_op(e, s, &e->merges[op->index]);
            break;
        case AN_OP_SUMMARY:
            r = an_summary_op(e, s, &e->summaries[op->index]);
            break;
        case AN_OP_ROOT:
            an_root_op(e, s, &e->roots[op->index]);
            break;
        default:
            e->kernel_status = -1;
            return AN_KERNEL_ERROR;
        }
        if (r == AN_DONE || r == AN_BAD_FRAME) {
            s->pc++;
            s->phase = 0;
        }
        if (r != AN_DONE) return r;
    }
    if (e->deliver_to && !(e->flags & (AK_FLAG_REFUSED | AK_FLAG_NONFINITE)) && !e->delivered) {
        memcpy(e->deliver_to, an_ptr(e, e->deliver_from), (size_t)(8 * e->deliver_count));
        e->delivered = 1;
    }
    return AN_DONE;
}

/* ------------------------------------------------------------------ life cycle */
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
    e->refused = -1;
    return e;
}

int an_prepare(an_exec *e, int32_t fcomm) {
    an_state *s = e->state;
    s->comm = MPI_Comm_f2c((MPI_Fint)fcomm);
    int64_t largest = 0;
    for (int32_t i = 0; i < e->nmsgs; i++)
        if (e->msgs[i].split && e->msgs[i].count > largest) largest = e->msgs[i].count;
    s->grace = e->sleep_after + (double)(8 * largest) / AN_FLOWING_RATE;
    int n = e->nmsgs > 0 ? e->nmsgs : 1;
    s->hreq = malloc(n * sizeof *s->hreq);
    s->preq = malloc(n * sizeof *s->preq);
    s->ppersist = calloc((size_t)n, 1);
    if (!s->hreq || !s->preq || !s->ppersist) return MPI_ERR_NO_MEM;
    for (int i = 0; i < e->nmsgs; i++) s->hreq[i] = s->preq[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < e->nmsgs; i++) {
        const an_msg *m = &e->msgs[i];
        if (m->hbytes > INT_MAX || m->count > INT_MAX) return MPI_ERR_COUNT;
        int rc = MPI_SUCCESS, statik = m->split && m->payload.buf >= e->first_static;
        if (m->sending) {
            rc = MPI_Send_init(m->hbuf, (int)m->hbytes, MPI_BYTE, m->peer, m->tag, s->comm, &s->hreq[i]);
            if (rc == MPI_SUCCESS && statik)
                rc = MPI_Send_init(an_ptr(e, m->payload), (int)m->count, MPI_DOUBLE, m->peer, m->tag + 1, s->comm,
                                   &s->preq[i]);
        } else if (!e->probe) {
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
    e->step = step;
    e->timeout = timeout;
    e->flags = flags;
    e->refused = refused;
    memcpy(e->code, &code, 4);
    e->bad_kind = 0;
    e->delivered = 0;
    s->pc = s->phase = 0;
    an_wait_reset(s);
    return an_loop(e);
}

int an_resume(an_exec *e) { return an_loop(e); }

/* 1 while request r may still be in flight: a request whose status MPI cannot tell counts as
 * in flight (its memory is then never freed under it). */
static int an_active(MPI_Request *r) {
    if (*r == MPI_REQUEST_NULL) return 0;
    int flag = 0;
    if (MPI_Request_get_status(*r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
    return !flag;
}

int an_cancel_receives(an_exec *e) {
    an_state *s = e->state;
    int first = MPI_SUCCESS;
    if (!s || !s->hreq) return first;
    for (int i = 0; i < e->nmsgs; i++) {
        if (e->msgs[i].sending) continue;
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

int an_pending_sends(an_exec *e) {
    an_state *s = e->state;
    int pending = 0;
    if (!s || !s->hreq) return 0;
    for (int i = 0; i < e->nmsgs; i++)
        if (e->msgs[i].sending) pending += an_active(&s->hreq[i]) + an_active(&s->preq[i]);
    return pending;
}

int an_free(an_exec *e) {
    int first = MPI_SUCCESS;
    if (!e) return first;
    an_state *s = e->state;
    if (s && s->hreq) {
        first = an_cancel_receives(e); /* never free a posted receive: MPI would write into freed memory */
        for (int i = 0; i < e->nmsgs; i++) {
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
