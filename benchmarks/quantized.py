"""Quantized variants of the shared models, written by onnxruntime's own quantizer.

``bench.py --quantized`` adds them: the CNNs quantized statically in the QDQ format (the
quantizer's default) and in the QOperator format (QLinearConv...), calibrated on random
inputs, and BERT quantized dynamically (MatMulInteger), the usual way to quantize a
transformer. Weights are random, so the figures say nothing of accuracy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from onnxpy.tools.feeds import make_feeds


def _calibration(model_path: str, seed: int) -> Iterator[dict[str, np.ndarray]]:
    header = onnx.load(model_path, load_external_data=False)
    for i in range(4):
        yield make_feeds(header, batch=1, seed=seed + i).arrays


def quantized_models(shared: list[str], workdir: str, seed: int = 0) -> list[tuple[str, str]]:
    """(name, path) of each quantized variant of the models in ``shared``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self, path: str) -> None:
            self.feeds = _calibration(path, seed)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    out: list[tuple[str, str]] = []
    for source in shared:
        stem = Path(source).stem
        # The quantizer's documented first step (constant folding, shape inference), which
        # its QOperator format needs for these exports.
        path = os.path.join(workdir, f"{stem}_preprocessed.onnx")
        quant_pre_process(source, path, skip_symbolic_shape=True)
        inputs = onnx.load(path, load_external_data=False).graph.input
        if any(i.type.tensor_type.elem_type != onnx.TensorProto.FLOAT for i in inputs):
            dest = os.path.join(workdir, f"{stem}_dynamic_u8.onnx")
            quantize_dynamic(path, dest, weight_type=QuantType.QUInt8)
            out.append((f"{stem} dynamic", dest))
            continue
        for fmt in ("QDQ", "QOperator"):
            dest = os.path.join(workdir, f"{stem}_{fmt.lower()}_u8s8.onnx")
            quantize_static(
                path,
                dest,
                Reader(path),
                quant_format=getattr(QuantFormat, fmt),
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                per_channel=True,
            )
            out.append((f"{stem} {fmt}", dest))
    return out
