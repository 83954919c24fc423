/* Little-endian loads/stores and UTF-8 validation for the FlatBuffers codec.
 *
 * FlatBuffers is little-endian on the wire. Every load goes through memcpy so
 * that unaligned positions (a frame inside a larger read buffer) are safe on
 * every CPU; compilers turn these into single mov instructions.
 * Bounds are NOT checked here: callers (reader.pxi / verifier) check first.
 */
#ifndef TF_CODEC_H
#define TF_CODEC_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tryll_fast's codec assumes a little-endian host (x86-64, aarch64)"
#endif

#define TF_MAX_FRAME 1048576u

static inline uint8_t  tf_ld_u8 (const uint8_t *p) { return *p; }
static inline int8_t   tf_ld_i8 (const uint8_t *p) { return (int8_t)*p; }
static inline uint16_t tf_ld_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline int16_t  tf_ld_i16(const uint8_t *p) { int16_t v;  memcpy(&v, p, 2); return v; }
static inline uint32_t tf_ld_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int32_t  tf_ld_i32(const uint8_t *p) { int32_t v;  memcpy(&v, p, 4); return v; }
static inline uint64_t tf_ld_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline int64_t  tf_ld_i64(const uint8_t *p) { int64_t v;  memcpy(&v, p, 8); return v; }
static inline float    tf_ld_f32(const uint8_t *p) { float v;    memcpy(&v, p, 4); return v; }
static inline double   tf_ld_f64(const uint8_t *p) { double v;   memcpy(&v, p, 8); return v; }

static inline void tf_st_u8 (uint8_t *p, uint8_t v)  { *p = v; }
static inline void tf_st_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void tf_st_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void tf_st_i32(uint8_t *p, int32_t v)  { memcpy(p, &v, 4); }
static inline void tf_st_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void tf_st_f32(uint8_t *p, float v)    { memcpy(p, &v, 4); }
static inline void tf_st_f64(uint8_t *p, double v)   { memcpy(p, &v, 8); }

/* Strict UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
 * Returns -1 when valid, else the byte offset of the first invalid sequence.
 * ASCII runs are skipped 8 bytes at a time: game text is mostly ASCII. */
static inline int64_t tf_utf8_invalid_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; }
        else return (int64_t)i;
        if (i + need >= n) return (int64_t)i;   /* truncated sequence */
        for (size_t k = 1; k <= need; k++) {
            uint8_t cc = s[i + k];
            if ((cc & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return (int64_t)i;
        i += need + 1;
    }
    return -1;
}

#endif
