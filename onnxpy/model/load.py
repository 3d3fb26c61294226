"""Load a model from a path, bytes or ModelProto, resolving external data safely.

External data is read only from regular files inside the model's folder: a location is looked up
next to the model path as given (a link to the model, as in the Hugging Face hub cache, keeps its
data beside the link), and absolute locations and those that resolve (``..``, links) outside both
that folder and the folder of the model's real file are refused. offset/length are checked against
the file size and against what the tensor's shape and type need, before anything is read.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from ..api.errors import Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile
from . import dtypes

# Highest versions this runtime was written against; newer models get a clear error.
MAX_IR_VERSION = onnx.IR_VERSION
MAX_OPSET = {
    "": onnx.defs.onnx_opset_version(),
    "ai.onnx": onnx.defs.onnx_opset_version(),
    "ai.onnx.ml": onnx.helper.VERSION_TABLE[-1][3],
}

# Deepest nesting of subgraphs (If inside If inside Loop...) a model may have. Every stage
# walks subgraphs without recursion, but compiling and running a subgraph calls into it, and
# a model nesting deeper than this is hostile, not useful. (Serialized models cannot even get
# near it: protobuf refuses to parse messages nested more than 100 deep, ~33 subgraph levels.)
MAX_NESTING_DEPTH = 512

# Deepest TypeProto nesting (sequence of sequence of ...) a value may declare.
MAX_TYPE_DEPTH = 32


def load_model(
    source: Any,
    external_data_dir: str | os.PathLike | None = None,
    provided: dict[str, Any] | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    files: dict[str, memoryview] | None = None,
) -> tuple[ModelProto, Path | None]:
    """Return (model, folder) where folder is where its external data may live (None for bytes).

    ``provided``: host arrays by initializer name (``SessionOptions.add_external_initializers``)
    that take the place of those main-graph initializers' external data, which is then not read.
    ``arrays``: where large main-graph initializers stored externally are read straight into
    (see ``resolve_external_data``). ``files``: the contents of external data files by location
    (``SessionOptions.add_external_initializers_from_files_in_memory``): main-graph initializers
    are then read from there, not from disk."""
    roots: list[Path] = []  # real folders external data may resolve into
    if isinstance(source, ModelProto):
        check_nesting(source)  # before copying: a copy of an absurdly deep message recurses in C
        model = ModelProto()
        model.CopyFrom(source)
        folder = None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        model = _parse(bytes(source), "the given bytes")
        folder = None
    elif isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        try:
            exists = path.exists()
        except (OSError, ValueError) as e:  # a NUL character, a name too long...
            raise InvalidArgument(f"Load model from {path!r} failed: {e}") from None
        if not exists:
            raise NoSuchFile(f"Load model from {path} failed: file does not exist")
        if path.is_dir():
            raise InvalidArgument(f"Load model from {path} failed: it is a folder, expected an .onnx file")
        if not path.is_file():
            # A FIFO or a device would block or never end (/dev/zero).
            raise InvalidArgument(f"Load model from {path} failed: not a regular file")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise NoSuchFile(f"Load model from {path} failed: {e}") from e
        model = _parse(data, str(path))
        # Data files are named relative to the path as given, not to where a link to it points.
        folder = path.absolute().parent
        roots = [folder.resolve(), path.resolve().parent]
    else:
        raise InvalidArgument(
            f"cannot load a model from {type(source).__name__}: expected a path (str or os.PathLike), "
            "bytes or an onnx.ModelProto"
        )
    if external_data_dir is not None:
        folder = Path(os.fspath(external_data_dir)).absolute()
        roots = [folder.resolve()]
        if not folder.is_dir():
            raise InvalidArgument(
                f"session config 'session.model_external_initializers_file_folder_path': '{external_data_dir}' is not a folder"
            )
    _check_versions(model)
    check_nesting(model)
    check_strings(model)
    if provided:
        _provide_external(model, provided)
    if files:
        _read_from_files(model, files, arrays)
    resolve_external_data(model, folder, roots, arrays)
    return model, folder


def _provide_external(model: ModelProto, provided: dict[str, Any]) -> None:
    """Fill main-graph initializers that store their data externally from ``provided``, as
    onnxruntime's AddExternalInitializers does: each name must be such an initializer, and each
    array must have its type and shape."""
    by_name = {t.name: t for t in model.graph.initializer}
    for name, arr in provided.items():
        t = by_name.get(name)
        if t is None:
            raise InvalidArgument(
                f"add_external_initializers: the model has no initializer named '{name}'; it has {sorted(by_name)[:20]}"
            )
        if t.data_location != TensorProto.EXTERNAL:
            raise InvalidArgument(
                f"add_external_initializers: initializer '{name}' is stored in the model, not in external data "
                "(SessionOptions.add_initializer replaces it)"
            )
        if tuple(t.dims) != arr.shape or t.data_type != dtypes.elem_type(arr.dtype):
            raise InvalidArgument(
                f"add_external_initializers '{name}': got {dtypes.dtype_string(arr.dtype)} {list(arr.shape)}, the "
                f"model's initializer is {dtypes.tensor_type_string(t.data_type)} {list(t.dims)}"
            )
        t.CopyFrom(onnx.numpy_helper.from_array(arr, name))


def _read_from_files(model: ModelProto, files: dict[str, memoryview], arrays: dict[str, np.ndarray] | None) -> None:
    """Fill main-graph initializers stored externally from in-memory file contents (``files``:
    normalized location -> bytes), as onnxruntime does: each such initializer's location must
    be one of them, and its offset and length must lie inside it."""
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        data = files.get(os.path.normpath(location.replace("\\", "/")).replace("\\", "/"))
        if data is None:
            raise Fail(
                f"tensor '{t.name}': external data file '{location}' is not among the files given in memory "
                f"({sorted(files)})"
            )
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise Fail(f"tensor '{t.name}': external data offset/length are not integers: {info}") from None
        needed = expected_nbytes(t)
        if length is None:
            length = len(data) - offset if needed is None else needed
        if offset < 0 or length < 0 or offset + length > len(data):
            raise Fail(
                f"tensor '{t.name}': external data [{offset}, {offset + length}) is outside '{location}' given in "
                f"memory ({len(data)} bytes)"
            )
        if needed is not None and needed != length:
            raise Fail(
                f"tensor '{t.name}': external data holds {length} bytes but shape {list(t.dims)} of "
                f"{dtypes.tensor_type_string(t.data_type)} needs {needed}"
            )
        dt = _direct_dtype(t) if arrays is not None and np.little_endian else None
        if dt is not None:
            assert arrays is not None
            chunk = np.frombuffer(data, dtype=np.uint8, count=length, offset=offset)
            arrays[t.name] = chunk.view(dt).reshape(tuple(int(d) for d in t.dims)).copy()
        else:
            t.raw_data = bytes(data[offset : offset + length])
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]


def _parse(data: bytes, what: str) -> ModelProto:
    if not data:
        raise InvalidProtobuf(f"Load model from {what} failed: the model is empty (0 bytes)")
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidProtobuf(f"Load model from {what} failed: Protobuf parsing failed ({e})") from None
    if not model.HasField("graph") and model.ir_version == 0:
        raise InvalidProtobuf(f"Load model from {what} failed: not an ONNX model (no graph, no IR version)")
    return model


def _check_versions(model: ModelProto) -> None:
    if model.ir_version > MAX_IR_VERSION:
        raise InvalidGraph(
            f"Unsupported model IR version: {model.ir_version}, max supported IR version: {MAX_IR_VERSION}"
        )
    for imp in model.opset_import:
        limit = MAX_OPSET.get(imp.domain)
        if limit is not None and imp.version > limit:
            raise InvalidGraph(
                f"Opset {imp.version} for domain '{imp.domain or 'ai.onnx'}' is newer than the newest "
                f"supported ({limit})"
            )


def check_nesting(model: ModelProto) -> None:
    """Refuse a model whose subgraphs nest deeper than MAX_NESTING_DEPTH (walked without recursion)."""
    roots = [model.graph] if model.HasField("graph") else []
    stack: list[tuple[GraphProto, int]] = [(g, 0) for g in roots]
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                stack.extend((g, 1) for g in _attr_graphs(attr))
    while stack:
        g, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise InvalidGraph(
                f"the model nests subgraphs more than {MAX_NESTING_DEPTH} levels deep (at graph '{g.name}')"
            )
        for vi in (*g.input, *g.output, *g.value_info):
            _check_type_depth(vi)
        for node in g.node:
            for attr in node.attribute:
                stack.extend((sub, depth + 1) for sub in _attr_graphs(attr))


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6; ``label`` before
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def check_strings(model: ModelProto) -> None:
    """Every string field (names, op types, domains, dimension names...) holds valid UTF-8.

    protobuf hands an invalid one to Python as ``bytes`` instead of ``str``, which would surface
    far away as a TypeError; refuse it here, naming the field.
    """
    stack: list[Any] = [model]
    kinds: dict[Any, int] = {}  # field descriptor -> _field_kind, looked up once per field
    while stack:
        msg = stack.pop()
        for field, value in msg.ListFields():
            kind = kinds.get(field)
            if kind is None:
                kind = kinds[field] = _field_kind(field)
            if kind == _STRING:
                if value.__class__ is not str:
                    _not_utf8(field, value)
            elif kind == _STRINGS:
                for v in value:
                    if v.__class__ is not str:
                        _not_utf8(field, v)
            elif kind == _MESSAGE:
                stack.append(value)
            elif kind == _MESSAGES:
                stack.extend(value)


_OTHER, _STRING, _STRINGS, _MESSAGE, _MESSAGES = range(5)


def _field_kind(field: FieldDescriptor) -> int:
    repeated = _is_repeated(field)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _STRINGS if repeated else _STRING
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _MESSAGES if repeated else _MESSAGE
    return _OTHER


def _not_utf8(field: FieldDescriptor, value: Any) -> NoReturn:
    raise InvalidProtobuf(f"the model's {field.full_name} field holds {bytes(value)[:40]!r}, which is not valid UTF-8")


def _check_type_depth(vi: onnx.ValueInfoProto) -> None:
    tp, depth = vi.type, 0
    while True:
        kind = tp.WhichOneof("value")
        if kind == "sequence_type":
            tp = tp.sequence_type.elem_type
        elif kind == "optional_type":
            tp = tp.optional_type.elem_type
        elif kind == "map_type":
            tp = tp.map_type.value_type
        else:
            return
        depth += 1
        if depth > MAX_TYPE_DEPTH:
            raise InvalidGraph(f"value '{vi.name}' has a type nested more than {MAX_TYPE_DEPTH} levels deep")


def _attr_graphs(attr: AttributeProto) -> list[GraphProto]:
    out = [attr.g] if attr.HasField("g") else []
    out.extend(attr.graphs)
    return out


def iter_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto of a graph: initializers, sparse parts and attribute tensors, nested."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield from g.initializer
        for sp in g.sparse_initializer:
            yield sp.values
            yield sp.indices
        for node in g.node:
            for attr in node.attribute:
                yield from _attr_tensors(attr, stack)


def _attr_tensors(attr: AttributeProto, stack: list[GraphProto]) -> Iterator[TensorProto]:
    if attr.HasField("t"):
        yield attr.t
    yield from attr.tensors
    if attr.HasField("sparse_tensor"):
        yield attr.sparse_tensor.values
        yield attr.sparse_tensor.indices
    if attr.HasField("g"):
        stack.append(attr.g)
    stack.extend(attr.graphs)


# Main-graph initializers of more elements than this are read straight into ``arrays`` (if
# given): more than shape inference reads (runtime/compile.py's _INFERENCE_VALUE_LIMIT).
DIRECT_MIN_ELEMENTS = 4096


def resolve_external_data(
    model: ModelProto,
    folder: Path | None,
    roots: list[Path] | None = None,
    arrays: dict[str, np.ndarray] | None = None,
) -> None:
    """Read every external tensor's data into it. Locations are relative to ``folder`` and must
    resolve inside one of ``roots`` (real folders; by default ``folder`` itself, resolved).

    With ``arrays``, large main-graph initializers (the weights) are read from the file straight
    into numpy arrays there, by name, and their TensorProtos keep no data: through the proto
    the bytes would exist twice while the graph is built (the parsed model's memory is freed
    only with the whole model)."""
    if roots is None:
        roots = [folder.resolve()] if folder is not None else []
    if arrays is not None and np.little_endian:
        for t in model.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL and _direct_dtype(t) is not None:
                arrays[t.name] = _load_external(t, folder, roots, into_array=True)  # type: ignore[assignment]
    tensors = list(iter_tensors(model.graph))
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                stack: list[GraphProto] = []
                tensors.extend(_attr_tensors(attr, stack))
                for g in stack:
                    tensors.extend(iter_tensors(g))
    for t in tensors:
        if t.data_location == TensorProto.EXTERNAL:
            _load_external(t, folder, roots)


def _direct_dtype(t: TensorProto) -> np.dtype | None:
    """The numpy dtype a large tensor's bytes are read as directly, or None (small, packed
    4-bit or string tensors go through the proto)."""
    count = 1
    for d in t.dims:
        count *= d
    if count <= DIRECT_MIN_ELEMENTS or t.data_type in _NOT_DIRECT:
        return None
    try:
        return dtypes.np_dtype(t.data_type)
    except ValueError:
        return None


_NOT_DIRECT = {
    getattr(TensorProto, n)
    for n in ("STRING", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "UNDEFINED")
    if hasattr(TensorProto, n)
}


def _load_external(
    tensor: TensorProto, folder: Path | None, roots: list[Path], into_array: bool = False
) -> np.ndarray | None:
    """Read ``tensor``'s external data into it, or with ``into_array`` into a new array of its
    type and shape (the tensor then keeps no data)."""
    info = {e.key: e.value for e in tensor.external_data}
    name = tensor.name or "<unnamed>"
    location = info.get("location")
    if not location:
        raise Fail(f"tensor '{name}' uses external data but names no location")
    if folder is None:
        raise InvalidArgument(
            f"tensor '{name}' stores its data in external file '{location}', but the model was given as "
            "bytes or a ModelProto and has no folder: set the session config entry "
            "'session.model_external_initializers_file_folder_path' to the folder that holds it"
        )
    rel = Path(location)
    if rel.is_absolute() or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise Fail(
            f"tensor '{name}': external data location '{location}' is an absolute path; only paths inside the model's folder are allowed"
        )
    real = _resolve_inside(folder, rel, roots, name, location)
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise Fail(f"tensor '{name}': external data offset/length are not integers: {info}") from None
    try:
        # O_NOFOLLOW and checks on the open descriptor: the file read is the file checked,
        # even if the path is swapped for a link in between.
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise NoSuchFile(f"tensor '{name}': external data file '{location}' not found in {folder}") from None
    except OSError as e:
        raise Fail(f"tensor '{name}': cannot open external data file '{location}': {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Fail(f"tensor '{name}': external data location '{location}' is not a regular file")
        # A file with several hard links is read (onnxruntime does; hard-linking caches make them
        # common): making a link into the folder takes the same access as copying the file there.
        size = st.st_size
        if offset < 0 or offset > size:
            raise Fail(f"tensor '{name}': external data offset {offset} is outside '{location}' ({size} bytes)")
        needed = expected_nbytes(tensor)
        if length is None:
            # length is optional (IR.md): the tensor takes what its type and shape need, and the
            # file may go on with other tensors' data.
            length = size - offset if needed is None else _needed_length(tensor, needed, offset, size, location)
        if length < 0 or offset + length > size:
            raise Fail(
                f"tensor '{name}': external data [{offset}, {offset + length}) runs past the end of '{location}' "
                f"({size} bytes)"
            )
        if needed is not None and needed != length:
            raise Fail(
                f"tensor '{name}': external data holds {length} bytes but shape {list(tensor.dims)} of "
                f"{dtypes.tensor_type_string(tensor.data_type)} needs {needed}"
            )
    except BaseException:
        os.close(fd)
        raise
    array = None
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        if into_array:
            dt = _direct_dtype(tensor)
            assert dt is not None
            array = np.empty(tuple(int(d) for d in tensor.dims), dtype=dt)
            got = f.readinto(memoryview(array.reshape(-1).view(np.uint8)))
        else:
            data = f.read(length)
            got = len(data)
    if got != length:
        raise Fail(f"tensor '{name}': external data file '{location}' changed while being read")
    if array is None:
        tensor.raw_data = data
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]
    return array


def _resolve_inside(folder: Path, rel: Path, roots: list[Path], name: str, location: str) -> Path:
    """``folder / rel`` with links and ``..`` resolved, refused unless it lies inside one of
    ``roots``. Checked before the file's existence, so nothing is learnt about files outside."""
    try:
        real = (folder / rel).resolve()
    except (RuntimeError, OSError, ValueError) as e:  # a link loop, a NUL character...
        raise NoSuchFile(f"tensor '{name}': external data file '{location}' not found in {folder} ({e})") from None
    if any(real == root or root in real.parents for root in roots):
        return real
    if ".." in rel.parts:
        raise Fail(
            f"tensor '{name}': external data location '{location}' points outside the model's folder ('..'): "
            f"it resolves to {real}"
        )
    raise Fail(f"tensor '{name}': external data file '{location}' resolves outside the model's folder ({real})")


