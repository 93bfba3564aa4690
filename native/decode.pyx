# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, auto_pickle=False
"""edgeinfer._decode: a decoder's per-frame arithmetic, in one call.

Right after an inference the lane's caches hold ONNX Runtime's working set, not
numpy's: the classification decoder's numpy top-k (argpartition, argsort,
fancy indexing) took 80 µs there and 180 µs after an idle wait, against 7 µs
warm (issue 28). One C loop over the scores does the same in a few µs, with the
GIL released, allocating nothing.
"""
from libc.math cimport expf, INFINITY


def top_k(const float[:, ::1] scores2, Py_ssize_t k, bint softmax, float[:, ::1] out) -> int:
    """The k highest of the scores (a C-contiguous float32 [rows, columns] array, read as one flat row: an
    ONNX classifier's [1, classes] output as it comes, with no reshape), best first, into out[:k] as (class
    index, score) rows; returns how many (min(k, classes, rows of out)). Ties: the lower index first. NaN ranks
    below every number and is published as NaN. softmax: the scores become exp(s - max) / sum(exp(s - max)) over
    all classes (NaN anywhere: all NaN). Another dtype, layout or rank: ValueError (the caller converts)."""
    cdef Py_ssize_t n = scores2.shape[0] * scores2.shape[1], i, j, filled = 0
    cdef float v, key, m = -INFINITY, total = 0.0
    cdef const float* scores
    if n == 0:
        return 0
    scores = &scores2[0, 0]
    if k > n:
        k = n
    if k > out.shape[0]:
        k = out.shape[0]
    if k <= 0:
        return 0
    with nogil:
        for i in range(n):  # insertion into the k best so far, kept sorted in out[:, 1] by key
            v = scores[i]
            key = v if v == v else -INFINITY
            if filled == k and not key > out[k - 1, 1]:
                continue
            j = filled if filled < k else k - 1
            while j > 0 and key > out[j - 1, 1]:
                out[j, 0] = out[j - 1, 0]
                out[j, 1] = out[j - 1, 1]
                j -= 1
            out[j, 0] = <float>i
            out[j, 1] = key
            if filled < k:
                filled += 1
        for j in range(filled):  # the keys back to the scores (a NaN stays NaN)
            out[j, 1] = scores[<Py_ssize_t>out[j, 0]]
        if softmax:
            for i in range(n):
                v = scores[i]
                if v > m or v != v:
                    m = v
                    if v != v:
                        break
            for i in range(n):
                total += expf(scores[i] - m)
            for j in range(filled):
                out[j, 1] = expf(out[j, 1] - m) / total
    return filled
