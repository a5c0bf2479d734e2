/*
 * native.h -- the engine's run in C: one rank's Program, interpreted op by op, calling MPI
 * point-to-point on the communicator mpi4py made (layer 4, alpha_mpi/execution/native.py
 * builds it with the MPI library's own mpicc and loads it; engine.py is its only caller).
 *
 * Python compiles the Program once (engine_build.py) into the records below and keeps their
 * memory. An executor (an_exec) is three parts: the program (immutable once prepared), the
 * wait policy and the run's state; C keeps the MPI requests and where a run is in `state` (no
 * MPI type appears here outside the AN_ROUND_SOURCES part at the end, so this header is also
 * the cffi declaration). A run is `an_run` then `an_resume` until AN_DONE: the
 * loop returns to Python only
 *   - AN_AGAIN  after `slice` seconds of waiting (so signals and KeyboardInterrupt are handled
 *               there; nothing is lost, call an_resume),
 *   - AN_HOOK   before starting a send whose header is written, when `hook` is set (the
 *               fault-injection send_hook of tests and alpha_mpi_verify; then an_resume),
 *   - AN_BAD_FRAME after a received frame failed its check (bad_* say how; its payload is
 *               zeros now and the refused flag set; Python names it, then an_resume),
 *   - AN_UNMATCHED when the receive an_cancel_awaited cancelled had never been matched (the
 *               peer is in another run: Python names it; the run cannot go on),
 *   - AN_TIMEOUT, AN_MPI_ERROR, AN_KERNEL_ERROR: the run cannot go on (`at_msg`, `mpi_error`,
 *               `kernel_status` say where and what).
 * The hot path never leaves C: per round a start of the persistent requests, a poll of them
 * under the wait policy (waits.py: poll, yield, back off; bounded), the header checks,
 * the evaluation with its finiteness check and the next headers' patch.
 *
 * Buffers are numbered: bases[b] is the start of buffer b (float64 elements); a region is
 * (buf, element offset). The caller's arrays (contributions, `out`) are bound per run by
 * writing their bases; the engine's own buffers are bound once.
 *
 * Receives. With `probe` == 0 (ALPHA_MPI_RECEIVES=posted, for measuring only: execution/
 * receives.py) every receive is a persistent receive of exactly the planned size, started at
 * its post op; a longer frame from a buggy or hostile rank is then the MPI's to truncate, which
 * Open MPI 5 does only after writing past the buffer. With `probe` != 0 (the default, on
 * every channel) nothing is posted: the wait matches the frame first
 * (MPI_Improbe), compares its size with the plan's and receives it (MPI_Mrecv) into the planned
 * buffer only when they agree, else whole into a scratch buffer whose header bytes are kept
 * in bad_header: no MPI ever writes past a buffer (Open MPI 5's single-copy path overruns a
 * posted receive by a longer message before it reports the truncation).
 */
#ifndef ALPHA_NATIVE_H
#define ALPHA_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "abi.h" /* the results (AN_DONE ...), op kinds (AN_OP_*), bad frames (AN_BAD_*), AN_NO_BUFFER */

typedef struct an_region {
    int32_t buf; /* index into bases, or AN_NO_BUFFER */
    int64_t off; /* element offset */
} an_region;

typedef struct an_op {
    int32_t kind;
    int32_t index; /* message, eval, copy, check or merge index */
} an_op;

typedef struct an_msg {
    int32_t index;   /* the message's index in the Program (the header's edge; the hook's argument) */
    int32_t peer;
    int32_t tag;     /* of the header message; a split frame's payload travels with tag + 1 */
    int32_t sending; /* 1: this rank sends it, 0: receives it */
    int32_t split;   /* 1: a header message, then the payload message from/into `payload` */
    int64_t count;   /* payload elements */
    uint8_t *hbuf;   /* the header (not split: header and payload, one message of hbytes) */
    int64_t hbytes;
    an_region payload;     /* where the payload lies on this rank (split frames) */
    const uint8_t *expect; /* the header at step 0 without flags (124 bytes) */
    const char *what;      /* "reduce frame 3", for the debug log */
    int32_t merge_min;     /* a flag-round frame (planning/flag_rounds.py): the lowest refusing rank wins */
} an_msg;

typedef struct an_eval {
    int32_t nin;
    int32_t finite; /* 1: check the output's finiteness in the same pass */
    int64_t count;
    const int32_t *prog; /* postfix (alpha_kernel.h TREE PROGRAMS) */
    int64_t plen;
    const an_region *inputs;
    const double **ptrs; /* nin pointers of scratch, filled per evaluation */
    an_region out;
} an_eval;

typedef struct an_copy {
    an_region src, dst;
    int64_t count;
} an_copy;

typedef struct an_check {
    an_region at;
    int64_t count;
} an_check;

typedef struct an_merge {
    /* heads: two int64 words (record count, flags); nodes: capacity records of 2 + k words;
     * n: the global length word (planning.program.Merge) */
    an_region a_head, b_head, out_head, n_word, a_nodes, b_nodes, out_nodes;
    int32_t k;
    int64_t capacity;
} an_merge;