def _needed_length(tensor: TensorProto, needed: int, offset: int, size: int, location: str) -> int:
    """The length of a tensor whose external data gives none: what its type and shape need,
    refused when that runs past the end of the file."""
    if 0 <= needed <= size - offset:
        return needed
    what = f"tensor '{tensor.name or '<unnamed>'}': shape {list(tensor.dims)} of {dtypes.tensor_type_string(tensor.data_type)}"
    if needed < 0:
        raise Fail(f"{what} needs {needed} bytes: a dimension is negative")
    raise Fail(
        f"{what} needs {needed} bytes of external data from offset {offset}, but '{location}' has only "
        f"{size - offset} there: the file is too short"
    )


def expected_nbytes(tensor: TensorProto) -> int | None:
    """Bytes a raw_data payload of this tensor must have (None when not fixed, e.g. strings)."""
    if tensor.data_type == TensorProto.STRING:
        return None
    try:
        dt = dtypes.np_dtype(tensor.data_type)
    except ValueError:
        return None
    count = math.prod(int(d) for d in tensor.dims)  # Python ints: no int64 wrap-around
    bits = {
        TensorProto.INT4: 4,
        TensorProto.UINT4: 4,
        TensorProto.FLOAT4E2M1: 4,
    }.get(tensor.data_type)
    if bits is None and getattr(TensorProto, "INT2", -1) == tensor.data_type:
        bits = 2
    if bits is None and getattr(TensorProto, "UINT2", -1) == tensor.data_type:
        bits = 2
    if bits is not None:
        return (count * bits + 7) // 8
    return count * dt.itemsize
