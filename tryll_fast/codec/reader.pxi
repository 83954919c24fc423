# Reading side of the codec: the buffer a frame lives in, the verifier walk,
# bounds-checked field access, and the base class of every generated table.
#
# Decoding is two steps. `decode()` first *verifies* the whole buffer (a C walk
# over the schema, like the C++ flatbuffers::Verifier plus strict UTF-8 for
# strings), so a hostile frame is rejected up front with a typed error that the
# server maps to 5001/5002. Then field access is lazy: a table view only holds
# its position, and each property reads its value from the buffer on demand.
# Reads are bounds-checked again (cheap compares): a caller may hand us a
# mutable buffer (bytearray, memoryview) and change it after verification.

cdef enum:
    MAX_DEPTH = 64          # same limit as flatbuffers::Verifier's default
    MAX_TABLES = 1000000    # same as the C++ verifier's max_tables
    # Work budget: every table, string and vector visited is charged at least
    # the bytes it occupies. A tree costs at most the buffer size; a DAG (one
    # table or string referenced many times) is allowed this factor of reuse
    # before verification stops, so no buffer can make the walk super-linear.
    WORK_FACTOR = 4
    WORK_SLACK = 65536


# The codec's errors are the protocol's (tryll_fast.errors): a CodecError is any 5xxx
# ProtocolError, and MalformedMessage / UnknownMessageType / FrameTooLarge are the classes of
# codes 5001-5003, so what the codec raises is what the server answers with.
from tryll_fast.errors import ErrorCode as _ErrorCode
from tryll_fast.errors import (FrameTooLarge, MalformedMessage, UnknownMessageType,
                               ProtocolError as CodecError)


class FramingError(CodecError):
    """The length prefix is 0 or above 1 MiB: fatal, the connection closes (nothing is
    answered; the code is the nearest one)."""
    code = _ErrorCode.MalformedMessage


class EncodeError(CodecError, TypeError):
    """A value given to the builder does not fit its schema field: the frame would be
    malformed, so it is never built.

    The message names the table, the field and the constraint."""
    code = _ErrorCode.MalformedMessage


cdef object _malformed(str what, Py_ssize_t pos):
    return MalformedMessage(f"malformed message: {what} (at byte {pos})")


# ---------------------------------------------------------------------------
# The source buffer

@cython.final
@cython.no_gc
cdef class _Source:
    """Keeps the decoded buffer alive (and un-resizable) while views exist."""
    cdef Py_buffer view
    cdef bint has_view
    cdef object obj
    cdef const uint8_t* buf
    cdef Py_ssize_t size

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False


cdef _Source _source_of(object data, Py_ssize_t offset, Py_ssize_t length):
    """Wrap `data[offset:offset+length]` (length -1 = to the end) without copying."""
    cdef _Source src = _Source.__new__(_Source)
    cdef Py_ssize_t total
    if PyBytes_CheckExact(data):
        src.buf = <const uint8_t*>PyBytes_AS_STRING(data)
        total = PyBytes_GET_SIZE(data)
    else:
        PyObject_GetBuffer(data, &src.view, PyBUF_SIMPLE)
        src.has_view = True
        src.buf = <const uint8_t*>src.view.buf
        total = src.view.len
    src.obj = data
    if offset < 0 or offset > total:
        raise MalformedMessage(f"malformed message: offset {offset} outside a {total}-byte buffer")
    if length < 0:
        length = total - offset
    elif length > total - offset:
        raise MalformedMessage(
            f"malformed message: {length} bytes wanted, {total - offset} available")
    src.buf += offset
    src.size = length
    return src


