"""Resource limits: allocations sized by data are checked against the session's byte budget
before anything is allocated; negative dimensions and out-of-range indices are refused, and
every such error names the node.

The budget comes from the session config entry 'session.max_allocation_bytes' (1 MiB here).
The values that size the allocation are fed at run time (not initializers), so constant
folding at creation never sees them and the run itself must refuse them.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import make_model, vinfo

BUDGET = 1 << 20
BIG = 1 << 40  # elements: far over the budget, far under what Python integers hold

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _session(model: Any, budget: int = BUDGET) -> onnxpy.InferenceSession:
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.max_allocation_bytes", str(budget))
    return onnxpy.InferenceSession(model.SerializeToString(), so)


def _node_model(
    op: str,
    feeds: dict[str, np.ndarray],
    attrs: dict[str, Any] | None = None,
    opset: int = 18,
    domain: str = "",
    n_outputs: int = 1,
) -> tuple[Any, dict[str, np.ndarray]]:
    """(model, feeds): one node named 'victim' whose inputs are all graph inputs, fed at run
    time. A feed named '_...' is an omitted optional input."""
    names = [n if not n.startswith("_") else "" for n in feeds]
    outs = ["y"] + [f"y{k}" for k in range(1, n_outputs)]
    node = helper.make_node(op, names, outs, name="victim", domain=domain or None, **(attrs or {}))
    elem = {
        np.dtype(np.float32): F,
        np.dtype(np.int64): I64,
        np.dtype(np.uint8): TensorProto.UINT8,
        np.dtype(bool): TensorProto.BOOL,
    }
    inputs = [vinfo(n, elem[v.dtype], list(v.shape)) for n, v in feeds.items() if not n.startswith("_")]
    extra = {"ai.onnx.ml": 3} if domain == "ai.onnx.ml" else None
    # Outputs declared without an element type: inference gives each the type its op makes
    # (an int64 Range, say), which a declared float would contradict.
    model = make_model(
        [node], inputs, [vinfo(o, TensorProto.UNDEFINED, None) for o in outs], opset=opset, extra_opsets=extra
    )
    return model, {n: v for n, v in feeds.items() if not n.startswith("_")}


def _i(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _f(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def _png_header(width: int, height: int) -> np.ndarray:
    """A PNG whose header claims width x height RGB pixels, with one tiny compressed row."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    return np.frombuffer(body, dtype=np.uint8).copy()


