"""Recurrent kernels: RNN, GRU, LSTM.

The input projection X @ W^T is one GEMM over all time steps; each step then does one GEMM
with R and elementwise gate math for the whole batch. Sequences shorter than seq_length
(``sequence_lens``) keep their state past their end and emit zeros there; the reverse direction
walks t = T-1 .. 0 and only starts updating a batch entry once t < its length, which is exactly
processing that entry's own sequence backwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._blas import stacked_matmul
from ._compat import host_ints
from ._derived import derived
from .conv import compute_dtype
from .registry import op

# name -> (uses alpha, uses beta, default alpha, default beta)
_ACT_PARAMS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}


def _activation(xp: Any, name: str, alpha: float, beta: float) -> Callable[[Any], Any]:
    n = name.lower()
    if n == "relu":
        return lambda v: xp.maximum(v, 0)
    if n == "tanh":
        return xp.tanh
    if n == "sigmoid":
        # tanh form: no overflow warning for large |v|
        return lambda v: 0.5 * (xp.tanh(0.5 * v) + 1)
    if n == "affine":
        return lambda v: alpha * v + beta
    if n == "leakyrelu":
        return lambda v: xp.where(v >= 0, v, alpha * v)
    if n == "thresholdedrelu":
        return lambda v: xp.where(v > alpha, v, 0)  # ThresholdedRelu: x > alpha
    if n == "scaledtanh":
        return lambda v: alpha * xp.tanh(beta * v)
    if n == "hardsigmoid":
        return lambda v: xp.clip(alpha * v + beta, 0, 1)
    if n == "elu":
        return lambda v: xp.where(v >= 0, v, alpha * (xp.exp(xp.minimum(v, 0)) - 1))
    if n == "softsign":
        return lambda v: v / (1 + xp.abs(v))
    if n == "softplus":
        return lambda v: xp.logaddexp(v, 0)
    raise ValueError(f"unsupported RNN activation '{name}' (expected one of {sorted(_ACT_PARAMS)})")


def _activations(
    xp: Any,
    names: list[str] | None,
    alphas: list[float] | None,
    betas: list[float] | None,
    defaults: list[str],
    num_dirs: int,
) -> list[list[Callable[[Any], Any]]]:
    """Per direction, the activation functions; alpha / beta are consumed in order by the
    activations that take them, falling back to the operator's defaults when the lists run out."""
    per_dir = len(defaults)
    if not names:
        names = defaults * num_dirs
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) == per_dir and num_dirs == 2:
        names = names * 2
    elif len(names) == 2 * per_dir and num_dirs == 1:
        # RNN's schema default lists both directions' functions; one direction uses the first.
        names = names[:per_dir]
    if len(names) != per_dir * num_dirs:
        raise ValueError(
            f"activations {names} must list {per_dir} functions per direction ({per_dir * num_dirs} in all)"
        )
    alphas = list(alphas or [])
    betas = list(betas or [])
    ai = bi = 0
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACT_PARAMS:
            raise ValueError(f"unsupported RNN activation '{name}' (expected one of {sorted(_ACT_PARAMS)})")
        uses_a, uses_b, da, db = _ACT_PARAMS[key]
        a, b = da, db
        if uses_a and ai < len(alphas):
            a = float(alphas[ai])
            ai += 1
        if uses_b and bi < len(betas):
            b = float(betas[bi])
            bi += 1
        fns.append(_activation(xp, key, a, b))
    return [fns[d * per_dir : (d + 1) * per_dir] for d in range(num_dirs)]


def default_activations(names: list[str] | None, defaults: list[str]) -> bool:
    """Whether ``names`` (already checked by _activations) are the operator's default functions
    in every direction: those take no alpha or beta, so the fast loops may hard-wire them."""
    if not names:
        return True
    want = [d.lower() for d in defaults]
    got = [(n.decode() if isinstance(n, bytes) else str(n)).lower() for n in names]
    return all(got[i : i + len(want)] == want for i in range(0, len(got), len(want)))


def _sigmoid_inplace(xp: Any, v: Any) -> None:
    """The tanh-form sigmoid of _activation, in place: the same operations in the same order."""
    v *= 0.5
    xp.tanh(v, out=v)
    v += 1
    v *= 0.5


