# Writing side of the codec: a FlatBuffers builder in C.
#
# It follows the reference algorithm step for step (back-to-front growth,
# `prep` alignment relative to the end, vtables trimmed of trailing zeros and
# de-duplicated against every vtable already written, `FinishSizePrefixed`), so
# that for the same sequence of operations it produces the same bytes as the
# official runtime: the conformance tests compare whole frames byte for byte.
# Generated `_b_<Table>` functions drive it in the same order as flatc's
# object-API `Pack()` (children first in field order, then fields in order).

cdef enum:
    _INITIAL_CAPACITY = 1024
    _DEFAULT_LIMIT = 1048576 + 4 + 8    # payload cap + size prefix + slack


@cython.final
cdef class Builder:
    cdef uint8_t* buf
    cdef Py_ssize_t cap          # allocated bytes; data lives in buf[head:cap]
    cdef Py_ssize_t head
    cdef Py_ssize_t minalign
    cdef Py_ssize_t limit        # refuse to grow past this many written bytes
    cdef uint32_t* vt            # field positions (offset from end) of the open table
    cdef Py_ssize_t vt_n
    cdef Py_ssize_t vt_cap
    cdef Py_ssize_t obj_end
    cdef bint nested
    cdef uint32_t* vtables       # written vtables (offset from end), for dedup
    cdef Py_ssize_t n_vtables
    cdef Py_ssize_t cap_vtables
    cdef uint32_t* scratch       # child offsets waiting to become a vector
    cdef Py_ssize_t n_scratch
    cdef Py_ssize_t cap_scratch

    def __cinit__(self, Py_ssize_t initial_capacity=_INITIAL_CAPACITY):
        if initial_capacity < 16:
            initial_capacity = 16
        self.buf = <uint8_t*>PyMem_Malloc(initial_capacity)
        self.vt = <uint32_t*>PyMem_Malloc(64 * sizeof(uint32_t))
        self.vtables = <uint32_t*>PyMem_Malloc(32 * sizeof(uint32_t))
        self.scratch = <uint32_t*>PyMem_Malloc(64 * sizeof(uint32_t))
        if not self.buf or not self.vt or not self.vtables or not self.scratch:
            raise MemoryError()
        self.cap = initial_capacity
        self.vt_cap = 64
        self.cap_vtables = 32
        self.cap_scratch = 64
        self.limit = _DEFAULT_LIMIT
        self.reset()

    def __dealloc__(self):
        PyMem_Free(self.buf)
        PyMem_Free(self.vt)
        PyMem_Free(self.vtables)
        PyMem_Free(self.scratch)

    cdef inline void reset(self):
        self.head = self.cap
        self.minalign = 1
        self.nested = False
        self.n_vtables = 0
        self.n_scratch = 0
        self.vt_n = 0

    cdef inline Py_ssize_t offset(self):
        return self.cap - self.head

    cdef int grow(self, Py_ssize_t needed) except -1:
        """Make room for `needed` more bytes in front of head (doubling,
        data kept at the end like the reference builder)."""
        cdef Py_ssize_t used = self.cap - self.head
        cdef Py_ssize_t newcap = self.cap
        cdef uint8_t* nb
        if used + needed > self.limit:
            raise FrameTooLarge(
                f"encoded message exceeds the {TF_MAX_FRAME}-byte frame limit")
        while newcap - used < needed:
            newcap *= 2
        nb = <uint8_t*>PyMem_Malloc(newcap)
        if not nb:
            raise MemoryError()
        memcpy(nb + newcap - used, self.buf + self.head, used)
        PyMem_Free(self.buf)
        self.buf = nb
        self.head = newcap - used
        self.cap = newcap
        return 0

    cdef inline int prep(self, Py_ssize_t size, Py_ssize_t additional) except -1:
        """Align so that `size` bytes written after `additional` more bytes
        land on a multiple of `size` (measured from the end)."""
        cdef Py_ssize_t align
        if size > self.minalign:
            self.minalign = size
        align = (-(self.cap - self.head + additional)) & (size - 1)
        if self.head < align + size + additional:
            self.grow(align + size + additional)
        if align:
            self.head -= align
            memset(self.buf + self.head, 0, align)
        return 0

    # -- raw placement (space already reserved by prep) --------------------
    cdef inline void put_u8(self, uint8_t x):
        self.head -= 1
        self.buf[self.head] = x

    cdef inline void put_u16(self, uint16_t x):
        self.head -= 2
        tf_st_u16(self.buf + self.head, x)

    cdef inline void put_u32(self, uint32_t x):
        self.head -= 4
        tf_st_u32(self.buf + self.head, x)

    cdef inline void put_u64(self, uint64_t x):
        self.head -= 8
        tf_st_u64(self.buf + self.head, x)

    cdef inline void put_f32(self, float x):
        self.head -= 4
        tf_st_f32(self.buf + self.head, x)

    cdef inline void put_f64(self, double x):
        self.head -= 8
        tf_st_f64(self.buf + self.head, x)

    # -- table fields ------------------------------------------------------
    cdef inline void slot(self, int i):
        self.vt[i] = <uint32_t>(self.cap - self.head)

    cdef inline int add_u8(self, int i, uint8_t x, uint8_t d) except -1:
        if x != d:
            self.prep(1, 0)
            self.put_u8(x)
            self.slot(i)
        return 0

    cdef inline int add_u16(self, int i, uint16_t x, uint16_t d) except -1:
        if x != d:
            self.prep(2, 0)
            self.put_u16(x)
            self.slot(i)
        return 0

    cdef inline int add_u32(self, int i, uint32_t x, uint32_t d) except -1:
        if x != d:
            self.prep(4, 0)
            self.put_u32(x)
            self.slot(i)
        return 0

    cdef inline int add_u64(self, int i, uint64_t x, uint64_t d) except -1:
        if x != d:
            self.prep(8, 0)
            self.put_u64(x)
            self.slot(i)
        return 0

    cdef inline int add_f32(self, int i, double x, double d) except -1:
        # compared in double precision, as the reference builder does
        if x != d:
            self.prep(4, 0)
            self.put_f32(<float>x)
            self.slot(i)
        return 0

    cdef inline int add_f64(self, int i, double x, double d) except -1:
        if x != d:
            self.prep(8, 0)
            self.put_f64(x)
            self.slot(i)
        return 0

    # optional scalars (`= null`): a set value is written whatever it is
    cdef inline int set_u8(self, int i, uint8_t x) except -1:
        self.prep(1, 0)
        self.put_u8(x)
        self.slot(i)
        return 0

    cdef inline int set_u16(self, int i, uint16_t x) except -1:
        self.prep(2, 0)
        self.put_u16(x)
        self.slot(i)
        return 0

    cdef inline int set_u32(self, int i, uint32_t x) except -1:
        self.prep(4, 0)
        self.put_u32(x)
        self.slot(i)
        return 0

    cdef inline int set_u64(self, int i, uint64_t x) except -1:
        self.prep(8, 0)
        self.put_u64(x)
        self.slot(i)
        return 0

    cdef inline int set_f32(self, int i, double x) except -1:
        self.prep(4, 0)
        self.put_f32(<float>x)
        self.slot(i)
        return 0

    cdef inline int set_f64(self, int i, double x) except -1:
        self.prep(8, 0)
        self.put_f64(x)
        self.slot(i)
        return 0

    cdef inline int add_offset(self, int i, uint32_t off) except -1:
        self.prepend_uoffset(off)
        self.slot(i)
        return 0

    cdef inline int prepend_uoffset(self, uint32_t off) except -1:
        self.prep(4, 0)
        self.put_u32(<uint32_t>(self.cap - self.head) - off + 4)
        return 0

    cdef int start_object(self, int nfields) except -1:
        cdef uint32_t* nv
        if self.nested:
            raise RuntimeError("builder: a table is already open")
        if nfields > self.vt_cap:
            nv = <uint32_t*>PyMem_Realloc(self.vt, nfields * sizeof(uint32_t))
            if not nv:
                raise MemoryError()
            self.vt = nv
            self.vt_cap = nfields
        memset(self.vt, 0, nfields * sizeof(uint32_t))
        self.vt_n = nfields
        self.obj_end = self.cap - self.head
        self.nested = True
        return 0

    cdef uint32_t end_object(self) except 0:
        cdef Py_ssize_t obj, n, i, vtbytes, objsize, vpos
        cdef uint32_t* nvt
        cdef const uint8_t* cand
        cdef uint16_t tmp[2]
        cdef bint same
        self.nested = False
        # the soffset to the vtable, patched below
        self.prep(4, 0)
        self.put_u32(0)
        obj = self.cap - self.head
        n = self.vt_n
        while n > 0 and self.vt[n - 1] == 0:
            n -= 1
        vtbytes = (n + 2) * 2
        objsize = obj - self.obj_end
        # look for an identical vtable already in the buffer
        for k in range(self.n_vtables):
            cand = self.buf + self.cap - self.vtables[k]
            if tf_ld_u16(cand) != vtbytes or tf_ld_u16(cand + 2) != objsize:
                continue
            same = True
            for i in range(n):
                if tf_ld_u16(cand + 4 + 2 * i) != (<uint16_t>(obj - self.vt[i]) if self.vt[i] else 0):
                    same = False
                    break
            if same:
                tf_st_i32(self.buf + self.cap - obj,
                          <int32_t>(<Py_ssize_t>self.vtables[k] - obj))
                return <uint32_t>obj
        # write a new vtable in front of the table
        self.prep(2, vtbytes)   # no padding in practice (table is 4-aligned)
        i = n - 1
        while i >= 0:
            self.put_u16(<uint16_t>(obj - self.vt[i]) if self.vt[i] else 0)
            i -= 1
        self.put_u16(<uint16_t>objsize)
        self.put_u16(<uint16_t>vtbytes)
        vpos = self.cap - self.head
        tf_st_i32(self.buf + self.cap - obj, <int32_t>(vpos - obj))
        if self.n_vtables == self.cap_vtables:
            nvt = <uint32_t*>PyMem_Realloc(self.vtables,
                                           2 * self.cap_vtables * sizeof(uint32_t))
            if not nvt:
                raise MemoryError()
            self.vtables = nvt
            self.cap_vtables *= 2
        self.vtables[self.n_vtables] = <uint32_t>vpos
        self.n_vtables += 1
        return <uint32_t>obj

    # -- strings and vectors -----------------------------------------------
    cdef uint32_t create_string(self, const char* s, Py_ssize_t n) except 0:
        self.prep(4, n + 1)
        self.put_u8(0)
        self.head -= n
        memcpy(self.buf + self.head, s, n)
        self.put_u32(<uint32_t>n)
        return <uint32_t>(self.cap - self.head)

    cdef inline int start_vector(self, Py_ssize_t elemsize, Py_ssize_t n,
                                 Py_ssize_t alignment) except -1:
        if n > 0 and elemsize * n > self.limit:
            raise FrameTooLarge(
                f"encoded message exceeds the {TF_MAX_FRAME}-byte frame limit")
        self.prep(4, elemsize * n)
        self.prep(alignment, elemsize * n)
        return 0

    cdef inline uint32_t end_vector(self, Py_ssize_t n):
        self.put_u32(<uint32_t>n)
        return <uint32_t>(self.cap - self.head)

    cdef uint32_t create_raw_vector(self, const void* data, Py_ssize_t n,
                                    Py_ssize_t elemsize, Py_ssize_t alignment) except 0:
        """A vector of n little-endian scalars (or struct images) copied at once."""
        self.start_vector(elemsize, n, alignment)
        self.head -= n * elemsize
        if n:
            memcpy(self.buf + self.head, data, n * elemsize)
        return self.end_vector(n)

    cdef inline uint8_t* reserve(self, Py_ssize_t nbytes):
        """Claim nbytes in front of head (already prepped), zeroed."""
        self.head -= nbytes
        memset(self.buf + self.head, 0, nbytes)
        return self.buf + self.head

    cdef inline int push_scratch(self, uint32_t off) except -1:
        cdef uint32_t* ns
        if self.n_scratch == self.cap_scratch:
            ns = <uint32_t*>PyMem_Realloc(self.scratch,
                                          2 * self.cap_scratch * sizeof(uint32_t))
            if not ns:
                raise MemoryError()
            self.scratch = ns
            self.cap_scratch *= 2
        self.scratch[self.n_scratch] = off
        self.n_scratch += 1
        return 0

    cdef uint32_t offsets_vector(self, Py_ssize_t base) except 0:
        """Turn the scratch offsets pushed since `base` into a vector."""
        cdef Py_ssize_t n = self.n_scratch - base
        cdef Py_ssize_t i
        self.start_vector(4, n, 4)
        i = self.n_scratch - 1
        while i >= base:
            self.prepend_uoffset(self.scratch[i])
            i -= 1
        self.n_scratch = base
        return self.end_vector(n)

    # -- finishing ---------------------------------------------------------
    cdef int finish(self, uint32_t root, bint size_prefix, const char* file_id) except -1:
        cdef Py_ssize_t prepsize = 4
        cdef int i
        if file_id != NULL:
            prepsize += 4
        if size_prefix:
            prepsize += 4
        self.prep(self.minalign, prepsize)
        if file_id != NULL:
            self.prep(4, 4)
            for i in range(3, -1, -1):
                self.put_u8(<uint8_t>file_id[i])
        self.prepend_uoffset(root)
        if size_prefix:
            self.prep(4, 0)
            self.put_u32(<uint32_t>(self.cap - self.head))
        return 0

    cdef bytes output(self):
        return PyBytes_FromStringAndSize(<char*>(self.buf + self.head), self.cap - self.head)


