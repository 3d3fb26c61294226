"""ai.onnx.ml kernels against onnxruntime (which implements the whole domain) on small hand-built
models; where onnxruntime's Python binding cannot feed a value (maps with string values) or
lacks a type, against values worked out from the spec by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy
from tests.helpers import skip_before_onnxruntime

Input = tuple[str, Any, Any]  # (name, elem type or TypeProto, value)


def ml_model(op: str, inputs: list[Input], outputs: list[Any], ml: int = 3, **attrs: Any) -> onnx.ModelProto:
    ins = [
        oh.make_value_info(n, t) if isinstance(t, onnx.TypeProto) else oh.make_tensor_value_info(n, t, None)
        for n, t, _ in inputs
    ]
    outs = [
        oh.make_value_info(f"y{i}", t) if isinstance(t, onnx.TypeProto) else oh.make_tensor_value_info(f"y{i}", t, None)
        for i, t in enumerate(outputs)
    ]
    node = oh.make_node(op, [n for n, _, _ in inputs], [o.name for o in outs], domain="ai.onnx.ml", **attrs)
    graph = oh.make_graph([node], "g", ins, outs)
    return oh.make_model(
        graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", ml)], ir_version=9
    )


def run_ours(model: onnx.ModelProto, inputs: list[Input]) -> list[Any]:
    sess = onnxpy.InferenceSession(model.SerializeToString())
    return sess.run(None, {n: v for n, _, v in inputs})


def run_ort(model: onnx.ModelProto, inputs: list[Input]) -> list[Any]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, _, v in inputs})


def assert_same(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, rtol, atol)
        return
    if isinstance(want, dict):
        # A map value must reach the caller as a dict (as onnxruntime returns it).
        assert isinstance(got, dict), f"expected a dict, got {type(got).__name__}: {got!r}"
        assert list(got) == list(want)
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=rtol, atol=atol)
        return
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype == object:
        assert got.dtype == object
        assert got.tolist() == want.tolist()
        return
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def both(op: str, inputs: list[Input], outputs: list[Any], ml: int = 3, rtol: float = 1e-5, **attrs: Any) -> list:
    model = ml_model(op, inputs, outputs, ml, **attrs)
    got = run_ours(model, inputs)
    want = run_ort(model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w, rtol=rtol)
    return got


RNG = np.random.default_rng(7)
X23 = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, 0.0], [3.0, -2.0]], dtype=np.float32)
POST = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"]


def map_type(key: int, value: int) -> onnx.TypeProto:
    return oh.make_map_type_proto(key, oh.make_tensor_type_proto(value, None))


# -- preprocessing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, y",
    [
        (np.arange(6, dtype=np.float32), np.array([1, 2])),
        (np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.array([[1, 3]])),
        (np.arange(24, dtype=np.int64).reshape(2, 3, 4), np.array(1)),
        (np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object), np.array([2, 0])),
    ],
)
def test_array_feature_extractor(x: np.ndarray, y: np.ndarray) -> None:
    t = TP.STRING if x.dtype == object else onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    both("ArrayFeatureExtractor", [("x", t, x), ("y", TP.INT64, y)], [t])


def test_array_feature_extractor_rejects_bad_index() -> None:
    model = ml_model("ArrayFeatureExtractor", [("x", TP.FLOAT, None), ("y", TP.INT64, None)], [TP.FLOAT])
    with pytest.raises(Exception, match="out of range"):
        run_ours(model, [("x", None, np.ones((2, 3), np.float32)), ("y", None, np.array([3]))])


def test_binarizer() -> None:
    x = (RNG.normal(size=(3, 4)) * 3).astype(np.float32)
    both("Binarizer", [("x", TP.FLOAT, x)], [TP.FLOAT], threshold=0.5)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_binarizer_types_onnxruntime_lacks(dtype: type) -> None:
    x = (RNG.normal(size=(3, 4)) * 3).astype(dtype)
    t = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    (got,) = run_ours(ml_model("Binarizer", [("x", t, None)], [t], threshold=0.5), [("x", None, x)])
    assert_same(got, np.where(x > 0.5, 1, 0).astype(dtype))


def test_binarizer_rejects_nan() -> None:
    model = ml_model("Binarizer", [("x", TP.FLOAT, None)], [TP.FLOAT])
    with pytest.raises(Exception, match="NaN"):
        run_ours(model, [("x", None, np.array([1.0, np.nan], np.float32))])


@pytest.mark.parametrize("cast_to, elem", [("TO_FLOAT", TP.FLOAT), ("TO_INT64", TP.INT64), ("TO_STRING", TP.STRING)])
@pytest.mark.parametrize("form", ["DENSE", "SPARSE"])
def test_cast_map_float_values(cast_to: str, elem: int, form: str) -> None:
    m = {3: 1.5, 1: 2.25, 7: 3.75}
    both("CastMap", [("x", map_type(TP.INT64, TP.FLOAT), m)], [elem], ml=1, cast_to=cast_to, map_form=form, max_map=9)


def test_cast_map_string_values() -> None:
    # onnxruntime's binding cannot feed map(int64, string): expected values follow the spec.
    model = ml_model(
        "CastMap", [("x", map_type(TP.INT64, TP.STRING), None)], [TP.FLOAT], ml=1, map_form="SPARSE", max_map=4
    )
    (got,) = run_ours(model, [("x", None, {2: "1.5", 0: "-3"})])
    np.testing.assert_array_equal(got, np.array([[-3.0, 0.0, 1.5, 0.0]], dtype=np.float32))
    model = ml_model("CastMap", [("x", map_type(TP.INT64, TP.STRING), None)], [TP.STRING], ml=1, cast_to="TO_STRING")
    (got,) = run_ours(model, [("x", None, {2: "b", 0: "a"})])
    assert got.tolist() == [["a", "b"]]


def test_category_mapper() -> None:
    cats = dict(cats_strings=["b", "a", "c"], cats_int64s=[5, 7, 9])
    both("CategoryMapper", [("x", TP.STRING, np.array([["a", "b", "z"]], dtype=object))], [TP.INT64], **cats)
    both("CategoryMapper", [("x", TP.STRING, np.array(["a", "q"], dtype=object))], [TP.INT64], default_int64=42, **cats)
    both("CategoryMapper", [("x", TP.INT64, np.array([[5, 7, 1], [9, 9, 0]]))], [TP.STRING], **cats)
    both("CategoryMapper", [("x", TP.INT64, np.array([5, 6]))], [TP.STRING], default_string="zz", **cats)


def test_dict_vectorizer() -> None:
    both(
        "DictVectorizer",
        [("x", map_type(TP.STRING, TP.FLOAT), {"a": 1.5, "c": 2.0})],
        [TP.FLOAT],
        ml=1,
        string_vocabulary=["a", "b", "c", "d"],
    )
    both(
        "DictVectorizer",
        [("x", map_type(TP.INT64, TP.FLOAT), {3: 1.5, 1: 2.0, 9: 4.0})],
        [TP.FLOAT],
        ml=1,
        int64_vocabulary=[1, 2, 3],
    )
    model = ml_model(
        "DictVectorizer", [("x", map_type(TP.INT64, TP.DOUBLE), None)], [TP.DOUBLE], ml=1, int64_vocabulary=[1, 2, 3]
    )
    (got,) = run_ours(model, [("x", None, {3: 1.5, 1: 2.0, 9: 4.0})])
    assert_same(got, np.array([[2.0, 0.0, 1.5]]))
    model = ml_model(
        "DictVectorizer", [("x", map_type(TP.INT64, TP.STRING), None)], [TP.STRING], ml=1, int64_vocabulary=[1, 2, 3]
    )
    (got,) = run_ours(model, [("x", None, {3: "q", 1: "z"})])
    assert got.tolist() == [["z", "", "q"]]


@pytest.mark.parametrize("dims", [[3, 2], [2, 3], [1, 1]])
def test_feature_vectorizer(dims: list[int]) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.float32).reshape(2, 2) + 10
    both("FeatureVectorizer", [("a", TP.FLOAT, a), ("b", TP.FLOAT, b)], [TP.FLOAT], inputdimensions=dims)


def test_feature_vectorizer_1d_and_int() -> None:
    both(
        "FeatureVectorizer",
        [("a", TP.DOUBLE, np.ones(3)), ("b", TP.DOUBLE, np.arange(2.0))],
        [TP.FLOAT],
        inputdimensions=[3, 2],
    )
    both("FeatureVectorizer", [("a", TP.INT64, np.ones((2, 2, 3), np.int64))], [TP.FLOAT], inputdimensions=[4])


def test_feature_vectorizer_no_rows() -> None:
    # onnxruntime 1.32 aborts the process on this input: onnx.reference is the oracle.
    from onnx.reference import ReferenceEvaluator

    inputs = [("a", TP.FLOAT, np.zeros((0, 2), np.float32)), ("b", TP.FLOAT, np.zeros((0, 3), np.float32))]
    model = ml_model("FeatureVectorizer", inputs, [TP.FLOAT], inputdimensions=[2, 3])
    (got,) = run_ours(model, inputs)
    (want,) = ReferenceEvaluator(model).run(None, {n: v for n, _, v in inputs})
    assert_same(got, want)
    assert got.shape == (0, 5)


def test_imputer() -> None:
    x = np.array([[1, np.nan, 3], [np.nan, 5, np.nan]], np.float32)
    both(
        "Imputer",
        [("x", TP.FLOAT, x)],
        [TP.FLOAT],
        imputed_value_floats=[7.0, 8.0, 9.0],
        replaced_value_float=float("nan"),
    )
    both("Imputer", [("x", TP.FLOAT, x)], [TP.FLOAT], imputed_value_floats=[7.0])
    xi = np.array([[1, -1, 3], [-1, 5, -1]], np.int64)
    both("Imputer", [("x", TP.INT64, xi)], [TP.INT64], imputed_value_int64s=[7], replaced_value_int64=-1)
    both(
        "Imputer",
        [("x", TP.FLOAT, np.array([[[1, -1], [3, -1]]], np.float32))],
        [TP.FLOAT],
        imputed_value_floats=[7.0, 8.0],
        replaced_value_float=-1.0,
    )


def test_label_encoder_v1() -> None:
    both(
        "LabelEncoder",
        [("x", TP.STRING, np.array(["a", "b", "z"], dtype=object))],
        [TP.INT64],
        ml=1,
        classes_strings=["b", "a"],
    )
    both(
        "LabelEncoder",
        [("x", TP.INT64, np.array([0, 1, 5, -1]))],
        [TP.STRING],
        ml=1,
        classes_strings=["b", "a"],
        default_string="?",
    )


def test_label_encoder_v2() -> None:
    xf = np.array([0, 1.5, np.nan, -1], np.float32)
    both(
        "LabelEncoder",
        [("x", TP.FLOAT, xf)],
        [TP.STRING],
        ml=2,
        keys_floats=[1.5, float("nan")],
        values_strings=["x", "y"],
    )
    both("LabelEncoder", [("x", TP.FLOAT, xf)], [TP.FLOAT], ml=2, keys_floats=[1.5, 0.0], values_floats=[3.0, 4.0])
    xi = np.array([[1, 1], [5, -1]])
    both(
        "LabelEncoder",
        [("x", TP.INT64, xi)],
        [TP.FLOAT],
        ml=2,
        keys_int64s=[1, 5],
        values_floats=[3.0, 4.0],
        default_float=2.5,
    )
    # repeated keys: the first wins, as in onnxruntime
    both("LabelEncoder", [("x", TP.INT64, xi)], [TP.INT64], ml=2, keys_int64s=[1, 5, 1], values_int64s=[3, 4, 9])
    xs = np.array(["a", "q", "b"], dtype=object)
    both("LabelEncoder", [("x", TP.STRING, xs)], [TP.STRING], ml=2, keys_strings=["a", "b"], values_strings=["A", "B"])


def test_label_encoder_v4() -> None:
    xf = np.array([0, 1.5, np.nan, -1], np.float32)
    # from ml opset 4 a NaN key matches NaN
    both(
        "LabelEncoder",
        [("x", TP.FLOAT, xf)],
        [TP.STRING],
        ml=4,
        keys_floats=[1.5, float("nan")],
        values_strings=["x", "y"],
    )
    xi = np.array([0, 1, 5, -1])
    values = oh.make_tensor("v", TP.DOUBLE, [2], [3.0, 4.0])
    both("LabelEncoder", [("x", TP.INT64, xi)], [TP.DOUBLE], ml=4, keys_int64s=[1, 5], values_tensor=values)
    strs = oh.make_tensor("v", TP.STRING, [2], [b"3", b"4"])
    both("LabelEncoder", [("x", TP.INT64, xi)], [TP.STRING], ml=4, keys_int64s=[1, 5], values_tensor=strs)
    keys = oh.make_tensor("k", TP.DOUBLE, [2], [1.5, float("nan")])
    both(
        "LabelEncoder",
        [("x", TP.DOUBLE, xf.astype(np.float64))],
        [TP.INT64],
        ml=4,
        keys_tensor=keys,
        values_int64s=[3, 4],
    )


def test_label_encoder_v4_types_onnxruntime_lacks() -> None:
    keys = oh.make_tensor("k", TP.INT16, [2], [1, 5])
    values = oh.make_tensor("v", TP.INT32, [2], [30, 40])
    default = oh.make_tensor("d", TP.INT32, [1], [-7])
    model = ml_model(
        "LabelEncoder",
        [("x", TP.INT16, None)],
        [TP.INT32],
        ml=4,
        keys_tensor=keys,
        values_tensor=values,
        default_tensor=default,
    )
    (got,) = run_ours(model, [("x", None, np.array([5, 2, 1], np.int16))])
    assert got.dtype == np.int32 and got.tolist() == [40, -7, 30]


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_normalizer(norm: str, dtype: type) -> None:
    x = np.array([[1, -2, 3], [0, 0, 0], [-4, -1, -2]]).astype(dtype)
    both("Normalizer", [("x", oh.np_dtype_to_tensor_dtype(np.dtype(dtype)), x)], [TP.FLOAT], norm=norm)
    both("Normalizer", [("x", oh.np_dtype_to_tensor_dtype(np.dtype(dtype)), x[0])], [TP.FLOAT], norm=norm)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_rows_without_features(norm: str) -> None:
    # MAX has no identity to reduce an empty row to: the (N, 0) input comes back as it is.
    got = both("Normalizer", [("x", TP.FLOAT, np.zeros((2, 0), np.float32))], [TP.FLOAT], norm=norm)
    assert got[0].shape == (2, 0)


def test_one_hot_encoder() -> None:
    both("OneHotEncoder", [("x", TP.INT64, np.array([[1, 4], [2, 9]]))], [TP.FLOAT], cats_int64s=[1, 2, 4])
    both("OneHotEncoder", [("x", TP.DOUBLE, np.array([1.7, 4.2, -1]))], [TP.FLOAT], cats_int64s=[1, 2, 4, -1])
    both(
        "OneHotEncoder",
        [("x", TP.STRING, np.array([["a", "b", "z"]], dtype=object))],
        [TP.FLOAT],
        cats_strings=["b", "a"],
    )
    model = ml_model("OneHotEncoder", [("x", TP.INT64, None)], [TP.FLOAT], cats_int64s=[1, 2], zeros=0)
    with pytest.raises(Exception, match="categor"):
        run_ours(model, [("x", None, np.array([1, 3]))])


def test_scaler() -> None:
    both("Scaler", [("x", TP.INT64, np.array([[1, 4], [2, 9]]))], [TP.FLOAT], offset=[1.0, 2.0], scale=[2.0, 3.0])
    both("Scaler", [("x", TP.DOUBLE, np.array([[1, 4], [2, 9]], np.float64))], [TP.FLOAT], offset=[1.0], scale=[2.0])
    both(
        "Scaler",
        [("x", TP.FLOAT, RNG.normal(size=(3, 4)).astype(np.float32))],
        [TP.FLOAT],
        offset=[0.5] * 4,
        scale=[1.5, 2, 3, 4],
    )


def _zipmap_type(key: int) -> onnx.TypeProto:
    return oh.make_sequence_type_proto(map_type(key, TP.FLOAT))


def test_zipmap() -> None:
    x = RNG.random((3, 2)).astype(np.float32)
    both("ZipMap", [("x", TP.FLOAT, x)], [_zipmap_type(TP.STRING)], ml=1, classlabels_strings=["a", "b"])
    both("ZipMap", [("x", TP.FLOAT, x)], [_zipmap_type(TP.INT64)], ml=1, classlabels_int64s=[10, 20])


# -- linear models and SVMs ---------------------------------------------------------------------


@pytest.mark.parametrize("post", POST)
def test_linear_classifier(post: str) -> None:
    if post == "LOGISTIC":
        skip_before_onnxruntime((1, 24), "leaves a binary classifier's scores without their LOGISTIC post-transform")
    coef3 = [1.0, 2, -1, 0.5, 0.3, -0.2]
    both(
        "LinearClassifier",
        [("x", TP.FLOAT, X23)],
        [TP.INT64, TP.FLOAT],
        coefficients=coef3,
        intercepts=[0.1, -0.2, 0.0],
        classlabels_ints=[4, 5, 6],
        post_transform=post,
    )
    both(
        "LinearClassifier",
        [("x", TP.FLOAT, X23)],
        [TP.INT64, TP.FLOAT],
        coefficients=coef3[:4],
        intercepts=[0.1, -0.2],
        classlabels_ints=[4, 5],
        post_transform=post,
    )
    # one coefficient row for two classes
    both(
        "LinearClassifier",
        [("x", TP.FLOAT, X23)],
        [TP.STRING, TP.FLOAT],
        coefficients=[1.0, 2.0],
        intercepts=[0.1],
        classlabels_strings=["a", "b"],
        post_transform=post,
    )


def test_linear_classifier_int_input_and_1d() -> None:
    coef3 = [1.0, 2, -1, 0.5, 0.3, -0.2]
    both(
        "LinearClassifier",
        [("x", TP.INT64, X23.astype(np.int64))],
        [TP.INT64, TP.FLOAT],
        coefficients=coef3,
        intercepts=[0.1, -0.2, 0.0],
        classlabels_ints=[4, 5, 6],
    )
    both(
        "LinearClassifier",
        [("x", TP.FLOAT, X23[0])],
        [TP.INT64, TP.FLOAT],
        coefficients=coef3,
        intercepts=[0.1, -0.2, 0.0],
        classlabels_ints=[4, 5, 6],
        post_transform="PROBIT",
    )


@pytest.mark.parametrize("post", [*POST, "PROBIT"])
def test_linear_regressor(post: str) -> None:
    rtol = 1e-3 if post == "PROBIT" else 1e-5  # onnxruntime's inverse erf is good to ~2e-4
    both(
        "LinearRegressor",
        [("x", TP.FLOAT, X23)],
        [TP.FLOAT],
        coefficients=[1.0, 2, -1, 0.5, 0.3, -0.2],
        intercepts=[0.1, -0.2, 0.5],
        targets=3,
        post_transform=post if post != "SOFTMAX_ZERO" else "NONE",
        rtol=rtol,
    )
    both(
        "LinearRegressor",
        [("x", TP.FLOAT, X23 * 0.1)],
        [TP.FLOAT],
        coefficients=[1.0, 2.0],
        intercepts=[0.6],
        post_transform=post,
        rtol=rtol,
    )


SV = RNG.normal(size=(5, 2)).astype(np.float32)
SV_COEF = RNG.normal(size=(2, 5)).astype(np.float32)
SV_RHO = RNG.normal(size=3).astype(np.float32)
XS = RNG.normal(size=(6, 2)).astype(np.float32)


def _svc(kernel: str, **kw: Any) -> dict[str, Any]:
    a = dict(
        kernel_type=kernel,
        kernel_params=[0.5, 0.1, 3.0],
        support_vectors=SV.ravel().tolist(),
        vectors_per_class=[2, 1, 2],
        coefficients=SV_COEF.ravel().tolist(),
        rho=SV_RHO.tolist(),
        classlabels_ints=[0, 1, 2],
    )
    a.update(kw)
    return a


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("post", [*POST, "PROBIT"])
def test_svm_classifier_multiclass(kernel: str, post: str) -> None:
    rtol = 1e-3 if post == "PROBIT" else 1e-4  # onnxruntime's inverse erf is good to ~2e-4
    both("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], rtol=rtol, **_svc(kernel, post_transform=post))


@pytest.mark.parametrize("kernel", ["LINEAR", "RBF"])
def test_svm_classifier_probabilities(kernel: str) -> None:
    probs = dict(prob_a=[-1.5, -0.7, -2.0], prob_b=[0.1, -0.2, 0.05])
    # pairwise coupling stops at a tolerance, so the probabilities agree to about 1e-4
    both("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], rtol=1e-3, **_svc(kernel, **probs))
    binary = _svc(
        kernel,
        vectors_per_class=[3, 2],
        coefficients=SV_COEF[0].tolist(),
        rho=SV_RHO[:1].tolist(),
        classlabels_strings=["no", "yes"],
        classlabels_ints=None,
    )
    del binary["classlabels_ints"]
    both(
        "SVMClassifier", [("x", TP.FLOAT, XS)], [TP.STRING, TP.FLOAT], rtol=1e-3, **binary, prob_a=[-1.5], prob_b=[-2.0]
    )


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_svm_classifier_binary(post: str) -> None:
    if post == "LOGISTIC":
        skip_before_onnxruntime((1, 24), "leaves a binary classifier's scores without their LOGISTIC post-transform")
    binary = _svc(
        "RBF",
        vectors_per_class=[3, 2],
        coefficients=SV_COEF[0].tolist(),
        rho=SV_RHO[:1].tolist(),
        classlabels_ints=[3, 7],
        post_transform=post,
    )
    both("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], rtol=1e-4, **binary)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
def test_svm_classifier_linear_mode(post: str) -> None:
    w = RNG.normal(size=(3, 2)).astype(np.float32)
    attrs = dict(
        kernel_type="LINEAR",
        kernel_params=[0.0, 0.0, 0.0],
        coefficients=w.ravel().tolist(),
        rho=[0.1, 0.2, -0.3],
        classlabels_ints=[0, 1, 2],
        post_transform=post,
    )
    both("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], rtol=1e-4, **attrs)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(kernel: str, one_class: int) -> None:
    attrs = dict(
        kernel_type=kernel,
        kernel_params=[0.5, 0.1, 3.0],
        support_vectors=SV.ravel().tolist(),
        n_supports=5,
        coefficients=SV_COEF[0].tolist(),
        rho=[0.3],
        one_class=one_class,
    )
    both("SVMRegressor", [("x", TP.FLOAT, XS)], [TP.FLOAT], rtol=1e-4, **attrs)
    both(
        "SVMRegressor",
        [("x", TP.FLOAT, XS)],
        [TP.FLOAT],
        kernel_type="LINEAR",
        kernel_params=[0.0, 0.0, 0.0],
        coefficients=[1.0, 2.0],
        rho=[0.3],
    )


# -- tree ensembles -----------------------------------------------------------------------------


def random_forest(
    rng: np.random.Generator,
    n_trees: int,
    depth: int,
    n_features: int,
    n_targets: int,
    modes: tuple[str, ...] = ("BRANCH_LEQ",),
    weights_per_leaf: int = 1,
    positive: bool = False,
) -> dict[str, list]:
    """Complete binary trees in the (treeid, nodeid) layout of ml opsets 1 and 3."""
    cols: dict[str, list] = {
        k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values", "true", "false", "missing")
    }
    leaves: dict[str, list] = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for t in range(n_trees):
        n_nodes = 2 ** (depth + 1) - 1
        for nid in range(n_nodes):
            leaf = nid >= 2**depth - 1
            cols["treeids"].append(t)
            cols["nodeids"].append(nid)
            cols["featureids"].append(0 if leaf else int(rng.integers(n_features)))
            cols["modes"].append("LEAF" if leaf else str(rng.choice(modes)))
            cols["values"].append(
                0.0 if leaf else float(np.float32(rng.normal() if rng.random() > 0.2 else rng.integers(-1, 2)))
            )
            cols["true"].append(0 if leaf else 2 * nid + 1)
            cols["false"].append(0 if leaf else 2 * nid + 2)
            cols["missing"].append(int(rng.integers(2)))
            if leaf:
                for _ in range(weights_per_leaf):
                    leaves["treeids"].append(t)
                    leaves["nodeids"].append(nid)
                    leaves["ids"].append(int(rng.integers(n_targets)))
                    w = float(np.float32(rng.random() if positive else rng.normal()))
                    leaves["weights"].append(w)
    return {"nodes": cols, "leaves": leaves}


def _node_attrs(f: dict[str, dict[str, list]], missing: bool = True) -> dict[str, Any]:
    n = f["nodes"]
    a = dict(
        nodes_treeids=n["treeids"],
        nodes_nodeids=n["nodeids"],
        nodes_featureids=n["featureids"],
        nodes_modes=n["modes"],
        nodes_values=n["values"],
        nodes_truenodeids=n["true"],
        nodes_falsenodeids=n["false"],
    )
    if missing:
        a["nodes_missing_value_tracks_true"] = n["missing"]
    return a


def regressor_attrs(f: dict[str, dict[str, list]], n_targets: int, **kw: Any) -> dict[str, Any]:
    lv = f["leaves"]
    a = _node_attrs(f)
    a.update(
        target_treeids=lv["treeids"],
        target_nodeids=lv["nodeids"],
        target_ids=lv["ids"],
        target_weights=lv["weights"],
        n_targets=n_targets,
    )
    a.update(kw)
    return a


def classifier_attrs(f: dict[str, dict[str, list]], class_labels: list[Any], **kw: Any) -> dict[str, Any]:
    lv = f["leaves"]
    a = _node_attrs(f)
    a.update(class_treeids=lv["treeids"], class_nodeids=lv["nodeids"], class_ids=lv["ids"], class_weights=lv["weights"])
    if isinstance(class_labels[0], str):
        a["classlabels_strings"] = class_labels
    else:
        a["classlabels_int64s"] = class_labels
    a.update(kw)
    return a


def tree_input(rng: np.random.Generator, n: int, n_features: int, dtype: type = np.float32) -> np.ndarray:
    x = rng.normal(size=(n, n_features))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[rng.random(x.shape) < 0.1] = 0.0  # hits the EQ / NEQ splits at integer thresholds
    x[rng.random(x.shape) < 0.05] = 1.0
    return x.astype(dtype)


ALL_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("n_targets", [1, 3])
def test_tree_regressor(aggregate: str, n_targets: int) -> None:
    rng = np.random.default_rng(n_targets)
    f = random_forest(rng, 6, 3, 4, n_targets, ALL_MODES, weights_per_leaf=2)
    x = tree_input(rng, 40, 4)
    both(
        "TreeEnsembleRegressor",
        [("x", TP.FLOAT, x)],
        [TP.FLOAT],
        ml=1,
        rtol=1e-5,
        **regressor_attrs(f, n_targets, aggregate_function=aggregate),
    )
    base = [0.5, -1.0, 2.0][:n_targets]
    both(
        "TreeEnsembleRegressor",
        [("x", TP.FLOAT, x)],
        [TP.FLOAT],
        ml=1,
        rtol=1e-5,
        **regressor_attrs(f, n_targets, aggregate_function=aggregate, base_values=base),
    )


@pytest.mark.parametrize("post", [*POST, "PROBIT"])
@pytest.mark.parametrize("n_targets", [1, 2])
def test_tree_regressor_post_transform(post: str, n_targets: int) -> None:
    rng = np.random.default_rng(3)
    f = random_forest(rng, 4, 2, 3, n_targets, positive=True)
    x = tree_input(rng, 20, 3)
    scale = [0.25] * 20  # keeps PROBIT inputs inside (0, 1)
    attrs = regressor_attrs(
        f,
        n_targets,
        post_transform=post,
        aggregate_function="AVERAGE",
        base_values=scale[:n_targets] if post == "PROBIT" else None,
    )
    if attrs["base_values"] is None:
        del attrs["base_values"]
    both(
        "TreeEnsembleRegressor",
        [("x", TP.FLOAT, x)],
        [TP.FLOAT],
        ml=1,
        rtol=1e-3 if post == "PROBIT" else 1e-5,
        **attrs,
    )


def test_tree_regressor_v3_tensor_attributes_and_double_input() -> None:
    rng = np.random.default_rng(5)
    f = random_forest(rng, 3, 3, 2, 2)
    attrs = regressor_attrs(f, 2)
    attrs["nodes_values_as_tensor"] = oh.make_tensor(
        "v", TP.DOUBLE, [len(attrs["nodes_values"])], attrs.pop("nodes_values")
    )
    attrs["target_weights_as_tensor"] = oh.make_tensor(
        "w", TP.DOUBLE, [len(attrs["target_weights"])], attrs.pop("target_weights")
    )
    attrs["base_values_as_tensor"] = oh.make_tensor("b", TP.DOUBLE, [2], [0.5, 1.5])
    x = tree_input(rng, 30, 2, np.float64)
    both("TreeEnsembleRegressor", [("x", TP.DOUBLE, x)], [TP.FLOAT], ml=3, **attrs)


@pytest.mark.parametrize("post", [*POST])
def test_tree_classifier_multiclass(post: str) -> None:
    rng = np.random.default_rng(11)
    f = random_forest(rng, 5, 3, 4, 3, ALL_MODES, weights_per_leaf=2, positive=True)
    x = tree_input(rng, 40, 4)
    both(
        "TreeEnsembleClassifier",
        [("x", TP.FLOAT, x)],
        [TP.INT64, TP.FLOAT],
        ml=1,
        **classifier_attrs(f, [3, 5, 9], post_transform=post),
    )
    both(
        "TreeEnsembleClassifier",
        [("x", TP.FLOAT, x)],
        [TP.STRING, TP.FLOAT],
        ml=1,
        **classifier_attrs(f, ["a", "b", "c"], post_transform=post, base_values=[0.1, 0.2, 0.3]),
    )


def _single_class(f: dict[str, dict[str, list]], cls: int) -> dict[str, dict[str, list]]:
    return {"nodes": f["nodes"], "leaves": dict(f["leaves"], ids=[cls] * len(f["leaves"]["ids"]))}


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("positive", [True, False])
@pytest.mark.parametrize("base", [None, [0.25]])
def test_tree_classifier_binary_one_score(post: str, positive: bool, base: list[float] | None) -> None:
    if post == "LOGISTIC":
        skip_before_onnxruntime((1, 24), "leaves a binary classifier's scores without their LOGISTIC post-transform")
    # Gradient-boosting exports: every leaf scores class 0, read as the positive class's margin.
    rng = np.random.default_rng(13)
    f = _single_class(random_forest(rng, 4, 2, 3, 1, positive=positive), 0)
    x = tree_input(rng, 30, 3)
    attrs = classifier_attrs(f, [0, 1], post_transform=post)
    if base:
        attrs["base_values"] = base
    both("TreeEnsembleClassifier", [("x", TP.FLOAT, x)], [TP.INT64, TP.FLOAT], ml=1, **attrs)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_tree_classifier_binary_two_scores(post: str) -> None:
    # Random-forest exports: leaves score both classes.
    rng = np.random.default_rng(17)
    f = random_forest(rng, 4, 3, 3, 2, weights_per_leaf=2, positive=True)
    x = tree_input(rng, 30, 3)
    both(
        "TreeEnsembleClassifier",
        [("x", TP.FLOAT, x)],
        [TP.INT64, TP.FLOAT],
        ml=1,
        **classifier_attrs(f, [0, 1], post_transform=post),
    )
    both(
        "TreeEnsembleClassifier",
        [("x", TP.FLOAT, x)],
        [TP.STRING, TP.FLOAT],
        ml=1,
        **classifier_attrs(f, ["no", "yes"], post_transform=post, base_values=[0.1, 0.3]),
    )
    f1 = _single_class(f, 1)
    both(
        "TreeEnsembleClassifier",
        [("x", TP.FLOAT, x)],
        [TP.INT64, TP.FLOAT],
        ml=1,
        **classifier_attrs(f1, [0, 1], post_transform=post),
    )


def _to_v5(f: dict[str, dict[str, list]]) -> dict[str, Any]:
    """The same forest in TreeEnsemble's layout: interior nodes and leaves indexed separately."""
    n, lv = f["nodes"], f["leaves"]
    interior = [i for i, m in enumerate(n["modes"]) if m != "LEAF"]
    pos = {(n["treeids"][i], n["nodeids"][i]): i for i in range(len(n["nodeids"]))}
    inner_index = {i: k for k, i in enumerate(interior)}
    leaf_nodes = sorted({pos[(t, nid)] for t, nid in zip(lv["treeids"], lv["nodeids"])})
    leaf_index = {i: k for k, i in enumerate(leaf_nodes)}
    # one weight per leaf in this layout: keep the first
    targets, weights, seen = [0] * len(leaf_nodes), [0.0] * len(leaf_nodes), set()
    for t, nid, c, w in zip(lv["treeids"], lv["nodeids"], lv["ids"], lv["weights"]):
        k = leaf_index[pos[(t, nid)]]
        if k not in seen:
            seen.add(k)
            targets[k], weights[k] = c, w
    mode_code = {m: i for i, m in enumerate(ALL_MODES)}

    def ref(i: int, child: str) -> tuple[int, int]:
        c = pos[(n["treeids"][i], n[child][i])]
        return (leaf_index[c], 1) if c in leaf_index else (inner_index[c], 0)

    trues = [ref(i, "true") for i in interior]
    falses = [ref(i, "false") for i in interior]
    roots = [inner_index[pos[(t, 0)]] for t in sorted(set(n["treeids"]))]
    return dict(
        nodes_featureids=[n["featureids"][i] for i in interior],
        nodes_modes=oh.make_tensor("m", TP.UINT8, [len(interior)], [mode_code[n["modes"][i]] for i in interior]),
        splits=[n["values"][i] for i in interior],
        nodes_truenodeids=[t for t, _ in trues],
        nodes_trueleafs=[lf for _, lf in trues],
        nodes_falsenodeids=[t for t, _ in falses],
        nodes_falseleafs=[lf for _, lf in falses],
        nodes_missing_value_tracks_true=[n["missing"][i] for i in interior],
        tree_roots=roots,
        leaf_targetids=targets,
        weights=weights,
    )