def _gate_major_r(xp: Any, r: Any, gates: int) -> Any:
    """R (dirs, gates*H, H) as (gates, dirs, H, H), the sigmoid gates' rows halved (the last
    gate, the candidate's tanh, as it is): a new array, derived once for a constant R."""

    def build() -> Any:
        dirs, _, hsz = r.shape
        halves = xp.asarray([0.5] * (gates - 1) + [1.0], dtype=r.dtype).reshape(gates, 1, 1, 1)
        return xp.multiply(r.reshape(dirs, gates, hsz, hsz).transpose(1, 0, 2, 3), halves, order="C")

    return derived((r,), ("gate-major-halved", gates), build)


class _Setup:
    """Shapes, layout handling and per-direction parameters shared by the three operators."""

    def __init__(
        self,
        xp: Any,
        x: Any,
        w: Any,
        r: Any,
        b: Any,
        sequence_lens: Any,
        hidden_size: int | None,
        direction: str,
        layout: int,
        gates: int,
        what: str,
    ) -> None:
        if x.ndim != 3:
            raise ValueError(f"{what}: X must be 3-D, got shape {list(x.shape)}")
        if layout not in (0, 1):
            raise ValueError(f"{what}: layout must be 0 or 1, got {layout}")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{what}: direction must be forward, reverse or bidirectional, got '{direction}'")
        self.num_dirs = 2 if direction == "bidirectional" else 1
        self.reverse = [False, True] if self.num_dirs == 2 else [direction == "reverse"]
        self.layout = layout
        self.dtype = x.dtype
        cdt = compute_dtype(x.dtype)
        self.cdt = cdt
        xs = x.astype(cdt, copy=False)
        if layout == 1:
            xs = xs.transpose(1, 0, 2)
        self.x = xs  # (T, B, I)
        self.t, self.batch, inp = xs.shape
        if w.ndim != 3 or w.shape[0] != self.num_dirs or w.shape[2] != inp or w.shape[1] % gates:
            raise ValueError(
                f"{what}: W must have shape [{self.num_dirs}, {gates}*hidden_size, {inp}], got {list(w.shape)}"
            )
        h = w.shape[1] // gates
        if hidden_size is not None and hidden_size != h:
            raise ValueError(f"{what}: hidden_size {hidden_size} does not match W's shape {list(w.shape)}")
        self.h = h
        if tuple(r.shape) != (self.num_dirs, gates * h, h):
            raise ValueError(f"{what}: R must have shape [{self.num_dirs}, {gates * h}, {h}], got {list(r.shape)}")
        self.w = w.astype(cdt, copy=False)
        self.r = r.astype(cdt, copy=False)
        if b is not None:
            if tuple(b.shape) != (self.num_dirs, 2 * gates * h):
                raise ValueError(f"{what}: B must have shape [{self.num_dirs}, {2 * gates * h}], got {list(b.shape)}")
            b = b.astype(cdt, copy=False)
            self.wb = b[:, : gates * h]
            self.rb = b[:, gates * h :]
        else:
            self.wb = self.rb = None
        if sequence_lens is not None:
            lens = np.asarray(host_ints(sequence_lens), dtype=np.int64)
            if lens.shape != (self.batch,):
                raise ValueError(f"{what}: sequence_lens must have shape [{self.batch}], got {list(lens.shape)}")
            if np.any(lens < 0) or np.any(lens > self.t):
                raise ValueError(f"{what}: sequence_lens {lens.tolist()} must lie in [0, {self.t}]")
            self.lens = None if np.all(lens == self.t) else lens
        else:
            self.lens = None

    def state(self, xp: Any, init: Any, what: str) -> Any:
        """An initial state as (num_dirs, B, H) in the compute dtype."""
        shape = (self.num_dirs, self.batch, self.h)
        if init is None:
            return xp.zeros(shape, dtype=self.cdt)
        s = init.astype(self.cdt, copy=False)
        if self.layout == 1:
            s = s.transpose(1, 0, 2)
        if tuple(s.shape) != shape:
            want = shape if self.layout == 0 else (self.batch, self.num_dirs, self.h)
            raise ValueError(f"{what} must have shape {list(want)}, got {list(init.shape)}")
        return s

    def steps(self, d: int) -> range:
        return range(self.t - 1, -1, -1) if self.reverse[d] else range(self.t)

    # The loops for the default activations keep each step's values gate-major and transposed,
    # (gates, dirs, H, B): every gate of every direction is then one contiguous block, and a
    # numpy call on a strided slice costs 1-1.7 us more than on a contiguous one, about as much
    # as the arithmetic at small sizes.
    def gate_major_steps(self, xp: Any, projections: list[Any], gates: int) -> Any:
        """(T, gates, dirs, H, B) from each direction's (T, B, gates*H) input projection, its
        time axis in the order its loop visits it (reverse directions back to front)."""
        per_direction = [
            p.reshape(self.t, self.batch, gates, self.h).transpose(0, 2, 3, 1)[:: -1 if rev else 1]
            for p, rev in zip(projections, self.reverse)
        ]
        return xp.stack(per_direction, axis=2)

    def step_masks(self, xp: Any) -> Any | None:
        """Per step k, a (dirs, 1, B) bool of the batch entries inside their sequence at the
        time each direction visits at step k."""
        if self.lens is None:
            return None
        inside = np.arange(self.t)[:, None] < self.lens[None, :]  # (T, B)
        per_direction = [inside[::-1] if rev else inside for rev in self.reverse]
        return xp.asarray(np.stack(per_direction, axis=1)[:, :, None, :])

    def from_gate_major(self, xp: Any, y: Any) -> list[Any]:
        """Per direction, its (T, B, H) outputs in time order from (T, dirs, H, B) in step order."""
        return [(y[::-1, d] if rev else y[:, d]).transpose(0, 2, 1) for d, rev in enumerate(self.reverse)]

    def masks(self, xp: Any) -> list[Any] | None:
        """Per time step, a (B, 1) bool of the batch entries still inside their sequence."""
        if self.lens is None:
            return None
        return [xp.asarray((t < self.lens).reshape(-1, 1)) for t in range(self.t)]

    def outputs(self, xp: Any, ys: list[Any], finals: list[list[Any]]) -> tuple[Any, ...]:
        """Y (T, dirs, B, H) or layout 1 (B, T, dirs, H), and each final state."""
        y = xp.stack(ys, axis=1)  # (T, dirs, B, H)
        states = [xp.stack(f, axis=0) for f in finals]  # (dirs, B, H)
        if self.layout == 1:
            y = y.transpose(2, 0, 1, 3)
            states = [s.transpose(1, 0, 2) for s in states]
        cast = [xp.ascontiguousarray(v).astype(self.dtype, copy=False) for v in (y, *states)]
        return tuple(cast)


