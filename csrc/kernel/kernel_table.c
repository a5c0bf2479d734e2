/* kernel_table.c -- see kernel_table.h. */
#include "kernel_table.h"

#include "alpha_kernel.h"
#include "frame.h"
#include "pairwise.h"

static const ak_table ak_the_table = {
    ak_tree_eval, ak_tree_eval_finite, ak_first_nonfinite, ap_merge, ak_crc32c, ak_frame_patch, ak_frame_check,
    ap_summary, ap_summary_tile,
};

const ak_table *ak_functions(void) { return &ak_the_table; }