@pytest.mark.parametrize("dtype, elem", [(np.float32, TP.FLOAT), (np.float64, TP.DOUBLE)])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_v5(dtype: type, elem: int, aggregate: int) -> None:
    rng = np.random.default_rng(aggregate)
    f = random_forest(rng, 5, 3, 4, 2, ALL_MODES)
    a = _to_v5(f)
    splits, weights = a.pop("splits"), a.pop("weights")
    a["nodes_splits"] = oh.make_tensor("s", elem, [len(splits)], splits)
    a["leaf_weights"] = oh.make_tensor("w", elem, [len(weights)], weights)
    x = tree_input(rng, 40, 4, dtype)
    both("TreeEnsemble", [("x", elem, x)], [elem], ml=5, n_targets=2, aggregate_function=aggregate, **a)


@pytest.mark.parametrize("post", [0, 1, 2, 3])
def test_tree_ensemble_v5_post_transform_and_membership(post: str) -> None:
    # tree: x0 <= 0.5 ? (x1 in {1, 2, 5} ? leaf0 : leaf1) : (x1 in {3} ? leaf2 : leaf3)
    a = dict(
        nodes_featureids=[0, 1, 1],
        nodes_modes=oh.make_tensor("m", TP.UINT8, [3], [0, 6, 6]),
        nodes_splits=oh.make_tensor("s", TP.FLOAT, [3], [0.5, float("nan"), float("nan")]),
        membership_values=oh.make_tensor("mv", TP.FLOAT, [6], [1, 2, 5, float("nan"), 3, float("nan")]),
        nodes_truenodeids=[1, 0, 2],
        nodes_trueleafs=[0, 1, 1],
        nodes_falsenodeids=[2, 1, 3],
        nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[0, 1, 0],
        tree_roots=[0],
        leaf_targetids=[0, 1, 2, 1],
        leaf_weights=oh.make_tensor("w", TP.FLOAT, [4], [0.5, 0.25, 2.0, -1.0]),
    )
    x = np.array([[0, 1], [0, 2], [0, 4], [1, 3], [1, 5], [0, np.nan], [np.nan, 3], [1, np.nan]], np.float32)
    inputs = [("x", TP.FLOAT, x)]
    (got,) = run_ours(ml_model("TreeEnsemble", inputs, [TP.FLOAT], ml=5, n_targets=3, post_transform=post, **a), inputs)
    # The spec numbers SOFTMAX 1 and LOGISTIC 2; onnxruntime 1.2x reads them the other way round.
    ort_code = {1: 2, 2: 1}.get(post, post)
    (want,) = run_ort(
        ml_model("TreeEnsemble", inputs, [TP.FLOAT], ml=5, n_targets=3, post_transform=ort_code, **a), inputs
    )
    assert_same(got, want)