# Builders are pooled: encode() may run on several threads at once (reactor,
# engine, speech), and list.pop/append are atomic under the GIL. One spare builder sits
# in front of the pool: taking and giving it back is a flag flip, no list call (most
# encodes run one at a time). The flag changes with the GIL held and no Python code
# between the test and the flip, so two threads never take it together.
cdef list _builder_pool = []
cdef Builder _spare = Builder()
cdef bint _spare_taken = False


cdef inline Builder _take_builder():
    global _spare_taken
    cdef Builder b
    if not _spare_taken:
        _spare_taken = True
        b = _spare
    else:
        try:
            b = <Builder>_builder_pool.pop()
        except IndexError:
            b = Builder()
    b.reset()
    return b


cdef inline void _give_builder(Builder b):
    global _spare_taken
    if b is _spare:
        _spare_taken = False
    elif len(_builder_pool) < 16 and b.cap <= 4 * 1048576:
        _builder_pool.append(b)


# ---------------------------------------------------------------------------
# Value conversion for the builder: each names the field on failure.

cdef inline object _as_int(object x, str field):
    if PyLong_Check(x):
        return x
    if isinstance(x, float) or not hasattr(x, "__index__"):
        raise EncodeError(f"{field}: expected an int, got {type(x).__name__}")
    return x.__index__()


