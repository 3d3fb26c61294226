"""Pattern fusions for exporter-decomposed operators:

- GELU: x * 0.5 * (1 + erf(x / sqrt(2))) in any of the orders exporters write it (Div by
  sqrt(2) or Mul by 1/sqrt(2); the 0.5 applied to x first or last) -> onnxpy.fused.Gelu.
- GELU's tanh approximation: 0.5 * x * (1 + tanh(beta * (x + kappa * x^3))), x^3 as Pow or two
  Muls, the 0.5 in any of the places the erf form takes it -> onnxpy.fused.GeluTanh with the
  model's beta and kappa.
- LayerNormalization decomposed as ReduceMean / Sub / Pow 2 / ReduceMean / Add eps / Sqrt / Div,
  optionally followed by Mul gamma and Add beta -> LayerNormalization (on the last axis).
- RMS normalization: x * 1 / Sqrt(ReduceMean(x^2) + eps) [* weight] over the last axis
  (LlamaRMSNorm, T5LayerNorm) -> onnxpy.fused.RMSNormalization.
- Swish: x * Sigmoid(x) (SiLU) and x * Sigmoid(alpha * x) (CLIP's QuickGelu, ONNX's Swish
  expanded) -> onnxpy.fused.Swish, which fuse_activation.py then moves into the producer of x.
- Transpose pairs: Transpose(Transpose(x, p), q) -> one Transpose (none if the composition is
  the identity).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant, scalar_value


# A pattern's constants match to float32's rounding of the exact ones, no looser: a GELU written
# with 0.4999 for 0.5 is another function (1e-4 let it be fused, 2e-4 off).
def _near(value: float | None, target: float, tol: float = 1e-6) -> bool:
    return value is not None and abs(value - target) <= tol * max(1.0, abs(target))


def _other(node: Node, name: str) -> str:
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})


def _is(node: Node | None, op: str) -> bool:
    if node is None or node.domain or node.op_type != op:
        return False
    return len(node.inputs) == 2 if op in _BINARY else True


def _divisor(value: float | None) -> float | None:
    """The erf argument's divisor c when it is within 1% of sqrt(2) (GELU's, rounded to a half
    precision type by a float16 or bfloat16 model), else None. Far from it the identity still
    holds, but x * s could overflow where x / c did not."""
    return value if value is not None and abs(value / math.sqrt(2) - 1) <= 0.01 else None


def _reciprocal(value: float | None) -> float | None:
    return None if value is None or value == 0.0 else _divisor(1 / value)


def _match_gelu(graph: Graph, uses: Uses, erf: Node) -> tuple[str, str, list[Node], float] | None:
    """(x, output, nodes to remove, c) when ``erf`` sits in a GELU pattern x * 0.5 * (1 + erf(x /
    c)): c is sqrt(2) for GELU itself, and near it where the model's constants were rounded
    (1.4140625 in a float16 model); any c gives x * Phi(x * sqrt(2) / c)."""
    pre = uses.producer.get(erf.inputs[0])
    if pre is None or uses.only_reader(erf.inputs[0]) is not erf:
        return None
    c: float | None = None
    if _is(pre, "Div") and (c := _divisor(scalar_value(constant(graph, pre.inputs[1])))) is not None:
        x = pre.inputs[0]
    elif _is(pre, "Mul"):
        k0, k1 = scalar_value(constant(graph, pre.inputs[0])), scalar_value(constant(graph, pre.inputs[1]))
        if (c := _reciprocal(k1)) is not None:
            x = pre.inputs[0]
        elif (c := _reciprocal(k0)) is not None:
            x = pre.inputs[1]
        else:
            return None
    else:
        return None
    found = _match_gelu_tail(graph, uses, erf, x)
    return None if found is None else (*found, c)


def _match_gelu_tail(graph: Graph, uses: Uses, erf: Node, x: str) -> tuple[str, str, list[Node]] | None:
    """The 0.5 * x * (1 + erf) part of ``_match_gelu``."""
    pre = uses.producer[erf.inputs[0]]
    add = uses.only_reader(erf.outputs[0])
    if not _is(add, "Add") or not _near(scalar_value(constant(graph, _other(add, erf.outputs[0]))), 1.0):
        return None
    m1 = uses.only_reader(add.outputs[0])
    if not _is(m1, "Mul"):
        return None
    partner = _other(m1, add.outputs[0])
    if partner == x:
        # x * (1 + erf) then * 0.5
        m2 = uses.only_reader(m1.outputs[0])
        if not _is(m2, "Mul") or not _near(scalar_value(constant(graph, _other(m2, m1.outputs[0]))), 0.5):
            return None
        return x, m2.outputs[0], [pre, erf, add, m1, m2]
    half = uses.producer.get(partner)
    if _is(half, "Mul") and uses.only_reader(partner) is m1:
        if x in half.inputs and _near(scalar_value(constant(graph, _other(half, x))), 0.5):
            return x, m1.outputs[0], [pre, erf, add, half, m1]
    if _near(scalar_value(constant(graph, partner)), 0.5):
        # (1 + erf) * 0.5 then * x
        m2 = uses.only_reader(m1.outputs[0])
        if _is(m2, "Mul") and _other(m2, m1.outputs[0]) == x:
            return x, m2.outputs[0], [pre, erf, add, m1, m2]
    return None


def _scalar(graph: Graph, name: str) -> float | None:
    """The finite value of a one-value constant of rank 0 or 1 (a higher rank would broadcast
    its operation's result to more dimensions), else None."""
    c = constant(graph, name)
    v = scalar_value(c) if c is not None and c.ndim <= 1 else None
    return v if v is not None and math.isfinite(v) else None


def _scaled_by_constant(graph: Graph, mul: Node) -> tuple[float, str] | None:
    """(k, v) for a Mul of v by a one-value constant k, in either order."""
    for k_name, v in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        k = _scalar(graph, k_name)
        if k is not None:
            return k, v
    return None


def _cube_of(graph: Graph, uses: Uses, value: str, x: str) -> list[Node] | None:
    """The nodes computing ``value`` = x^3 as Pow(x, 3), x * (x * x) or (x * x) * x, each
    read only on the way, else None."""
    node = uses.producer.get(value)
    if _is(node, "Pow"):
        return [node] if node.inputs[0] == x and _scalar(graph, node.inputs[1]) == 3.0 else None
    if not _is(node, "Mul") or x not in node.inputs:
        return None
    square = uses.producer.get(_other(node, x))
    if _is(square, "Mul") and square.inputs == [x, x] and uses.only_reader(square.outputs[0]) is node:
        return [square, node]
    return None


def _match_gelu_tanh(graph: Graph, uses: Uses, tanh: Node) -> tuple[str, str, list[Node], float, float] | None:
    """(x, output, nodes to remove, beta, kappa) when ``tanh`` sits in a tanh-approximated GELU
    0.5 * x * (1 + tanh(beta * (x + kappa * x^3))), as GPT-2's NewGELU and torch's
    gelu(approximate="tanh") export it (beta sqrt(2 / pi), kappa 0.044715; any constants are
    kept as the model has them). The output node is last."""
    scaled = uses.producer.get(tanh.inputs[0])
    if not _is(scaled, "Mul") or uses.only_reader(tanh.inputs[0]) is not tanh:
        return None
    beta_inner = _scaled_by_constant(graph, scaled)
    if beta_inner is None:
        return None
    beta, inner = beta_inner
    add = uses.producer.get(inner)
    if not _is(add, "Add") or uses.only_reader(inner) is not scaled:
        return None
    for x, term in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        times_kappa = uses.producer.get(term)
        if not _is(times_kappa, "Mul") or uses.only_reader(term) is not add:
            continue
        kappa_cube = _scaled_by_constant(graph, times_kappa)
        if kappa_cube is None or (cube := _cube_of(graph, uses, kappa_cube[1], x)) is None:
            continue
        if uses.only_reader(kappa_cube[1]) is not times_kappa:
            continue
        tail = _match_gelu_tail(graph, uses, tanh, x)
        if tail is None:
            return None
        _, out, rest = tail
        return x, out, [*cube, times_kappa, add, *rest], beta, kappa_cube[0]
    return None


def _axes_of(graph: Graph, node: Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and node.inputs[1]:
        c = constant(graph, node.inputs[1])
        return None if c is None else [int(a) for a in c.reshape(-1)]
    return None


def _last_axis_mean(graph: Graph, node: Node | None) -> bool:
    if node is None or node.domain or node.op_type != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return False
    axes = _axes_of(graph, node)
    rank = len(graph.shape(node.inputs[0]) or [])
    return axes is not None and len(axes) == 1 and (axes[0] == -1 or (rank and axes[0] == rank - 1))


def _match_layernorm(graph: Graph, uses: Uses, mean: Node) -> tuple[str, float, str, list[Node]] | None:
    """(x, epsilon, normalized output, nodes) for the decomposed normalization starting at ``mean``."""
    if not _last_axis_mean(graph, mean):
        return None
    x = mean.inputs[0]
    sub = uses.only_reader(mean.outputs[0])
    if not _is(sub, "Sub") or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    readers = uses.readers_of(d)
    if len(readers) != 2 or d in uses.graph_outputs:
        return None
    pow_ = next((r for r in readers if _is(r, "Pow") or (_is(r, "Mul") and r.inputs == [d, d])), None)
    div = next((r for r in readers if _is(r, "Div") and r.inputs[0] == d), None)
    if pow_ is None or div is None:
        return None
    if pow_.op_type == "Pow":
        exponent = constant(graph, pow_.inputs[1])
        if not _near(scalar_value(exponent), 2.0) or exponent.ndim > 1:
            return None
    var = uses.only_reader(pow_.outputs[0])
    if not _last_axis_mean(graph, var):
        return None
    add = uses.only_reader(var.outputs[0])
    if not _is(add, "Add"):
        return None
    eps_value = constant(graph, _other(add, var.outputs[0]))
    eps = scalar_value(eps_value)
    x_shape = graph.shape(x)
    if eps is None or x_shape is None or eps_value.ndim > len(x_shape):
        return None  # a one-value epsilon of higher rank adds leading dimensions to the result
    sqrt = uses.only_reader(add.outputs[0])
    if sqrt is None or sqrt.domain or sqrt.op_type != "Sqrt" or div.inputs[1] != sqrt.outputs[0]:
        return None
    if uses.only_reader(sqrt.outputs[0]) is not div:
        return None  # the standard deviation is read elsewhere too (or is an output): it must stay
    return x, eps, div.outputs[0], [mean, sub, pow_, var, add, sqrt, div]


def _match_rmsnorm(graph: Graph, uses: Uses, mean: Node) -> tuple[str, float, str, list[Node]] | None:
    """(x, epsilon, normalized output, nodes) for x * 1 / Sqrt(ReduceMean(x^2) + eps) over the
    last axis, as transformers' LlamaRMSNorm and T5LayerNorm export it (x^2 as Pow or Mul; the
    reciprocal as Div(1, .) or Reciprocal then Mul, or one Div of x), starting at ``mean``."""
    if not _last_axis_mean(graph, mean):
        return None
    square = uses.producer.get(mean.inputs[0])
    if uses.only_reader(mean.inputs[0]) is not mean:
        return None
    if _is(square, "Pow") and _scalar(graph, square.inputs[1]) == 2.0:
        x = square.inputs[0]
    elif _is(square, "Mul") and square.inputs[0] == square.inputs[1]:
        x = square.inputs[0]
    else:
        return None
    add = uses.only_reader(mean.outputs[0])
    if not _is(add, "Add"):
        return None
    eps = _scalar(graph, _other(add, mean.outputs[0]))
    sqrt = uses.only_reader(add.outputs[0])
    if eps is None or sqrt is None or sqrt.domain or sqrt.op_type != "Sqrt":
        return None
    nodes = [square, mean, add, sqrt]
    step = uses.only_reader(sqrt.outputs[0])
    if _is(step, "Div") and step.inputs == [x, sqrt.outputs[0]]:
        return x, eps, step.outputs[0], [*nodes, step]
    reciprocal = None
    if _is(step, "Div") and step.inputs[1] == sqrt.outputs[0] and _scalar(graph, step.inputs[0]) == 1.0:
        reciprocal = step
    elif step is not None and not step.domain and step.op_type == "Reciprocal":
        reciprocal = step
    if reciprocal is None:
        return None
    mul = uses.only_reader(reciprocal.outputs[0])
    if not _is(mul, "Mul") or _other(mul, reciprocal.outputs[0]) != x or mul.inputs[0] == mul.inputs[1]:
        return None
    return x, eps, mul.outputs[0], [*nodes, reciprocal, mul]


def _fuse_rmsnorm(graph: Graph, sweep: Sweep, node: Node, x: str, eps: float, out: str, dead: list[Node]) -> None:
    """The matched RMS normalization, with a following Mul by a constant weight over the last
    axis, as onnxpy.fused.RMSNormalization (x's float32 or float64 only)."""
    uses = sweep.uses
    shape = graph.shape(x)
    dtype = {1: np.float32, 11: np.float64}.get(graph.elem_type(x) or 0)
    if shape is None or not shape or not isinstance(shape[-1], int) or dtype is None:
        return
    width = shape[-1]
    scale = np.ones(width, dtype)
    tail = dead[-1]
    mul = uses.only_reader(out)
    if _is(mul, "Mul") and sweep.fresh(mul):
        g = constant(graph, _other(mul, out))
        if _along_last_axis(g, width, len(shape)) and g.dtype == dtype:
            scale = g.reshape(width)
            tail, out, dead = mul, mul.outputs[0], [*dead, mul]
    sname = sweep.new_name(f"{node.name or 'rmsnorm'}_scale")
    graph.initializers[sname] = np.ascontiguousarray(scale)
    fused = Node(
        "RMSNormalization", [x, sname], [out], {"epsilon": float(eps)}, node.name or "rmsnorm", FUSED_DOMAIN, 1
    )
    sweep.replace(tail, fused)
    sweep.remove(*[d for d in dead if d is not tail])


def _match_swish(graph: Graph, uses: Uses, sig: Node) -> tuple[str, float, Node, list[Node]] | None:
    """(x, alpha, the Mul to replace, other nodes to remove) when Sigmoid ``sig`` sits in
    x * Sigmoid(x) or x * Sigmoid(alpha * x), alpha a scalar constant."""
    mul = uses.only_reader(sig.outputs[0])
    if not _is(mul, "Mul") or mul.inputs[0] == mul.inputs[1]:
        return None
    x = _other(mul, sig.outputs[0])
    if sig.inputs[0] == x:
        return x, 1.0, mul, [sig]
    scaled = uses.producer.get(sig.inputs[0])
    if not _is(scaled, "Mul") or uses.only_reader(sig.inputs[0]) is not sig or x not in scaled.inputs:
        return None
    alpha = scalar_value(constant(graph, _other(scaled, x)))
    if alpha is None or not math.isfinite(alpha):
        return None
    return x, float(alpha), mul, [sig, scaled]


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if node.domain or not sweep.fresh(node):
            continue
        if node.op_type == "Erf" and graph.elem_type(node.inputs[0]) in (1, 10, 16, None):
            m = _match_gelu(graph, uses, node)
            if m is None or not sweep.fresh(*m[2]):
                continue
            x, out, dead, c = m
            # GELU's own divisor to float32's rounding: the plain kernel; another (a float16
            # model's 1.4140625) scales its input: x * Phi(x * s) = gelu(x * s) / s
            attrs = {} if _near(c, math.sqrt(2)) else {"scale": math.sqrt(2) / c}
            sweep.replace(dead[-1], Node("Gelu", [x], [out], attrs, node.name or "gelu", FUSED_DOMAIN, 1))
            sweep.remove(*dead[:-1])
        elif node.op_type == "Tanh" and graph.elem_type(node.inputs[0]) in (1, 10, 11, 16, None):
            t = _match_gelu_tanh(graph, uses, node)
            if t is None or not sweep.fresh(*t[2]):
                continue
            x, out, dead, beta, kappa = t
            attrs = {"beta": beta, "kappa": kappa}
            sweep.replace(dead[-1], Node("GeluTanh", [x], [out], attrs, node.name or "gelu_tanh", FUSED_DOMAIN, 1))
            sweep.remove(*dead[:-1])
        elif node.op_type == "Sigmoid" and graph.elem_type(node.inputs[0]) in (1, 10, 11, 16, None):
            s = _match_swish(graph, uses, node)
            if s is None or not sweep.fresh(s[2], *s[3]):
                continue
            x, alpha, mul, dead = s
            attrs = {} if alpha == 1.0 else {"alpha": alpha}
            sweep.replace(mul, Node("Swish", [x], list(mul.outputs), attrs, mul.name or "swish", FUSED_DOMAIN, 1))
            sweep.remove(*dead)
        elif node.op_type == "ReduceMean":
            m2 = _match_layernorm(graph, uses, node)
            if m2 is not None and sweep.fresh(*m2[3]):
                _fuse_layernorm(graph, sweep, node, *m2)
                continue
            r = _match_rmsnorm(graph, uses, node)
            if r is not None and sweep.fresh(*r[3]):
                _fuse_rmsnorm(graph, sweep, node, *r)
    _merge_transposes(graph, sweep)
    return sweep.finish()


def _along_last_axis(c: np.ndarray | None, width: int, rank: int) -> bool:
    """A constant that broadcasts along the normalized (last) axis only, without adding
    dimensions: [W], [1, W], ... A [W, 1] beta runs along another axis."""
    return c is not None and c.shape[-1:] == (width,) and c.size == width and c.ndim <= rank


def _fuse_layernorm(graph: Graph, sweep: Sweep, node: Node, x: str, eps: float, out: str, dead: list[Node]) -> None:
    uses = sweep.uses
    shape = graph.shape(x)
    if shape is None or not isinstance(shape[-1], int):
        return
    width = shape[-1]
    np_dtype = {1: np.float32, 11: np.float64, 10: np.float16}.get(graph.elem_type(x) or 0)
    if np_dtype is None:
        return
    # Absorb a following Mul(gamma) and Add(beta) with constant vectors.
    scale = np.ones(width, np_dtype)
    bias = None
    tail = dead[-1]
    mul = uses.only_reader(out)
    if _is(mul, "Mul") and sweep.fresh(mul):
        g = constant(graph, _other(mul, out))
        if _along_last_axis(g, width, len(shape)):
            scale = g.reshape(width).astype(np_dtype)
            tail, out = mul, mul.outputs[0]
            dead = [*dead, mul]
            add = uses.only_reader(out)
            if _is(add, "Add") and sweep.fresh(add):
                b = constant(graph, _other(add, out))
                if _along_last_axis(b, width, len(shape)):
                    bias = b.reshape(width).astype(np_dtype)
                    tail, out = add, add.outputs[0]
                    dead = [*dead, add]
    sname = sweep.new_name(f"{node.name or 'layernorm'}_scale")
    graph.initializers[sname] = scale
    inputs = [x, sname]
    if bias is not None:
        bname = sweep.new_name(f"{node.name or 'layernorm'}_bias")
        graph.initializers[bname] = bias
        inputs.append(bname)
    # In onnxpy's own domain: the model's opset may predate ONNX's LayerNormalization (17).
    ln = Node(
        "LayerNormalization",
        inputs,
        [out],
        {"axis": -1, "epsilon": float(eps)},
        node.name or "layernorm",
        FUSED_DOMAIN,
        1,
    )
    sweep.replace(tail, ln)
    sweep.remove(*[d for d in dead if d is not tail])


def _merge_transposes(graph: Graph, sweep: Sweep) -> None:
    uses = sweep.uses
    for node in list(graph.nodes):
        if node.domain or node.op_type != "Transpose" or "perm" not in node.attrs or not sweep.fresh(node):
            continue
        first = uses.producer.get(node.inputs[0])
        if first is None or first.domain or first.op_type != "Transpose" or "perm" not in first.attrs:
            continue
        if not sweep.fresh(first) or uses.only_reader(first.outputs[0]) is not node:
            continue
        p, q = list(first.attrs["perm"]), list(node.attrs["perm"])
        if len(p) != len(q):
            continue
        combined = [p[i] for i in q]
        node.inputs = [first.inputs[0]]
        node.attrs = {"perm": combined}
        if combined == list(range(len(combined))):
            node.op_type = "Identity"
            node.attrs = {}
        sweep.touch(node)
        sweep.remove(first)