def test_tree_ensemble_v5_float16() -> None:
    # onnxruntime lacks float16 here: the expected values are the tree's, worked by hand.
    a = dict(
        nodes_featureids=[0],
        nodes_modes=oh.make_tensor("m", TP.UINT8, [1], [0]),
        nodes_splits=oh.make_tensor("s", TP.FLOAT16, [1], [0.5]),
        nodes_truenodeids=[0],
        nodes_trueleafs=[1],
        nodes_falsenodeids=[1],
        nodes_falseleafs=[1],
        tree_roots=[0],
        leaf_targetids=[0, 0],
        leaf_weights=oh.make_tensor("w", TP.FLOAT16, [2], [1.5, -2.0]),
    )
    model = ml_model("TreeEnsemble", [("x", TP.FLOAT16, None)], [TP.FLOAT16], ml=5, n_targets=1, **a)
    (got,) = run_ours(model, [("x", None, np.array([[0.25], [0.5], [0.75]], np.float16))])
    assert got.dtype == np.float16 and got.tolist() == [[1.5], [1.5], [-2.0]]


def test_tree_walk_is_vectorized() -> None:
    # 20000 samples through 100 trees of depth 8: about 2,200 interpreter lines in all, where a
    # per-sample Python walk would run at least one per sample.
    from tests.helpers import python_lines_run

    rng = np.random.default_rng(1)
    f = random_forest(rng, 100, 8, 10, 1)
    model = ml_model("TreeEnsembleRegressor", [("x", TP.FLOAT, None)], [TP.FLOAT], ml=1, **regressor_attrs(f, 1))
    x = rng.normal(size=(20000, 10)).astype(np.float32)
    sess = onnxpy.InferenceSession(model.SerializeToString())
    sess.run(None, {"x": x[:10]})
    (got,), lines = python_lines_run(lambda: sess.run(None, {"x": x}))
    want = run_ort(model, [("x", None, x)])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert lines < 20000, f"{lines} Python lines for 20000 samples"


