# cython: language_level=3, freethreading_compatible=False
# distutils: include_dirs = csrc
"""The compiled FlatBuffers codec (see tryll_fast/codec/__init__.py)."""

cimport cython
from libc.stdint cimport (uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t,
                          uint64_t, int64_t, INT64_MIN)
from libc.string cimport memcpy, memset
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyObject_CheckBuffer,
                             PyBuffer_IsContiguous,
                             PyBUF_SIMPLE, PyBUF_FORMAT, PyBUF_WRITABLE,
                             PyBUF_C_CONTIGUOUS, PyBUF_RECORDS_RO)
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_Check, PyUnicode_CheckExact
from cpython.long cimport PyLong_Check, PyLong_CheckExact, PyLong_AsUnsignedLongLong, PyLong_AsLongLong
from cpython.bool cimport PyBool_Check
from cpython.float cimport PyFloat_Check, PyFloat_CheckExact, PyFloat_AS_DOUBLE
from cpython.list cimport PyList_CheckExact
from cpython.tuple cimport PyTuple_CheckExact
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.memoryview cimport PyMemoryView_FromObject

from cpython.ref cimport PyObject, Py_DECREF
from cpython.exc cimport PyErr_Clear

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    PyObject* _PyUnicode_DecodeUTF8_raw "PyUnicode_DecodeUTF8" (
        const char* s, Py_ssize_t size, const char* errors)

cdef inline object _steal(PyObject* p):
    """Take ownership of a new reference returned by a raw C-API call."""
    cdef object o = <object>p
    Py_DECREF(o)
    return o

cdef extern from "tf_codec.h":
    enum: TF_MAX_FRAME
    uint8_t tf_ld_u8(const uint8_t* p)
    int8_t tf_ld_i8(const uint8_t* p)
    uint16_t tf_ld_u16(const uint8_t* p)
    int16_t tf_ld_i16(const uint8_t* p)
    uint32_t tf_ld_u32(const uint8_t* p)
    int32_t tf_ld_i32(const uint8_t* p)
    uint64_t tf_ld_u64(const uint8_t* p)
    int64_t tf_ld_i64(const uint8_t* p)
    float tf_ld_f32(const uint8_t* p)
    double tf_ld_f64(const uint8_t* p)
    void tf_st_u16(uint8_t* p, uint16_t v)
    void tf_st_u32(uint8_t* p, uint32_t v)
    void tf_st_i32(uint8_t* p, int32_t v)
    void tf_st_u64(uint8_t* p, uint64_t v)
    void tf_st_f32(uint8_t* p, float v)
    void tf_st_f64(uint8_t* p, double v)
    int64_t tf_utf8_invalid_at(const uint8_t* s, size_t n)

cdef extern from "tf_pcm.h":
    void tf_f32_to_s16le(const float* inp, int64_t n, uint8_t* out) nogil

MAX_FRAME = TF_MAX_FRAME

include "reader.pxi"
include "builder.pxi"
include "framing.pxi"
include "_generated.pxi"
include "api.pxi"
