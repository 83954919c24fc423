/* Speech output kernels: float samples -> int16 little-endian PCM, and a voice's phoneme
 * durations -> viseme cues.
 *
 * tf_f32_to_s16le runs once per synthesized sample, straight into the frame the codec is
 * building (TtsAudioFrame.pcm), so it is written to vectorise: a clamp and a rounding
 * conversion with no branch the compiler cannot turn into a blend. NaN becomes 0 (a model
 * that emits one must not produce a full-scale click).
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

static inline void tf_f32_to_s16le(const float *in, int64_t n, uint8_t *out)
{
    int16_t tmp[256];
    int64_t i = 0;
    while (i < n) {
        int64_t m = n - i < 256 ? n - i : 256;
        for (int64_t k = 0; k < m; k++) {
            float v = in[i + k] * 32767.0f;
            v = (v == v) ? v : 0.0f;               /* NaN -> silence */
            v = v > 32767.0f ? 32767.0f : v;
            v = v < -32768.0f ? -32768.0f : v;
            v = v >= 0.0f ? v + 0.5f : v - 0.5f;   /* round half away from zero */
            tmp[k] = (int16_t)v;
        }
        /* the host is little-endian (tf_codec.h refuses to build otherwise) */
        memcpy(out + 2 * i, tmp, (size_t)m * 2);
        i += m;
    }
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