# -- found by an audit against onnxruntime 1.32 ------------------------------------------------


def test_probit_of_zero_and_one_is_infinite() -> None:
    # The inverse normal CDF is -inf at 0 and +inf at 1 (onnxpy gave NaN there).
    x = np.array([[0.0], [1.0], [0.5], [0.975]], np.float32)
    (got,) = run_ours(
        ml_model("LinearRegressor", [("x", TP.FLOAT, x)], [TP.FLOAT], coefficients=[1.0], post_transform="PROBIT"),
        [("x", TP.FLOAT, x)],
    )
    assert got[:2].ravel().tolist() == [-np.inf, np.inf]
    np.testing.assert_allclose(got[2:].ravel(), [0.0, 1.959964], atol=1e-5)
    both("LinearRegressor", [("x", TP.FLOAT, x)], [TP.FLOAT], coefficients=[1.0], post_transform="PROBIT", rtol=1e-3)


@pytest.mark.parametrize("post", ["SOFTMAX", "LOGISTIC"])
def test_svm_classifier_probabilities_take_the_post_transform(post: str) -> None:
    probs = dict(prob_a=[-1.5, -0.7, -2.0], prob_b=[0.1, -0.2, 0.05])
    got = both(
        "SVMClassifier",
        [("x", TP.FLOAT, XS)],
        [TP.INT64, TP.FLOAT],
        rtol=1e-3,
        **_svc("RBF", post_transform=post, **probs),
    )
    raw = run_ours(
        ml_model("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], **_svc("RBF", **probs)),
        [("x", TP.FLOAT, XS)],
    )
    assert not np.allclose(got[1], raw[1])  # the transform is applied, not skipped


@pytest.mark.parametrize("kernel", ["RBF", "POLY", "SIGMOID"])
def test_svm_classifier_linear_mode_ignores_the_kernel(kernel: str) -> None:
    w = RNG.normal(size=(3, 2)).astype(np.float32)
    attrs = dict(
        kernel_type=kernel,
        kernel_params=[0.5, 0.1, 3.0],
        coefficients=w.ravel().tolist(),
        rho=[0.1],
        classlabels_ints=[0, 1, 2],
    )
    got = both("SVMClassifier", [("x", TP.FLOAT, XS)], [TP.INT64, TP.FLOAT], rtol=1e-5, **attrs)
    np.testing.assert_allclose(got[1], XS @ w.T + 0.1, rtol=1e-5, atol=1e-6)


def test_outputs_without_a_declared_type_report_the_schemas_type() -> None:
    # ai.onnx.ml operators have no type inference in onnx: Scaler's Y is tensor(float) by its
    # schema, as onnxruntime reports it (onnxpy said 'undefined').
    node = oh.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=[0.0], scale=[2.0])
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info("x", TP.FLOAT, [None, 2])], [oh.make_value_info("y", onnx.TypeProto())]
    )
    m = oh.make_model(
        graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", 1)], ir_version=9
    ).SerializeToString()
    ours = onnxpy.InferenceSession(m).get_outputs()
    theirs = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).get_outputs()
    assert [o.type for o in ours] == [o.type for o in theirs] == ["tensor(float)"]
