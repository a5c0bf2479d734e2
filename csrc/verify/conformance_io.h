/*
 * conformance_io.h -- the output file of the conformance drivers (conformance_driver.c,
 * train_driver.c), read by alpha_mpi_verify/isa.py read_sections():
 *
 *   "AKCONF01"                                  8-byte magic (conformance_open writes it)
 *   repeated: char name[16] (NUL padded), uint64 count, uint64 elem_size (4 or 8),
 *             count * elem_size bytes (little endian)
 *
 * Driver code only: never part of the kernel (the Python module does not include it).
 */
#ifndef ALPHA_CONFORMANCE_IO_H
#define ALPHA_CONFORMANCE_IO_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
#error "the conformance file format is little endian"
#endif

/* Open `path` for writing and write the magic; NULL when it cannot. */
static FILE *conformance_open(const char *path) {
    FILE *f = fopen(path, "wb");
    if (f && fwrite("AKCONF01", 1, 8, f) != 8) {
        fclose(f);
        return NULL;
    }
    return f;
}

/* One section; exits with status 3 when the write fails. */
static void conformance_section(FILE *f, const char *name, const void *data, uint64_t count,
                                uint64_t elem) {
    char nm[16] = {0};
    strncpy(nm, name, sizeof nm - 1);
    if (fwrite(nm, 1, 16, f) != 16 || fwrite(&count, 8, 1, f) != 1 || fwrite(&elem, 8, 1, f) != 1 ||
        (count && fwrite(data, (size_t)elem, (size_t)count, f) != count)) {
        fprintf(stderr, "conformance driver: write failed\n");
        exit(3);
    }
}

#endif /* ALPHA_CONFORMANCE_IO_H */