def _clip(xp: Any, v: Any, clip: float | None) -> Any:
    return v if clip is None else xp.clip(v, -clip, clip)


def _input_proj(xp: Any, s: _Setup, d: int) -> Any:
    """X @ W^T (+ Wb + Rb) for every step at once: (T, B, G*H)."""
    proj = stacked_matmul(xp, s.x, s.w[d].T)
    if s.wb is not None:
        proj += s.wb[d] + s.rb[d]
    return proj


def _rnn(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any,  # noqa: N803 - spec name
    sequence_lens: Any,
    initial_h: Any,
    activation_alpha: list[float] | None,
    activation_beta: list[float] | None,
    activations: list[str] | None,
    clip: float | None,
    direction: str,
    hidden_size: int | None,
    layout: int,
) -> tuple[Any, ...]:
    s = _Setup(xp, X, W, R, B, sequence_lens, hidden_size, direction, layout, 1, "RNN")
    acts = _activations(xp, activations, activation_alpha, activation_beta, ["Tanh"], s.num_dirs)
    h0 = s.state(xp, initial_h, "RNN initial_h")
    masks = s.masks(xp)
    ys, hs = [], []
    for d in range(s.num_dirs):
        (f,) = acts[d]
        proj = _input_proj(xp, s, d)
        rt = s.r[d].T
        h = h0[d]
        y = xp.zeros((s.t, s.batch, s.h), dtype=s.cdt)
        for t in s.steps(d):
            hn = f(_clip(xp, proj[t] + h @ rt, clip))
            if masks is not None:
                hn = xp.where(masks[t], hn, h)
                y[t] = xp.where(masks[t], hn, 0)
            else:
                y[t] = hn
            h = hn
        ys.append(y)
        hs.append(h)
    return s.outputs(xp, ys, [hs])


