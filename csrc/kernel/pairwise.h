/*
 * pairwise.h -- the pairwise tree over global indices, for sums and dot products of
 * distributed arrays (alpha_mpi/arrays; DESIGN.md "Decomposition-independent array
 * reductions"). No MPI, no allocation, no global state. Built with the same flags as
 * alpha_kernel.c (-ffp-contract=off: every product below is rounded once, then added;
 * no fused multiply-add), so x86-64 and AArch64 give the same bits.
 *
 * ------------------------------------------------------------------------------
 * THE TREE (the one place it is written down; tests/array_oracle.py mirrors it)
 * ------------------------------------------------------------------------------
 *   The terms are t_i = x_i (sum) or t_i = x_i * y_i (dot; one rounding each), for
 *   global indices i in [0, n). A node is a range [lo, hi):
 *       size 1:   value t_lo
 *       else:     m = lo + 2^floor(log2(hi - lo - 1))   (left size: the largest power
 *                 of two below the size), value = value[lo, m) + value[m, hi),
 *                 left operand first.
 *   The root is [0, n); for n = 0 the value is +0.0. Every node [lo, hi) has
 *   lo % P == 0 for P = the smallest power of two >= hi - lo, and hi - lo == P or
 *   hi == n; conversely every such range is a node. So a complete aligned block
 *   [a 2^j, (a+1) 2^j) inside [0, n) is a node, and its value is the balanced tree.
 *
 * SUMMARIES. A rank holding the block [offset, offset + len) evaluates the maximal
 * complete aligned blocks inside it (left to right: at pos, the largest 2^j dividing
 * pos with pos + 2^j <= end) and merges siblings (below). The result, its summary, is
 * a list of records sorted by lo, each one node of the tree with its value(s):
 *       record = { int64 lo, int64 hi, double v[k] }     (2 + k 8-byte words)
 * One block has at most 2*63 + 1 records; the union of two runs of blocks at most
 * 2*64 + 1 (AP_CAPACITY leaves slack).
 *
 * MERGE (ap_merge): the union of two summaries, sorted by lo; a record contained in
 * another (the same node reached twice) is dropped; then, as each record is
 * appended, while the last two records L, R are adjacent siblings -- [L.lo, R.hi) is
 * a node split at L.hi -- they become their parent with v = L.v + R.v. Every value
 * in a summary is the value of its node in the one tree, so the bits of the root
 * never depend on how the index range was cut into blocks, nor on the merge order.
 *
 * TILES (ap_summary_tile). An N-d block of a C-order global array of shape S is a
 * tile: extent E at offset O. Its terms are not one range of [0, n), n = prod(S), but
 * one range per row segment: the global index of element (O + i) is sum_d (O_d + i_d) G_d,
 * G_d = prod(S_{d+1..}). Trailing dimensions the tile covers whole (E_d == S_d) join a
 * segment; where memory is contiguous too they join its memory run, otherwise (a halo
 * view) the runs that meet in global index meet in the carry. The tile's summary is the
 * runs' records appended left to right with the same carry: the records of the maximal
 * nodes inside the tile, the same as cutting its global runs into blocks (so the bits
 * equal those of any other cut). Runs that do not meet never join, so a tile of R
 * separate runs has sum over its runs of their record counts (ap_tile_records): at least
 * R, one each where a run is a complete aligned block.
 *
 * LOCAL KERNEL. A complete block of 2^j <= AP_BLOCK terms is evaluated level by
 * level in a buffer that stays in L1 (level 1 reads x and y once, at memory speed);
 * a larger block is a left-to-right sweep of AP_BLOCK-term blocks whose values are
 * combined by a binary carry (the balanced tree above them): the same tree, bit for
 * bit, in one pass over memory.
 */
#ifndef ALPHA_PAIRWISE_H
#define ALPHA_PAIRWISE_H

#include <stddef.h>
#include <stdint.h>

#define AP_BLOCK 2048     /* terms per cache block (a power of two) */
#define AP_CAPACITY 132   /* records per summary buffer (2*64 + 1, plus slack) */
#define AP_MAX_K 4096     /* values per record (batched dot products) */
#define AP_MAX_NDIM 4     /* dimensions of a tile (ap_summary_tile) */

#define AP_ERR_OVERFLOW (-1)      /* more records than `cap` */
#define AP_ERR_INVALID (-2)       /* records partially overlap, unsorted, or out of [0, n) */
#define AP_ERR_BAD_ARGUMENT (-3)  /* offset/len/n/k/cap out of range, NULL pointer */

/* Summary of the block [offset, offset + len) of [0, n) into `out` (records of
 * 2 + k words, at most `cap`). xs[j] (and ys[j], or ys == NULL for sums, or
 * ys[j] == NULL for the sum of xs[j]) point at the block's first element (global
 * index offset). Returns the record count or AP_ERR_*. *nonfinite is set to 1 when a
 * value in the summary is NaN or +-Inf (an input or an overflow), else 0. */
int64_t ap_summary(const double *const *xs, const double *const *ys, int32_t k,
                   int64_t offset, int64_t len, int64_t n, int64_t *out, int64_t cap,
                   int32_t *nonfinite);

/* Summary of the tile of extent[d] at offset[d] (d < ndim) of the C-order array of
 * shape[d] (see TILES). xs[j] (ys[j], as in ap_summary) point at the tile's first element;
 * strides holds rows of ndim element strides: row j for xs[j] and, when ys is given,
 * row k + j for ys[j] (read for every j; give a NULL ys[j] its x row); every
 * last-dimension stride must be 1. scratch: room for 2 * k pointers. Returns the record
 * count or AP_ERR_*; AP_ERR_OVERFLOW when out would hold more than `cap` records at some
 * point (ap_tile_records says how many). *room (if given): the most records out held. */
int64_t ap_summary_tile(const double *const *xs, const double *const *ys, int32_t k,
                        int32_t ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *extent, const int64_t *strides, int64_t *out,
                        int64_t cap, const double **scratch, int32_t *nonfinite, int64_t *room);

/* The record count of that tile's summary, from its geometry and the `arrays` rows of
 * strides (0 and NULL: segments of whole global runs), or AP_ERR_BAD_ARGUMENT; *room (if
 * given): the capacity ap_summary_tile needs with those strides (a block is written
 * before it joins its left sibling, so the count can be exceeded on the way). */
int64_t ap_tile_records(int32_t ndim, const int64_t *shape, const int64_t *offset,
                        const int64_t *extent, const int64_t *strides, int32_t arrays,
                        int64_t *room);

/* out = merge(a, b) (see MERGE). a, b: ma, mb records of 2 + k words; out must not
 * overlap either. Returns the record count or AP_ERR_*. */
int64_t ap_merge(const int64_t *a, int64_t ma, const int64_t *b, int64_t mb, int64_t *out,
                 int64_t cap, int64_t n, int32_t k);

/* The value of the node [lo, hi) of the tree over [0, n) for terms x (and y, or NULL),
 * where x points at global index lo: the whole tree when lo = 0 and hi = n. Returns 0
 * or AP_ERR_BAD_ARGUMENT (not a node). For tests and the local-kernel benchmark. */
int ap_node_value(const double *x, const double *y, int64_t lo, int64_t hi, int64_t n,
                  double *value);

/* The balanced tree over s = 2^j terms starting at x (and y), with the lanes this CPU offers
 * (portable == 0: AVX2 where present) or with the portable C lanes only (portable != 0, what
 * AArch64 and pre-AVX2 x86 run). Both give the same bits; tests compare them on one machine. */
int ap_block_value(const double *x, const double *y, int64_t s, int32_t portable, double *value);

#endif
