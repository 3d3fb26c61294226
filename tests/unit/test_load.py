"""Loading: external data is read only from inside the model's folder, with checked bounds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import make_model, vinfo


def _external_model(
    folder: Path, location: str = "weights.bin", offset: int = 0, length: int | None = None, write: bool = True
) -> Path:
    w = np.arange(16, dtype=np.float32)
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [16])],
        [vinfo("y", TensorProto.FLOAT, [16])],
        initializers={"w": w},
    )
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    if write:
        (folder / "weights.bin").write_bytes(b"\0" * offset + w.tobytes())
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    path = _external_model(tmp_path, offset=8, length=64)
    sess = onnxpy.InferenceSession(str(path))
    out = sess.run(None, {"x": np.zeros(16, np.float32)})[0]
    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32))


def test_model_saved_by_onnx_with_external_data(tmp_path: Path) -> None:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    m = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [1, 64])],
        [vinfo("y", TensorProto.FLOAT, [1, 64])],
        initializers={"w": w},
    )
    onnx.save_model(
        m,
        tmp_path / "big.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="big.data",
        size_threshold=0,
    )
    x = np.ones((1, 64), np.float32)
    np.testing.assert_allclose(
        onnxpy.InferenceSession(str(tmp_path / "big.onnx")).run(None, {"x": x})[0], x @ w, rtol=1e-5
    )


@pytest.mark.parametrize("location", ["../weights.bin", "sub/../../weights.bin", "/etc/passwd"])
def test_locations_outside_the_folder_are_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    path = _external_model(folder, location=location)
    with pytest.raises(onnxpy.Fail, match="outside the model's folder|absolute path"):
        onnxpy.InferenceSession(str(path))


def test_symlink_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "secret.bin"
    outside.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    folder = tmp_path / "m"
    folder.mkdir()
    path = _external_model(folder, location="link.bin", write=False)
    os.symlink(outside, folder / "link.bin")
    with pytest.raises(onnxpy.Fail, match="resolves outside"):
        onnxpy.InferenceSession(str(path))


def test_offset_and_length_are_checked(tmp_path: Path) -> None:
    path = _external_model(tmp_path, offset=0, length=4096)
    with pytest.raises(onnxpy.Fail, match="runs past the end"):
        onnxpy.InferenceSession(str(path))
    path = _external_model(tmp_path, offset=0, length=32)
    with pytest.raises(onnxpy.Fail, match="needs 64"):
        onnxpy.InferenceSession(str(path))


def test_bytes_model_with_external_data_needs_a_folder(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    data = path.read_bytes()
    with pytest.raises(onnxpy.InvalidArgument, match="model_external_initializers_file_folder_path"):
        onnxpy.InferenceSession(data)
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(tmp_path))
    out = onnxpy.InferenceSession(data, so).run(None, {"x": np.zeros(16, np.float32)})[0]
    assert out[-1] == 15


def test_numpy_helper_roundtrip_of_exotic_initializers() -> None:
    import ml_dtypes

    w = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    m = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [vinfo("y", TensorProto.BFLOAT16, [3])])
    m.graph.initializer.append(numpy_helper.from_array(w, "w"))
    out = onnxpy.InferenceSession(m).run(None, {})[0]
    assert out.dtype == ml_dtypes.bfloat16 and out.tolist() == w.tolist()


# -- compared with onnxruntime ----------------------------------------------------------------------

X16 = np.linspace(-1, 1, 16, dtype=np.float32)


def _both(path: Path) -> np.ndarray:
    import onnxruntime as ort

    got = onnxpy.InferenceSession(str(path)).run(None, {"x": X16})[0]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": X16})[0]
    np.testing.assert_array_equal(got, want)
    return got


def test_model_reached_through_a_symlink_reads_data_beside_the_link(tmp_path: Path) -> None:
    # The Hugging Face hub cache: snapshots/<rev>/{model.onnx,weights.bin} link to blobs/<hash>.
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    _external_model(blobs)
    (blobs / "model.onnx").rename(blobs / "h1")
    (blobs / "weights.bin").rename(blobs / "h2")
    os.symlink("../../blobs/h1", snap / "model.onnx")
    os.symlink("../../blobs/h2", snap / "weights.bin")
    np.testing.assert_array_equal(_both(snap / "model.onnx"), X16 + np.arange(16, dtype=np.float32))


def test_model_symlink_with_data_in_the_link_folder(tmp_path: Path) -> None:
    work, real = tmp_path / "work", tmp_path / "real"
    work.mkdir()
    real.mkdir()
    _external_model(work)
    (work / "model.onnx").rename(real / "model.onnx")
    os.symlink(real / "model.onnx", work / "model.onnx")
    _both(work / "model.onnx")


def test_symlinked_model_still_refuses_data_outside_both_folders(tmp_path: Path) -> None:
    work, real, other = tmp_path / "work", tmp_path / "real", tmp_path / "other"
    for d in (work, real, other):
        d.mkdir()
    _external_model(other)
    os.symlink(other / "weights.bin", work / "link.bin")
    _external_model(real, location="link.bin", write=False)
    os.symlink(real / "model.onnx", work / "model.onnx")
    with pytest.raises(onnxpy.Fail, match="resolves outside"):
        onnxpy.InferenceSession(str(work / "model.onnx"))
    _external_model(real, location="../other/weights.bin", write=False)
    with pytest.raises(onnxpy.Fail, match="outside the model's folder"):
        onnxpy.InferenceSession(str(work / "model.onnx"))


def test_data_file_with_a_second_hard_link_loads(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    path = _external_model(folder)
    os.link(folder / "weights.bin", tmp_path / "backup.bin")
    _both(path)


def test_dotdot_that_stays_inside_the_folder_loads(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    _both(_external_model(tmp_path, location="sub/../weights.bin"))


def test_offset_without_length_reads_what_the_tensor_needs(tmp_path: Path) -> None:
    # Two tensors packed in one file: the first has an offset and no length.
    path = _external_model(tmp_path, offset=8)
    with open(tmp_path / "weights.bin", "ab") as f:
        f.write(np.ones(16, np.float32).tobytes())
    np.testing.assert_array_equal(_both(path), X16 + np.arange(16, dtype=np.float32))


def test_offset_without_length_in_a_file_too_short_is_refused(tmp_path: Path) -> None:
    path = _external_model(tmp_path, offset=8)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:-4])
    with pytest.raises(
        onnxpy.Fail,
        match="needs 64 bytes of external data from offset 8, but .* has only 60 there: the file is too short",
    ):
        onnxpy.InferenceSession(str(path))