def _gru(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any,  # noqa: N803 - spec name
    sequence_lens: Any,
    initial_h: Any,
    activation_alpha: list[float] | None,
    activation_beta: list[float] | None,
    activations: list[str] | None,
    clip: float | None,
    direction: str,
    hidden_size: int | None,
    layout: int,
    linear_before_reset: int,
) -> tuple[Any, ...]:
    s = _Setup(xp, X, W, R, B, sequence_lens, hidden_size, direction, layout, 3, "GRU")
    acts = _activations(xp, activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], s.num_dirs)
    h0 = s.state(xp, initial_h, "GRU initial_h")
    if clip is None and default_activations(activations, ["Sigmoid", "Tanh"]):
        return _gru_plain_steps(xp, s, h0, linear_before_reset)
    masks = s.masks(xp)
    hsz = s.h
    ys, hs = [], []
    for d in range(s.num_dirs):
        f, g = acts[d]
        # Input projection with only W's bias (R's candidate bias sits inside the reset product
        # when linear_before_reset); z and r take both biases.
        proj = stacked_matmul(xp, s.x, s.w[d].T)
        rb_h = None
        if s.wb is not None:
            proj += s.wb[d]
            proj[..., : 2 * hsz] += s.rb[d][: 2 * hsz]
            rb_h = s.rb[d][2 * hsz :]
        r_zr = s.r[d][: 2 * hsz].T  # (H, 2H)
        r_h = s.r[d][2 * hsz :].T  # (H, H)
        h = h0[d]
        y = xp.zeros((s.t, s.batch, hsz), dtype=s.cdt)
        for t in s.steps(d):
            p = proj[t]
            zr = f(_clip(xp, p[:, : 2 * hsz] + h @ r_zr, clip))
            z, rgate = zr[:, :hsz], zr[:, hsz:]
            if linear_before_reset:
                rec = h @ r_h
                if rb_h is not None:
                    rec = rec + rb_h
                cand = p[:, 2 * hsz :] + rgate * rec
            else:
                rec = (rgate * h) @ r_h
                if rb_h is not None:
                    rec = rec + rb_h
                cand = p[:, 2 * hsz :] + rec
            hc = g(_clip(xp, cand, clip))
            hn = (1 - z) * hc + z * h
            if masks is not None:
                hn = xp.where(masks[t], hn, h)
                y[t] = xp.where(masks[t], hn, 0)
            else:
                y[t] = hn
            h = hn
        ys.append(y)
        hs.append(h)
    return s.outputs(xp, ys, [hs])


def _gru_plain_steps(xp: Any, s: _Setup, h0: Any, linear_before_reset: int) -> tuple[Any, ...]:
    """_gru with the default activations and no clip: all directions advance together in about
    a dozen numpy calls a step, gate-major and transposed (_Setup.gate_major_steps). The
    arithmetic is the general loop's, with z's and r's rows of W, R and the biases halved
    first: the sigmoid's 0.5 * v is then exact and free, since halving is exact."""
    hsz, dirs = s.h, s.num_dirs
    projections = []
    for d in range(dirs):
        proj = stacked_matmul(xp, s.x, s.w[d].T)
        if s.wb is not None:
            proj += s.wb[d]
            proj[..., : 2 * hsz] += s.rb[d][: 2 * hsz]
        projections.append(proj)
    proj = s.gate_major_steps(xp, projections, 3)  # (T, 3, dirs, H, B)
    proj[:, :2] *= 0.5
    r3 = _gate_major_r(xp, s.r, 3)  # (3, dirs, H, H), z and r halved
    rb_h = None if s.rb is None else xp.ascontiguousarray(s.rb[:, 2 * hsz :, None])  # (dirs, H, 1)
    masks = s.step_masks(xp)
    y = xp.empty((s.t, dirs, hsz, s.batch), dtype=s.cdt)
    h = xp.ascontiguousarray(h0.transpose(0, 2, 1))  # (dirs, H, B)
    g = xp.empty((3, dirs, hsz, s.batch), dtype=s.cdt)
    zr, z, rgate, cand = g[:2], g[0], g[1], g[2]
    zh = xp.empty_like(h)
    for k in range(s.t):
        p = proj[k]
        if linear_before_reset:
            xp.matmul(r3, h, out=g)
        else:
            xp.matmul(r3[:2], h, out=zr)
        zr += p[:2]
        xp.tanh(zr, out=zr)  # the sigmoid of z and r, from their halved arguments
        zr += 1
        zr *= 0.5
        if linear_before_reset:
            if rb_h is not None:
                cand += rb_h
            cand *= rgate
        else:
            xp.multiply(rgate, h, out=zh)
            xp.matmul(r3[2], zh, out=cand)
            if rb_h is not None:
                cand += rb_h
        cand += p[2]
        xp.tanh(cand, out=cand)
        hn = y[k] if masks is None else xp.empty_like(h)
        xp.subtract(1, z, out=hn)  # (1 - z) * candidate + z * h
        hn *= cand
        xp.multiply(z, h, out=zh)
        hn += zh
        if masks is not None:
            hn = xp.where(masks[k], hn, h)
            y[k] = xp.where(masks[k], hn, 0)
        h = hn
    return s.outputs(xp, s.from_gate_major(xp, y), [[h[d].T for d in range(dirs)]])


