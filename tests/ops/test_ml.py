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
        assert isinstance(got, dict) and list(got) == list(want)
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
