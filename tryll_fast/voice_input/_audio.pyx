# cython: language_level=3
"""The audio path of a voice input, compiled: AudioBuffer PCM (int16 little-endian, any
rate, 1-8 channels) -> 16 kHz mono float32 in a ring buffer, with no per-sample Python.

`Resampler` converts, downmixes and resamples with a windowed-sinc polyphase filter (the
rate ratio reduced to L/M, e.g. 48 kHz -> 16 kHz is 1/3, 44.1 kHz -> 16 kHz 160/441; the
cutoff at the lower of the two Nyquist frequencies, so a 12 kHz tone in 48 kHz audio
does not fold back into the speech band). It keeps the last input samples between calls,
so buffers can be cut anywhere. Latency: `half` input samples (0.5 ms at 48 kHz).

`AudioRing` holds the newest `capacity` samples; samples are addressed by their absolute
index since the ring was created (`written` is the next one), so a reader can ask for any
range still inside the ring (the VAD's windows, a segment to decode).
"""
cimport cython
from libc.math cimport sin, cos, M_PI, floor
from libc.stdint cimport int16_t, int64_t, uint8_t
from libc.string cimport memcpy, memmove
from cpython.mem cimport PyMem_Malloc, PyMem_Free, PyMem_Realloc

import numpy as np

cdef extern from "tf_audio.h":
    float tf_dot(const float* h, const float* x, int taps) nogil
    void tf_dot4(const float** h, const float** x, int taps, float* out) nogil
    void tf_s16le_to_f32(const uint8_t* pcm, int64_t n, float scale, float* out) nogil

OUT_RATE = 16000
MIN_RATE = 8000
MAX_RATE = 192000
MAX_CHANNELS = 8
# filter half-width in output periods: taps per output = 2 x ZEROS / fc input samples
cdef int ZEROS = 6


cdef inline int64_t _gcd(int64_t a, int64_t b) noexcept nogil:
    while b:
        a, b = b, a % b
    return a


cdef inline double _sinc(double x) noexcept nogil:
    if x == 0.0:
        return 1.0
    return sin(M_PI * x) / (M_PI * x)


@cython.final
cdef class AudioRing:
    cdef float* buf
    cdef readonly Py_ssize_t capacity
    cdef readonly int64_t written        # absolute index of the next sample

    def __cinit__(self, Py_ssize_t capacity):
        if capacity <= 0:
            raise ValueError(f"capacity {capacity} must be > 0")
        self.buf = <float*>PyMem_Malloc(capacity * sizeof(float))
        if self.buf == NULL:
            raise MemoryError()
        self.capacity = capacity
        self.written = 0

    def __dealloc__(self):
        PyMem_Free(self.buf)

    cdef void push(self, const float* x, Py_ssize_t n) noexcept nogil:
        cdef Py_ssize_t pos, first
        if n >= self.capacity:               # only the newest capacity samples survive
            x += n - self.capacity
            self.written += n - self.capacity
            n = self.capacity
        pos = self.written % self.capacity
        first = min(n, self.capacity - pos)
        memcpy(self.buf + pos, x, first * sizeof(float))
        if first < n:
            memcpy(self.buf, x + first, (n - first) * sizeof(float))
        self.written += n

    @property
    def oldest(self) -> int:
        """Absolute index of the oldest sample still held."""
        return max(0, self.written - self.capacity)

    def read(self, int64_t start, int64_t stop):
        """Samples [start, stop) as a new float32 array; the part already overwritten or
        not yet written is refused (ValueError)."""
        cdef Py_ssize_t n, pos, first
        if start < self.oldest or stop > self.written or start > stop:
            raise ValueError(f"samples [{start}, {stop}) are not in the ring "
                             f"[{self.oldest}, {self.written})")
        n = stop - start
        out = np.empty(n, dtype=np.float32)
        cdef float[::1] o = out
        if n:
            pos = start % self.capacity
            first = min(n, self.capacity - pos)
            memcpy(&o[0], self.buf + pos, first * sizeof(float))
            if first < n:
                memcpy(&o[first], self.buf, (n - first) * sizeof(float))
        return out

    def append(self, const float[::1] x):
        """Add float samples (tests and tools; AudioBuffers go through a Resampler)."""
        if x.shape[0]:
            self.push(&x[0], x.shape[0])

    def reset(self):
        self.written = 0