# (id, model, feeds): each run must be refused for its size, naming the node.
OVER_BUDGET = [
    ("ConstantOfShape", lambda: _node_model("ConstantOfShape", {"shape": _i(BIG, 4)})),
    ("Expand", lambda: _node_model("Expand", {"x": _f(1.0), "shape": _i(BIG, 2)})),
    ("Tile", lambda: _node_model("Tile", {"x": _f(1.0, 2.0), "repeats": _i(BIG)})),
    (
        "Resize-scales",
        lambda: _node_model(
            "Resize", {"x": np.ones((1, 1, 2, 2), np.float32), "_roi": _f(), "scales": _f(1, 1, 1e6, 1e6)}
        ),
    ),
    (
        "Resize-sizes",
        lambda: _node_model(
            "Resize", {"x": np.ones((1, 1, 2, 2), np.float32), "_roi": _f(), "_scales": _f(), "sizes": _i(1, 1, BIG, 2)}
        ),
    ),
    ("Upsample-9", lambda: _node_model("Upsample", {"x": np.ones((1, 2), np.float32), "scales": _f(1, 1e9)}, opset=9)),
    (
        "Upsample-7",
        lambda: _node_model("Upsample", {"x": np.ones((1, 2), np.float32)}, {"scales": [1.0, 1e9]}, opset=7),
    ),
    ("Range-int", lambda: _node_model("Range", {"a": _i(0), "b": _i(BIG), "c": _i(1)})),
    (
        "Range-float",
        lambda: _node_model("Range", {"a": _f(0).reshape(()), "b": _f(1e12).reshape(()), "c": _f(1).reshape(())}),
    ),
    ("Pad-11", lambda: _node_model("Pad", {"x": _f(1, 2), "pads": _i(0, BIG)})),
    ("Pad-2", lambda: _node_model("Pad", {"x": _f(1, 2)}, {"pads": [0, BIG]}, opset=2)),
    ("OneHot", lambda: _node_model("OneHot", {"i": _i(0, 1), "depth": _i(BIG), "v": _f(0, 1)})),
    ("RandomNormal", lambda: _node_model("RandomNormal", {}, {"shape": [BIG, 2]})),
    ("RandomUniform", lambda: _node_model("RandomUniform", {}, {"shape": [BIG, 2]})),
    ("Multinomial", lambda: _node_model("Multinomial", {"x": np.zeros((1, 2), np.float32)}, {"sample_size": 1 << 30})),
    ("DFT", lambda: _node_model("DFT", {"x": np.ones((1, 4, 1), np.float32), "n": _i(BIG).reshape(())}, opset=17)),
    ("HannWindow", lambda: _node_model("HannWindow", {"n": _i(BIG).reshape(())}, opset=17)),
    (
        "MelWeightMatrix",
        lambda: _node_model(
            "MelWeightMatrix",
            {
                "bins": _i(1 << 20).reshape(()),
                "dft": _i(1 << 21).reshape(()),
                "rate": _i(16000).reshape(()),
                "lo": _f(0).reshape(()),
                "hi": _f(8000).reshape(()),
            },
            opset=17,
        ),
    ),
    ("CenterCropPad", lambda: _node_model("CenterCropPad", {"x": _f(1, 2), "shape": _i(BIG)})),
    (
        "AffineGrid",
        lambda: _node_model(
            "AffineGrid", {"theta": np.ones((1, 2, 3), np.float32), "size": _i(1, 1, 1 << 20, 1 << 20)}, opset=20
        ),
    ),
    (
        "Col2Im",
        lambda: _node_model(
            "Col2Im",
            {"x": np.ones((1, 1, 1), np.float32), "image": _i(1 << 20, 1 << 20), "block": _i(1, 1)},
            {"strides": [1 << 20, 1 << 20]},  # one block position: a one-element input
        ),
    ),
    ("ImageDecoder", lambda: _node_model("ImageDecoder", {"png": _png_header(1 << 20, 1 << 20)}, opset=20)),
    (
        "RoiAlign",
        lambda: _node_model(
            "RoiAlign",
            {"x": np.ones((1, 1, 2, 2), np.float32), "rois": np.zeros((1, 4), np.float32), "b": _i(0)},
            {"output_height": 1 << 16, "output_width": 1 << 16},
            opset=16,
        ),
    ),
    (
        "TfIdfVectorizer",
        lambda: _node_model(
            "TfIdfVectorizer",
            {"x": _i(1, 2)},
            {
                "max_gram_length": 1,
                "min_gram_length": 1,
                "max_skip_count": 0,
                "mode": "TF",
                "ngram_counts": [0],
                "ngram_indexes": [BIG],
                "pool_int64s": [1],
            },
        ),
    ),
    (
        "FeatureVectorizer",
        lambda: _node_model(
            "FeatureVectorizer", {"x": np.ones((2, 1), np.float32)}, {"inputdimensions": [1 << 30]}, domain="ai.onnx.ml"
        ),
    ),
    (
        "TreeEnsembleRegressor",
        lambda: _node_model(
            "TreeEnsembleRegressor",
            {"x": np.ones((2, 1), np.float32)},
            {
                "n_targets": 1 << 30,
                "nodes_featureids": [0],
                "nodes_modes": ["LEAF"],
                "nodes_nodeids": [0],
                "nodes_treeids": [0],
                "nodes_values": [0.0],
                "nodes_truenodeids": [0],
                "nodes_falsenodeids": [0],
                "target_ids": [0],
                "target_nodeids": [0],
                "target_treeids": [0],
                "target_weights": [1.0],
            },
            domain="ai.onnx.ml",
        ),
    ),
]


@pytest.mark.parametrize("make", [c[1] for c in OVER_BUDGET], ids=[c[0] for c in OVER_BUDGET])
def test_data_sized_allocation_over_budget_is_refused(make: Any) -> None:
    model, feeds = make()
    sess = _session(model)
    with pytest.raises(onnxpy.RuntimeException) as e:
        sess.run(None, feeds)
    msg = str(e.value)
    assert "victim" in msg, msg
    assert "budget" in msg, msg


def test_product_of_dimensions_beyond_int64_is_over_budget() -> None:
    model, feeds = _node_model("ConstantOfShape", {"shape": _i(1 << 62, 1 << 62, 1 << 62)})
    with pytest.raises(onnxpy.RuntimeException, match="victim.*budget"):
        _session(model).run(None, feeds)


def test_default_budget_refuses_more_than_memory_without_any_config() -> None:
    model, feeds = _node_model("ConstantOfShape", {"shape": _i(1 << 50)})
    with pytest.raises(onnxpy.RuntimeException, match="victim.*budget"):
        onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)


