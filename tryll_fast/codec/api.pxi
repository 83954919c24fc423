# The Python-facing entry points: decode / encode a frame, any table as a
# standalone root (dialog snapshots), and helpers the generated code calls.

def decode(data, Py_ssize_t offset=0, Py_ssize_t length=-1):
    """Verify and decode one `Message` payload (no length prefix).

    `data` is any bytes-like object; nothing is copied. `length` < 0 means
    to the end of `data`. Raises
    MalformedMessage (5001) or UnknownMessageType (5002) for bad input.
    The returned view keeps `data` alive; read fields from `msg.body`."""
    return _decode(data, offset, length)


cdef Table _decode(object data, Py_ssize_t offset, Py_ssize_t length):
    cdef _Source src = _source_of(data, offset, length)
    cdef _V v
    cdef Py_ssize_t root
    _v_init(&v, src)
    root = _v_root(&v)
    _vf_Message(&v, root, 0)
    return _vw_Message(src, root)


def decode_frame(frame):
    """Decode a whole frame: 4-byte little-endian length, then the payload."""
    cdef _Source src = _source_of(frame, 0, -1)
    cdef Py_ssize_t n
    if src.size < 4:
        raise FramingError(f"a frame needs a 4-byte length, got {src.size} bytes")
    n = tf_ld_u32(src.buf)
    if n == 0 or n > TF_MAX_FRAME:
        raise FramingError(f"frame length {n} is outside 1..{TF_MAX_FRAME}")
    if n != src.size - 4:
        raise MalformedMessage(
            f"malformed message: length prefix says {n} bytes, frame has {src.size - 4}")
    return _decode(frame, 4, n)


def peek_body_type(data, Py_ssize_t offset=0, Py_ssize_t length=-1):
    """The MessageBody tag of a payload without verifying the rest (0 if
    unreadable): lets a server name the request type in an error reply."""
    cdef _Source src
    cdef Table m
    try:
        src = _source_of(data, offset, length)
        if src.size < 8:
            return 0
        m = <Table>_vw_Message(src, tf_ld_u32(src.buf))
        return int(m.body_type)
    except (CodecError, ValueError):
        return 0


cdef frozenset _REQUEST_ID_TAGS = None


def peek_request_id(data, Py_ssize_t offset=0, Py_ssize_t length=-1):
    """The request_id of a payload that may have failed verification, or 0.

    Reads Message.body and the body table's field 0 with bounds checks only,
    and only for body types whose field 0 is request_id (every request and
    reply table, by convention): lets a server echo the id on a 5001/5002
    reply to a frame it cannot otherwise use."""
    global _REQUEST_ID_TAGS
    cdef _Source src
    cdef Table m, body
    cdef Py_ssize_t p
    cdef int tag
    if _REQUEST_ID_TAGS is None:
        _REQUEST_ID_TAGS = frozenset(
            int(member) for member in MessageBody if member.value and
            globals()[member.name].FIELDS[:1] == ("request_id",))
    try:
        src = _source_of(data, offset, length)
        if src.size < 8:
            return 0
        m = Table.__new__(Table)
        _bind(m, src, tf_ld_u32(src.buf))
        p = _tfield(m, 4, 1)                      # Message.body_type
        tag = src.buf[p] if p else 0
        if tag not in _REQUEST_ID_TAGS:
            return 0
        p = _tfield(m, 6, 4)                      # Message.body
        if p == 0:
            return 0
        body = Table.__new__(Table)
        _bind(body, src, _rd_target(src, p))
        p = _tfield(body, 4, 8)                   # field 0: request_id: ulong
        return tf_ld_u64(src.buf + p) if p else 0
    except (CodecError, ValueError, OverflowError):
        return 0


cdef int _ANSWER_TEXT_TAG = MessageBody.AnswerText


cpdef tuple answer_text_of(object frame):
    """(request_id, text) of a whole AnswerText frame (4-byte length prefix), None for any
    other message. Bounds-checked reads, no full verification and no views: for frames
    this process encoded, which a pipeline connection coalesces by the thousand
    (gateway/connection.py); anything unreadable is None."""
    cdef _Source src
    cdef Table m, body
    cdef Py_ssize_t p
    cdef uint64_t rid = 0
    try:
        src = _source_of(frame, 0, -1)
        if src.size < 12 or <Py_ssize_t>tf_ld_u32(src.buf) != src.size - 4:
            return None
        src = _source_of(frame, 4, src.size - 4)
        m = Table.__new__(Table)
        _bind(m, src, tf_ld_u32(src.buf))
        p = _tfield(m, 4, 1)                      # Message.body_type
        if p == 0 or src.buf[p] != _ANSWER_TEXT_TAG:
            return None
        p = _tfield(m, 6, 4)                      # Message.body
        if p == 0:
            return None
        body = Table.__new__(Table)
        _bind(body, src, _rd_target(src, p))
        p = _tfield(body, 4, 8)                   # AnswerText.request_id
        if p:
            rid = tf_ld_u64(src.buf + p)
        return (rid, _rd_string(src, _tfield(body, 8, 4)))     # AnswerText.text
    except (CodecError, ValueError, OverflowError):
        return None


