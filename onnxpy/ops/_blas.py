"""Direct calls into the BLAS numpy ships with (its bundled OpenBLAS), for what numpy's API
cannot ask for: a GEMM that adds into its output, C += A @ B (BLAS's beta = 1), a blocked
matrix transpose (OpenBLAS's ?omatcopy extension) and a stack of GEMMs in one call
(?gemm_batch_strided), which OpenBLAS spreads over its threads a whole product at a time.

A residual convolution, relu(W @ X + Z), then needs no separate pass over Z: the GEMM
accumulates into Z's buffer while each tile of it is in cache (ResNet-50's 64->256 layer on its
56x56 map: 1.49 -> 1.06 ms with cold memory). numpy wheels bundle OpenBLAS under a prefixed
symbol name, found here once through ctypes (no compiled code of our own). Where no known
BLAS is found (another numpy build), ``gemm_accumulate`` returns False and callers add with
numpy as before. ctypes releases the GIL during the call, as numpy's own matmul does.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import re
from typing import Any

import numpy as np

from ._derived import derived

# (symbol prefix, integer type): the ILP64 builds numpy wheels ship, then plain LP64 names.
_NAMES = (
    ("scipy_cblas_{}64_", ctypes.c_int64),
    ("cblas_{}64_", ctypes.c_int64),
    ("scipy_cblas_{}", ctypes.c_int),
    ("cblas_{}", ctypes.c_int),
)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

_lib: ctypes.CDLL | None | bool = False
_routines: dict[str, Any] = {}


def openblas_library() -> ctypes.CDLL | None:
    """numpy's bundled OpenBLAS, loaded once (None where numpy has none we can find)."""
    global _lib
    if _lib is False:
        root = os.path.dirname(np.__file__)
        candidates = glob.glob(os.path.join(root, "..", "numpy.libs", "*openblas*")) + glob.glob(
            os.path.join(root, ".dylibs", "*openblas*")
        )
        _lib = None
        for path in candidates:
            try:
                _lib = ctypes.CDLL(path)
                break
            except OSError:
                continue
    return _lib  # type: ignore[return-value]


def _routine(name: str) -> Any:
    """cblas_sgemm / cblas_dgemm / cblas_somatcopy / cblas_domatcopy with argument types set,
    or None."""
    if name not in _routines:
        lib, fn = openblas_library(), None
        if lib is not None:
            for pattern, int_t in _NAMES:
                fn = getattr(lib, pattern.format(name), None)
                if fn is not None:
                    real = ctypes.c_float if name[0] == "s" else ctypes.c_double
                    p = ctypes.c_void_p
                    if name.endswith("gemm"):
                        fn.argtypes = [ctypes.c_int] * 3 + [int_t] * 3 + [real, p, int_t, p, int_t, real, p, int_t]
                    else:  # order, trans, rows, cols, alpha, a, lda, b, ldb
                        fn.argtypes = [ctypes.c_int] * 2 + [int_t] * 2 + [real, p, int_t, p, int_t]
                    fn.restype = None
                    break
        _routines[name] = fn
    return _routines[name]