/* The arrays' summary (an A op, planning/program.py Summary): the kernel's ap_summary (1-D
 * blocks) or ap_summary_tile (N-d tiles) of the caller's blocks xs[j] = bases[x0 + j] (and
 * ys[j] = bases[y0 + j]) into a state (head, nodes), this rank's coverage row and the global
 * length word, read from the geometry words at bases[geometry] (int64):
 *   blocks  offset, length, n                  -> row: offset, length, n, status 0
 *   tiles   n, ndim, shape, offset, extent (ndim words each), the arrays' element strides
 *           (ndim words per array: xs, then ys), then the row's tail (row_words - 3 words)
 *                                              -> row: status 0, records, room, tail
 * `result` gets two int64 words: the record count (or AP_ERR_*) and the non-finite flag. A
 * summary that fails (AP_ERR_*: a tile whose frames are too small) or holds a NaN/Inf writes
 * nothing else and stops the run (AN_STOP): the op comes before every message op, so nothing
 * was sent or posted, and the caller takes its own path. A NULL bases[geometry]: the caller
 * wrote this run's state, row and length itself; the op does nothing. */
typedef struct an_summary {
    int32_t k;
    int32_t tiles;     /* 0: 1-D blocks, 1: N-d tiles */
    int32_t x0, y0;    /* buffer numbers of xs[0], ys[0] (y0 AN_NO_BUFFER: a sum, no ys) */
    int32_t geometry;  /* buffer number of the geometry words */
    int32_t row_words; /* words of the coverage row */
    an_region head, nodes, row, n_word, result;
    int64_t capacity;
    const double **scratch; /* 2k pointers (ap_summary_tile's) */
} an_summary;

/* The arrays' root check (an R op, planning/program.py Root): `verdict` (one int64 word) is 0
 * and `values` (k float64) holds the root's values when the run saw no flag, the table holds
 * exactly the rows that passed every check last time (`valid`: word 0 is 1 while usable, then
 * table_words words), the merged state (`final`: count, flags, lo, hi, k values) is the root
 * [0, n) of the length word (or empty, n = 0) and its values are finite; else 1: the caller
 * checks the run itself. */
typedef struct an_root {
    int32_t k;
    an_region table, valid, final, n_word, values, verdict;
    int64_t table_words;
} an_root;

/* The program: what Python compiled (engine_build.py), fixed once an_prepare ran. The
 * buffer table `bases` is the program's; the caller's entries in it (numbers below
 * first_static) are bound per run by writing their pointers, the engine's once. */
typedef struct an_program {
    int32_t rank;
    int32_t nops;
    const an_op *ops;
    an_msg *msgs; /* (their tags written before an_prepare, from the build agreement) */
    int32_t nmsgs;
    const an_eval *evals;
    const an_copy *copies;
    const an_check *checks;
    const an_merge *merges;
    const an_summary *summaries;
    const an_root *roots;
    double **bases;
    int32_t nbases;
    int32_t first_static; /* bases from here on are the engine's (bound once); before: the caller's */
    int32_t probe;         /* receives matched first (size-safe), else posted (receives.py) */
    int32_t check_payload; /* a CRC32C of every payload rides in its header */
    /* where the result lies, copied into the caller's `out` (run.deliver_to) at the end of a
     * run that nothing refused (no refused or non-finite flag) */
    an_region deliver_from;
    int64_t deliver_count;
} an_program;

/* The wait policy (transport.Waiter) and where a run returns to Python: polls before the
 * first yield, never yield or sleep, seconds of waiting before returning AN_AGAIN, seconds of
 * yielding before sleeping; `hook`: return AN_HOOK before each send; `debug`: log every frame. */
typedef struct an_policy {
    int32_t before_yield;
    int32_t spin;
    double slice;
    double sleep_after;
    int32_t hook;
    int32_t debug;
} an_policy;

/* One run: set by an_run, updated as frames arrive; where it stopped (AN_HOOK, AN_BAD_FRAME,
 * AN_TIMEOUT, AN_MPI_ERROR, AN_KERNEL_ERROR). */
typedef struct an_run_state {
    uint64_t step;
    double timeout;
    int32_t flags;   /* frames.FLAG_*: what this rank has seen so far (rides on every send) */
    int32_t refused; /* the refusing rank the flags name (-1: none yet) */
    uint8_t code[4]; /* its refusal code tag */
    int32_t at_msg;      /* index into msgs */
    int32_t at_payload;  /* 1: the payload message of a split frame */
    int32_t bad_kind;    /* AN_BAD_* */
    int64_t bad_got;     /* bytes of the (header) message that arrived */
    int64_t bad_pgot;    /* bytes of the payload message (split) */
    uint8_t bad_header[128]; /* the first bytes of a frame received into scratch (bad_got of them) */
    int32_t mpi_error;
    int32_t kernel_status;
    double *deliver_to; /* the caller's `out` (bound per run), or NULL for none */
    int32_t delivered;  /* 1 when the copy was made */
} an_run_state;