@cython.final
cdef class Resampler:
    cdef readonly int in_rate
    cdef readonly int channels
    cdef readonly int up                 # L
    cdef readonly int down               # M
    cdef readonly int half               # input samples each side of an output
    cdef float* table                    # up phases x 2*half taps
    cdef int* advance                    # per phase: input samples to the next output
    cdef int* next_phase                 # per phase: the next output's phase
    cdef float* work                     # mono input not yet consumed (+ history)
    cdef Py_ssize_t work_len
    cdef Py_ssize_t work_cap
    cdef float* out                      # scratch for one call's output
    cdef Py_ssize_t out_cap
    # the next output sits phase/up of an input period after work[base]; stepping by
    # tables, not by dividing a running position (an integer division is ~40 cycles)
    cdef Py_ssize_t base
    cdef int phase
    cdef readonly int64_t samples_in     # input frames consumed (per channel)

    def __cinit__(self, int in_rate, int channels=1):
        cdef int64_t g
        cdef int p, i, taps
        cdef double fc, u, w, total
        if in_rate < MIN_RATE or in_rate > MAX_RATE:
            raise ValueError(f"sample rate {in_rate} Hz outside {MIN_RATE}..{MAX_RATE}")
        if channels < 1 or channels > MAX_CHANNELS:
            raise ValueError(f"{channels} channels outside 1..{MAX_CHANNELS}")
        self.in_rate = in_rate
        self.channels = channels
        g = _gcd(OUT_RATE, in_rate)
        self.up = <int>(OUT_RATE // g)
        self.down = <int>(in_rate // g)
        fc = min(1.0, <double>OUT_RATE / in_rate)       # cutoff, relative to input Nyquist
        self.half = 1 if self.up == 1 and self.down == 1 else <int>(ZEROS / fc + 0.999)
        taps = 2 * self.half
        self.table = <float*>PyMem_Malloc(self.up * taps * sizeof(float))
        self.advance = <int*>PyMem_Malloc(self.up * sizeof(int))
        self.next_phase = <int*>PyMem_Malloc(self.up * sizeof(int))
        self.work_cap = 4096
        self.work = <float*>PyMem_Malloc(self.work_cap * sizeof(float))
        self.out_cap = 4096
        self.out = <float*>PyMem_Malloc(self.out_cap * sizeof(float))
        if (self.table == NULL or self.work == NULL or self.out == NULL
                or self.advance == NULL or self.next_phase == NULL):
            raise MemoryError()
        for p in range(self.up):
            self.advance[p] = (p + self.down) // self.up
            self.next_phase[p] = (p + self.down) % self.up
        # phase p: the output sits p/up of an input period after input sample `base`; tap i
        # reads input base - half + 1 + i, at distance u = p/up + half - 1 - i from it
        for p in range(self.up):
            total = 0.0
            for i in range(taps):
                u = <double>p / self.up + self.half - 1 - i
                if self.up == 1 and self.down == 1:
                    w = 1.0 if u == 0.0 else 0.0
                else:
                    # Blackman window over +-half input samples
                    w = 0.42 + 0.5 * cos(M_PI * u / self.half) + 0.08 * cos(2 * M_PI * u / self.half)
                    w = w * fc * _sinc(fc * u) if -self.half < u < self.half else 0.0
                self.table[p * taps + i] = <float>w
                total += w
            if total != 0.0:
                for i in range(taps):          # unity gain at DC in every phase
                    self.table[p * taps + i] = <float>(self.table[p * taps + i] / total)
        # history: half - 1 zeros before the first sample, which is output position 0
        for i in range(self.half - 1):
            self.work[i] = 0.0
        self.work_len = self.half - 1
        self.base = self.half - 1
        self.phase = 0
        self.samples_in = 0

    def __dealloc__(self):
        PyMem_Free(self.table)
        PyMem_Free(self.advance)
        PyMem_Free(self.next_phase)
        PyMem_Free(self.work)
        PyMem_Free(self.out)

    cdef int _reserve(self, Py_ssize_t work_need, Py_ssize_t out_need) except -1:
        cdef float* p
        if work_need > self.work_cap:
            p = <float*>PyMem_Realloc(self.work, work_need * sizeof(float))
            if p == NULL:
                raise MemoryError()
            self.work = p
            self.work_cap = work_need
        if out_need > self.out_cap:
            p = <float*>PyMem_Realloc(self.out, out_need * sizeof(float))
            if p == NULL:
                raise MemoryError()
            self.out = p
            self.out_cap = out_need
        return 0

    cdef Py_ssize_t _run(self, const uint8_t* pcm, Py_ssize_t nbytes) noexcept nogil:
        """Append the buffer's mono samples to work, write what can be resampled to out;
        returns the number of output samples."""
        cdef Py_ssize_t frames = nbytes // (2 * self.channels)
        cdef Py_ssize_t f, c, n_out = 0, drop, base, last
        cdef int ch = self.channels, taps = 2 * self.half, j, phase
        cdef int16_t s
        cdef float acc, scale = 1.0 / 32768.0
        cdef float* w = self.work + self.work_len
        cdef const float* hs[4]
        cdef const float* xs[4]
        if ch == 1:
            tf_s16le_to_f32(pcm, frames, scale, w)
        else:
            for f in range(frames):
                acc = 0.0
                for c in range(ch):
                    memcpy(&s, pcm + 2 * (f * ch + c), 2)
                    acc += s
                w[f] = acc * scale / ch
        self.work_len += frames
        self.samples_in += frames
        if self.up == 1 and self.down == 1:
            memcpy(self.out, self.work, self.work_len * sizeof(float))
            n_out = self.work_len
            self.work_len = 0
            return n_out
        base, phase = self.base, self.phase
        # an output's last tap is work[base + half]; the last output of four is at most
        # 3 * down / up + 1 input samples after the first
        last = self.work_len - self.half - (3 * self.down) // self.up - 1
        while base < last:
            for j in range(4):
                hs[j] = self.table + phase * taps
                xs[j] = self.work + base - self.half + 1
                base += self.advance[phase]
                phase = self.next_phase[phase]
            tf_dot4(hs, xs, taps, self.out + n_out)
            n_out += 4
        while base + self.half < self.work_len:
            self.out[n_out] = tf_dot(self.table + phase * taps,
                                     self.work + base - self.half + 1, taps)
            n_out += 1
            base += self.advance[phase]
            phase = self.next_phase[phase]
        # keep what the next outputs still read: from base - half + 1 on
        drop = base - self.half + 1
        if drop > 0:
            memmove(self.work, self.work + drop, (self.work_len - drop) * sizeof(float))
            self.work_len -= drop
            base -= drop
        self.base, self.phase = base, phase
        return n_out

    def feed(self, const uint8_t[:] pcm, AudioRing ring):
        """Resample one AudioBuffer's PCM into `ring`; returns the samples written. An odd
        trailing byte, or a partial frame of a multi-channel buffer, is ignored (the
        caller counts it)."""
        cdef Py_ssize_t nbytes = pcm.shape[0]
        cdef Py_ssize_t frames = nbytes // (2 * self.channels)
        cdef Py_ssize_t n_out
        cdef const uint8_t* data = &pcm[0] if nbytes else NULL
        if frames == 0:
            return 0
        self._reserve(self.work_len + frames + 1,
                      ((self.work_len + frames) * self.up) // self.down + 2)
        with nogil:
            n_out = self._run(data, frames * 2 * self.channels)
            ring.push(self.out, n_out)
        return n_out
