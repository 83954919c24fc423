# cython: language_level=3
# cython: boundscheck=False, wraparound=False
# distutils: language = c++
"""The knowledge stores' vector index: USearch HNSW, cosine distance, a metadata filter
consulted during the graph search (csrc/tf_vindex.hpp says why not the usearch package).

Keys are the store's row numbers. Every call that walks the graph releases the GIL.
"""
from libc.stdint cimport uint8_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.string cimport string

import numpy as np


cdef extern from "tf_vindex.hpp" namespace "tf_vindex" nogil:
    cdef cppclass Index:
        string error
        size_t dim
        cbool init(size_t, size_t, size_t, size_t)
        cbool add(uint64_t, const uint64_t*, const float*, size_t, size_t)
        size_t search(const float*, size_t, const uint8_t*, size_t, uint64_t*, float*)
        cbool save(const char*)
        cbool load(const char*)
        cbool get(uint64_t, float*)
        size_t size()
        size_t expansion_search()
        void set_expansion_search(size_t)
        size_t memory()
        cbool is_cosine()
        cbool is_f32()


class IndexError_(RuntimeError):
    """USearch refused an operation (its message is kept)."""


cdef class VectorIndex:
    """An HNSW index over L2-normalised float32 vectors of `dim` dimensions."""
    cdef Index* _ix

    def __cinit__(self, size_t dim, size_t connectivity=16, size_t expansion_add=128,
                  size_t expansion_search=64):
        self._ix = new Index()
        if dim == 0:
            raise ValueError("dim must be positive")
        if not self._ix.init(dim, connectivity, expansion_add, expansion_search):
            raise IndexError_(self._ix.error.decode("utf-8", "replace"))

    def __dealloc__(self):
        del self._ix

    @property
    def dim(self) -> int:
        return self._ix.dim

    def __len__(self) -> int:
        return self._ix.size()

    @property
    def expansion_search(self) -> int:
        """Candidates kept while walking the graph (USearch's `ef`): recall against time."""
        return self._ix.expansion_search()

    @expansion_search.setter
    def expansion_search(self, size_t value):
        self._ix.set_expansion_search(max(value, 1))

    @property
    def memory(self) -> int:
        """Bytes held by the graph and the vectors."""
        return self._ix.memory()

    def add(self, vectors, size_t threads=1, keys=None) -> None:
        """Add rows under `keys` (one unsigned key each, not in the index yet), or under
        keys continuing from len(self) when keys is None."""
        cdef const float[:, ::1] v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.shape[1] != self._ix.dim:
            raise ValueError(f"vectors have {v.shape[1]} dimensions; the index has "
                             f"{self._ix.dim}")
        cdef size_t n = v.shape[0]
        cdef uint64_t first = self._ix.size()
        cdef const uint64_t[::1] kv
        cdef const uint64_t* kp = NULL
        cdef cbool ok = True
        if n == 0:
            return
        if keys is not None:
            kv = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
            if <size_t>kv.shape[0] != n:
                raise ValueError(f"{kv.shape[0]} keys for {n} vectors")
            kp = &kv[0]
        with nogil:
            ok = self._ix.add(first, kp, &v[0, 0], n, threads)
        if not ok:
            raise IndexError_(self._ix.error.decode("utf-8", "replace"))

    def search(self, query, size_t count, allow=None):
        """(keys int64, distances float32), best first, at most `count`; `allow` is a
        uint8/bool array by key (nonzero = may be returned) or None for every record."""
        cdef const float[::1] q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self._ix.dim:
            raise ValueError(f"the query has {q.shape[0]} dimensions; the index has "
                             f"{self._ix.dim}")
        keys = np.empty(max(count, 1), dtype=np.uint64)
        dist = np.empty(max(count, 1), dtype=np.float32)
        cdef uint64_t[::1] kv = keys
        cdef float[::1] dv = dist
        cdef const uint8_t[::1] av
        cdef const uint8_t* ap = NULL
        cdef size_t alen = 0
        cdef size_t found = 0
        if allow is not None:
            av = np.ascontiguousarray(allow).view(np.uint8)
            alen = av.shape[0]
            if alen == 0:
                return keys[:0].astype(np.int64), dist[:0]
            ap = &av[0]
        if count == 0 or self._ix.size() == 0:
            return keys[:0].astype(np.int64), dist[:0]
        with nogil:
            found = self._ix.search(&q[0], count, ap, alen, &kv[0], &dv[0])
        if found == <size_t>-1:
            raise IndexError_(self._ix.error.decode("utf-8", "replace"))
        return keys[:found].astype(np.int64), dist[:found]

    def vectors(self, keys) -> np.ndarray:
        """The stored (normalised) vectors of `keys`, one row each."""
        k = np.asarray(keys, dtype=np.uint64).reshape(-1)
        out = np.zeros((k.shape[0], self._ix.dim), dtype=np.float32)
        cdef float[:, ::1] ov = out
        cdef Py_ssize_t i
        for i in range(k.shape[0]):
            if not self._ix.get(<uint64_t>k[i], &ov[i, 0]):
                raise KeyError(int(k[i]))
        return out

    def save(self, path) -> None:
        cdef bytes p = str(path).encode("utf-8")
        cdef cbool ok
        cdef const char* cp = p
        with nogil:
            ok = self._ix.save(cp)
        if not ok:
            raise IndexError_(self._ix.error.decode("utf-8", "replace"))

    @staticmethod
    def load(path, size_t expansion_search=64):
        """An index read from a USearch file; IndexError_ when it is not one, or not a
        cosine f32 index."""
        cdef VectorIndex out = VectorIndex.__new__(VectorIndex, 1, 16, 128, expansion_search)
        cdef bytes p = str(path).encode("utf-8")
        cdef const char* cp = p
        cdef cbool ok
        with nogil:
            ok = out._ix.load(cp)
        if not ok:
            raise IndexError_(out._ix.error.decode("utf-8", "replace"))
        if not out._ix.is_cosine() or not out._ix.is_f32():
            raise IndexError_("the file is not a cosine-distance float32 index")
        out._ix.set_expansion_search(expansion_search)
        return out