def _operand(shape: tuple[int, ...], strides: tuple[int, ...], item: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a matrix of this shape and byte strides that BLAS
    can read in place, or None."""
    rows, cols = shape
    s0, s1 = strides
    if (s1 == item or cols == 1) and s0 % item == 0 and s0 // item >= max(1, cols):
        return _NO_TRANS, max(1, s0 // item) if rows > 1 else max(1, cols)
    if (s0 == item or rows == 1) and s1 % item == 0 and s1 // item >= max(1, rows):
        return _TRANS, max(1, s1 // item) if cols > 1 else max(1, rows)
    return None


def gemm_accumulate(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> bool:
    """``c += a @ b`` in one BLAS call, for 2-D float32/float64 host arrays of one dtype with
    ``c``'s rows contiguous; False (and ``c`` untouched) where it cannot."""
    dt = c.dtype
    if not (a.dtype == b.dtype == dt and dt in (np.float32, np.float64)) or a.ndim != 2 or b.ndim != 2 or c.ndim != 2:
        return False
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or c.shape != (m, n) or not c.flags.writeable or min(m, n, k) == 0:
        return False
    fn = _routine("sgemm" if dt == np.float32 else "dgemm")
    item = c.itemsize
    ta, tb = _operand(a.shape, a.strides, item), _operand(b.shape, b.strides, item)
    if fn is None or ta is None or tb is None or c.strides[1] != item or c.strides[0] < n * item:
        return False
    if np.may_share_memory(c, a) or np.may_share_memory(c, b):
        return False
    fn(_ROW_MAJOR, ta[0], tb[0], m, n, k, 1.0, a.ctypes.data, ta[1], b.ctypes.data, tb[1], 1.0, c.ctypes.data,
       c.strides[0] // item)  # fmt: skip
    return True


def transpose_into(src: np.ndarray, dst: np.ndarray) -> bool:
    """``dst[...] = src.T`` in one OpenBLAS ?omatcopy call, for 2-D float32/float64 host arrays
    of one dtype whose rows are contiguous (any row stride); False (and ``dst`` untouched) where
    it cannot. About 3-4x faster than numpy's strided copy, which walks one side element by
    element (136 x 784 float32: 44-65 us against 15; a plain copy takes 10)."""
    dt = src.dtype
    if dst.dtype != dt or dt not in (np.float32, np.float64) or src.ndim != 2 or dst.ndim != 2:
        return False
    rows, cols = src.shape
    item = dt.itemsize
    if dst.shape != (cols, rows) or min(rows, cols) == 0 or not dst.flags.writeable:
        return False
    # A single row's stride is never used: it may be anything (0 for a broadcast).
    lda = cols if rows == 1 else src.strides[0] // item
    ldb = rows if cols == 1 else dst.strides[0] // item
    if (src.strides[1] != item and cols > 1) or (dst.strides[1] != item and rows > 1):
        return False
    if (rows > 1 and src.strides[0] % item) or (cols > 1 and dst.strides[0] % item):
        return False
    if lda < cols or ldb < rows or np.may_share_memory(src, dst):
        return False
    fn = _routine("somatcopy" if dt == np.float32 else "domatcopy")
    if fn is None:
        return False
    fn(_ROW_MAJOR, _TRANS, rows, cols, 1.0, src.ctypes.data, lda, dst.ctypes.data, ldb)
    return True


# -- a stack of products in one call ---------------------------------------------------------------

# numpy's matmul on a stack calls ?gemm once per matrix, and OpenBLAS splits each small product
# over its threads (a fork and a join per matrix). ?gemm_batch_strided hands whole products to
# the threads instead: Winograd's 36 x (196 x 64 @ 64 x 80) 740 -> 575 us, 36 x (64 x 64 @ 64 x
# 448) 2.6 -> 1.4 ms (both alone, hot). In the models (paired runs): Inception v2 -2 to -4%,
# VGG-19 -3.1%, ResNet-50 -2.2 to -2.5%, AlexNet -2.3%; Inception v1 and DenseNet within noise.
#
# Products of at most 100^3 multiply-adds take OpenBLAS's "small matrix" kernels, whose lookup
# crashes (a jump to address 0x160) in the DYNAMIC_ARCH builds numpy ships: OpenBLAS 0.3.31
# (numpy 2.4) and still 0.3.34 (numpy 2.5). Only larger products are sent, and only to versions
# where that threshold was checked: read from the source for 0.3.31; for 0.3.34, products of
# 101^3 and of 1000 x 32 x 32 come out right, where a higher threshold would have crashed.
# Other versions (0.3.32 and 0.3.33 included: not checked) keep numpy's matmul.
_BATCH_MIN_MNK = 100**3
# A stack worth less than this many multiply-adds stays with numpy: waking OpenBLAS's second
# thread and then reading its half of the result from the other core's cache cost more than
# the split saves (BERT's two heads of 128 x 64 @ 64 x 128, 2.1 M: the model +19%).
_BATCH_MIN_TOTAL = 1 << 24
_BATCH_VERSIONS = (((0, 3, 30), (0, 3, 31)), ((0, 3, 34), (0, 3, 34)))  # (first, last) ranges
batching_enabled = True  # tests and A/B timings switch the batched path off here
_batch_routines: dict[str, Any] = {}


def _openblas_config() -> str:
    lib = openblas_library()
    for name in (
        "scipy_openblas_get_config64_",
        "scipy_openblas_get_config",
        "openblas_get_config64_",
        "openblas_get_config",
    ):
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            fn.restype = ctypes.c_char_p
            return (fn() or b"").decode("ascii", "replace")
    return ""


def _batch_routine(dt: np.dtype) -> Any:
    """cblas_?gemm_batch_strided with argument types set, or None (no such routine, or an
    OpenBLAS version not known to be safe with it)."""
    key = dt.char
    if key not in _batch_routines:
        fn = None
        config = _openblas_config()
        found = re.match(r"OpenBLAS (\d+)\.(\d+)\.(\d+)", config)
        version = tuple(int(v) for v in found.groups()) if found else None
        lib = openblas_library()
        if lib is not None and version is not None and any(lo <= version <= hi for lo, hi in _BATCH_VERSIONS):
            name = ("s" if key == "f" else "d") + "gemm_batch_strided"
            # The integer width is the build's (USE64BITINT), whatever the symbol's prefix says:
            # numpy's ILP64 build exports this routine without its usual prefix.
            int_t = ctypes.c_int64 if "USE64BITINT" in config else ctypes.c_int
            for pattern in ("scipy_cblas_{}64_", "cblas_{}64_", "scipy_cblas_{}", "cblas_{}"):
                fn = getattr(lib, pattern.format(name), None)
                if fn is not None:
                    real = ctypes.c_float if key == "f" else ctypes.c_double
                    p, i = ctypes.c_void_p, int_t
                    fn.argtypes = [ctypes.c_int] * 3 + [i] * 3 + [real, p, i, i, p, i, i, real, p, i, i, i]
                    fn.restype = None
                    break
        _batch_routines[key] = fn
    return _batch_routines[key]


def _stack_stride(x: np.ndarray) -> int | None:
    """The byte stride between consecutive matrices of ``x``'s stack with its leading axes
    merged into one (0 for a single matrix), or None where they cannot merge without a copy."""
    lead = [(size, stride) for size, stride in zip(x.shape[:-2], x.strides[:-2], strict=True) if size != 1]
    for (_, outer), (size, inner) in zip(lead, lead[1:], strict=False):
        if outer != inner * size:
            return None
    return lead[-1][1] if lead else 0


def _gemm_stack(a: np.ndarray, b: np.ndarray, out: np.ndarray, count: int) -> bool:
    """``out[i] = a[i] @ b[i]`` over the ``count`` matrices of the stacks (``b`` may be one
    shared 2-D matrix) in one OpenBLAS call; False (and ``out`` untouched) where it cannot."""
    dt = out.dtype
    item = dt.itemsize
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if m * n * k <= _BATCH_MIN_MNK:
        return False  # OpenBLAS's small-matrix kernels crash the process here (see above)
    ta = _operand(a.shape[-2:], a.strides[-2:], item)
    tb = _operand(b.shape[-2:], b.strides[-2:], item)
    ldc = out.strides[-2] // item
    if ta is None or tb is None or out.strides[-1] != item or out.strides[-2] % item or ldc < n:
        return False
    strides = [_stack_stride(a), 0 if b.ndim == 2 else _stack_stride(b), _stack_stride(out)]
    if any(s is None or s < 0 or s % item for s in strides):
        return False
    stride_a, stride_b, stride_c = (s // item for s in strides)  # type: ignore[operator]
    # The products' outputs must not overlap one another (a broadcast out would).
    if stride_c < (m - 1) * ldc + n or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return False
    fn = _batch_routine(dt)
    if fn is None:
        return False
    fn(_ROW_MAJOR, ta[0], tb[0], m, n, k, 1.0, a.ctypes.data, ta[1], stride_a, b.ctypes.data, tb[1], stride_b,
       0.0, out.ctypes.data, ldc, stride_c, count)  # fmt: skip
    return True


def batches(a: Any, b: Any, many: bool = False) -> bool:
    """Whether the host stack ``a @ b`` is one ``stacked_matmul`` sends to OpenBLAS in one
    batched call: float32/float64 operands of one dtype whose shapes match (equal leading
    shapes, or 2-D ``b`` shared by the stack), products and a stack large enough to gain, and
    this OpenBLAS (the layouts are checked by the call itself). With ``many``, a stack of at
    least _BATCH_MANY products is large enough whatever its total."""
    if not (batching_enabled and isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    if a.ndim < 3 or b.ndim < 2:
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if m * n * k <= _BATCH_MIN_MNK:  # first: a decoder step's per-head products stop here
        return False
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        return False
    count = math.prod(a.shape[:-2])
    return (
        count >= 2
        and ((many and count >= _BATCH_MANY) or count * m * n * k >= _BATCH_MIN_TOTAL)
        and (b.ndim == 2 or b.shape[:-2] == a.shape[:-2])
        and b.shape[-2] == k
        and _batch_routine(a.dtype) is not None
    )


# A stack of products just under _BATCH_MIN_MNK may be padded with rows of zeros up to it, so
# that the batched call takes it on both threads, when that adds at most this share of rows.
# Winograd's per-frequency products (alone, hot): 36 x (49 x 128 @ 128 x 128) padded to 62
# rows 412-522 -> 348-351 us, 16 x the same 206 -> 148-150; at 82 rows for 96 input channels
# (1.67x) the padding cost what the second thread saved (141 -> 151, 360 -> 349), at 2.2x more.
# Products with K or N under _PAD_MIN_SIDE lose even at 1.25x: 36 x (196 x 64 @ 64 x 64) padded
# to 245 rows 315 -> 334 us alone, and ResNet-50's three such layers +50-300 us each in the model.
_PAD_MAX_GROWTH = 1.3
_PAD_MIN_SIDE = 96
# Winograd's stacks of at least this many products count by product size only (``many``): each
# thread then takes several whole products (16 x (49 x 128 @ 128 x 160), 16 M multiply-adds:
# 296-301 -> 153-154 us alone). Attention heads keep the total (their results are read next by
# one core; the heads of other models were not measured).
_BATCH_MANY = 8


def padded_rows(count: int, m: int, k: int, n: int, dtype: Any) -> int:
    """Rows per matrix to give a stack of ``count`` (m x k) @ (k x n) products of ``dtype``
    computed by ``stacked_matmul(..., many=True)``: ``m``, or more (rows of zeros to add) where
    that brings each product past the batched call's minimum at little cost. The extra rows of
    the result are garbage to ignore. Without the batched routine (another numpy build) the
    padding would be work for nothing: ``m``."""
    if not batching_enabled or count < _BATCH_MANY or m * k * n > _BATCH_MIN_MNK or min(k, n) < _PAD_MIN_SIDE:
        return m
    if np.dtype(dtype) not in (np.float32, np.float64) or _batch_routine(np.dtype(dtype)) is None:
        return m
    rows = _BATCH_MIN_MNK // (k * n) + 1
    return rows if rows <= _PAD_MAX_GROWTH * m else m


# One-row products (a decoder step's x @ W, a batch-1 head) stream the weight, one
# multiply-add per value read: OpenBLAS's GEMV does that faster when W's longer side runs along
# its rows. Cold weights, one row (alone, alternating): a 3072 x 768 weight 472-637 us as stored
# against 255-407 us through its transpose (N x K rows), 2048 x 2048 654 -> 497, 1536 x 384
# 121 -> 87; the other way round, 768 x 3072 stored as its transpose (Gemm's transB) 389-460
# against 302-354, 512 x 2048 204 -> 150. Under about 2 MB (in cache) neither form wins
# (512 x 512: 85 against 102), and beyond 32 MB neither does either (5632 x 2048: 1715 against
# 1919; 11008 x 4096: 4990 against 5491). A 12-layer, 768-wide GPT-2 decoder step: 22.4 -> 20.0 ms
# (90% of 300 alternating pairs faster). The other form is a derived copy of the constant, so
# those weights are held twice.
_ROW_FORM_MIN_BYTES = 2 << 20
_ROW_FORM_MAX_BYTES = 32 << 20
# From 512 KB, oblong weights (one side at least twice the other) gain as well when cold
# (alone, a 24 MB pass between calls): 1024 x 256 88-100 -> 75-81 us, 768 x 256 67-72 -> 48-63,
# 2048 x 128 83-96 -> 55-71, 1024 x 384 81-110 -> 76-89, and stored transposed 256 x 1024 100
# -> 53; near-square ones do not (512 x 512 73-89 against 66-90, 640 x 640 82-110 against
# 105-116). A 4-layer, 256-wide GPT-2 decoder step (its 1024 x 256 projections): 0.96-0.98
# paired in three runs of 1,000 pairs.
_ROW_FORM_OBLONG_MIN_BYTES = 512 << 10
_OBLONG = 2

# Products of a few rows with such a weight (beam search, a small batch of decoder steps) run
# as one GEMV per row: OpenBLAS's GEMM packs the whole weight for each call, which for a few rows
# costs far more than the products (cold, 768 x 3072 with 2 rows: 989-1251 us as one GEMM,
# 487-664 as two GEMVs, the second reading the weight from cache; 3072 x 768 967-1074 against
# 484-529; 4 rows 0.70-0.84 of the GEMM's time, 6 rows 0.66-0.82, 8 rows 0.87-1.08). A 6-layer,
# 768-wide GPT-2 decoder step, batches of 5 and 6: 0.878 and 0.853 against a cut at 4 rows.
_FEW_ROWS = 6
# Beyond 32 MB each row streams the weight from memory again, so only pairs of rows gain
# (5632 x 2048: 0.59 of the GEMM's time with 2 rows, 1.13 with 4; 4096 x 11008: 0.50, 0.99).
_FEW_ROWS_STREAMED = 2


def one_row_operand(b: Any) -> Any:
    """``b`` for a one-row product ``x @ b``, or the same matrix as a view of a cached copy laid
    out the way GEMV streams faster (see above): for a constant (read-only) 2-D float32/float64
    host weight of 2-32 MB (512 KB for an oblong one) whose longer side does not run along its
    memory rows."""
    size = getattr(b, "nbytes", 0)
    if not _ROW_FORM_OBLONG_MIN_BYTES <= size <= _ROW_FORM_MAX_BYTES:
        return b  # first, as the cheapest test: a batch-1 head's small weights stop here
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype not in (np.float32, np.float64):
        return b
    if b.flags.writeable:
        return b  # fed at run time: a copy per call would cost more than it saves
    k, n = b.shape
    if size < _ROW_FORM_MIN_BYTES and max(k, n) < _OBLONG * min(k, n):
        return b
    if b.flags.c_contiguous:
        if k < n:
            return b  # rows of n > k values already
        flip = True  # rows of n <= k values: read a C-ordered (n, k) copy through its transpose
    elif b.flags.f_contiguous:
        if k >= n:
            return b  # the transpose of a C-ordered (n, k) array (Gemm's transB): rows of k already
        flip = False  # rows of k < n values: a C-ordered copy of b
    else:
        return b
    # The view to return, cached per b: a hit costs 0.3 us, where finding the copy by the
    # memory's address (below) costs 2-5.
    form = derived((b,), ("one-row-view",), lambda: _row_form(b, flip))
    return b if form is None else form


def few_row_product(a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` for a 2-D host ``a`` of 2 to _FEW_ROWS rows and a 2-32 MB float32/float64 2-D
    ``b`` (2 rows beyond 32 MB), one GEMV per row through ``one_row_operand``'s form of b (into
    ``out`` when given: C-contiguous, of the product's shape); None where that does not apply."""
    rows = a.shape[0]
    size = getattr(b, "nbytes", 0)
    if (
        not 2 <= rows <= (_FEW_ROWS if size <= _ROW_FORM_MAX_BYTES else _FEW_ROWS_STREAMED)
        or size < _ROW_FORM_MIN_BYTES
    ):
        return None
    if not isinstance(b, np.ndarray) or b.ndim != 2 or b.dtype not in (np.float32, np.float64):
        return None
    if not isinstance(a, np.ndarray) or a.dtype != b.dtype or a.shape[1] != b.shape[0]:
        return None
    y = np.empty((rows, b.shape[1]), dtype=b.dtype) if out is None else out
    form = one_row_operand(b)
    for r in range(rows):
        np.matmul(a[r : r + 1], form, out=y[r : r + 1])
    return y


def _row_form(b: np.ndarray, flip: bool) -> np.ndarray | None:
    """b in the other layout, from a copy keyed by the array that holds the memory, not by b: a
    view made per call (a Transpose or Reshape of a constant when optimizations are off) then
    finds the copy made the first time. None (use b) for a read-only view of writeable memory,
    which may change between calls."""
    owner = b
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if owner.flags.writeable:
        return None
    tag = ("one-row-form", b.ctypes.data, b.shape, b.strides)
    if flip:
        return derived((owner,), tag, lambda: _read_only(np.ascontiguousarray(b.T))).T
    return derived((owner,), tag, lambda: _read_only(np.ascontiguousarray(b)))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def stacked_matmul(xp: Any, a: Any, b: Any, out: Any = None, many: bool = False) -> Any:
    """``xp.matmul(a, b, out=out)``. A stack times one shared 2-D matrix is one product of
    all the stack's rows; on the host, other stacks of float32/float64 products (equal leading
    shapes) large enough to gain go to OpenBLAS in one batched call."""
    ndim = getattr(a, "ndim", 0)
    if ndim >= 3 and getattr(b, "ndim", 0) == 2 and (out is None or out.flags.c_contiguous):
        # numpy multiplies each matrix of the stack by b on its own: a sequence-first attention
        # projection, (197, 1, 768) @ (768, 2304), was 197 row products (130 ms against 5 ms
        # for one). Rows evenly spaced merge as a view, others in one copy of a, small beside
        # the product.
        rows = math.prod(a.shape[:-1])
        flat = a.reshape(rows, a.shape[-1])
        shape = (*a.shape[:-1], b.shape[-1])
        if rows <= _FEW_ROWS and xp is np:
            if rows == 1:
                b = one_row_operand(b)
            elif (y := few_row_product(flat, b, None if out is None else out.reshape(rows, b.shape[-1]))) is not None:
                return y.reshape(shape) if out is None else out
        if out is None:
            return xp.matmul(flat, b).reshape(shape)
        xp.matmul(flat, b, out=out.reshape(rows, b.shape[-1]))
        return out
    if xp is np and ndim >= 3 and batches(a, b, many):  # ndim first: 2-D products skip the call
        shape = (*a.shape[:-1], b.shape[-1])
        y = np.empty(shape, a.dtype) if out is None else out
        usable = isinstance(y, np.ndarray) and y.shape == shape and y.dtype == a.dtype and y.flags.writeable
        if usable and _gemm_stack(a, b, y, math.prod(a.shape[:-2])):
            return y
    if xp is np and ndim <= 2 and getattr(b, "ndim", 0) == 2:
        if ndim == 1 or a.shape[0] == 1:
            b = one_row_operand(b)
        elif a.shape[0] <= _FEW_ROWS and (out is None or out.flags.c_contiguous):
            y = few_row_product(a, b, out)
            if y is not None:
                return y
    return xp.matmul(a, b, out=out)