@cython.final
@cython.no_gc
cdef class _VectorBuffer:
    """Exports a scalar vector inside a frame through the buffer protocol, so
    `memoryview()` / `numpy.frombuffer()` see it without copying (PCM audio)."""
    cdef _Source src
    cdef Py_ssize_t start
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    cdef const char* fmt

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("decoded frames are read-only")
        view.buf = <void*>(self.src.buf + self.start)
        view.obj = self
        view.len = self.shape[0] * self.strides[0]
        view.readonly = 1
        view.itemsize = self.strides[0]
        view.format = <char*>self.fmt if (flags & PyBUF_FORMAT) else NULL
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef object _scalar_vector(_Source src, Py_ssize_t fieldpos, Py_ssize_t itemsize,
                           const char* fmt):
    """A zero-copy memoryview of the scalar vector whose uoffset is at fieldpos."""
    cdef Py_ssize_t target, n
    cdef _VectorBuffer vb = _VectorBuffer.__new__(_VectorBuffer)
    vb.src = src
    vb.fmt = fmt
    vb.strides[0] = itemsize
    if fieldpos == 0:
        vb.start = 0
        vb.shape[0] = 0
    else:
        target = _rd_target(src, fieldpos)
        n = _rd_vec_len(src, target, itemsize)
        vb.start = target + 4
        vb.shape[0] = n
    return PyMemoryView_FromObject(vb)


# ---------------------------------------------------------------------------
# Bounds-checked reads used by generated accessors (after verification).

cdef inline Py_ssize_t _rd_target(_Source src, Py_ssize_t pos) except -1:
    """Follow the uoffset at `pos`; the target must leave room for a length."""
    cdef Py_ssize_t target
    if pos < 0 or pos > src.size - 4:
        raise _malformed("offset field past the end", pos)
    target = pos + <Py_ssize_t>tf_ld_u32(src.buf + pos)
    if target > src.size - 4:
        raise _malformed("offset points past the end", pos)
    return target


cdef inline Py_ssize_t _rd_vec_len(_Source src, Py_ssize_t target,
                                   Py_ssize_t elemsize) except -1:
    cdef Py_ssize_t n = <Py_ssize_t>tf_ld_u32(src.buf + target)
    if n > (src.size - target - 4) // elemsize:
        raise _malformed("vector runs past the end", target)
    return n


cdef inline str _rd_string_at(_Source src, Py_ssize_t target):
    cdef Py_ssize_t n = <Py_ssize_t>tf_ld_u32(src.buf + target)
    if n > src.size - target - 4:
        raise _malformed("string runs past the end", target)
    # A raw call instead of try/except: saving the exception state on every
    # string read showed up in py-spy. NULL is only reachable when a mutable
    # buffer changed after verification.
    cdef PyObject* r = _PyUnicode_DecodeUTF8_raw(<const char*>(src.buf + target + 4), n, NULL)
    if r == NULL:
        PyErr_Clear()
        raise _malformed("string is not valid UTF-8", target)
    return <str><object>_steal(r)


cdef inline str _rd_string(_Source src, Py_ssize_t fieldpos):
    if fieldpos == 0:
        return ""
    return _rd_string_at(src, _rd_target(src, fieldpos))


cdef inline int _chk(_Source src, Py_ssize_t pos, Py_ssize_t nbytes) except -1:
    if pos < 0 or pos > src.size - nbytes:
        raise _malformed("scalar past the end", pos)
    return 0


@cython.no_gc
cdef class Table:
    """Base of every generated table class.

    An instance is either a *view* (returned by decode, bound to a buffer
    position; `_src` is set) or a *value* (built from keyword arguments by
    the caller, to be encoded). Properties work the same way on both."""
    cdef _Source _src
    cdef Py_ssize_t _pos
    cdef Py_ssize_t _vt
    cdef Py_ssize_t _vtsize

    @property
    def is_view(self):
        """True when this object reads a decoded buffer, False for a value."""
        return self._src is not None

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.to_dict() == (<Table>other).to_dict()

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = None

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({fields})"

    def to_dict(self):
        """Every field as plain Python data (nested tables as dicts,
        unions as {"<Member>": {...}}, byte vectors as bytes)."""
        cdef dict out = {}
        cdef frozenset unions = self.UNION_FIELDS
        for name in self.FIELDS:
            v = getattr(self, name)
            if v is not None and unions and name in unions:
                out[name] = {type(v).__name__: (<Table>v).to_dict()}
            else:
                out[name] = _plain(v)
        return out


