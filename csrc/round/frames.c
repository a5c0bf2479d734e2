/*
 * frames.c -- the round's message ops (see native.h): P posts a receive (posted mode only), S
 * patches the frame's header from its template and starts the send, W matches, receives and
 * checks a frame (its size before it is received, in probe mode: no MPI writes past a buffer),
 * D waits for a send's completion. The header patch and check and CRC32C are the kernel's.
 */
#define AN_ROUND_SOURCES
#include "native.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void an_log(const an_exec *e, const char *dir, const an_msg *m) {
    fprintf(stderr, "r%d | %s %d %s step %llu %lldB\n", e->program.rank, dir, m->peer, m->what,
            (unsigned long long)e->run.step, (long long)(AK_FRAME_HEADER + 8 * m->count));
    fflush(stderr);
}

/* The payload memory of message m on this rank. */
static inline double *an_payload(const an_exec *e, const an_msg *m) {
    return m->split ? an_ptr(e, m->payload) : (double *)(m->hbuf + AK_FRAME_HEADER);
}

/* Receive the matched message: into `buf` when it has exactly `want` bytes, else whole into
 * scratch, its first bytes kept in bad_header. *got: its bytes. 1 when it went into buf. */
static int an_take(an_exec *e, an_state *s, MPI_Status *st, void *buf, int64_t want, MPI_Datatype type,
                   int64_t *got) {
    MPI_Count n = 0;
    int rc = MPI_Get_elements_x(st, MPI_BYTE, &n);
    if (rc != MPI_SUCCESS) {
        e->run.mpi_error = rc;
        return -1;
    }
    *got = (int64_t)n;
    if (n == want) {
        int count = type == MPI_BYTE ? (int)want : (int)(want / 8);
        rc = MPI_Mrecv(buf, count, type, &s->mmsg, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            e->run.mpi_error = rc;
            return -1;
        }
        return 1;
    }
    uint8_t *scratch = malloc(n > 0 ? (size_t)n : 1);
    if (!scratch) {
        e->run.mpi_error = MPI_ERR_NO_MEM;
        return -1;
    }
#if MPI_VERSION >= 4
    rc = MPI_Mrecv_c(scratch, n, MPI_BYTE, &s->mmsg, MPI_STATUS_IGNORE);
#else
    rc = n <= INT_MAX ? MPI_Mrecv(scratch, (int)n, MPI_BYTE, &s->mmsg, MPI_STATUS_IGNORE) : MPI_ERR_COUNT;
#endif
    if (rc == MPI_SUCCESS) memcpy(e->run.bad_header, scratch, n < 128 ? (size_t)n : 128);
    free(scratch);
    if (rc != MPI_SUCCESS) {
        e->run.mpi_error = rc;
        return -1;
    }
    return 0;
}

/* Start message i's requests: the header's (persistent), and a split frame's payload's
 * (persistent where the payload is the engine's, else Isend/Irecv on the caller's memory). */
static int an_start(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->program.msgs[i];
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
        e->run.mpi_error = rc;
        e->run.at_msg = i;
        return AN_MPI_ERROR;
    }
    return AN_DONE;
}

int an_post(an_exec *e, an_state *s, int32_t i) {
    if (e->program.probe) return AN_DONE; /* nothing is posted: the wait matches the frame first */
    return an_start(e, s, i);
}

int an_send(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->program.msgs[i];
    if (s->phase == 0) {
        uint32_t pcrc = 0;
        int32_t flags = e->run.flags;
        if (e->program.check_payload && m->count) {
            pcrc = s->k->crc32c(0, an_payload(e, m), (size_t)(8 * m->count));
            flags |= AK_FLAG_PAYLOAD_CRC;
        }
        /* from the template: the buffer may have held a received header */
        s->k->frame_patch(m->hbuf, m->expect, e->run.step, flags, e->run.refused, e->run.code, pcrc);
        if (e->policy.hook) {
            s->phase = 1;
            e->run.at_msg = i;
            return AN_HOOK;
        }
    }
    int r = an_start(e, s, i);
    if (r == AN_DONE && e->policy.debug) an_log(e, "send ->", m);
    return r;
}

