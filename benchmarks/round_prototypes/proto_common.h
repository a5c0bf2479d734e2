/* Shared by the two prototypes of issue 33 item 3 (docs/design.md "The round in C"): the frame
 * header's per-run patch and check (128 bytes; step at 64, flags at 11, crc32c of 0..123 at 124)
 * and the butterfly's one evaluation with its finiteness check. Not product code. */
#include <stdint.h>
#include <string.h>
#include <nmmintrin.h>

#define PH_HEADER 128
#define PH_CRC_OFF 124
#define PH_STEP_OFF 64
#define PH_FLAGS_OFF 11

__attribute__((target("sse4.2"))) static uint32_t ph_crc32c(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) { uint64_t v; memcpy(&v, p, 8); c = _mm_crc32_u64(c, v); p += 8; n -= 8; }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}

static void ph_patch(uint8_t *h, const uint8_t *tmpl, uint64_t step, uint8_t flags) {
    memcpy(h, tmpl, PH_CRC_OFF);
    memcpy(h + PH_STEP_OFF, &step, 8);
    h[PH_FLAGS_OFF] = flags;
    uint32_t c = ph_crc32c(h, PH_CRC_OFF);
    memcpy(h + PH_CRC_OFF, &c, 4);
}

/* -1: bad header; else its flags */
static int ph_check(const uint8_t *h, const uint8_t *expect, uint64_t step) {
    uint64_t s;
    memcpy(&s, h + PH_STEP_OFF, 8);
    if (s != step || memcmp(h, expect, PH_FLAGS_OFF) || memcmp(h + 12, expect + 12, PH_STEP_OFF - 12) ||
        memcmp(h + 72, expect + 72, PH_CRC_OFF - 72))
        return -1;
    uint32_t c;
    memcpy(&c, h + PH_CRC_OFF, 4);
    if (c != ph_crc32c(h, PH_CRC_OFF)) return -1;
    return h[PH_FLAGS_OFF];
}

/* out = l + r with the finiteness check; returns 1 if anything is non-finite */
static int ph_add_finite(double *out, const double *l, const double *r, size_t n) {
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        double v = l[i] + r[i];
        out[i] = v;
        uint64_t u;
        memcpy(&u, &v, 8);
        acc |= (u & 0x7FF0000000000000ull) + 0x0010000000000000ull;
    }
    return (int)(acc >> 63);
}