def encode(body):
    """Encode a message body (e.g. `AnswerText(text="hi", ...)`) into a
    complete frame: length prefix + Message{body}. Also accepts a Message.
    Raises EncodeError naming the field for a bad value, FrameTooLarge (5003)
    when the frame would exceed 1 MiB."""
    cdef Message msg
    cdef Builder b
    cdef uint32_t root, o_body
    cdef uint8_t tag
    cdef bytes out
    b = _take_builder()
    try:
        if isinstance(body, Table) and not isinstance(body, Message):
            # the usual case, a body table: Message{body} written without the wrapper
            tag = _tag_MessageBody(body, 'Message.body')
            o_body = _BF_MessageBody[tag](b, body)
            b.start_object(2)
            b.add_u8(0, tag, 0)
            b.add_offset(1, o_body)
            root = b.end_object()
        else:
            if isinstance(body, Message):
                msg = <Message>body
            else:
                msg = Message.__new__(Message)
                msg._v_body = body
            root = _b_Message(b, msg)
        b.finish(root, True, NULL)
        if b.offset() - 4 > TF_MAX_FRAME:
            raise FrameTooLarge(
                f"{type(body).__name__} encodes to {b.offset() - 4} bytes; "
                f"a frame holds at most {TF_MAX_FRAME}")
        out = b.output()
    finally:
        _give_builder(b)
    return out


cpdef bytes encode_answer_text(uint64_t request_id, uint64_t agent_id, str node_name, str text,
                               bint is_delta, bint is_final):
    """The AnswerText frame of the token-streaming hot path, written directly: the same
    bytes as encode(AnswerText(request_id=..., agent_id=..., text=..., is_delta=...,
    is_final=..., node_name=...)) (a test checks it), without building the value objects
    first."""
    cdef Builder b = _take_builder()
    cdef uint32_t o_node, o_text, body, root
    cdef bytes out
    try:
        # children in the field order flatc's Pack() uses: text (slot 2), node_name (slot 5)
        o_text = _cv_string(b, text, 'AnswerText.text')
        o_node = _cv_string(b, node_name, 'AnswerText.node_name')
        b.start_object(6)
        b.add_u64(0, request_id, 0)
        b.add_u64(1, agent_id, 0)
        b.add_offset(2, o_text)
        b.add_u8(3, is_delta, 0)
        b.add_u8(4, is_final, 0)
        b.add_offset(5, o_node)
        body = b.end_object()
        b.start_object(2)
        b.add_u8(0, <uint8_t>MessageBody.AnswerText, 0)
        b.add_offset(1, body)
        root = b.end_object()
        b.finish(root, True, NULL)
        if b.offset() - 4 > TF_MAX_FRAME:
            raise FrameTooLarge(
                f"AnswerText encodes to {b.offset() - 4} bytes; a frame holds at most "
                f"{TF_MAX_FRAME}")
        out = b.output()
    finally:
        _give_builder(b)
    return out


cdef bytes _tts_audio_frame(Builder b, uint64_t request_id, uint64_t agent_id,
                            str node_name, const float* samples, Py_ssize_t n,
                            uint32_t sample_offset, uint32_t sentence_index):
    cdef uint32_t o_pcm, o_node, body, root
    b.reset()
    # children in the order flatc's Pack() writes them: pcm (slot 2), node_name (slot 3)
    b.start_vector(1, 2 * n, 1)
    b.head -= 2 * n
    tf_f32_to_s16le(samples, n, b.buf + b.head)
    o_pcm = b.end_vector(2 * n)
    o_node = _cv_string(b, node_name, 'TtsAudioFrame.node_name')
    b.start_object(6)
    b.add_u64(0, request_id, 0)
    b.add_u64(1, agent_id, 0)
    b.add_offset(2, o_pcm)
    b.add_offset(3, o_node)
    b.add_u32(4, sample_offset, 0)
    b.add_u32(5, sentence_index, 0)
    body = b.end_object()
    b.start_object(2)
    b.add_u8(0, <uint8_t>MessageBody.TtsAudioFrame, 0)
    b.add_offset(1, body)
    root = b.end_object()
    b.finish(root, True, NULL)
    if b.offset() - 4 > TF_MAX_FRAME:
        raise FrameTooLarge(f"TtsAudioFrame encodes to {b.offset() - 4} bytes; a frame "
                            f"holds at most {TF_MAX_FRAME}")
    return b.output()


