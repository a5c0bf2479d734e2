/*
 * vectors.h -- a float64 vector's data pointer, checked and read from its NumPy array object
 * in one call (the prepared run's binding, alpha_mpi/kernel/vectors.py).
 *
 * A call with NEW arrays must bind their memory to the C records: in Python that is a buffer
 * export per array (ffi.from_buffer) and a dozen attribute reads for the checks, about 1 us per
 * array, more than the whole budget of issue 42 (new arrays at most 1 us over the same ones).
 * Here one C call checks exactly what the Python checks checked -- the object is an ndarray
 * (not a subclass), its dtype object is float64's, 1-D of n elements, C-contiguous, aligned,
 * writeable where asked -- and writes its data pointer where the caller says. The pointer is
 * read on EVERY call, the very same array included, so a layout or a buffer changed in place
 * is never read through an earlier one.
 *
 * Arguments are addresses: `a` is the array object (CPython's id(a)); `slot` the address of
 * the `double *` to write (a C record's entry). vectors.py checks at import, on probe arrays,
 * that what this file reads is what NumPy says, and uses it only then (CPython).
 * Nothing is written unless every array of the call fits (the caller then takes its full
 * path, which refuses or copies by name). No allocation; the two type addresses are set once
 * per process by ak_vec_kind (np.ndarray and np.dtype(np.float64) live as long as it).
 */
#ifndef ALPHA_VECTORS_H
#define ALPHA_VECTORS_H

#include <stdint.h>

#define AK_VEC_OK 0
#define AK_VEC_OTHER 1 /* not a 1-D, C-contiguous, aligned float64 ndarray of n (writeable) */
#define AK_VEC_NO_KIND 2 /* ak_vec_kind was not called */
#define AK_VEC_PROBE_WORDS 9

/* The addresses of np.ndarray and np.dtype(np.float64), once per process. */
int ak_vec_kind(uintptr_t ndarray_type, uintptr_t float64_descr);
/* Check array `a` (n elements; writeable when `writeable`) and write its data pointer to `slot`. */
int ak_vec_bind(uintptr_t a, int64_t n, int writeable, uintptr_t slot);
/* The same for two arrays of n elements (a dot's x and y; y may be x), both or neither. */
int ak_vec_bind2(uintptr_t x, uintptr_t y, int64_t n, uintptr_t slot_x, uintptr_t slot_y);
/* The same for an N-d tile (arrays/fast.py): x (and y, a dot's other array, which may be x and
   is checked against its own strides then too; 0: a sum) each an ndarray of float64, nd dimensions of shape[0..nd), byte strides
   strides[0..nd) for x and strides[nd..2nd) for y, aligned; the first element's address (a
   strided view's too) written to slot_x (slot_y). Both or neither. */
int ak_vec_bind_tile(uintptr_t x, uintptr_t y, int32_t nd, const int64_t *shape,
                     const int64_t *strides, uintptr_t slot_x, uintptr_t slot_y);
/* What this file reads of `a`, for the import check: type, descr, data, nd, flags, and (when
   nd >= 1) dimension and stride 0 and the last dimension and stride; AK_VEC_PROBE_WORDS words. */
int ak_vec_probe(uintptr_t a, int64_t *words);

#endif
