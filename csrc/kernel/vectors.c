/* vectors.c -- see vectors.h. Reads NumPy's array object through NumPy's own accessors
 * (numpy/ndarraytypes.h: plain field reads, no API table, so no import_array). It is called
 * with the GIL released (cffi): it only reads fields of objects the caller holds. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>

#include "vectors.h"

static uintptr_t kind_type, kind_f64;

int ak_vec_kind(uintptr_t ndarray_type, uintptr_t float64_descr) {
    kind_type = ndarray_type;
    kind_f64 = float64_descr;
    return AK_VEC_OK;
}

/* 1 when `a` is a 1-D, C-contiguous, aligned float64 ndarray of n elements (writeable if asked). */
static int fits(uintptr_t a, int64_t n, int need) {
    PyArrayObject *arr = (PyArrayObject *)a;
    if ((uintptr_t)Py_TYPE((PyObject *)a) != kind_type || (uintptr_t)PyArray_DESCR(arr) != kind_f64
        || PyArray_NDIM(arr) != 1 || PyArray_DIMS(arr)[0] != (npy_intp)n)
        return 0;
    return (PyArray_FLAGS(arr) & need) == need;
}

#define NEED (NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED)

int ak_vec_bind(uintptr_t a, int64_t n, int writeable, uintptr_t slot) {
    if (!kind_type)
        return AK_VEC_NO_KIND;
    if (!fits(a, n, writeable ? NEED | NPY_ARRAY_WRITEABLE : NEED))
        return AK_VEC_OTHER;
    *(double **)slot = (double *)PyArray_DATA((PyArrayObject *)a);
    return AK_VEC_OK;
}

int ak_vec_bind2(uintptr_t x, uintptr_t y, int64_t n, uintptr_t slot_x, uintptr_t slot_y) {
    if (!kind_type)
        return AK_VEC_NO_KIND;
    if (!fits(x, n, NEED) || (y != x && !fits(y, n, NEED)))
        return AK_VEC_OTHER;
    *(double **)slot_x = (double *)PyArray_DATA((PyArrayObject *)x);
    *(double **)slot_y = (double *)PyArray_DATA((PyArrayObject *)y);
    return AK_VEC_OK;
}

/* 1 when `a` is an aligned float64 ndarray of nd dimensions `shape` and byte strides `strides`. */
static int fits_tile(uintptr_t a, int32_t nd, const int64_t *shape, const int64_t *strides) {
    PyArrayObject *arr = (PyArrayObject *)a;
    if ((uintptr_t)Py_TYPE((PyObject *)a) != kind_type || (uintptr_t)PyArray_DESCR(arr) != kind_f64
        || PyArray_NDIM(arr) != nd || !(PyArray_FLAGS(arr) & NPY_ARRAY_ALIGNED))
        return 0;
    const npy_intp *dims = PyArray_DIMS(arr), *st = PyArray_STRIDES(arr);
    for (int32_t d = 0; d < nd; d++)
        if (dims[d] != (npy_intp)shape[d] || st[d] != (npy_intp)strides[d])
            return 0;
    return 1;
}

int ak_vec_bind_tile(uintptr_t x, uintptr_t y, int32_t nd, const int64_t *shape,
                     const int64_t *strides, uintptr_t slot_x, uintptr_t slot_y) {
    if (!kind_type)
        return AK_VEC_NO_KIND;
    if (!fits_tile(x, nd, shape, strides) || (y && !fits_tile(y, nd, shape, strides + nd)))
        return AK_VEC_OTHER;
    *(double **)slot_x = (double *)PyArray_DATA((PyArrayObject *)x);
    if (y)
        *(double **)slot_y = (double *)PyArray_DATA((PyArrayObject *)y);
    return AK_VEC_OK;
}

int ak_vec_probe(uintptr_t a, int64_t *words) {
    PyArrayObject *arr = (PyArrayObject *)a;
    words[0] = (int64_t)(uintptr_t)Py_TYPE((PyObject *)a);
    words[1] = (int64_t)(uintptr_t)PyArray_DESCR(arr);
    words[2] = (int64_t)(uintptr_t)PyArray_DATA(arr);
    words[3] = PyArray_NDIM(arr);
    words[4] = PyArray_FLAGS(arr);
    words[5] = words[6] = words[7] = words[8] = -1;
    if (words[3] >= 1 && words[3] <= 32) { /* dereferenced only once nd looks like NumPy's */
        const int last = (int)words[3] - 1;
        words[5] = PyArray_DIMS(arr)[0];
        words[6] = PyArray_STRIDES(arr)[0];
        words[7] = PyArray_DIMS(arr)[last];
        words[8] = PyArray_STRIDES(arr)[last];
    }
    return AK_VEC_OK;
}