def test_constant_folding_at_creation_allocates_nothing_huge() -> None:
    """A ConstantOfShape whose shape is an initializer is folded at creation when it fits; a huge
    one must not be, and the run then names the node."""
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], name="victim")
    model = make_model([node], [], [vinfo("y", F, None)], initializers={"shape": _i(1 << 50)})
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(onnxpy.RuntimeException, match="victim.*budget"):
        sess.run(None, {})


NEGATIVE = [
    ("ConstantOfShape", lambda: _node_model("ConstantOfShape", {"shape": _i(2, -1)})),
    ("Expand", lambda: _node_model("Expand", {"x": _f(1.0), "shape": _i(-3)})),
    ("Tile", lambda: _node_model("Tile", {"x": _f(1.0, 2.0), "repeats": _i(-2)})),
    ("Reshape", lambda: _node_model("Reshape", {"x": _f(1, 2, 3, 4), "shape": _i(-2, -2)})),
    ("OneHot", lambda: _node_model("OneHot", {"i": _i(0, 1), "depth": _i(-5), "v": _f(0, 1)})),
    ("RandomNormal", lambda: _node_model("RandomNormal", {}, {"shape": [2, -1]})),
    (
        "Resize-sizes",
        lambda: _node_model(
            "Resize", {"x": np.ones((1, 1, 2, 2), np.float32), "_roi": _f(), "_scales": _f(), "sizes": _i(1, 1, -4, 2)}
        ),
    ),
    ("CenterCropPad", lambda: _node_model("CenterCropPad", {"x": _f(1, 2), "shape": _i(-7)})),
    ("Range", lambda: _node_model("Range", {"a": _i(0), "b": _i(10), "c": _i(0)})),
    ("HannWindow", lambda: _node_model("HannWindow", {"n": _i(-5).reshape(())}, opset=17)),
]

OUT_OF_RANGE = [
    ("Gather", lambda: _node_model("Gather", {"x": _f(1, 2, 3), "i": _i(0, 7)})),
    ("Gather-negative", lambda: _node_model("Gather", {"x": _f(1, 2, 3), "i": _i(-4)})),
    (
        "GatherElements",
        lambda: _node_model("GatherElements", {"x": np.ones((2, 2), np.float32), "i": np.array([[0, 5]], np.int64)}),
    ),
    (
        "GatherND",
        lambda: _node_model("GatherND", {"x": np.ones((2, 2), np.float32), "i": np.array([[3, 0]], np.int64)}),
    ),
    (
        "ScatterND",
        lambda: _node_model("ScatterND", {"x": _f(1, 2, 3), "i": np.array([[9]], np.int64), "u": _f(5)}),
    ),
    (
        "ScatterElements",
        lambda: _node_model("ScatterElements", {"x": _f(1, 2, 3), "i": _i(-9), "u": _f(5)}),
    ),
    ("TopK", lambda: _node_model("TopK", {"x": _f(1, 2, 3), "k": _i(5)}, n_outputs=2)),
    ("Compress", lambda: _node_model("Compress", {"x": _f(1, 2), "c": np.ones(5, bool)}, {"axis": 0})),
    ("Split", lambda: _node_model("Split", {"x": _f(1, 2, 3), "s": _i(2, 5)})),
    ("Slice-axes", lambda: _node_model("Slice", {"x": _f(1, 2, 3), "s": _i(0), "e": _i(1), "a": _i(4)})),
    ("Transpose", lambda: _node_model("Transpose", {"x": np.ones((2, 3), np.float32)}, {"perm": [0, 5]})),
    ("Concat-axis", lambda: _node_model("Concat", {"x": _f(1, 2), "z": _f(3)}, {"axis": 3})),
]


def _assert_refused_naming_node(model: Any, feeds: dict[str, np.ndarray]) -> None:
    sess = _session(model)
    with pytest.raises(onnxpy.OnnxpyError) as e:
        sess.run(None, feeds)
    assert "victim" in str(e.value), str(e.value)
    assert isinstance(e.value, (onnxpy.RuntimeException, onnxpy.InvalidArgument)), repr(e.value)


@pytest.mark.parametrize("make", [c[1] for c in NEGATIVE], ids=[c[0] for c in NEGATIVE])
def test_negative_dimensions_are_refused_naming_the_node(make: Any) -> None:
    _assert_refused_naming_node(*make())


