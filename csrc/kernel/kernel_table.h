/*
 * kernel_table.h -- the kernel's functions that the MPI executor calls (layer 3 -> 4).
 *
 * The executor's round (csrc/round/native.c) is built apart, by the MPI library's own mpicc, at first
 * use; it does no arithmetic of its own. It receives this table from the kernel module that
 * setup.py built with the fixed flags of alpha_mpi/kernel/build.py and calls the evaluation,
 * the finiteness check, the summary and its merge, CRC32C and the header patch/check through it: one
 * kernel per process, so the bits never depend on which compiler built the executor.
 */
#ifndef ALPHA_KERNEL_TABLE_H
#define ALPHA_KERNEL_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ak_table {
    int (*tree_eval)(double *out, const double *const *inputs, size_t k, size_t n, const int32_t *prog,
                     size_t prog_len);
    int (*tree_eval_finite)(double *out, const double *const *inputs, size_t k, size_t n,
                            const int32_t *prog, size_t prog_len, int32_t *nonfinite);
    int64_t (*first_nonfinite)(const double *x, size_t n);
    int64_t (*merge)(const int64_t *a, int64_t ma, const int64_t *b, int64_t mb, int64_t *out, int64_t cap,
                     int64_t n, int32_t k);
    uint32_t (*crc32c)(uint32_t crc, const void *p, size_t n);
    void (*frame_patch)(uint8_t *h, const uint8_t *expect, uint64_t step, int32_t flags, int32_t refused,
                        const uint8_t *code, uint32_t payload_crc);
    int32_t (*frame_check)(const uint8_t *h, const uint8_t *expect, uint64_t step);
    int64_t (*summary)(const double *const *xs, const double *const *ys, int32_t k, int64_t offset, int64_t len,
                       int64_t n, int64_t *out, int64_t cap, int32_t *nonfinite);
    int64_t (*summary_tile)(const double *const *xs, const double *const *ys, int32_t k, int32_t ndim,
                            const int64_t *shape, const int64_t *offset, const int64_t *extent,
                            const int64_t *strides, int64_t *out, int64_t cap, const double **scratch,
                            int32_t *nonfinite, int64_t *room);
} ak_table;

/* The table of this build (static storage; never freed). */
const ak_table *ak_functions(void);

#endif /* ALPHA_KERNEL_TABLE_H */