/* One executor: the immutable program, the wait policy, the run's state, and C's own state
 * (the communicator, the requests, where the run is: native.h's AN_ROUND_SOURCES part). */
typedef struct an_exec {
    an_program program;
    an_policy policy;
    an_run_state run;
    void *state;
} an_exec;

/* A new executor calling the kernel through `kernel` (kernel_table.h ak_functions()). NULL when
 * out of memory. Python fills its program and policy, then an_prepare. */
an_exec *an_new(const void *kernel);

/* After Python filled the program (tags and `probe` included, once the build agreement gave the
 * executor its tag block): make the persistent requests on the communicator whose Fortran
 * handle is `fcomm` (comm.py2f()). 0, or an MPI error code (an_free frees what was made). */
int an_prepare(an_exec *e, int32_t fcomm);

/* Start a run: step, the per-wait bound in seconds, the initial flags, refusing rank, code. */
int an_run(an_exec *e, uint64_t step, double timeout, int32_t flags, int32_t refused, uint32_t code);

/* Go on after AN_AGAIN, AN_HOOK or AN_BAD_FRAME. */
int an_resume(an_exec *e);

/* After a failure: cancel the receives still pending (sends are never cancelled). 0, or the
 * first MPI error code a cancel or its wait returned. */
int an_cancel_receives(an_exec *e);

/* The peer's first unmatched message on the channel belongs to another run (Python probed it,
 * engine_walk): cancel the receive this run waits for, so that its completion tells whether
 * that peer's frame had already been matched (the run goes on with it: the probe found the
 * peer's next message) or never was (the run returns AN_UNMATCHED). 0, or an MPI error code. */
int an_cancel_awaited(an_exec *e);

/* The sends of this rank still incomplete (tested now). */
int an_pending_sends(an_exec *e);

/* Free the requests and the executor (sends in flight complete in the background). 0, or the
 * first MPI error code a cancel or a free returned (the executor is freed all the same). */
int an_free(an_exec *e);

/* MPI_Get_library_version of the libmpi this module is linked against (the load check). */
int an_library_version(char *buf, int32_t len);

/* MPI_Error_string and MPI_Error_class of an MPI error code. */
int an_error_string(int32_t code, char *buf, int32_t len, int32_t *cls);

/* sizeof(ak_table) as this module was built (kernel_table.h): load() compares it with the
 * kernel module's, which an older build of the kernel would not match. */
int64_t an_kernel_table_size(void);

/* The values of MPI_ERR_TRUNCATE in this library (mpi_failure names truncation). */
int32_t an_err_truncate(void);

#ifdef AN_ROUND_SOURCES
/* ------------------------------------------------------------------ the round's own part
 * What the round's C files share; each defines AN_ROUND_SOURCES before it includes this header,
 * and the cffi declaration leaves this part out (alpha_mpi/kernel/build.py header_cdef):
 *   entry.c        the ABI entry: an_new, an_prepare, an_run ... an_free, the library queries
 *   interpreter.c  the op loop and the ops that compute (E C F M A R): no MPI call
 *   frames.c       the message ops (P S W D): frames sent, received and checked
 *   waits.c        the wait policy and the time bounds
 * Only point-to-point calls: MPI_Start/Isend/Irecv/Improbe/Mrecv/Test on the communicator
 * mpi4py created (MPI_Comm_f2c); no collective, no communicator of its own. */
#include <mpi.h>

#include "frame.h"
#include "kernel_table.h"

#define AN_HIDDEN __attribute__((visibility("hidden")))
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
    /* the receive an_cancel_awaited cancelled (NULL: none): its completion says whether it
     * had been matched (the run goes on) or not (AN_UNMATCHED) */
    MPI_Request *cancelled;
} an_state;

static inline double *an_ptr(const an_exec *e, an_region r) { return e->program.bases[r.buf] + r.off; }

/* waits.c: poll under the wait policy until request r completes (an_wait) or a message from
 * m's peer with `tag` is matched into s->mmsg (an_match): AN_DONE, AN_AGAIN, AN_TIMEOUT or
 * AN_MPI_ERROR; an_active: 1 while r may still be in flight. */
AN_HIDDEN void an_wait_reset(an_state *s);
AN_HIDDEN int an_wait(an_exec *e, an_state *s, MPI_Request *r, MPI_Status *st);
AN_HIDDEN int an_match(an_exec *e, an_state *s, const an_msg *m, int tag, MPI_Status *st);
AN_HIDDEN int an_active(MPI_Request *r);

/* frames.c: the message ops of message i (P S W D). */
AN_HIDDEN int an_post(an_exec *e, an_state *s, int32_t i);
AN_HIDDEN int an_send(an_exec *e, an_state *s, int32_t i);
AN_HIDDEN int an_recv(an_exec *e, an_state *s, int32_t i);
AN_HIDDEN int an_done(an_exec *e, an_state *s, int32_t i);

/* interpreter.c: run the ops from where the run is, then the delivery. */
AN_HIDDEN int an_loop(an_exec *e);
#endif /* AN_ROUND_SOURCES */

#endif /* ALPHA_NATIVE_H */