def _lstm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any,  # noqa: N803 - spec name
    sequence_lens: Any,
    initial_h: Any,
    initial_c: Any,
    P: Any,  # noqa: N803 - spec name
    activation_alpha: list[float] | None,
    activation_beta: list[float] | None,
    activations: list[str] | None,
    clip: float | None,
    direction: str,
    hidden_size: int | None,
    input_forget: int,
    layout: int,
) -> tuple[Any, ...]:
    s = _Setup(xp, X, W, R, B, sequence_lens, hidden_size, direction, layout, 4, "LSTM")
    acts = _activations(xp, activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], s.num_dirs)
    projections = [_input_proj(xp, s, d) for d in range(s.num_dirs)]
    transposed = [s.r[d].T for d in range(s.num_dirs)]
    recurrences = [lambda h, rt=rt: h @ rt for rt in transposed]
    plain = default_activations(activations, ["Sigmoid", "Tanh", "Tanh"])
    return lstm_steps(
        xp, s, projections, recurrences, acts, P, initial_h, initial_c, clip, input_forget, "LSTM",
        plain=plain, r_float=s.r,
    )  # fmt: skip


def lstm_steps(
    xp: Any,
    s: _Setup,
    projections: list[Any],
    recurrences: list[Any],
    acts: list[Any],
    P: Any,  # noqa: N803 - spec name
    initial_h: Any,
    initial_c: Any,
    clip: float | None,
    input_forget: int,
    name: str,
    plain: bool = False,
    r_float: Any = None,
) -> tuple[Any, ...]:
    """LSTM's recurrence per direction d: gates = projections[d][t] (the input's projection with
    both biases, (T, B, 4H) in i, o, f, c order) + recurrences[d](h); shared by LSTM and
    DynamicQuantizeLSTM, which differ only in how they multiply. ``plain``: the activations are
    the defaults; with no clip, peepholes or coupled gate too, every direction then advances in
    one set of in-place passes per step (``r_float``: LSTM's R, whose products for all
    directions are then one matmul)."""
    h0 = s.state(xp, initial_h, f"{name} initial_h")
    c0 = s.state(xp, initial_c, f"{name} initial_c")
    hsz = s.h
    if P is not None:
        if tuple(P.shape) != (s.num_dirs, 3 * hsz):
            raise ValueError(f"{name}: P must have shape [{s.num_dirs}, {3 * hsz}], got {list(P.shape)}")
        P = P.astype(s.cdt, copy=False)  # noqa: N806 - spec name
    if plain and P is None and clip is None and not input_forget:
        return _lstm_plain_steps(xp, s, projections, recurrences, r_float, h0, c0)
    masks = s.masks(xp)
    ys, hs, cs = [], [], []
    for d in range(s.num_dirs):
        f, g, hact = acts[d]
        proj, recur = projections[d], recurrences[d]
        pi = po = pf = None
        if P is not None:
            pi, po, pf = P[d, :hsz], P[d, hsz : 2 * hsz], P[d, 2 * hsz :]
        h, c = h0[d], c0[d]
        y = xp.zeros((s.t, s.batch, hsz), dtype=s.cdt)
        for t in s.steps(d):
            gates = proj[t] + recur(h)  # (B, 4H) in i, o, f, c order
            gi = gates[:, :hsz]
            go = gates[:, hsz : 2 * hsz]
            gf = gates[:, 2 * hsz : 3 * hsz]
            gc = gates[:, 3 * hsz :]
            if pi is not None:
                gi = gi + pi * c
                gf = gf + pf * c
            i = f(_clip(xp, gi, clip))
            fg = 1 - i if input_forget else f(_clip(xp, gf, clip))
            cn = fg * c + i * g(_clip(xp, gc, clip))
            if po is not None:
                go = go + po * cn
            o = f(_clip(xp, go, clip))
            hn = o * hact(cn)
            if masks is not None:
                hn = xp.where(masks[t], hn, h)
                cn = xp.where(masks[t], cn, c)
                y[t] = xp.where(masks[t], hn, 0)
            else:
                y[t] = hn
            h, c = hn, cn
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return s.outputs(xp, ys, [hs, cs])


