/*
 * interpreter.c -- the round's op loop (see native.h): one rank's Program, op by op. It knows
 * ops, not front ends (Open MPI's libnbc is the model: one schedule grammar, one interpreter):
 * the message ops are frames.c's; the ops that compute call the kernel through its table
 * (kernel_table.h) -- evaluations with their finiteness check, copies, checks, the merges of
 * node summaries, the arrays' summary and root check -- and no MPI.
 */
#define AN_ROUND_SOURCES
#include "native.h"

#include <string.h>

#include "pairwise.h" /* AP_ERR_*, AP_MAX_NDIM */

static int an_evaluate(an_exec *e, an_state *s, const an_eval *ev) {
    for (int32_t j = 0; j < ev->nin; j++) ev->ptrs[j] = an_ptr(e, ev->inputs[j]);
    double *out = an_ptr(e, ev->out);
    int status;
    if (ev->finite) {
        int32_t nf = 0;
        status = s->k->tree_eval_finite(out, ev->ptrs, (size_t)ev->nin, (size_t)ev->count, ev->prog,
                                        (size_t)ev->plen, &nf);
        if (nf) e->run.flags |= AK_FLAG_NONFINITE;
    } else {
        status = s->k->tree_eval(out, ev->ptrs, (size_t)ev->nin, (size_t)ev->count, ev->prog, (size_t)ev->plen);
    }
    if (status) {
        e->run.kernel_status = status;
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
    const int64_t *g = (const int64_t *)e->program.bases[sm->geometry];
    if (!g) return AN_DONE; /* the caller wrote this run's summary itself */
    const double *const *xs = (const double *const *)&e->program.bases[sm->x0];
    const double *const *ys = sm->y0 == AN_NO_BUFFER ? NULL : (const double *const *)&e->program.bases[sm->y0];
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
    if (e->run.flags || valid[0] != 1 || memcmp(an_ptr(e, r->table), valid + 1, (size_t)(8 * r->table_words)))
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

int an_loop(an_exec *e) {
    an_state *s = e->state;
    while (s->pc < e->program.nops) {
        const an_op *op = &e->program.ops[s->pc];
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
            r = an_evaluate(e, s, &e->program.evals[op->index]);
            break;
        case AN_OP_COPY: {
            const an_copy *c = &e->program.copies[op->index];
            memmove(an_ptr(e, c->dst), an_ptr(e, c->src), (size_t)(8 * c->count));
            break;
        }
        case AN_OP_CHECK: {
            const an_check *c = &e->program.checks[op->index];
            if (s->k->first_nonfinite(an_ptr(e, c->at), (size_t)c->count) >= 0) e->run.flags |= AK_FLAG_NONFINITE;
            break;
        }
        case AN_OP_MERGE:
            an_merge_op(e, s, &e->program.merges[op->index]);
            break;
        case AN_OP_SUMMARY:
            r = an_summary_op(e, s, &e->program.summaries[op->index]);
            break;
        case AN_OP_ROOT:
            an_root_op(e, s, &e->program.roots[op->index]);
            break;
        default:
            e->run.kernel_status = -1;
            return AN_KERNEL_ERROR;
        }
        if (r == AN_DONE || r == AN_BAD_FRAME) {
            s->pc++;
            s->phase = 0;
        }
        if (r != AN_DONE) return r;
    }
    if (e->run.deliver_to && !(e->run.flags & (AK_FLAG_REFUSED | AK_FLAG_NONFINITE)) && !e->run.delivered) {
        memcpy(e->run.deliver_to, an_ptr(e, e->program.deliver_from), (size_t)(8 * e->program.deliver_count));
        e->run.delivered = 1;
    }
    return AN_DONE;
}