cdef inline uint64_t _cv_uint(object x, uint64_t maxv, str field) except? 0xFFFFFFFFFFFFFFFF:
    """A Python int in [0, maxv]; the range is checked in C."""
    cdef uint64_t r
    x = _as_int(x, field)
    try:
        r = PyLong_AsUnsignedLongLong(x)
    except OverflowError:
        raise EncodeError(f"{field}: {x} is outside [0, {maxv}]") from None
    if r > maxv:
        raise EncodeError(f"{field}: {x} is outside [0, {maxv}]")
    return r


cdef inline int64_t _cv_int(object x, int64_t minv, int64_t maxv, str field) except? -0x7FFFFFFFFFFFFFFF:
    """A Python int in [minv, maxv]; the range is checked in C."""
    cdef int64_t r
    x = _as_int(x, field)
    try:
        r = PyLong_AsLongLong(x)
    except OverflowError:
        raise EncodeError(f"{field}: {x} is outside [{minv}, {maxv}]") from None
    if r < minv or r > maxv:
        raise EncodeError(f"{field}: {x} is outside [{minv}, {maxv}]")
    return r


cdef inline bint _cv_bool(object x, str field) except -1:
    if x is True:
        return 1
    if x is False:
        return 0
    if PyLong_Check(x):
        return x != 0
    raise EncodeError(f"{field}: expected a bool, got {type(x).__name__}")


