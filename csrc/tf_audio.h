/* Voice input kernels: int16 -> float conversion and the resampler's dot products.
 *
 * Each 16 kHz output sample is a dot product of 2 * half input samples with one phase of
 * the windowed-sinc filter (tryll_fast/voice_input/_audio.pyx). Summed left to right, a
 * float dot product is one long dependency chain and the compiler may not reorder it (no
 * -ffast-math), so it runs at one addition every few cycles; four lanes of SSE2 (NEON on
 * AArch64) run it several times faster. tf_dot4 computes four outputs at once: four
 * independent chains, and one transpose-and-add for the four horizontal sums instead of
 * one each. The conversion is explicit too: at -O2 the compiler does not vectorise a loop
 * whose input and output might overlap.
 */
#ifndef TF_AUDIO_H
#define TF_AUDIO_H

#include <stdint.h>

#include <string.h>

/* Samples [i, n) of little-endian int16 -> float, times scale, one at a time (the tail
 * the vector loops leave, and the whole conversion where there is no vector unit). */
static inline void tf_s16le_to_f32_from(const uint8_t *pcm, int64_t i, int64_t n,
                                        float scale, float *out)
{
    for (; i < n; i++) {
        int16_t s;
        memcpy(&s, pcm + 2 * i, 2);
        out[i] = (float)s * scale;
    }
}

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
static inline void tf_s16le_to_f32(const uint8_t *pcm, int64_t n, float scale, float *out)
{
    const __m128 k = _mm_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(pcm + 2 * i));
        /* each int16 into the top half of an int32, then an arithmetic shift back down */
        __m128i lo = _mm_srai_epi32(_mm_unpacklo_epi16(v, v), 16);
        __m128i hi = _mm_srai_epi32(_mm_unpackhi_epi16(v, v), 16);
        _mm_storeu_ps(out + i, _mm_mul_ps(_mm_cvtepi32_ps(lo), k));
        _mm_storeu_ps(out + i + 4, _mm_mul_ps(_mm_cvtepi32_ps(hi), k));
    }
    tf_s16le_to_f32_from(pcm, i, n, scale, out);
}

static inline void tf_dot4(const float *const h[4], const float *const x[4], int taps,
                           float *out)
{
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    __m128 a2 = _mm_setzero_ps(), a3 = _mm_setzero_ps();
    int i = 0;
    for (; i + 4 <= taps; i += 4) {
        a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(h[0] + i), _mm_loadu_ps(x[0] + i)));
        a1 = _mm_add_ps(a1, _mm_mul_ps(_mm_loadu_ps(h[1] + i), _mm_loadu_ps(x[1] + i)));
        a2 = _mm_add_ps(a2, _mm_mul_ps(_mm_loadu_ps(h[2] + i), _mm_loadu_ps(x[2] + i)));
        a3 = _mm_add_ps(a3, _mm_mul_ps(_mm_loadu_ps(h[3] + i), _mm_loadu_ps(x[3] + i)));
    }
    /* transpose-and-add: lane j of s is the sum of aj's four lanes */
    __m128 t0 = _mm_add_ps(_mm_unpacklo_ps(a0, a1), _mm_unpackhi_ps(a0, a1));
    __m128 t1 = _mm_add_ps(_mm_unpacklo_ps(a2, a3), _mm_unpackhi_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0)));
    for (; i < taps; i++)
        for (int j = 0; j < 4; j++)
            out[j] += h[j][i] * x[j][i];
}

static inline float tf_dot(const float *h, const float *x, int taps)
{
    __m128 a0 = _mm_setzero_ps(), a1 = _mm_setzero_ps();
    int i = 0;
    for (; i + 8 <= taps; i += 8) {
        a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(h + i), _mm_loadu_ps(x + i)));
        a1 = _mm_add_ps(a1, _mm_mul_ps(_mm_loadu_ps(h + i + 4), _mm_loadu_ps(x + i + 4)));
    }
    for (; i + 4 <= taps; i += 4)
        a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(h + i), _mm_loadu_ps(x + i)));
    a0 = _mm_add_ps(a0, a1);
    float lanes[4];
    _mm_storeu_ps(lanes, a0);
    float acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < taps; i++)
        acc += h[i] * x[i];
    return acc;
}
#elif defined(__ARM_NEON)
#include <arm_neon.h>
static inline void tf_s16le_to_f32(const uint8_t *pcm, int64_t n, float scale, float *out)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int16x8_t v = vreinterpretq_s16_u8(vld1q_u8(pcm + 2 * i));
        vst1q_f32(out + i, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), scale));
        vst1q_f32(out + i + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(v))), scale));
    }
    tf_s16le_to_f32_from(pcm, i, n, scale, out);
}

static inline float tf_dot(const float *h, const float *x, int taps)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= taps; i += 8) {
        a0 = vmlaq_f32(a0, vld1q_f32(h + i), vld1q_f32(x + i));
        a1 = vmlaq_f32(a1, vld1q_f32(h + i + 4), vld1q_f32(x + i + 4));
    }
    for (; i + 4 <= taps; i += 4)
        a0 = vmlaq_f32(a0, vld1q_f32(h + i), vld1q_f32(x + i));
    a0 = vaddq_f32(a0, a1);
    float acc = (vgetq_lane_f32(a0, 0) + vgetq_lane_f32(a0, 1))
              + (vgetq_lane_f32(a0, 2) + vgetq_lane_f32(a0, 3));
    for (; i < taps; i++)
        acc += h[i] * x[i];
    return acc;
}
#else
static inline void tf_s16le_to_f32(const uint8_t *pcm, int64_t n, float scale, float *out)
{
    tf_s16le_to_f32_from(pcm, 0, n, scale, out);
}

static inline float tf_dot(const float *h, const float *x, int taps)
{
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int i = 0;
    for (; i + 4 <= taps; i += 4) {
        a0 += h[i] * x[i];
        a1 += h[i + 1] * x[i + 1];
        a2 += h[i + 2] * x[i + 2];
        a3 += h[i + 3] * x[i + 3];
    }
    float acc = (a0 + a1) + (a2 + a3);
    for (; i < taps; i++)
        acc += h[i] * x[i];
    return acc;
}
#endif

#if !(defined(__SSE2__) || defined(_M_X64))
/* Without SSE2 the four outputs are four dot products (NEON vectorises each one). */
static inline void tf_dot4(const float *const h[4], const float *const x[4], int taps,
                           float *out)
{
    for (int j = 0; j < 4; j++)
        out[j] = tf_dot(h[j], x[j], taps);
}
#endif

#endif