cdef inline int _bind(Table t, _Source src, Py_ssize_t pos) except -1:
    """Point a view at the table starting at `pos` (header bounds-checked)."""
    cdef Py_ssize_t vt, vtsize
    if pos < 0 or pos > src.size - 4:
        raise _malformed("table past the end", pos)
    vt = pos - <Py_ssize_t>tf_ld_i32(src.buf + pos)
    if vt < 0 or vt > src.size - 4:
        raise _malformed("vtable outside the buffer", pos)
    vtsize = tf_ld_u16(src.buf + vt)
    if vtsize < 4 or vt + vtsize > src.size:
        raise _malformed("bad vtable size", vt)
    t._src = src
    t._pos = pos
    t._vt = vt
    t._vtsize = vtsize
    return 0


cdef inline Py_ssize_t _tfield(Table t, Py_ssize_t voffset, Py_ssize_t nbytes) except -1:
    """Absolute position of a view's field at `voffset`, or 0 when absent."""
    cdef Py_ssize_t fo
    if voffset >= t._vtsize:
        return 0
    fo = tf_ld_u16(t._src.buf + t._vt + voffset)
    if fo == 0:
        return 0
    fo += t._pos
    if fo > t._src.size - nbytes:
        raise _malformed("field past the end", fo)
    return fo


cdef object _plain(object v):
    if v is None or PyUnicode_CheckExact(v) or PyLong_CheckExact(v) or PyFloat_CheckExact(v) \
            or PyBool_Check(v):
        return v
    if isinstance(v, Table):
        return v.to_dict()
    if isinstance(v, Struct):
        return v.to_tuple()
    if isinstance(v, memoryview):
        if (<memoryview>v).format == "B":
            return bytes(v)
        return v.tolist()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


@cython.no_gc
cdef class Struct:
    """Base of generated struct value classes (small, copied on read)."""

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.to_tuple() == other.to_tuple()

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return hash(self.to_tuple())

    def __repr__(self):
        return f"{type(self).__name__}{self.to_tuple()!r}"


# ---------------------------------------------------------------------------
# The verifier: one C walk over the whole buffer before any field is read.

cdef struct _V:
    const uint8_t* buf
    Py_ssize_t size
    Py_ssize_t tables_left
    Py_ssize_t work_left


cdef inline int _v_init(_V* v, _Source src) except -1:
    v.buf = src.buf
    v.size = src.size
    v.tables_left = MAX_TABLES
    v.work_left = WORK_FACTOR * src.size + WORK_SLACK
    return 0


cdef inline int _v_charge(_V* v, Py_ssize_t cost, Py_ssize_t pos) except -1:
    v.work_left -= cost
    if v.work_left < 0:
        raise _malformed("buffer references the same data too many times", pos)
    return 0


cdef inline Py_ssize_t _v_root(_V* v) except -1:
    cdef Py_ssize_t root
    if v.size < 8:
        raise _malformed(f"{v.size} bytes is shorter than any message", 0)
    root = tf_ld_u32(v.buf)
    if root > v.size - 4:
        raise _malformed("root offset points past the end", 0)
    return root