cdef inline double _cv_float(object x, str field) except? -1.0:
    if PyFloat_Check(x):
        return PyFloat_AS_DOUBLE(x)
    if not isinstance(x, (str, bytes, bytearray)) and (PyLong_Check(x) or hasattr(x, "__float__")):
        try:
            return float(x)
        except (TypeError, ValueError, OverflowError) as e:
            raise EncodeError(f"{field}: expected a number, got {type(x).__name__} ({e})") from None
    raise EncodeError(f"{field}: expected a number, got {type(x).__name__}")


cdef uint32_t _cv_string(Builder b, object x, str field) except 0:
    """str is written as UTF-8; bytes-like must already be valid UTF-8."""
    cdef const char* p
    cdef Py_ssize_t n
    cdef Py_buffer view
    cdef uint32_t r
    cdef int64_t bad
    if PyUnicode_Check(x):
        try:
            p = PyUnicode_AsUTF8AndSize(x, &n)
        except UnicodeEncodeError as e:
            raise EncodeError(f"{field}: string cannot be encoded as UTF-8 ({e.reason} "
                              f"at index {e.start})") from None
        return b.create_string(p, n)
    if PyBytes_CheckExact(x):
        p = PyBytes_AS_STRING(x)
        n = PyBytes_GET_SIZE(x)
        bad = tf_utf8_invalid_at(<const uint8_t*>p, <size_t>n)
        if bad >= 0:
            raise EncodeError(f"{field}: bytes are not valid UTF-8 (at byte {bad})")
        return b.create_string(p, n)
    if PyObject_CheckBuffer(x):
        PyObject_GetBuffer(x, &view, PyBUF_SIMPLE)
        try:
            bad = tf_utf8_invalid_at(<const uint8_t*>view.buf, <size_t>view.len)
            if bad >= 0:
                raise EncodeError(f"{field}: bytes are not valid UTF-8 (at byte {bad})")
            r = b.create_string(<const char*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)
        return r
    raise EncodeError(f"{field}: expected str, got {type(x).__name__}")


