/* Speech output kernels: float samples -> int16 little-endian PCM, and a voice's phoneme
 * durations -> viseme cues.
 *
 * tf_f32_to_s16le runs once per synthesized sample, straight into the frame the codec is
 * building (TtsAudioFrame.pcm): scaled by 32767, clamped to the int16 range, rounded to
 * nearest (ties to even). NaN becomes 0 (a model that emits one must not click).
 *
 * tf_viseme_cues walks a sentence's phoneme ids once: each id's class comes from the
 * voice's table (a viseme 0..14, or "carry": the time belongs to the previous or next
 * sound, see tryll_fast/engines/speech/visemes.py), each id lasts durations[i] * hop
 * samples, and a cue is written wherever the mouth shape changes.
 */
#ifndef TF_PCM_H
#define TF_PCM_H

#include <stdint.h>
#include <string.h>

#define TF_CARRY_PREVIOUS (-1)
#define TF_CARRY_NEXT (-2)

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define TF_PCM_SSE2 1
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define TF_PCM_NEON 1
#endif
#include <math.h>

/* One sample: scale, NaN -> 0, clamp, round to nearest (ties to even, as the vector
 * conversions below do), little-endian int16. */
static inline void tf_s16_one(float x, uint8_t *out)
{
    float v = x * 32767.0f;
    if (!(v == v))
        v = 0.0f;
    if (v > 32767.0f)
        v = 32767.0f;
    if (v < -32768.0f)
        v = -32768.0f;
    int16_t s = (int16_t)rintf(v);
    memcpy(out, &s, 2);
}

/* Eight samples a step with SSE2 (every x86-64 CPU) or NEON (every AArch64 CPU): about
 * 0.3 ns a sample, against about 7 for the same C loop, which the compiler does not
 * vectorise (the NaN test and the clamps are control flow to it). */
static inline void tf_f32_to_s16le(const float *in, int64_t n, uint8_t *out)
{
    int64_t k = 0;
#if defined(TF_PCM_SSE2)
    const __m128 scale = _mm_set1_ps(32767.0f);
    const __m128 lo = _mm_set1_ps(-32768.0f), hi = _mm_set1_ps(32767.0f);
    for (; k + 8 <= n; k += 8) {
        __m128 a = _mm_mul_ps(_mm_loadu_ps(in + k), scale);
        __m128 b = _mm_mul_ps(_mm_loadu_ps(in + k + 4), scale);
        a = _mm_and_ps(a, _mm_cmpord_ps(a, a));          /* NaN lanes -> 0 */
        b = _mm_and_ps(b, _mm_cmpord_ps(b, b));
        a = _mm_min_ps(_mm_max_ps(a, lo), hi);
        b = _mm_min_ps(_mm_max_ps(b, lo), hi);
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * k),
                         _mm_packs_epi32(_mm_cvtps_epi32(a), _mm_cvtps_epi32(b)));
    }
#elif defined(TF_PCM_NEON)
    const float32x4_t lo = vdupq_n_f32(-32768.0f), hi = vdupq_n_f32(32767.0f);
    for (; k + 8 <= n; k += 8) {
        float32x4_t a = vmulq_n_f32(vld1q_f32(in + k), 32767.0f);
        float32x4_t b = vmulq_n_f32(vld1q_f32(in + k + 4), 32767.0f);
        a = vbslq_f32(vceqq_f32(a, a), a, vdupq_n_f32(0.0f));
        b = vbslq_f32(vceqq_f32(b, b), b, vdupq_n_f32(0.0f));
        a = vminq_f32(vmaxq_f32(a, lo), hi);
        b = vminq_f32(vmaxq_f32(b, lo), hi);
        int16x8_t s = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(a)), vqmovn_s32(vcvtnq_s32_f32(b)));
        vst1q_s16((int16_t *)(void *)(out + 2 * k), s);
    }
#endif
    for (; k < n; k++)
        tf_s16_one(in[k], out + 2 * k);
}

/* classes[ids[i]] per id (resolved into `work`, int8[n]); writes at most n cues and
 * returns how many. Offsets are samples from the sentence's first sample. */
static inline int64_t tf_viseme_cues(const int64_t *ids, const float *durations, int64_t n,
                                     const int8_t *classes, int64_t n_classes, int64_t hop,
                                     int8_t *work, uint32_t *offsets, uint8_t *visemes)
{
    int8_t next = 0;                       /* silence after the last sound */
    for (int64_t i = n - 1; i >= 0; i--) {
        int64_t id = ids[i];
        int8_t c = (id >= 0 && id < n_classes) ? classes[id] : TF_CARRY_PREVIOUS;
        if (c == TF_CARRY_NEXT)
            c = next;
        else if (c >= 0)
            next = c;
        work[i] = c;
    }
    int8_t prev = 0;                       /* silence before the first sound */
    int64_t count = 0;
    int64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        int8_t c = work[i];
        if (c < 0)
            c = prev;
        if (count == 0 || c != visemes[count - 1]) {
            offsets[count] = (uint32_t)(pos * hop);
            visemes[count] = (uint8_t)c;
            count++;
        }
        prev = c;
        float d = durations[i];
        pos += d > 0.0f ? (int64_t)(d + 0.5f) : 0;   /* whole frames (a Ceil output) */
    }
    return count;
}

#endif
