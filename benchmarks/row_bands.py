"""Experiment: MobileNet-v2 on both cores, each process computing half of every layer.

    python benchmarks/row_bands.py                  # 20 s of interleaved timing
    python benchmarks/row_bands.py --seconds 60 --model ../shared/models/mobilenet_v2.onnx

Not part of the package and not run by the tests: a measurement that decides the design of
onnxpy's intra-op parallelism (docs/benchmark.md, "the ninth night"). Python threads cannot
share numpy work on this machine (a GIL handoff puts a thread to sleep for 50-70 us), but a
second *process* can: here a helper process runs the same layers as the main one, on shared
memory, each on its own half.

How the work is split:

- Every layer with a map of more than 7 rows is split by output rows. Each process computes its
  rows of the block's output from the rows of the block's input they need (one halo row on each
  side for a 3x3 depthwise layer, read from the other process's half); the 1x1 expansion, the
  depthwise convolution and the projection of a MobileNet block all run on that band with the
  session's own kernels. One barrier a block: the next block's halo rows must be written.
- 7x7 layers are split by channels (their weights, read cold, dominate): each process expands
  and convolves half the expanded channels, then computes half of the projection's output
  channels from all of them (a second barrier in the block). So is the head: half the last 1x1
  convolution's channels and their average, then half the classes.
- Both processes run OpenBLAS single-threaded; barriers spin on counters in shared memory
  (about 1 us a round trip).

It prints the largest difference from the session's own result, then the medians of the
band-parallel forward pass, ``InferenceSession.run`` and onnxruntime, timed in alternating
blocks of ten calls in one process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import onnxpy  # noqa: E402
from onnxpy.ops import _depthwise as depthwise  # noqa: E402
from onnxpy.ops import fused  # noqa: E402
from onnxpy.runtime.threads import blas_threads  # noqa: E402

DEFAULT_MODEL = REPO.parent / "shared" / "models" / "mobilenet_v2.onnx"
SMALL = 7  # maps of at most this many rows are split by channels
PARTS = 2
CLIP6 = fused._epilogue(np, "Clip", [0.0, 6.0])
Sync = Callable[[], None]


def split(n: int, part: int) -> tuple[int, int]:
    return round(n * part / PARTS), round(n * (part + 1) / PARTS)


def readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False  # derived forms of read-only weights are cached (ops/_derived.py)
    return a


class Model:
    """MobileNet-v2's layers and weights, read from the plan of an onnxpy session."""

    def __init__(self, path: str) -> None:
        self.session = onnxpy.InferenceSession(path)
        plan = next(
            getattr(self.session, a) for a in dir(self.session) if hasattr(getattr(self.session, a), "plan")
        ).plan
        steps, const = plan.steps, plan.constants
        stem, dw1, pj1, f18, gemm = steps[0], steps[1], steps[2], steps[-4], steps[-1]
        self.stem_w, self.stem_b = const[stem.inputs[1]], const[stem.inputs[2]]
        self.dw1_w, self.dw1_b = const[dw1.inputs[1]], const[dw1.inputs[2]]
        w = const[pj1.inputs[1]]
        self.pj1_wt = readonly(w.reshape(w.shape[:2]).T)
        self.pj1_b = const.get(pj1.inputs[2]) if len(pj1.inputs) > 2 else None
        w18 = const[f18.inputs[1]]
        w18t = w18.reshape(w18.shape[:2]).T
        wct = const[gemm.inputs[1]].T
        self.features, self.classes = w18t.shape[1], wct.shape[1]
        self.head = []
        for part in range(PARTS):
            a, b = split(w18t.shape[1], part)
            k0, k1 = split(wct.shape[1], part)
            self.head.append(
                (readonly(w18t[:, a:b]), readonly(const[f18.inputs[2]][a:b]), readonly(wct[:, k0:k1]),
                 readonly(const[gemm.inputs[2]][k0:k1]), (a, b), (k0, k1))
            )  # fmt: skip
        self.blocks = [
            self._block(steps, const, i) for i, s in enumerate(steps) if s.op_type == "PointwiseDepthwiseConv"
        ]

    @staticmethod
    def _block(steps: list[Any], const: dict[int, Any], i: int) -> dict[str, Any]:
        st, pr = steps[i], steps[i + 1]
        kw = st.fn.keywords
        w1, b1, w, b = (const.get(j) for j in st.inputs[1:5])
        w1b1 = fused._augmented_t(w1, b1, np.dtype(np.float32), kw.get("group1", 1), kw.get("shuffle_groups1", 0))
        pw = const[pr.inputs[1]]
        pb = const.get(pr.inputs[2]) if len(pr.inputs) > 2 else None
        pb = np.zeros(pw.shape[0], np.float32) if pb is None else pb
        m, n = w1b1.shape[1], pw.shape[0]
        wt = pw.reshape(n, m).T
        block = {
            "w1b1": readonly(w1b1), "w": w, "b": b, "wt": readonly(wt), "pb": pb, "n": n, "m": m,
            "act1": fused._epilogue(np, kw.get("activation1", ""), kw.get("activation1_params")),
            "act": fused._epilogue(np, kw.get("activation", ""), kw.get("activation_params")),
            "stride": kw["strides"][0], "residual": len(pr.inputs) > 3 and pr.inputs[3] == st.inputs[0],
            "parts": [],
        }  # fmt: skip
        for part in range(PARTS):
            m0, m1 = split(m, part)
            n0, n1 = split(n, part)
            block["parts"].append(
                {"w1b1": readonly(w1b1[:, m0:m1]), "w": readonly(w[m0:m1]), "b": None if b is None else readonly(b[m0:m1]),
                 "wt": readonly(wt[:, n0:n1]), "pb": readonly(pb[n0:n1]), "m": (m0, m1), "n": (n0, n1)}
            )  # fmt: skip
        return block

    def shapes(self) -> list[tuple[int, ...]]:
        """Shared arrays: input, stem output, each block's input and output (channels-last), a
        scratch buffer for 7x7 blocks, the pooled features and the logits."""
        shapes: list[tuple[int, ...]] = [(1, 3, 224, 224), (112, 112, self.stem_w.shape[0])]
        h = 112
        shapes.append((h, h, self.pj1_wt.shape[1]))
        for b in self.blocks:
            h = (h - 1) // b["stride"] + 1
            shapes.append((h, h, b["n"]))
        return [*shapes, (1 << 20,), (self.features,), (self.classes,)]