cdef object _cv_sequence(object x, str field):
    """Vectors accept lists and tuples (and any non-string sequence)."""
    if PyList_CheckExact(x) or PyTuple_CheckExact(x):
        return x
    if isinstance(x, (str, bytes, dict)) or not hasattr(x, "__len__"):
        raise EncodeError(f"{field}: expected a list, got {type(x).__name__}")
    return list(x)


cdef inline bint _is_buffer(object x):
    return PyObject_CheckBuffer(x) and not PyUnicode_Check(x)


cdef uint32_t _cv_buffer_vector(Builder b, object x, Py_ssize_t itemsize,
                                const char* fmt, str field) except 0:
    """Fast path for 1-D buffers of the right item type: one memcpy when
    contiguous, a strided copy otherwise (e.g. one channel of stereo PCM).
    A [ubyte] field also takes int16 samples (array.array('h'), numpy int16, a memoryview
    cast to 'h'): PCM travels as [ubyte] holding int16 little-endian, so the samples go in
    as their bytes (the byte order of every host this builds for). Other formats and
    big-endian samples are refused, naming the field.
    Callers check `_is_buffer(x)` first."""
    cdef Py_buffer view
    cdef Py_ssize_t n, i, stride, elem = itemsize
    cdef const uint8_t* src
    cdef uint8_t* dst
    PyObject_GetBuffer(x, &view, PyBUF_RECORDS_RO)
    try:
        if itemsize == 1 and _is_native_int16(view.format, view.itemsize):
            elem = 2
        elif not _format_matches(view.format, view.itemsize, itemsize, fmt):
            raise EncodeError(
                f"{field}: buffer of format {view.format.decode() if view.format else 'B'!r}"
                f" (itemsize {view.itemsize}) does not match element format {fmt.decode()!r}"
                + (" (or int16 samples)" if itemsize == 1 else ""))
        n = view.len // elem
        if view.ndim > 1 or view.strides == NULL:
            # N-D data is taken as flat samples, but only if it is one block
            if not PyBuffer_IsContiguous(&view, b'C'):
                raise EncodeError(f"{field}: a {view.ndim}-D buffer must be C-contiguous")
            stride = elem
        else:
            stride = view.strides[0] if view.ndim == 1 else elem
        if stride == elem:
            return b.create_raw_vector(view.buf, n * elem // itemsize, itemsize, itemsize)
        b.start_vector(itemsize, n * elem // itemsize, itemsize)
        b.head -= n * elem
        dst = b.buf + b.head
        src = <const uint8_t*>view.buf
        for i in range(n):
            memcpy(dst + i * elem, src + i * stride, elem)
        return b.end_vector(n * elem // itemsize)
    finally:
        PyBuffer_Release(&view)


cdef inline bint _is_native_int16(const char* have, Py_ssize_t have_size):
    """An int16 buffer format in native or little-endian order ('h', '<h', '=H', ...)."""
    if have_size != 2 or have == NULL:
        return False
    if have[0] == b'<' or have[0] == b'=' or have[0] == b'@':
        have += 1
    return have[0] == b'h' or have[0] == b'H'


cdef inline bint _format_matches(const char* have, Py_ssize_t have_size,
                                 Py_ssize_t itemsize, const char* want):
    cdef char h, w
    if have_size != itemsize:
        return False
    if have == NULL:
        return itemsize == 1
    # skip a byte-order prefix of native/little order
    if have[0] == b'<' or have[0] == b'=' or have[0] == b'@':
        have += 1
    h = have[0]
    w = want[0]
    if h == w:
        return True
    # bytes/bytearray export 'B'; accept them for any 1-byte type
    if itemsize == 1 and h in b'Bbc?':
        return True
    # numpy and array.array use 'l'/'L' for 64-bit on LP64 (and 'i' / 'I')
    if itemsize == 8 and ((h in b'lq' and w in b'lq') or (h in b'LQ' and w in b'LQ')):
        return True
    if itemsize == 4 and ((h in b'il' and w in b'il') or (h in b'IL' and w in b'IL')):
        return True
    return False
