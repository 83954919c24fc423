# cython: language_level=3
"""The viseme timeline of one synthesized sentence, compiled (csrc/tf_pcm.h).

`cues(ids, durations, classes, hop)`: Piper's phoneme ids, the per-id durations the voice
predicted in the same run as the audio (frames of `hop` samples), and the voice's id ->
viseme class table (visemes.id_classes) -> (offsets: uint32 samples from the sentence's
first sample, visemes: uint8), one cue wherever the mouth shape changes, in time order.
"""
from libc.stdint cimport int8_t, int64_t, uint8_t, uint32_t
from cpython.mem cimport PyMem_Malloc, PyMem_Free

import numpy as np

cdef extern from "tf_pcm.h":
    int64_t tf_viseme_cues(const int64_t* ids, const float* durations, int64_t n,
                           const int8_t* classes, int64_t n_classes, int64_t hop,
                           int8_t* work, uint32_t* offsets, uint8_t* visemes) nogil


def cues(const int64_t[::1] ids, const float[::1] durations, const int8_t[::1] classes,
         int64_t hop):
    cdef int64_t n = ids.shape[0]
    cdef int64_t count
    cdef int8_t* work
    if durations.shape[0] != n:
        raise ValueError(f"{n} ids but {durations.shape[0]} durations")
    if hop <= 0:
        raise ValueError(f"hop {hop} must be > 0")
    offsets = np.empty(max(n, 1), dtype=np.uint32)
    visemes = np.empty(max(n, 1), dtype=np.uint8)
    cdef uint32_t[::1] o = offsets
    cdef uint8_t[::1] v = visemes
    if n == 0:
        return offsets[:0], visemes[:0]
    work = <int8_t*>PyMem_Malloc(n)
    if work == NULL:
        raise MemoryError()
    try:
        with nogil:
            count = tf_viseme_cues(&ids[0], &durations[0], n, &classes[0],
                                   classes.shape[0], hop, work, &o[0], &v[0])
    finally:
        PyMem_Free(work)
    return offsets[:count], visemes[:count]
