"""External data is read only from regular files inside the model's folder, with offset and
length checked against the file and the tensor; optimized_model_filepath never overwrites the
model or writes anywhere but the one file it names. (The basic cases live in
tests/unit/test_load.py; this covers every escape and bound.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import make_model, vinfo

W = np.arange(16, dtype=np.float32)
ROOT_ONLY = hasattr(os, "geteuid") and os.geteuid() == 0


def _model(entries: dict[str, str], dims: list[int] | None = None) -> onnx.ModelProto:
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [16])],
        [vinfo("y", TensorProto.FLOAT, [16])],
        initializers={"w": W},
    )
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    if dims is not None:
        t.dims[:] = dims
    t.data_location = TensorProto.EXTERNAL
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    return m


def _save(folder: Path, m: onnx.ModelProto, name: str = "model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(m.SerializeToString())
    return path


def _load(path: Path) -> onnxpy.InferenceSession:
    return onnxpy.InferenceSession(str(path))


def _works(sess: onnxpy.InferenceSession) -> None:
    out = sess.run(None, {"x": np.ones(16, np.float32)})[0]
    np.testing.assert_array_equal(out, W + 1)


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """model/ holds the model; outside/ next to it holds a file the model must never read."""
    model = tmp_path / "model"
    outside = tmp_path / "outside"
    model.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(W.tobytes())
    (model / "w.bin").write_bytes(W.tobytes())
    return {"model": model, "outside": outside, "root": tmp_path}


def test_the_inside_case_works(layout: dict[str, Path]) -> None:
    _works(_load(_save(layout["model"], _model({"location": "w.bin"}))))


@pytest.mark.parametrize(
    "location",
    [
        "/etc/passwd",
        "{outside}/secret.bin",
        "C:\\Windows\\win.ini",
        "C:secret.bin",
        "\\\\server\\share\\secret.bin",
        "\\secret.bin",
    ],
)
def test_absolute_locations_are_refused(layout: dict[str, Path], location: str) -> None:
    loc = location.format(outside=layout["outside"])
    with pytest.raises(onnxpy.Fail, match="absolute path"):
        _load(_save(layout["model"], _model({"location": loc})))


@pytest.mark.parametrize(
    "location",
    ["../outside/secret.bin", "sub/../../outside/secret.bin", "./../outside/secret.bin"],
)
def test_dot_dot_locations_are_refused(layout: dict[str, Path], location: str) -> None:
    (layout["model"] / "sub").mkdir()
    with pytest.raises(onnxpy.Fail, match=r"outside the model's folder \('\.\.'\)"):
        _load(_save(layout["model"], _model({"location": location})))


def test_symlinked_file_pointing_outside_is_refused(layout: dict[str, Path]) -> None:
    os.symlink(layout["outside"] / "secret.bin", layout["model"] / "link.bin")
    with pytest.raises(onnxpy.Fail, match="resolves outside"):
        _load(_save(layout["model"], _model({"location": "link.bin"})))


def test_symlinked_folder_pointing_outside_is_refused(layout: dict[str, Path]) -> None:
    os.symlink(layout["outside"], layout["model"] / "data")
    with pytest.raises(onnxpy.Fail, match="resolves outside"):
        _load(_save(layout["model"], _model({"location": "data/secret.bin"})))


def test_symlink_staying_inside_the_folder_is_fine(layout: dict[str, Path]) -> None:
    os.symlink(layout["model"] / "w.bin", layout["model"] / "alias.bin")
    _works(_load(_save(layout["model"], _model({"location": "alias.bin"}))))


def test_model_reached_through_a_symlinked_folder_reads_its_real_folder(layout: dict[str, Path]) -> None:
    path = _save(layout["model"], _model({"location": "w.bin"}))
    os.symlink(layout["model"], layout["root"] / "shortcut")
    _works(_load(layout["root"] / "shortcut" / path.name))


@pytest.mark.skipif(os.sep == "\\", reason="a backslash is a separator on Windows")
def test_backslashes_are_part_of_a_posix_file_name(layout: dict[str, Path]) -> None:
    """As onnxruntime reads it on Linux: '..\\outside\\secret.bin' is one name inside the folder."""
    with pytest.raises(onnxpy.NoSuchFile, match="not found"):
        _load(_save(layout["model"], _model({"location": "..\\outside\\secret.bin"})))


def test_location_that_is_a_folder_is_refused(layout: dict[str, Path]) -> None:
    (layout["model"] / "adir").mkdir()
    with pytest.raises(onnxpy.Fail, match="not a regular file"):
        _load(_save(layout["model"], _model({"location": "adir"})))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX feature")
def test_location_that_is_a_fifo_is_refused_without_blocking(layout: dict[str, Path]) -> None:
    os.mkfifo(layout["model"] / "pipe.bin")  # opening it for reading would wait for a writer
    with pytest.raises(onnxpy.Fail, match="not a regular file"):
        _load(_save(layout["model"], _model({"location": "pipe.bin"})))


@pytest.mark.parametrize("location", ["missing.bin", "w.bin\0.png"])
def test_missing_file_is_a_clear_error(layout: dict[str, Path], location: str) -> None:
    with pytest.raises(onnxpy.NoSuchFile, match="not found"):
        _load(_save(layout["model"], _model({"location": location})))


def test_no_location_is_a_clear_error(layout: dict[str, Path]) -> None:
    with pytest.raises(onnxpy.Fail, match="names no location"):
        _load(_save(layout["model"], _model({"offset": "0"})))


@pytest.mark.parametrize(
    "entries, message",
    [
        ({"offset": "65"}, "outside"),  # the file has 64 bytes
        ({"offset": "-1"}, "outside"),
        ({"offset": "8"}, "needs 64"),  # 56 bytes left for 64 needed
        ({"length": "-8"}, "runs past the end"),
        ({"offset": "32", "length": "64"}, "runs past the end"),
        ({"length": "4096"}, "runs past the end"),
        ({"length": "32"}, "needs 64"),
        ({"offset": "0x10"}, "not integers"),
        ({"length": "1e3"}, "not integers"),
        ({"offset": str(1 << 70)}, "outside"),
    ],
)
def test_offset_and_length_are_checked_against_file_and_tensor(
    layout: dict[str, Path], entries: dict[str, str], message: str
) -> None:
    with pytest.raises(onnxpy.Fail, match=message):
        _load(_save(layout["model"], _model({"location": "w.bin", **entries})))


@pytest.mark.parametrize("dims", [[1 << 40], [-16], [4, 5], [1 << 31, 1 << 31, 1 << 31]])
def test_shape_disagreeing_with_the_data_is_refused_before_reading(layout: dict[str, Path], dims: list[int]) -> None:
    with pytest.raises(onnxpy.Fail, match="needs"):
        _load(_save(layout["model"], _model({"location": "w.bin"}, dims=dims)))


def test_bytes_and_modelproto_sources_need_the_folder_entry(layout: dict[str, Path]) -> None:
    m = _model({"location": "w.bin"})
    for source in (m.SerializeToString(), m):
        with pytest.raises(onnxpy.InvalidArgument, match="model_external_initializers_file_folder_path"):
            onnxpy.InferenceSession(source)
        so = onnxpy.SessionOptions()
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(layout["model"]))
        _works(onnxpy.InferenceSession(source, so))
    # The entry's folder is then the model's folder: the same escapes are refused.
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(layout["model"]))
    with pytest.raises(onnxpy.Fail, match="outside"):
        onnxpy.InferenceSession(_model({"location": "../outside/secret.bin"}).SerializeToString(), so)
    bad = onnxpy.SessionOptions()
    bad.add_session_config_entry("session.model_external_initializers_file_folder_path", str(layout["model"] / "w.bin"))
    with pytest.raises(onnxpy.InvalidArgument, match="not a folder"):
        onnxpy.InferenceSession(m.SerializeToString(), bad)


def test_tensors_inside_subgraphs_and_sparse_tensors_are_checked_too(layout: dict[str, Path]) -> None:
    value = numpy_helper.from_array(W, "c")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    value.external_data.add(key="location", value="../outside/secret.bin")
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=value)], "b", [], [vinfo("k", TensorProto.FLOAT, [16])]
    )
    m = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        [vinfo("c", TensorProto.BOOL, [])],
        [vinfo("y", TensorProto.FLOAT, [16])],
    )
    with pytest.raises(onnxpy.Fail, match="outside"):
        _load(_save(layout["model"], m))
    sp = m.graph.sparse_initializer.add()
    sp.dims.append(16)
    sp.values.CopyFrom(value)
    sp.values.name = "sv"
    sp.indices.CopyFrom(numpy_helper.from_array(np.arange(16, dtype=np.int64), "si"))
    del m.graph.node[:]
    with pytest.raises(onnxpy.Fail, match="outside"):
        _load(_save(layout["model"], m, "sparse.onnx"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX feature")
def test_model_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.onnx")
    with pytest.raises(onnxpy.InvalidArgument, match="not a regular file"):
        onnxpy.InferenceSession(str(tmp_path / "model.onnx"))
    with pytest.raises(onnxpy.InvalidArgument, match="not a regular file|NUL|embedded null"):
        onnxpy.InferenceSession(os.devnull)


# -- optimized_model_filepath -----------------------------------------------------------------


def _plain_model() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
    )


def _with_output(path: Any) -> onnxpy.SessionOptions:
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(path)
    return so


def test_optimized_model_never_overwrites_the_model(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(_plain_model().SerializeToString())
    original = src.read_bytes()
    for target in (src, tmp_path / "." / "m.onnx", tmp_path / "sub" / ".." / "m.onnx"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(onnxpy.InvalidArgument, match="model being loaded"):
            onnxpy.InferenceSession(str(src), _with_output(target))
    os.link(src, tmp_path / "hard.onnx")  # another name for the same file
    with pytest.raises(onnxpy.InvalidArgument, match="model being loaded"):
        onnxpy.InferenceSession(str(src), _with_output(tmp_path / "hard.onnx"))
    assert src.read_bytes() == original


def test_optimized_model_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "out.onnx")
    with pytest.raises(onnxpy.InvalidArgument, match="symbolic link"):
        onnxpy.InferenceSession(_plain_model().SerializeToString(), _with_output(tmp_path / "out.onnx"))
    assert victim.read_text() == "keep me"


def test_optimized_model_path_must_be_a_file_in_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(onnxpy.InvalidArgument, match="does not exist"):
        onnxpy.InferenceSession(_plain_model().SerializeToString(), _with_output(tmp_path / "nope" / "o.onnx"))
    (tmp_path / "adir").mkdir()
    with pytest.raises(onnxpy.InvalidArgument, match="not a regular file"):
        onnxpy.InferenceSession(_plain_model().SerializeToString(), _with_output(tmp_path / "adir"))


def test_optimized_model_writes_exactly_one_file(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "other.txt").write_text("untouched")
    target = folder / "opt.onnx"
    onnxpy.InferenceSession(_plain_model().SerializeToString(), _with_output(target))
    assert sorted(p.name for p in folder.iterdir()) == ["opt.onnx", "other.txt"]  # no temporary left
    assert (folder / "other.txt").read_text() == "untouched"
    out = onnxpy.InferenceSession(str(target)).run(None, {"x": np.array([-1, 2], np.float32)})[0]
    np.testing.assert_array_equal(out, [0, 2])
    # A hard link to an unrelated file at the target is replaced, not written through.
    keep = folder / "keep.bin"
    keep.write_bytes(b"precious")
    target.unlink()
    os.link(keep, target)
    onnxpy.InferenceSession(_plain_model().SerializeToString(), _with_output(target))
    assert keep.read_bytes() == b"precious"