def views(buf: Any, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    out, offset = [], 4096  # the first page holds the flags
    for shape in shapes:
        out.append(np.ndarray(shape, np.float32, buf, offset))
        offset += (int(np.prod(shape)) * 4 + 4095) // 4096 * 4096
    return out


def stem_rows(md: Model, x: np.ndarray, out: np.ndarray, o0: int, o1: int) -> None:
    lo, hi = max(0, 2 * o0 - 1), min(x.shape[2], 2 * (o1 - 1) + 2)
    top = 1 if o0 == 0 else 0
    bottom = (2 * (o1 - o0 - 1) + 3) - (hi - lo + top)
    y = fused.fused_conv(
        np, x[:, :, lo:hi], md.stem_w, md.stem_b, pads=[top, 1, bottom, 1], strides=[2, 2], kernel_shape=[3, 3],
        activation="Clip", activation_params=[0.0, 6.0], channels_last=1,
    )  # fmt: skip
    out[o0:o1] = y[0].transpose(1, 2, 0)


def first_block_rows(md: Model, x: np.ndarray, out: np.ndarray, o0: int, o1: int) -> None:
    h = x.shape[0]
    lo, hi = max(0, o0 - 1), min(h, o1 + 1)
    band = x[lo:hi].transpose(2, 0, 1)[None]
    top = 1 if o0 == 0 else 0
    y = depthwise.depthwise_channels_last(band, md.dw1_w, md.dw1_b, [top, 1], [o1 - o0, x.shape[1]], [1, 1], CLIP6)
    dst = out[o0:o1].reshape(-1, out.shape[2])
    np.matmul(y[0].transpose(1, 2, 0).reshape(-1, y.shape[1]), md.pj1_wt, out=dst)
    if md.pj1_b is not None:
        dst += md.pj1_b


def block_rows(b: dict[str, Any], x: np.ndarray, out: np.ndarray, o0: int, o1: int) -> None:
    """Output rows [o0, o1) of an inverted residual block, from the input rows they need."""
    h, w, _ = x.shape
    s = b["stride"]
    lo, hi = o0 * s - 1, min(h, (o1 - 1) * s + 2)
    top = 1 if lo < 0 else 0
    band = x[max(lo, 0) : hi].transpose(2, 0, 1)[None]  # NCHW-shaped view of channels-last rows
    ow = (w - 1) // s + 1
    y = depthwise.pointwise_depthwise_channels_last(
        band, b["w1b1"], b["act1"], b["w"], b["b"], [top, 1], [o1 - o0, ow], [s, s], b["act"]
    )
    dst = out[o0:o1].reshape(-1, b["n"])
    np.matmul(y[0].transpose(1, 2, 0).reshape(-1, b["m"]), b["wt"], out=dst)
    dst += b["pb"]
    if b["residual"]:
        dst += x[o0:o1].reshape(-1, b["n"])


def block_channels(
    b: dict[str, Any], x: np.ndarray, out: np.ndarray, scratch: np.ndarray, part: int, sync: Sync
) -> None:
    """A 7x7 block by channels: half the expanded channels, then half the output channels."""
    h, w, _ = x.shape
    s = b["stride"]
    oh = (h - 1) // s + 1
    p = b["parts"][part]
    y = depthwise.pointwise_depthwise_channels_last(
        x.transpose(2, 0, 1)[None], p["w1b1"], b["act1"], p["w"], p["b"], [1, 1], [oh, oh], [s, s], b["act"]
    )
    m0, m1 = p["m"]
    expanded = scratch[: oh * oh * b["m"]].reshape(oh * oh, b["m"])
    expanded[:, m0:m1] = y[0].transpose(1, 2, 0).reshape(-1, m1 - m0)
    sync()  # both halves of the expanded channels are in place
    n0, n1 = p["n"]
    dst = out.reshape(-1, b["n"])[:, n0:n1]
    np.matmul(expanded, p["wt"], out=dst)
    dst += p["pb"]
    if b["residual"]:
        dst += x.reshape(-1, b["n"])[:, n0:n1]


def head(md: Model, x: np.ndarray, pooled: np.ndarray, logits: np.ndarray, part: int, sync: Sync) -> None:
    w18, b18, wc, bc, (a, b), (k0, k1) = md.head[part]
    h = np.matmul(x.reshape(-1, x.shape[2]), w18)
    h += b18
    CLIP6(h)
    pooled[a:b] = h.mean(axis=0)
    sync()
    np.matmul(pooled, wc, out=logits[k0:k1])
    logits[k0:k1] += bc


def forward(md: Model, arrays: list[np.ndarray], part: int, sync: Sync) -> None:
    """This process's part of one forward pass (``sync`` waits for the other part)."""
    x, stem, *acts, scratch, pooled, logits = arrays
    r = split(stem.shape[0], part)
    stem_rows(md, x, stem, *r)
    sync()
    first_block_rows(md, stem, acts[0], *r)
    sync()
    for k, b in enumerate(md.blocks):
        oh = acts[k + 1].shape[0]
        if oh <= SMALL:
            block_channels(b, acts[k], acts[k + 1], scratch, part, sync)
        else:
            block_rows(b, acts[k], acts[k + 1], *split(oh, part))
        sync()
    head(md, acts[-1], pooled, logits, part, sync)
    sync()


class Barrier:
    """Two processes' counters in shared memory: each bumps its own, then spins until the other's
    count reaches it."""

    def __init__(self, flags: np.ndarray, mine: int, theirs: int, start: int) -> None:
        self.flags, self.mine, self.theirs, self.count = flags, mine, theirs, start

    def __call__(self) -> None:
        self.count += 1
        self.flags[self.mine] = self.count
        while self.flags[self.theirs] < self.count:
            pass


def helper(model: str, name: str) -> None:
    """The second process: waits for a run number, computes part 1, reports it done."""
    with blas_threads(1):
        _serve(Model(model), name)


def _serve(md: Model, name: str) -> None:
    shm = shared_memory.SharedMemory(name=name)
    # The creating process unlinks the memory; Python 3.11's tracker would do it on our exit too.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    flags = np.ndarray((64,), np.int64, shm.buf, 0)
    arrays = views(shm.buf, md.shapes())
    flags[9] = 1  # ready
    while True:
        idle = 0
        while flags[0] == flags[1]:
            idle += 1
            if idle > 100_000:  # about 10 ms: sleep, so that an idle helper leaves the core alone
                time.sleep(0.0002)
        run = int(flags[0])
        if run < 0:
            return
        forward(md, arrays, 1, Barrier(flags, 3, 2, run * 1000))
        flags[1] = run


def measure(md: Model, shm: shared_memory.SharedMemory, model: str, seconds: float) -> None:
    import onnxruntime as ort

    flags = np.ndarray((64,), np.int64, shm.buf, 0)
    flags[:] = 0
    arrays = views(shm.buf, md.shapes())
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    arrays[0][...] = x
    name = md.session.get_inputs()[0].name
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r}); import row_bands; "
        f"row_bands.helper({model!r}, {shm.name!r})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        while flags[9] != 1:
            time.sleep(0.01)
        runs = [0]

        def bands() -> np.ndarray:
            with blas_threads(1):  # OpenBLAS single-threaded in both processes while split
                runs[0] += 1
                flags[0] = runs[0]
                forward(md, arrays, 0, Barrier(flags, 2, 3, runs[0] * 1000))
                while flags[1] != runs[0]:
                    pass
            return arrays[-1]

        want = md.session.run(None, {name: x})[0][0]
        got = bands()
        diff = np.abs(got - want).max() / np.abs(want).max()
        print(f"largest difference from the session's result: {diff:.2e} (relative)")
        ort_session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        contenders = {
            "row bands": bands,
            "onnxpy": lambda: md.session.run(None, {name: x}),
            "onnxruntime": lambda: ort_session.run(None, {name: x}),
        }
        medians: dict[str, list[float]] = {k: [] for k in contenders}
        t0 = time.time()
        while time.time() - t0 < seconds:
            for label, fn in contenders.items():
                time.sleep(0.15)  # spinning threads of the previous contender settle
                ts = []
                for _ in range(10):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                medians[label].append(float(np.median(ts)))
        ort_ms = np.median(medians["onnxruntime"]) * 1e3
        for label, v in medians.items():
            ms = np.median(v) * 1e3
            print(f"{label:12s} {ms:6.2f} ms  {ms / ort_ms:4.2f}x onnxruntime")
    finally:
        flags[0] = -1
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    md = Model(args.model)
    shm = shared_memory.SharedMemory(create=True, size=64 << 20)
    try:
        measure(md, shm, args.model, args.seconds)
    finally:
        shm.close()
        shm.unlink()


if __name__ == "__main__":
    main()