cdef bint _tts_locate(bytes frame, Py_ssize_t pcm_bytes, Py_ssize_t* pcm_pos,
                      Py_ssize_t* off_pos) noexcept:
    """Where a size-prefixed Message{TtsAudioFrame} built by _tts_audio_frame keeps its
    pcm bytes and its sample_offset; False when the layout is not the one expected (the
    caller then keeps building every frame)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(frame)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(frame)
    cdef Py_ssize_t root, vt, body, bvt, ref, vec
    cdef uint32_t vt_len, voff
    if size < 16:
        return False
    root = 4 + <Py_ssize_t>tf_ld_u32(p + 4)
    if root + 4 > size:
        return False
    vt = root - tf_ld_i32(p + root)
    if vt < 4 or vt + 8 > size:
        return False
    vt_len = tf_ld_u16(p + vt)
    if vt_len < 8:                                  # Message's field 1: the body
        return False
    voff = tf_ld_u16(p + vt + 6)
    ref = root + voff
    if voff == 0 or ref + 4 > size:
        return False
    body = ref + <Py_ssize_t>tf_ld_u32(p + ref)
    if body + 4 > size:
        return False
    bvt = body - tf_ld_i32(p + body)
    if bvt < 4 or bvt + 14 > size:
        return False
    vt_len = tf_ld_u16(p + bvt)
    if vt_len < 14:                                 # TtsAudioFrame's fields 2 (pcm), 4
        return False
    voff = tf_ld_u16(p + bvt + 8)
    ref = body + voff
    if voff == 0 or ref + 4 > size:
        return False
    vec = ref + <Py_ssize_t>tf_ld_u32(p + ref)
    if vec + 4 + pcm_bytes > size or tf_ld_u32(p + vec) != pcm_bytes:
        return False
    voff = tf_ld_u16(p + bvt + 12)
    if voff == 0 or body + voff + 4 > size:
        return False
    pcm_pos[0] = vec + 4
    off_pos[0] = body + voff
    return True


cdef bytes _tts_from_template(bytes tmpl, Py_ssize_t pcm_pos, Py_ssize_t off_pos,
                              const float* samples, Py_ssize_t n, uint32_t sample_offset):
    """A frame laid out as `tmpl`, with these samples and this offset: one allocation, the
    header copied, the samples converted straight into place."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(tmpl)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* d = <uint8_t*>PyBytes_AS_STRING(out)
    cdef const uint8_t* s = <const uint8_t*>PyBytes_AS_STRING(tmpl)
    memcpy(d, s, pcm_pos)
    tf_f32_to_s16le(samples, n, d + pcm_pos)
    memcpy(d + pcm_pos + 2 * n, s + pcm_pos + 2 * n, size - pcm_pos - 2 * n)
    tf_st_u32(d + off_pos, sample_offset)
    return out


cpdef list encode_tts_audio(uint64_t request_id, uint64_t agent_id, str node_name,
                            const float[::1] samples, Py_ssize_t chunk_samples,
                            uint32_t first_offset, uint32_t sentence_index):
    """Synthesized float samples (-1..1) as TtsAudioFrame frames of `chunk_samples` each
    (the last one shorter), converted to int16 little-endian while they are written into
    each frame: no intermediate int16 array, no per-sample Python. Out-of-range samples
    clip, NaN is silence. Frame k carries sample_offset = first_offset + k * chunk_samples.
    The bytes equal encode(TtsAudioFrame(...)) with pcm = the converted chunk (a test
    checks it). Full chunks after the first one written with a non-zero offset copy its
    layout and change only the samples and the offset (no builder pass, one write of
    the samples)."""
    cdef Py_ssize_t n = samples.shape[0]
    cdef Py_ssize_t start = 0, m, pcm_pos = 0, off_pos = 0
    cdef list out = []
    cdef Builder b
    cdef bytes frame, tmpl = None
    if chunk_samples <= 0 or 2 * chunk_samples > TF_MAX_FRAME - 256:
        raise ValueError(f"chunk_samples {chunk_samples} must be in 1..{(TF_MAX_FRAME - 256) // 2}")
    if n and first_offset + <uint64_t>n - 1 > 4294967295u:
        raise ValueError("sample offsets would pass 2**32 (about 54 hours at 22 kHz)")
    b = _take_builder()
    try:
        while start < n:
            m = min(chunk_samples, n - start)
            if tmpl is not None and m == chunk_samples:
                frame = _tts_from_template(tmpl, pcm_pos, off_pos, &samples[start], m,
                                           first_offset + <uint32_t>start)
            else:
                frame = _tts_audio_frame(b, request_id, agent_id, node_name, &samples[start],
                                         m, first_offset + <uint32_t>start, sentence_index)
                # a full chunk with a non-zero offset (the field is written, not elided) is
                # the layout of every later full chunk: only its samples and offset change
                if (tmpl is None and m == chunk_samples and first_offset + start != 0
                        and _tts_locate(frame, 2 * m, &pcm_pos, &off_pos)):
                    tmpl = frame
            out.append(frame)
            start += m
    finally:
        _give_builder(b)
    return out