@pytest.mark.parametrize("make", [c[1] for c in OUT_OF_RANGE], ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_indices_are_refused_naming_the_node(make: Any) -> None:
    _assert_refused_naming_node(*make())


def test_session_still_runs_after_a_refused_allocation() -> None:
    model, feeds = _node_model("ConstantOfShape", {"shape": _i(BIG, 1)})
    sess = _session(model)
    with pytest.raises(onnxpy.RuntimeException, match="budget"):
        sess.run(None, feeds)
    out = sess.run(None, {"shape": _i(3, 2)})[0]
    np.testing.assert_array_equal(out, np.zeros((3, 2), np.float32))


def _lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    out = np.empty_like(x, dtype=np.float64)
    for i in range(c):
        window = (x[:, max(0, i - lo) : min(c, i + hi + 1)].astype(np.float64) ** 2).sum(axis=1)
        out[:, i] = x[:, i] / (bias + alpha / size * window) ** beta
    return out


@pytest.mark.parametrize("size", [3, 7, (1 << 31) - 1])
def test_lrn_size_attribute_does_not_size_an_allocation(size: int) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    model, feeds = _node_model("LRN", {"x": x}, {"size": size, "alpha": 0.5, "beta": 0.75, "bias": 1.0})
    out = _session(model).run(None, feeds)[0]
    np.testing.assert_allclose(out, _lrn_reference(x, size, 0.5, 0.75, 1.0), rtol=1e-5, atol=1e-6)


def test_quantize_block_size_attribute_does_not_size_an_allocation() -> None:
    x = _f(0.5, -1.0, 2.0, 3.3)
    model, feeds = _node_model("QuantizeLinear", {"x": x, "s": _f(0.5)}, {"axis": 0, "block_size": 1 << 40}, opset=21)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    out = _session(model).run(None, feeds)[0]
    np.testing.assert_array_equal(out, np.clip(np.rint(x / 0.5), 0, 255).astype(np.uint8))


def test_loop_scan_outputs_stop_at_the_budget() -> None:
    """A Loop whose trip count is data, emitting a 1 KiB scan output per iteration: refused once
    the stacked output would pass the budget, long before 2**40 iterations."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("ConstantOfShape", ["shape"], ["chunk"]),
        ],
        "body",
        [vinfo("i", I64, []), vinfo("cond_in", TensorProto.BOOL, [])],
        [vinfo("cond_out", TensorProto.BOOL, []), vinfo("chunk", F, [256])],
    )
    loop = helper.make_node("Loop", ["n", ""], ["chunks"], name="victim", body=body)
    model = make_model([loop], [vinfo("n", I64, [])], [vinfo("chunks", F, None)], initializers={"shape": _i(256)})
    sess = _session(model)
    with pytest.raises(onnxpy.RuntimeException, match="victim.*budget"):
        sess.run(None, {"n": np.array(1 << 40, np.int64)})
    assert sess.run(None, {"n": np.array(3, np.int64)})[0].shape == (3, 256)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Conv", {"pads": [16384, 16384, 16384, 16384]}),
        ("Conv", {"dilations": [1, 1], "pads": [0, 0, 0, 0], "strides": [1, 1], "group": 1, "auto_pad": "NOTSET"}),
        ("MaxPool", {"kernel_shape": [1, 1], "pads": [16384, 16384, 16384, 16384]}),
        ("AveragePool", {"kernel_shape": [1, 1], "pads": [16384, 16384, 16384, 16384], "count_include_pad": 1}),
        ("LpPool", {"kernel_shape": [1, 1], "pads": [16384, 16384, 16384, 16384]}),
    ],
    ids=["conv-pads", "conv-plain", "maxpool-pads", "avgpool-pads", "lppool-pads"],
)
def test_pads_that_size_huge_buffers_are_refused(op: str, attrs: dict) -> None:
    """Convolution and pooling pads come from the model: a padded copy of 4 GiB is refused
    against the budget before anything is allocated (a plain conv of the same input is fine)."""
    feeds = {"x": np.ones((1, 1, 3, 3), np.float32)}
    if op == "Conv":
        feeds["w"] = np.ones((1, 1, 1, 1), np.float32)
    model, feeds = _node_model(op, feeds, attrs)
    sess = _session(model)
    if "16384" not in str(attrs):
        assert sess.run(None, feeds)[0].shape == (1, 1, 3, 3)
        return
    with pytest.raises(onnxpy.RuntimeException, match="victim.*over the session's allocation budget"):
        sess.run(None, feeds)