cdef inline int _v_table(_V* v, Py_ssize_t t, int depth,
                         Py_ssize_t* vt_out, Py_ssize_t* vtsize_out,
                         Py_ssize_t* tsize_out) except -1:
    """Check a table header: soffset, vtable and inline size inside the buffer."""
    cdef Py_ssize_t vt, vtsize, tsize
    if depth > MAX_DEPTH:
        raise _malformed(f"tables nested deeper than {MAX_DEPTH}", t)
    v.tables_left -= 1
    if v.tables_left < 0:
        raise _malformed(f"more than {MAX_TABLES} tables", t)
    if t < 0 or t > v.size - 4:
        raise _malformed("table past the end", t)
    vt = t - <Py_ssize_t>tf_ld_i32(v.buf + t)
    if vt < 0 or vt > v.size - 4:
        raise _malformed("vtable outside the buffer", t)
    vtsize = tf_ld_u16(v.buf + vt)
    if vtsize < 4 or (vtsize & 1) or vt + vtsize > v.size:
        raise _malformed(f"bad vtable size {vtsize}", vt)
    tsize = tf_ld_u16(v.buf + vt + 2)
    if tsize < 4 or t + tsize > v.size:
        raise _malformed(f"bad table size {tsize}", t)
    _v_charge(v, tsize, t)
    vt_out[0] = vt
    vtsize_out[0] = vtsize
    tsize_out[0] = tsize
    return 0


cdef inline Py_ssize_t _v_field(_V* v, Py_ssize_t t, Py_ssize_t vt, Py_ssize_t vtsize,
                                Py_ssize_t tsize, Py_ssize_t voffset,
                                Py_ssize_t nbytes) except -1:
    """Position of a field (0 = absent); it must lie inside its table."""
    cdef Py_ssize_t fo
    if voffset >= vtsize:
        return 0
    fo = tf_ld_u16(v.buf + vt + voffset)
    if fo == 0:
        return 0
    if fo < 4 or fo + nbytes > tsize:
        raise _malformed(f"field at vtable slot {(voffset - 4) // 2} outside its table", t)
    return t + fo


cdef inline Py_ssize_t _v_target(_V* v, Py_ssize_t pos) except -1:
    """Follow a uoffset (pos is inside the buffer already); the target needs
    at least 4 bytes (a length or an soffset)."""
    cdef Py_ssize_t target = pos + <Py_ssize_t>tf_ld_u32(v.buf + pos)
    if target > v.size - 4:
        raise _malformed("offset points past the end", pos)
    return target


cdef inline int _v_string(_V* v, Py_ssize_t target) except -1:
    cdef Py_ssize_t n = <Py_ssize_t>tf_ld_u32(v.buf + target)
    cdef int64_t bad
    if n > v.size - target - 5:
        raise _malformed("string runs past the end", target)
    if v.buf[target + 4 + n] != 0:
        raise _malformed("string without terminator", target)
    _v_charge(v, n + 5, target)
    bad = tf_utf8_invalid_at(v.buf + target + 4, <size_t>n)
    if bad >= 0:
        raise _malformed("string is not valid UTF-8", target + 4 + <Py_ssize_t>bad)
    return 0


cdef inline int _v_string_field(_V* v, Py_ssize_t fpos) except -1:
    if fpos != 0:
        _v_string(v, _v_target(v, fpos))
    return 0


cdef inline Py_ssize_t _v_vector(_V* v, Py_ssize_t target, Py_ssize_t elemsize) except -1:
    """Check a vector's length against the buffer; returns the element count."""
    cdef Py_ssize_t n = <Py_ssize_t>tf_ld_u32(v.buf + target)
    if n > (v.size - target - 4) // elemsize:
        raise _malformed("vector runs past the end", target)
    _v_charge(v, 4 + n * elemsize, target)
    return n


cdef inline int _v_scalar_vector(_V* v, Py_ssize_t fpos, Py_ssize_t elemsize) except -1:
    if fpos != 0:
        _v_vector(v, _v_target(v, fpos), elemsize)
    return 0


cdef inline int _v_string_vector(_V* v, Py_ssize_t fpos) except -1:
    cdef Py_ssize_t target, n, i, e
    if fpos == 0:
        return 0
    target = _v_target(v, fpos)
    n = _v_vector(v, target, 4)
    for i in range(n):
        e = target + 4 + 4 * i
        _v_string(v, _v_target(v, e))
    return 0
