/*
 * frame.h -- the frame header's per-run fields and CRC32C (layer 3; no MPI, no allocation).
 *
 * The wire format is owned by alpha_mpi/execution/frames.py (its docstring holds the table);
 * the offsets below are the ones C needs, and frames.py checks at import that they equal its
 * own, so the format is written down once and read in one place by each language.
 *
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor
 * 0xFFFFFFFF: the iSCSI / SSE4.2 `crc32` / ARMv8 `crc32c` checksum; "123456789" ->
 * 0xE3069283). ak_crc32c uses the instruction where the CPU has it (chosen once at run
 * time: SSE4.2 on x86-64, the CRC32 extension on AArch64) and a table-driven loop
 * otherwise; both give the same value (ak_crc32c_portable is the table path, for tests).
 * `crc` chains: ak_crc32c(ak_crc32c(0, a, na), b, nb) == ak_crc32c(0, a||b, na + nb).
 *
 * THE HEADER CHECK (ak_frame_check): a received header is the expected one byte for byte
 * (`expect`: the 124 bytes of the header at step 0 with no flags), except the fields a run
 * writes (flags, step, refusing rank, refusal code, payload crc), its step is `step`, and
 * its CRC32C over bytes 0..123 is the one at 124. Returns the header's flags, or -1 (then
 * frames.FrameSpec.check names the field that differs).
 */
#ifndef ALPHA_FRAME_H
#define ALPHA_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "abi.h" /* the frame layout and flags (AK_FRAME_*, AK_FLAG_*) */

/* CRC32C of n bytes at p, continuing from crc (0 to start). */
uint32_t ak_crc32c(uint32_t crc, const void *p, size_t n);

/* The same value by the table-driven loop only (what CPUs without the instruction run). */
uint32_t ak_crc32c_portable(uint32_t crc, const void *p, size_t n);

/* 1 when ak_crc32c uses the CPU's CRC32C instruction, else 0. */
int ak_crc32c_hardware(void);

/* Write a header: the 124 template bytes `expect`, then step, flags, refusing rank + 1,
 * the 4-byte refusal code, the payload crc, then the header CRC32C at 124. */
void ak_frame_patch(uint8_t *h, const uint8_t *expect, uint64_t step, int32_t flags, int32_t refused,
                    const uint8_t *code, uint32_t payload_crc);

/* The received header's flags if it is the expected one (see THE HEADER CHECK), else -1. */
int32_t ak_frame_check(const uint8_t *h, const uint8_t *expect, uint64_t step);

#endif /* ALPHA_FRAME_H */
