/*
 * abi.h -- every constant both languages read, written once (issue 42 item 4).
 *
 * The kernel (alpha_mpi/kernel/build.py: this header is part of its cdef) and the engine's
 * round (alpha_mpi/execution/native.py) both include it; Python reads the values from the
 * kernel module and checks its own names for them at import (alpha_mpi/execution/abi.py,
 * frames.py for the frame layout), so an edit on one side only, or a stale build, is an
 * ImportError that says which constant differs, never a silent disagreement.
 */
#ifndef ALPHA_ABI_H
#define ALPHA_ABI_H

/* ------------------------------------------------------------------ frames (frames.py) */
#define AK_FRAME_HEADER 128
#define AK_FRAME_VERSION 3
#define AK_FRAME_VERSION_OFF 8
#define AK_FRAME_FLAGS_OFF 11
#define AK_FRAME_STEP_OFF 64
#define AK_FRAME_REFUSED_OFF 100
#define AK_FRAME_CODE_OFF 104
#define AK_FRAME_PCRC_OFF 108
#define AK_FRAME_SEQ_OFF 112
#define AK_FRAME_CRC_OFF 124

/* frame flags (frames.FLAG_*) */
#define AK_FLAG_NONFINITE 1
#define AK_FLAG_REFUSED 2
#define AK_FLAG_PAYLOAD_CRC 4
#define AK_FLAG_VOTE 8

/* ------------------------------------------------------------------ the round (native.h) */
/* an_run / an_resume results */
#define AN_DONE 0
#define AN_AGAIN 1
#define AN_HOOK 2
#define AN_BAD_FRAME 3
#define AN_TIMEOUT 4
#define AN_MPI_ERROR 5
#define AN_KERNEL_ERROR 6
#define AN_STOP 7 /* an op stopped the run before any message op ran (an_summary: Python looks) */
#define AN_UNMATCHED 8 /* the awaited receive an_cancel_awaited cancelled was never matched */

/* op kinds (planning/program.py OP_KINDS; engine_build.OP_CODE) */
#define AN_OP_POST 1
#define AN_OP_SEND 2
#define AN_OP_WAIT 3
#define AN_OP_DONE 4
#define AN_OP_EVAL 5
#define AN_OP_COPY 6
#define AN_OP_CHECK 7
#define AN_OP_MERGE 8
#define AN_OP_SUMMARY 9 /* the arrays' local summary (an_summary) */
#define AN_OP_ROOT 10   /* the arrays' root check (an_root) */

/* what was wrong with a bad frame (an_run_state.bad_kind) */
#define AN_BAD_HEADER 1       /* the header is not the planned one (frames.FrameSpec.check names it) */
#define AN_BAD_SIZE 2         /* the (header) message had another size: bad_got bytes */
#define AN_BAD_PAYLOAD_SIZE 3 /* the payload message of a split frame had another size: bad_pgot */
#define AN_BAD_CRC 4          /* the payload fails its CRC32C */

#define AN_NO_BUFFER (-1)

/* the flags word of a merged summary (an M op; arrays/pairwise.py FLAG_*) */
#define AN_MERGE_OVERFLOW 1 /* a merge had more nodes than its capacity */
#define AN_MERGE_INVALID 2  /* a merge met partially overlapping nodes */

#endif /* ALPHA_ABI_H */