def _lstm_plain_steps(
    xp: Any, s: _Setup, projections: list[Any], recurrences: list[Any], r_float: Any, h0: Any, c0: Any
) -> tuple[Any, ...]:
    """lstm_steps with the default activations, no clip, peepholes or coupled gate: all
    directions advance together in ten numpy calls a step (against about twenty per direction),
    gate-major and transposed (_Setup.gate_major_steps). The arithmetic is the general loop's,
    with the rows of the i, o and f gates halved first: the sigmoid's 0.5 * v is then exact and
    free, and one tanh serves all four gates."""
    hsz, dirs = s.h, s.num_dirs
    proj = s.gate_major_steps(xp, projections, 4)  # (T, 4, dirs, H, B) in i, o, f, c order
    proj[:, :3] *= 0.5
    r4 = None
    if r_float is not None:
        r4 = _gate_major_r(xp, r_float, 4)  # (4, dirs, H, H), i, o and f halved
    masks = s.step_masks(xp)
    y = xp.empty((s.t, dirs, hsz, s.batch), dtype=s.cdt)
    h = xp.ascontiguousarray(h0.transpose(0, 2, 1))  # (dirs, H, B)
    c = xp.array(c0.transpose(0, 2, 1), dtype=s.cdt, order="C", copy=True)  # updated in place
    g = xp.empty((4, dirs, hsz, s.batch), dtype=s.cdt)
    ifo, gi, go, gf, gc = g[:3], g[0], g[1], g[2], g[3]
    tc = xp.empty_like(c)
    for k in range(s.t):
        if r4 is not None:
            xp.matmul(r4, h, out=g)
        else:
            for d in range(dirs):  # DynamicQuantizeLSTM: the states are quantized per direction
                g[:, d] = recurrences[d](h[d].T).reshape(s.batch, 4, hsz).transpose(1, 2, 0)
            ifo *= 0.5
        g += proj[k]
        xp.tanh(g, out=g)
        ifo += 1
        ifo *= 0.5
        gc *= gi
        if masks is None:
            c *= gf
            c += gc
            xp.tanh(c, out=tc)
            h = xp.multiply(go, tc, out=y[k])
        else:
            cn = gf * c
            cn += gc
            xp.tanh(cn, out=tc)
            hn = xp.where(masks[k], go * tc, h)
            c = xp.where(masks[k], cn, c)
            y[k] = xp.where(masks[k], hn, 0)
            h = hn
    finals = [h[d].T for d in range(dirs)], [c[d].T for d in range(dirs)]
    return s.outputs(xp, s.from_gate_major(xp, y), list(finals))


# -- registrations (7: no layout; 14: layout) ----------------------------------------------------


@op("RNN", 7)
def rnn_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] = ["Tanh", "Tanh"],  # noqa: B006 - schema default, never mutated
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
) -> tuple[Any, ...]:
    return _rnn(
        xp, X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip,
        direction, hidden_size, 0,
    )  # fmt: skip


@op("RNN", 14)
def rnn(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] = ["Tanh", "Tanh"],  # noqa: B006 - schema default, never mutated
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
) -> tuple[Any, ...]:
    return _rnn(
        xp, X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip,
        direction, hidden_size, layout,
    )  # fmt: skip


@op("GRU", 7)
def gru_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    linear_before_reset: int = 0,
) -> tuple[Any, ...]:
    return _gru(
        xp, X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip,
        direction, hidden_size, 0, linear_before_reset,
    )  # fmt: skip


@op("GRU", 14)
def gru(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
    linear_before_reset: int = 0,
) -> tuple[Any, ...]:
    return _gru(
        xp, X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip,
        direction, hidden_size, layout, linear_before_reset,
    )  # fmt: skip


@op("LSTM", 7)
def lstm_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    initial_c: Any = None,
    P: Any = None,  # noqa: N803 - spec name
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
) -> tuple[Any, ...]:
    return _lstm(
        xp, X, W, R, B, sequence_lens, initial_h, initial_c, P, activation_alpha, activation_beta, activations,
        clip, direction, hidden_size, input_forget, 0,
    )  # fmt: skip


@op("LSTM", 14)
def lstm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    R: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    sequence_lens: Any = None,
    initial_h: Any = None,
    initial_c: Any = None,
    P: Any = None,  # noqa: N803 - spec name
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
    layout: int = 0,
) -> tuple[Any, ...]:
    return _lstm(
        xp, X, W, R, B, sequence_lens, initial_h, initial_c, P, activation_alpha, activation_beta, activations,
        clip, direction, hidden_size, input_forget, layout,
    )  # fmt: skip
