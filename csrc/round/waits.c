/*
 * waits.c -- the round's waits (see native.h): the wait policy of waits.py in C, and the time
 * bounds (a slice of waiting returns to Python; the per-wait bound ends the run).
 */
#define AN_ROUND_SOURCES
#include "native.h"

#include <sched.h>
#include <time.h>

static double an_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void an_wait_reset(an_state *s) {
    s->polls = 0;
    s->wait_start = -1.0;
}

/* After a poll that found nothing: 0 to poll again, else AN_AGAIN (a slice of waiting is
 * over: return to Python, which handles signals, and resume) or AN_TIMEOUT. The policy of
 * waits.py: poll `before_yield` times, then yield the core between polls, after `grace`
 * seconds (sleep_after, longer for large frames: an_state) sleep between polls, 50 us doubling
 * to 1 ms; `spin`: never yield or sleep (the clock is read every 4096 polls). */
static int an_idle(const an_exec *e, an_state *s) {
    const an_policy *pol = &e->policy;
    s->polls++;
    if (s->polls < pol->before_yield) return 0;
    if (pol->spin && (s->polls & 4095)) return 0;
    double now = an_now();
    if (s->wait_start < 0) {
        s->wait_start = s->slice_start = now;
        s->pause = 50e-6;
    }
    if (now - s->wait_start > e->run.timeout) return AN_TIMEOUT;
    if (now - s->slice_start > pol->slice) {
        s->slice_start = now;
        return AN_AGAIN;
    }
    if (pol->spin) return 0;
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
            e->run.mpi_error = rc;
            return AN_MPI_ERROR;
        }
        if (flag) {
            an_wait_reset(s);
            if (r && r == s->cancelled) {
                int unmatched = 0;
                s->cancelled = NULL;
                rc = MPI_Test_cancelled(st, &unmatched);
                if (rc != MPI_SUCCESS) {
                    e->run.mpi_error = rc;
                    return AN_MPI_ERROR;
                }
                if (unmatched) return AN_UNMATCHED;
            }
            return AN_DONE;
        }
        int idle = an_idle(e, s);
        if (idle) return idle;
    }
}

int an_wait(an_exec *e, an_state *s, MPI_Request *r, MPI_Status *st) { return an_poll(e, s, r, NULL, 0, st); }

/* Match the next message from m's peer with `tag` (size-safe receives, probe mode). */
int an_match(an_exec *e, an_state *s, const an_msg *m, int tag, MPI_Status *st) {
    return an_poll(e, s, NULL, m, tag, st);
}

/* A request whose status MPI cannot tell counts as in flight (its memory is then never freed
 * under it). */
int an_active(MPI_Request *r) {
    if (*r == MPI_REQUEST_NULL) return 0;
    int flag = 0;
    if (MPI_Request_get_status(*r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
    return !flag;
}