int an_done(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->program.msgs[i];
    int r;
    e->run.at_msg = i;
    if (s->phase == 0) {
        e->run.at_payload = 0;
        r = an_wait(e, s, &s->hreq[i], MPI_STATUS_IGNORE);
        if (r != AN_DONE) return r;
        s->phase = 1;
    }
    if (m->split) {
        e->run.at_payload = 1;
        r = an_wait(e, s, &s->preq[i], MPI_STATUS_IGNORE);
        if (r != AN_DONE) return r;
    }
    return AN_DONE;
}

/* W: phase 0 the header (or whole frame), phase 1 a split frame's payload, then the verdict. */
int an_recv(an_exec *e, an_state *s, int32_t i) {
    const an_msg *m = &e->program.msgs[i];
    MPI_Status st;
    int r;
    e->run.at_msg = i;
    if (s->phase == 0) {
        e->run.at_payload = 0;
        s->hbad = 0;
        if (e->program.probe) {
            r = an_match(e, s, m, m->tag, &st);
            if (r != AN_DONE) return r;
            int64_t got = 0;
            int into = an_take(e, s, &st, m->hbuf, m->hbytes, MPI_BYTE, &got);
            if (into < 0) return AN_MPI_ERROR;
            e->run.bad_got = got;
            if (!into) s->hbad = AN_BAD_SIZE;
        } else {
            r = an_wait(e, s, &s->hreq[i], &st);
            if (r != AN_DONE) return r;
            int got = 0, rc = MPI_Get_count(&st, MPI_BYTE, &got);
            if (rc != MPI_SUCCESS) {
                e->run.mpi_error = rc;
                return AN_MPI_ERROR;
            }
            e->run.bad_got = got;
            if (got != m->hbytes) {
                s->hbad = AN_BAD_SIZE;
                memcpy(e->run.bad_header, m->hbuf, got < 128 ? (size_t)(got > 0 ? got : 0) : 128);
            }
        }
        if (!s->hbad) {
            s->hflags = s->k->frame_check(m->hbuf, m->expect, e->run.step);
            if (s->hflags < 0) s->hbad = AN_BAD_HEADER;
        }
        s->phase = 1;
        if (m->split && s->hbad == AN_BAD_SIZE && !e->program.probe) {
            /* the peer is not sending this frame (another program): no payload is coming */
            int rc = MPI_Cancel(&s->preq[i]);
            if (rc == MPI_SUCCESS) rc = MPI_Wait(&s->preq[i], MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) {
                e->run.mpi_error = rc;
                return AN_MPI_ERROR;
            }
        }
    }
    if (s->phase == 1 && m->split && s->hbad != AN_BAD_SIZE) {
        e->run.at_payload = 1;
        double *pay = an_ptr(e, m->payload);
        if (e->program.probe) {
            r = an_match(e, s, m, m->tag + 1, &st);
            if (r != AN_DONE) return r;
            int64_t got = 0;
            int into = an_take(e, s, &st, pay, 8 * m->count, MPI_DOUBLE, &got);
            if (into < 0) return AN_MPI_ERROR;
            e->run.bad_pgot = got;
            if (!into && !s->hbad) s->hbad = AN_BAD_PAYLOAD_SIZE;
        } else {
            r = an_wait(e, s, &s->preq[i], &st);
            if (r != AN_DONE) return r;
            int got = 0, rc = MPI_Get_count(&st, MPI_DOUBLE, &got);
            if (rc != MPI_SUCCESS) {
                e->run.mpi_error = rc;
                return AN_MPI_ERROR;
            }
            e->run.bad_pgot = 8 * (int64_t)got;
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
        e->run.flags |= AK_FLAG_REFUSED;
        e->run.bad_kind = s->hbad;
        return AN_BAD_FRAME;
    }
    if (f & AK_FLAG_REFUSED) {
        /* the first refusal seen is named; a flag-round frame's names the lowest refusing rank
         * its sender knows, so that every rank ends the flag rounds naming the same one */
        uint32_t who;
        memcpy(&who, m->hbuf + AK_FRAME_REFUSED_OFF, 4);
        int32_t r = (int32_t)who - 1;
        if (e->run.refused < 0 || (m->merge_min && r >= 0 && r < e->run.refused)) {
            e->run.refused = r;
            memcpy(e->run.code, m->hbuf + AK_FRAME_CODE_OFF, 4);
        }
    }
    e->run.flags |= f & AN_FOLDED;
    if (e->policy.debug) an_log(e, "recv <-", m);
    return AN_DONE;
}