def encode_root(Table table, bint size_prefix=False):
    """Encode any table as a standalone FlatBuffers root. Roots that declare
    a file_identifier (PersistedDialogSnapshot: TDLG) get it written."""
    cdef object idx = _TINDEX.get(type(table))
    cdef object fid
    cdef const char* fid_p = NULL
    cdef Builder b
    cdef uint32_t root
    cdef bytes out
    if idx is None:
        raise TypeError(f"{type(table).__name__} is not a schema table")
    fid = _FILE_IDS.get(type(table))
    if fid is not None:
        fid_p = PyBytes_AS_STRING(fid)
    b = _take_builder()
    try:
        root = _BF_ALL[<Py_ssize_t>idx](b, table)
        b.finish(root, size_prefix, fid_p)
        if b.offset() - (4 if size_prefix else 0) > TF_MAX_FRAME:
            raise FrameTooLarge(
                f"{type(table).__name__} encodes to {b.offset()} bytes; at most {TF_MAX_FRAME}")
        out = b.output()
    finally:
        _give_builder(b)
    return out


def decode_root(cls, data):
    """Verify and view `data` as a standalone root of table class `cls`
    (checking its file_identifier if the schema declares one)."""
    cdef object idx = _TINDEX.get(cls)
    cdef object fid
    cdef _Source src
    cdef _V v
    cdef Py_ssize_t root
    if idx is None:
        raise TypeError(f"{cls!r} is not a schema table")
    src = _source_of(data, 0, -1)
    _v_init(&v, src)
    root = _v_root(&v)
    fid = _FILE_IDS.get(cls)
    if fid is not None and (src.size < 8 or
                            PyBytes_FromStringAndSize(<const char*>src.buf + 4, 4) != fid):
        raise MalformedMessage(
            f"malformed message: not a {cls.__name__} buffer (file identifier {fid!r} missing)")
    _VF_ALL[<Py_ssize_t>idx](&v, root, 0)
    return _VW_ALL[<Py_ssize_t>idx](src, root)


# -- helpers used by the generated code -------------------------------------

cdef object _as_table(object cls, object x, str where):
    """A table value: an instance of `cls`, or a dict of its fields."""
    if type(x) is cls:
        return x
    if isinstance(x, dict):
        try:
            return cls(**x)
        except TypeError as e:
            raise EncodeError(f"{where}: {e}") from None
    raise EncodeError(f"{where}: expected {cls.__name__} or a dict, got {type(x).__name__}")


cdef object _detach(Table view, object cls):
    """A value copy of a decoded view, so views can be re-encoded. Fields
    absent from the buffer stay absent, so the bytes come out as flatc's
    unpack-then-pack would write them."""
    cdef dict values = {}
    for name, voffset in zip(cls.FIELDS, cls._VOFFSETS):
        if _tfield(view, voffset, 0):
            values[name] = getattr(view, name)
    return cls(**values)


cdef int _vf_nested(_V* v, Py_ssize_t start, Py_ssize_t n, _vf_fn fn, int depth,
                    str where) except -1:
    """Verify a nested_flatbuffer [ubyte] as a root of its own; a failure names the
    field (byte positions are then within the nested buffer)."""
    cdef _V sub
    cdef Py_ssize_t root
    sub.buf = v.buf + start
    sub.size = n
    sub.tables_left = v.tables_left
    sub.work_left = v.work_left
    try:
        root = _v_root(&sub)
        fn(&sub, root, depth)
    except MalformedMessage as e:
        text = str(e)
        if text.startswith("malformed message: "):
            text = text[len("malformed message: "):]
        raise MalformedMessage(f"malformed message: {where} (a nested buffer): {text}") from None
    v.tables_left = sub.tables_left
    v.work_left = sub.work_left
    return 0


cdef bytes _nested_bytes(object x, str where):
    """A nested buffer given as a list of ints, checked like any [ubyte]."""
    cdef str item = where + "[]"
    return bytes([_cv_uint(e, 255, item) for e in _cv_sequence(x, where)])


cdef int _check_nested(object x, Py_ssize_t idx, str where) except -1:
    """A nested_flatbuffer field given to the builder must itself be a valid
    buffer of its table type (empty means absent), or the frame we send
    would fail its reader's verification."""
    cdef _Source src = _source_of(x, 0, -1)
    cdef _V v
    if src.size == 0:
        return 0
    _v_init(&v, src)
    try:
        _VF_ALL[idx](&v, _v_root(&v), 1)
    except CodecError as e:
        raise EncodeError(f"{where}: not a valid nested buffer ({e})") from None
    return 0
