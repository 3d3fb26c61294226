"""The CUDA C++ bodies of onnxpy/ops/cuda_kernels.py, checked without a GPU.

Each body is compiled by the host C++ compiler inside a loop equivalent to what CuPy's
ElementwiseKernel generates (``T`` the element type, one element per iteration), run over test
values in float32 and float64, and compared with the generic numpy kernel of the same op. What
this cannot check is CuPy's float16 type and NVRTC itself; tests/gpu/test_cuda.py does on a GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from onnxpy.ops import cuda_kernels, registry
from onnxpy.ops import elementwise as generic

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/clang++) to check the CUDA C bodies")

ATTRS = {"alpha": 0.7, "beta": 0.4, "gamma": 1.3}

# body name -> the generic kernel computing the same thing
ORACLES = {
    "sigmoid": lambda x: generic.sigmoid(np, x),
    "erf": lambda x: generic.erf(np, x),
    "gelu": lambda x: generic.gelu(np, x),
    "gelu_tanh": lambda x: generic.gelu(np, x, approximate="tanh"),
    "softplus": lambda x: generic.softplus(np, x),
    "softsign": lambda x: generic.softsign(np, x),
    "mish": lambda x: generic.mish(np, x),
    "elu": lambda x: generic.elu(np, x, alpha=ATTRS["alpha"]),
    "selu": lambda x: generic.selu(np, x, alpha=ATTRS["alpha"], gamma=ATTRS["gamma"]),
    "celu": lambda x: generic.celu(np, x, alpha=ATTRS["alpha"]),
    "leaky_relu": lambda x: generic.leaky_relu(np, x, alpha=ATTRS["alpha"]),
    "hard_sigmoid": lambda x: generic.hard_sigmoid(np, x, alpha=ATTRS["alpha"], beta=ATTRS["beta"]),
    "hard_swish": lambda x: generic.hard_swish(np, x),
    "thresholded_relu": lambda x: generic.thresholded_relu(np, x, alpha=ATTRS["alpha"]),
}


def _source() -> str:
    parts = ["#include <cmath>", "using namespace std;", cuda_kernels.PREAMBLE]
    for name in cuda_kernels.BODIES:
        _, _, operation = cuda_kernels.kernel_source(name)
        parts.append(
            f"template <typename T> static void {name}_loop(const T* xs, T* ys, long n,"
            " double alpha, double beta, double gamma) {\n"
            "  (void)alpha; (void)beta; (void)gamma;\n"
            f"  for (long i = 0; i < n; ++i) {{ const T x = xs[i]; T y; {operation} ys[i] = y; }}\n"
            "}\n"
            f'extern "C" void {name}_f32(const float* x, float* y, long n, double a, double b, double g)'
            f" {{ {name}_loop<float>(x, y, n, a, b, g); }}\n"
            f'extern "C" void {name}_f64(const double* x, double* y, long n, double a, double b, double g)'
            f" {{ {name}_loop<double>(x, y, n, a, b, g); }}\n"
        )
    return "\n".join(parts)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    folder = Path(tmp_path_factory.mktemp("cuda_bodies"))
    src = folder / "bodies.cpp"
    lib = folder / "bodies.so"
    src.write_text(_source())
    done = subprocess.run(
        [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True
    )
    assert done.returncode == 0, f"the CUDA C bodies do not compile as C++17:\n{done.stderr[:3000]}"
    return ctypes.CDLL(str(lib))


def _values(dtype: type) -> np.ndarray:
    grid = np.linspace(-8, 8, 801)
    extremes = np.array([-80.0, -30.0, -1e-6, 0.0, 1e-6, 0.7, 0.70001, 30.0, 80.0])
    return np.concatenate([grid, extremes]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(cuda_kernels.BODIES))
def test_body_matches_the_generic_kernel(library: ctypes.CDLL, name: str, dtype: type) -> None:
    x = _values(dtype)
    y = np.empty_like(x)
    suffix = "f32" if dtype == np.float32 else "f64"
    fn = getattr(library, f"{name}_{suffix}")
    ptr = ctypes.c_void_p
    fn.argtypes = [ptr, ptr, ctypes.c_long, ctypes.c_double, ctypes.c_double, ctypes.c_double]
    fn(x.ctypes.data, y.ctypes.data, x.size, ATTRS["alpha"], ATTRS["beta"], ATTRS["gamma"])
    want = ORACLES[name](x)
    assert want.dtype == x.dtype
    rtol = 2e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=rtol, atol=rtol, err_msg=name)


def test_every_body_has_an_oracle_and_a_registered_kernel() -> None:
    assert set(ORACLES) == set(cuda_kernels.BODIES)
    latest = {"Gelu": 22, "Mish": 22, "HardSwish": 22, "Celu": 22}
    for op_type in [
        "Sigmoid",
        "Erf",
        "Gelu",
        "Softplus",
        "Softsign",
        "Mish",
        "Elu",
        "Selu",
        "Celu",
        "LeakyRelu",
        "HardSigmoid",
        "HardSwish",
        "ThresholdedRelu",
        "Conv",
    ]:
        opset = latest.get(op_type, 22)
        cuda = registry.resolve("", op_type, opset, cuda_kernels.PROVIDER)
        assert cuda is not None and cuda.provider == cuda_kernels.PROVIDER, op_type
        plain = registry.resolve("", op_type, opset, "CPUExecutionProvider")
        assert plain is not None and plain.provider is None, op_type
        assert cuda.attributes == plain.attributes, op_type
