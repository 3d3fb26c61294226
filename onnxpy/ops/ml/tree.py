"""Tree ensembles: TreeEnsembleRegressor, TreeEnsembleClassifier (ml opsets 1 and 3) and
TreeEnsemble (ml opset 5).

Every form is first turned into one flat forest (built once per node and cached): interior
nodes as parallel arrays, children encoded as ``>= 0`` for an interior node and ``~leaf`` for a
leaf, and per-leaf weight vectors. Evaluation walks all (sample, tree) pairs level by level with
array operations, dropping pairs as they reach a leaf, so the Python loop runs once per tree
level, never per sample or per node.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import check_alloc
from ..registry import op
from ._common import ML, POST_TRANSFORMS, as_2d, check_post_transform, labels, logistic, probit
from ._common import post_transform as apply_transform

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)
_MODE_NAMES = {
    "BRANCH_LEQ": LEQ,
    "BRANCH_LT": LT,
    "BRANCH_GTE": GTE,
    "BRANCH_GT": GT,
    "BRANCH_EQ": EQ,
    "BRANCH_NEQ": NEQ,
}
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")

# Elements of the largest temporary the walk and the aggregation create at once.
_BUDGET = 1 << 18


@dataclass
class Forest:
    feature: np.ndarray  # int64 [n_nodes]
    threshold: np.ndarray  # float64 [n_nodes]
    mode: np.ndarray  # int8 [n_nodes]
    true_next: np.ndarray  # int64 [n_nodes]: >= 0 an interior node, < 0 ~leaf
    false_next: np.ndarray
    missing_true: np.ndarray  # bool [n_nodes]
    roots: np.ndarray  # int64 [n_trees], encoded like the children
    n_leaves: int
    n_targets: int
    leaf_ids: np.ndarray  # int64 [n_weights]: (leaf, target, value) triples
    target_ids: np.ndarray
    values: np.ndarray  # float64
    # BRANCH_MEMBER: sorted distinct member values and sorted node * len(uniq) + rank keys.
    member_values: np.ndarray
    member_keys: np.ndarray

    @property
    def n_trees(self) -> int:
        return int(self.roots.size)

    def check(self) -> None:
        n = self.feature.size
        for name, nxt in (("true", self.true_next), ("false", self.false_next)):
            bad = (nxt >= n) | (nxt < -self.n_leaves)
            if bad.any():
                raise ValueError(f"a node's {name} branch points outside the tree (node {int(np.argmax(bad))})")
        if self.roots.size and ((self.roots >= n) | (self.roots < -self.n_leaves)).any():
            raise ValueError("a tree root points outside the nodes")
        if self.feature.size and self.feature.min() < 0:
            raise ValueError("a node has a negative feature id")
        if self.target_ids.size and (self.target_ids.min() < 0 or self.target_ids.max() >= self.n_targets):
            raise ValueError(f"a leaf weight's target / class id is outside [0, {self.n_targets})")

    def dense_weights(self, fill: float, combine: Callable[..., Any]) -> tuple[np.ndarray, np.ndarray]:
        """[n_leaves, n_targets] weights combined with ``combine`` (np.add / minimum / maximum)
        where a leaf has several for one target, and whether the leaf has any for the target."""
        w = np.full((self.n_leaves, self.n_targets), fill, dtype=np.float64)
        has = np.zeros((self.n_leaves, self.n_targets), dtype=bool)
        combine.at(w, (self.leaf_ids, self.target_ids), self.values)
        has[self.leaf_ids, self.target_ids] = True
        return w, has


# -- building ---------------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = OrderedDict()


def _cached(key_objects: tuple[Any, ...], build: Callable[[], Any]) -> Any:
    """Build once per node: attributes are the same objects on every call of a bound kernel.

    The entry keeps its key objects alive, so an id cannot be reused while it is cached."""
    key = tuple(id(o) for o in key_objects)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[1]
    value = build()
    _CACHE[key] = (key_objects, value)
    while len(_CACHE) > 64:
        _CACHE.popitem(last=False)
    return value


def _forest_v1(
    a: dict[str, Any], prefix: str, values: Any, weights: Any, n_targets: int, first_weight_only: bool
) -> Forest:
    """The flat forest of a TreeEnsembleRegressor ("target" leaves) or Classifier ("class"
    leaves), built once per node and cached."""
    key = (a["nodes_nodeids"], a["nodes_treeids"], a[f"{prefix}_weights"], a.get(f"{prefix}_weights_as_tensor"))

    def build() -> Forest:
        return build_v1(
            nodes_treeids=list(a["nodes_treeids"] or []),
            nodes_nodeids=list(a["nodes_nodeids"] or []),
            nodes_featureids=list(a["nodes_featureids"] or []),
            nodes_modes=list(a["nodes_modes"] or []),
            nodes_values=values,
            nodes_truenodeids=list(a["nodes_truenodeids"] or []),
            nodes_falsenodeids=list(a["nodes_falsenodeids"] or []),
            nodes_missing_value_tracks_true=a["nodes_missing_value_tracks_true"],
            w_treeids=list(a[f"{prefix}_treeids"] or []),
            w_nodeids=list(a[f"{prefix}_nodeids"] or []),
            w_ids=list(a[f"{prefix}_ids"] or []),
            w_weights=weights,
            n_targets=n_targets,
            first_weight_only=first_weight_only,
        )

    return _cached(key, build)


def _member_tables(mode: np.ndarray, membership_values: Any) -> tuple[np.ndarray, np.ndarray]:
    members = np.flatnonzero(mode == MEMBER)
    if members.size == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    if membership_values is None:
        raise ValueError("BRANCH_MEMBER nodes need membership_values")
    vals = np.asarray(membership_values, dtype=np.float64).reshape(-1)
    sets: list[np.ndarray] = []
    start = 0
    for i, v in enumerate(vals):
        if np.isnan(v):
            sets.append(vals[start:i])
            start = i + 1
    if start < vals.size:
        sets.append(vals[start:])
    if len(sets) != members.size:
        raise ValueError(f"membership_values hold {len(sets)} sets for {members.size} BRANCH_MEMBER nodes")
    uniq = np.unique(np.concatenate(sets)) if sets else np.zeros(0)
    keys = [int(node) * max(uniq.size, 1) + np.searchsorted(uniq, s) for node, s in zip(members, sets)]
    return uniq, np.unique(np.concatenate(keys).astype(np.int64)) if keys else np.zeros(0, dtype=np.int64)


def build_v1(
    *,
    nodes_treeids: list[int],
    nodes_nodeids: list[int],
    nodes_featureids: list[int],
    nodes_modes: list[str],
    nodes_values: Any,
    nodes_truenodeids: list[int],
    nodes_falsenodeids: list[int],
    nodes_missing_value_tracks_true: list[int] | None,
    w_treeids: list[int],
    w_nodeids: list[int],
    w_ids: list[int],
    w_weights: Any,
    n_targets: int,
    first_weight_only: bool = False,
) -> Forest:
    """A forest from the (treeid, nodeid)-keyed attributes of the ml opset 1 / 3 ops.

    ``first_weight_only``: a leaf listing several weights keeps its first (onnxruntime's
    single-target regressor reads only that one)."""
    n = len(nodes_nodeids)
    columns = {
        "nodes_treeids": nodes_treeids,
        "nodes_featureids": nodes_featureids,
        "nodes_modes": nodes_modes,
        "nodes_values": nodes_values,
        "nodes_truenodeids": nodes_truenodeids,
        "nodes_falsenodeids": nodes_falsenodeids,
    }
    for name, col in columns.items():
        if len(col) != n:
            raise ValueError(f"{name} has {len(col)} entries, nodes_nodeids {n}")
    missing = list(nodes_missing_value_tracks_true or [])
    if missing and len(missing) != n:
        raise ValueError(f"nodes_missing_value_tracks_true has {len(missing)} entries for {n} nodes")
    position: dict[tuple[int, int], int] = {}
    for i, (t, nid) in enumerate(zip(nodes_treeids, nodes_nodeids)):
        if (t, nid) in position:
            raise ValueError(f"node {nid} of tree {t} is defined twice")
        position[(t, nid)] = i
    is_leaf = [m == "LEAF" for m in nodes_modes]
    for m in nodes_modes:
        if m != "LEAF" and m not in _MODE_NAMES:
            raise ValueError(f"node mode '{m}' is not one of {[*_MODE_NAMES, 'LEAF']}")
    interior = [i for i in range(n) if not is_leaf[i]]
    leaves = [i for i in range(n) if is_leaf[i]]
    code = {}
    for k, i in enumerate(interior):
        code[i] = k
    for k, i in enumerate(leaves):
        code[i] = ~k

    def child(tree: int, nid: int, what: str, parent: int) -> int:
        p = position.get((tree, nid))
        if p is None:
            raise ValueError(f"node {parent} of tree {tree}: its {what} child {nid} does not exist")
        return code[p]

    values = np.asarray(nodes_values, dtype=np.float64).reshape(-1)
    true_next = np.array(
        [child(nodes_treeids[i], nodes_truenodeids[i], "true", nodes_nodeids[i]) for i in interior], dtype=np.int64
    )
    false_next = np.array(
        [child(nodes_treeids[i], nodes_falsenodeids[i], "false", nodes_nodeids[i]) for i in interior], dtype=np.int64
    )
    # A tree's root is the node no other node of the tree points to (the first such one).
    pointed = set()
    for i in interior:
        pointed.add((nodes_treeids[i], nodes_truenodeids[i]))
        pointed.add((nodes_treeids[i], nodes_falsenodeids[i]))
    roots: dict[int, int] = {}
    for i in range(n):
        t = nodes_treeids[i]
        if t not in roots and (t, nodes_nodeids[i]) not in pointed:
            roots[t] = code[i]
    trees = sorted(set(nodes_treeids))
    for t in trees:
        if t not in roots:
            raise ValueError(f"tree {t} has no root (its nodes form a cycle)")
    if not (len(w_treeids) == len(w_nodeids) == len(w_ids) == len(w_weights)):
        raise ValueError("the weight attributes (treeids, nodeids, ids, weights) differ in length")
    leaf_ids = []
    keep = []
    seen: set[int] = set()
    for k, (t, nid) in enumerate(zip(w_treeids, w_nodeids)):
        p = position.get((t, nid))
        if p is None or not is_leaf[p]:
            raise ValueError(f"a weight refers to node {nid} of tree {t}, which is not a leaf")
        if first_weight_only:
            if code[p] in seen:
                continue
            seen.add(code[p])
        leaf_ids.append(~code[p])
        keep.append(k)
    w_ids = [w_ids[k] for k in keep]
    w_values = np.asarray(w_weights, dtype=np.float64).reshape(-1)[keep]
    mode = np.array([_MODE_NAMES[nodes_modes[i]] for i in interior], dtype=np.int8)
    forest = Forest(
        feature=np.array([nodes_featureids[i] for i in interior], dtype=np.int64),
        threshold=values[interior] if interior else np.zeros(0),
        mode=mode,
        true_next=true_next,
        false_next=false_next,
        missing_true=np.array([bool(missing[i]) for i in interior] if missing else [False] * len(interior), dtype=bool),
        roots=np.array([roots[t] for t in trees], dtype=np.int64),
        n_leaves=len(leaves),
        n_targets=n_targets,
        leaf_ids=np.array(leaf_ids, dtype=np.int64),
        target_ids=np.array(list(w_ids), dtype=np.int64),
        values=w_values,
        member_values=np.zeros(0),
        member_keys=np.zeros(0, dtype=np.int64),
    )
    forest.check()
    return forest


def build_v5(
    *,
    nodes_featureids: list[int],
    nodes_splits: Any,
    nodes_modes: Any,
    nodes_truenodeids: list[int],
    nodes_falsenodeids: list[int],
    nodes_trueleafs: list[int],
    nodes_falseleafs: list[int],
    nodes_missing_value_tracks_true: list[int] | None,
    tree_roots: list[int],
    leaf_targetids: list[int],
    leaf_weights: Any,
    membership_values: Any,
    n_targets: int,
) -> Forest:
    n = len(nodes_featureids)
    splits = np.asarray(nodes_splits, dtype=np.float64).reshape(-1)
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int8)
    for name, col in (
        ("nodes_splits", splits),
        ("nodes_modes", modes),
        ("nodes_truenodeids", nodes_truenodeids),
        ("nodes_falsenodeids", nodes_falsenodeids),
        ("nodes_trueleafs", nodes_trueleafs),
        ("nodes_falseleafs", nodes_falseleafs),
    ):
        if len(col) != n:
            raise ValueError(f"{name} has {len(col)} entries, nodes_featureids {n}")
    if modes.size and (modes.min() < 0 or modes.max() > MEMBER):
        raise ValueError(f"nodes_modes must lie in [0, {MEMBER}]")
    missing = list(nodes_missing_value_tracks_true or [])
    if missing and len(missing) != n:
        raise ValueError(f"nodes_missing_value_tracks_true has {len(missing)} entries for {n} nodes")
    weights = np.asarray(leaf_weights, dtype=np.float64).reshape(-1)
    n_leaves = weights.size
    if len(leaf_targetids) != n_leaves:
        raise ValueError(f"leaf_targetids has {len(leaf_targetids)} entries, leaf_weights {n_leaves}")

    def encode(ids: list[int], leafs: list[int]) -> np.ndarray:
        ids_a = np.asarray(ids, dtype=np.int64)
        return np.where(np.asarray(leafs, dtype=bool), ~ids_a, ids_a)

    uniq, keys = _member_tables(modes, membership_values)
    forest = Forest(
        feature=np.asarray(nodes_featureids, dtype=np.int64),
        threshold=splits,
        mode=modes,
        true_next=encode(nodes_truenodeids, nodes_trueleafs),
        false_next=encode(nodes_falsenodeids, nodes_falseleafs),
        missing_true=np.asarray(missing if missing else [0] * n, dtype=bool),
        roots=np.asarray(tree_roots, dtype=np.int64),
        n_leaves=n_leaves,
        n_targets=n_targets,
        leaf_ids=np.arange(n_leaves, dtype=np.int64),
        target_ids=np.asarray(leaf_targetids, dtype=np.int64),
        values=weights,
        member_values=uniq,
        member_keys=keys,
    )
    forest.check()
    return forest


# -- evaluation -------------------------------------------------------------------------------


class _DeviceForest:
    """The forest's arrays on the kernel's device, made once per (forest, namespace)."""

    def __init__(self, xp: Any, f: Forest, aggregate: str) -> None:
        self.xp = xp
        self.f = f
        a = xp.asarray
        self.feature, self.threshold, self.mode = a(f.feature), a(f.threshold), a(f.mode)
        self.true_next, self.false_next, self.missing_true = a(f.true_next), a(f.false_next), a(f.missing_true)
        self.roots = a(f.roots)
        self.children = a(np.stack([f.true_next, f.false_next], axis=1).reshape(-1))
        self.modes_present = sorted({int(m) for m in np.unique(f.mode)})
        self.any_missing = bool(f.missing_true.any())
        self.member_values, self.member_keys = a(f.member_values), a(f.member_keys)
        combine, fill = {"MIN": (np.minimum, np.inf), "MAX": (np.maximum, -np.inf)}.get(aggregate, (np.add, 0.0))
        w, has = f.dense_weights(fill, combine)
        self.weights, self.has = a(w), a(has)

    def walk(self, x: Any) -> Any:
        """Leaf reached in every tree by every sample: int64 [N, n_trees].

        The (sample, tree) pairs still inside a tree are kept compacted (node, position, flat
        offset of the sample's row); a level is a handful of ``take``s over them."""
        xp = self.xp
        n, t = int(x.shape[0]), self.f.n_trees
        n_features = int(x.shape[1])
        if self.f.feature.size and int(self.f.feature.max()) >= n_features:
            raise IndexError(f"the trees read feature {int(self.f.feature.max())}, X has {n_features} features")
        out = xp.empty(n * t, dtype=xp.int64)
        node = xp.broadcast_to(self.roots, (n, t)).reshape(-1).copy()
        pos = xp.arange(n * t, dtype=xp.int64)
        base = xp.repeat(xp.arange(n, dtype=xp.int64) * n_features, t)
        xflat = x.reshape(-1)
        done = node < 0
        if bool(done.any()):
            out[pos[done]] = ~node[done]
            keep = ~done
            node, pos, base = node[keep], pos[keep], base[keep]
        for _ in range(self.f.feature.size + 1):
            if node.size == 0:
                break
            v = xflat.take(base + self.feature.take(node))
            # children[2 * node] is the true branch, children[2 * node + 1] the false one
            nxt = self.children.take(2 * node + 1 - self._test(v, node))
            leaf = nxt < 0
            if bool(leaf.any()):
                out[pos[leaf]] = ~nxt[leaf]
                keep = ~leaf
                node, pos, base = nxt[keep], pos[keep], base[keep]
            else:
                node = nxt
        else:
            raise ValueError("a tree has a cycle: a path is longer than the number of nodes")
        return out.reshape(n, t)

    def _test(self, v: Any, node: Any) -> Any:
        xp = self.xp
        thr = self.threshold.take(node)
        present = self.modes_present
        if len(present) == 1:
            cond = self._compare(present[0], v, thr, node)
        else:
            md = self.mode.take(node)
            cond = xp.zeros(v.shape, dtype=bool)
            for m in present:
                cond = xp.where(md == m, self._compare(m, v, thr, node), cond)
        if self.any_missing:
            cond = cond | (self.missing_true.take(node) & xp.isnan(v))
        return cond

    def _compare(self, m: int, v: Any, thr: Any, node: Any) -> Any:
        if m == LEQ:
            return v <= thr
        if m == LT:
            return v < thr
        if m == GTE:
            return v >= thr
        if m == GT:
            return v > thr
        if m == EQ:
            return v == thr
        if m == NEQ:
            return v != thr
        xp = self.xp
        u = int(self.member_values.size)
        if u == 0:
            return xp.zeros(v.shape, dtype=bool)
        r = xp.searchsorted(self.member_values, v)
        rc = xp.minimum(r, u - 1)
        found = self.member_values[rc] == v
        key = node * u + rc
        k = xp.searchsorted(self.member_keys, key)
        kc = xp.minimum(k, self.member_keys.size - 1)
        return found & (self.member_keys[kc] == key)

    def scores(self, x: Any, aggregate: str) -> tuple[Any, Any]:
        """Aggregated leaf weights [N, n_targets] (0 where no tree gave one) and which exist."""
        xp = self.xp
        n = int(x.shape[0])
        f = self.f
        t = max(f.n_trees, 1)
        out = xp.zeros((n, f.n_targets), dtype=xp.float64)
        has_out = xp.zeros((n, f.n_targets), dtype=bool)
        rows = max(1, _BUDGET // t)
        for r0 in range(0, n, rows):
            leaves = self.walk(x[r0 : r0 + rows])
            m = int(leaves.shape[0])
            acc, has = self._aggregate(leaves, m, aggregate)
            out[r0 : r0 + m] = acc
            has_out[r0 : r0 + m] = has
        if aggregate == "AVERAGE" and f.n_trees:
            out = out / f.n_trees
        return xp.where(has_out, out, 0.0), has_out

    def _aggregate(self, leaves: Any, n: int, aggregate: str) -> tuple[Any, Any]:
        xp = self.xp
        f = self.f
        fill = {"MIN": np.inf, "MAX": -np.inf}.get(aggregate, 0.0)
        acc = xp.full((n, f.n_targets), fill, dtype=xp.float64)
        has = xp.zeros((n, f.n_targets), dtype=bool)
        step = max(1, _BUDGET // max(1, n * f.n_targets))
        for t0 in range(0, f.n_trees, step):
            lv = leaves[:, t0 : t0 + step]
            w = self.weights[lv]
            h = self.has[lv]
            has = has | h.any(axis=1)
            if aggregate == "MIN":
                acc = xp.minimum(acc, xp.where(h, w, np.inf).min(axis=1))
            elif aggregate == "MAX":
                acc = xp.maximum(acc, xp.where(h, w, -np.inf).max(axis=1))
            else:
                acc = acc + w.sum(axis=1)
        return acc, has


_DEVICE: OrderedDict[tuple[int, int, str], tuple[Forest, _DeviceForest]] = OrderedDict()


def _on_device(xp: Any, f: Forest, aggregate: str) -> _DeviceForest:
    key = (id(f), id(xp), aggregate)
    hit = _DEVICE.get(key)
    if hit is not None and hit[0] is f:
        return hit[1]
    d = _DeviceForest(xp, f, aggregate)
    _DEVICE[key] = (f, d)
    while len(_DEVICE) > 64:
        _DEVICE.popitem(last=False)
    return d


def _features(xp: Any, X: Any) -> Any:
    x = as_2d(X)
    # Thresholds compare in the input's precision (float32 splits against float32 data).
    return x.astype(xp.float64) if x.dtype == xp.float64 else x.astype(xp.float32).astype(xp.float64)


def _regression_output(xp: Any, scores: Any, transform: str) -> Any:
    if scores.shape[1] == 1:
        # onnxruntime applies only PROBIT to a single score column.
        return probit(xp, scores) if transform == "PROBIT" else scores
    return apply_transform(xp, scores, transform)


def _base(values: Any, n: int, what: str) -> np.ndarray | None:
    if values is None:
        return None
    b = np.asarray(values, dtype=np.float64).reshape(-1)
    if b.size == 0:
        return None
    if b.size != n:
        raise ValueError(f"{what} has {b.size} values for {n} targets")
    return b


# -- TreeEnsembleRegressor --------------------------------------------------------------------


def _check_targets(X: Any, n_nodes: int, n_targets: int, ctx: Any) -> None:
    """Weights [leaves, n_targets] and scores [rows, n_targets]: n_targets is one attribute
    value, so a tiny model could ask for any amount of memory."""
    rows = int(X.shape[0]) if getattr(X, "ndim", 0) else 1
    check_alloc((n_nodes + rows, n_targets), np.float64, ctx, "tree ensemble scores")


def _regressor(xp: Any, X: Any, a: dict[str, Any], ctx: Any = None) -> Any:
    transform = check_post_transform(a["post_transform"])
    aggregate = a["aggregate_function"]
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate_function '{aggregate}' is not one of {list(AGGREGATES)}")
    values = a.get("nodes_values_as_tensor")
    values = values if values is not None else a["nodes_values"] or []
    weights = a.get("target_weights_as_tensor")
    weights = weights if weights is not None else a["target_weights"] or []
    base = a.get("base_values_as_tensor")
    base = base if base is not None else a["base_values"]
    n_targets = a["n_targets"]
    if n_targets is None or n_targets <= 0:
        raise ValueError("n_targets must be a positive number")
    _check_targets(X, len(a["nodes_nodeids"] or []), n_targets, ctx)
    forest = _forest_v1(a, "target", values, weights, n_targets, first_weight_only=n_targets == 1)
    scores, has = _on_device(xp, forest, aggregate).scores(_features(xp, X), aggregate)
    b = _base(base, n_targets, "base_values")
    if b is not None:
        # A target no tree scored stays 0: onnxruntime adds the base value only to real scores.
        scores = xp.where(has, scores + xp.asarray(b), 0.0)
    return _regression_output(xp, scores, transform).astype(xp.float32)


_REGRESSOR_V1 = dict(
    aggregate_function="SUM",
    base_values=None,
    n_targets=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_nodeids=None,
    nodes_treeids=None,
    nodes_truenodeids=None,
    nodes_values=None,
    post_transform="NONE",
    target_ids=None,
    target_nodeids=None,
    target_treeids=None,
    target_weights=None,
)


@op("TreeEnsembleRegressor", 1, domain=ML)
def tree_ensemble_regressor_1(
    xp: Any,
    X: Any,
    *,
    aggregate_function: str = "SUM",
    base_values: list[float] | None = None,
    n_targets: int | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    post_transform: str = "NONE",
    target_ids: list[int] | None = None,
    target_nodeids: list[int] | None = None,
    target_treeids: list[int] | None = None,
    target_weights: list[float] | None = None,
    ctx: Any = None,
) -> Any:
    a = {k: v for k, v in locals().items() if k in _REGRESSOR_V1}
    return _regressor(xp, X, a, ctx)


@op("TreeEnsembleRegressor", 3, domain=ML)
def tree_ensemble_regressor_3(
    xp: Any,
    X: Any,
    *,
    aggregate_function: str = "SUM",
    base_values: list[float] | None = None,
    base_values_as_tensor: Any = None,
    n_targets: int | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_hitrates_as_tensor: Any = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    nodes_values_as_tensor: Any = None,
    post_transform: str = "NONE",
    target_ids: list[int] | None = None,
    target_nodeids: list[int] | None = None,
    target_treeids: list[int] | None = None,
    target_weights: list[float] | None = None,
    target_weights_as_tensor: Any = None,
    ctx: Any = None,
) -> Any:
    a = {k: v for k, v in locals().items() if k not in ("xp", "X", "ctx")}
    return _regressor(xp, X, a, ctx)


# -- TreeEnsembleClassifier -------------------------------------------------------------------


def _classifier(xp: Any, X: Any, a: dict[str, Any]) -> Any:
    transform = check_post_transform(a["post_transform"])
    classes = labels(a["classlabels_int64s"], a["classlabels_strings"])
    k = int(classes.size)
    if k == 0:
        raise ValueError("classlabels_int64s or classlabels_strings must name the classes")
    values = a.get("nodes_values_as_tensor")
    values = values if values is not None else a["nodes_values"] or []
    weights = a.get("class_weights_as_tensor")
    weights = weights if weights is not None else a["class_weights"] or []
    base = a.get("base_values_as_tensor")
    base = base if base is not None else a["base_values"]
    forest = _forest_v1(a, "class", values, weights, k, first_weight_only=False)
    scores, has = _on_device(xp, forest, "SUM").scores(_features(xp, X), "SUM")
    b = np.asarray(base if base is not None else [], dtype=np.float64).reshape(-1)
    if k > 2:
        if b.size not in (0, k):
            raise ValueError(f"base_values has {b.size} values for {k} classes")
        if b.size:
            scores = scores + xp.asarray(b)
            has = xp.ones_like(has)
        # The best class among those some tree scored (the first on ties).
        best = xp.argmax(xp.where(has, scores, -xp.inf), axis=1)
        return _pick(xp, classes, best), apply_transform(xp, scores, transform).astype(xp.float32)
    return _binary(xp, forest, classes, scores, has, b, transform)


def _pick(xp: Any, classes: np.ndarray, index: Any) -> Any:
    if classes.dtype == object:
        host = index.get() if hasattr(index, "get") and not isinstance(index, np.ndarray) else np.asarray(index)
        return classes[host]
    return xp.asarray(classes)[index]


def _binary(
    xp: Any, forest: Forest, classes: np.ndarray, scores: Any, has: Any, b: np.ndarray, transform: str
) -> tuple[Any, Any]:
    """Two classes, as onnxruntime scores them (the spec does not say).

    When the trees score only one class id, that score is the positive class's: over 0.5 (all
    weights non-negative, so it reads as a probability) or over 0 (a margin) picks the second
    label, and the missing column is derived from it. When they score both, the columns are
    kept, and a positive second-class score picks the second label.
    """
    if classes.size == 1:
        classes = np.concatenate([classes, classes])
    s0, s1 = scores[:, 0], scores[:, 1] if scores.shape[1] > 1 else xp.zeros_like(scores[:, 0])
    h0, h1 = has[:, 0], has[:, 1] if has.shape[1] > 1 else xp.zeros_like(has[:, 0])
    two = h1  # rows that keep two columns
    if b.size == 2:
        # onnxruntime: with a second-class score, column 1 = base[1] + class-0 score and column 0
        # its negation; otherwise each column gets its base value. A column no tree scored
        # reads 0 either way.
        s1_new = xp.where(h1, b[1] + s0, 0.0)
        s0 = xp.where(h0, xp.where(h1, -(b[1] + s0), s0 + b[0]), 0.0)
        s1 = s1_new
        two = xp.ones_like(h1)
    elif b.size == 1:
        s0 = s0 + b[0]
    elif b.size > 2:
        raise ValueError(f"base_values has {b.size} values for 2 classes")
    positive = xp.where(two & h1, s1, xp.where(h0, s0, 0.0))
    single_class = np.unique(forest.target_ids).size == 1
    all_positive = bool((forest.values >= 0).all())
    cut = 0.5 if single_class and all_positive else 0.0
    label = _pick(xp, classes, (positive > cut).astype(xp.int64))
    pair = xp.stack([s0, s1], axis=1)
    z2 = apply_transform(xp, pair, transform)
    # Rows left with one score s: [1 - s, s] when it reads as a probability, else [-s, s].
    s = s0
    if transform == "LOGISTIC":
        p = logistic(xp, s)
        z1 = xp.stack([1 - p, p], axis=1)
    elif transform == "PROBIT":
        z1 = xp.stack([probit(xp, 1 - s), probit(xp, s)], axis=1)
    elif single_class and all_positive:
        z1 = xp.stack([1 - s, s], axis=1)
    else:
        z1 = xp.stack([-s, s], axis=1)
    z = xp.where(two[:, None], z2, z1)
    return label, z.astype(xp.float32)


_CLASSIFIER_V1 = (
    "base_values",
    "class_ids",
    "class_nodeids",
    "class_treeids",
    "class_weights",
    "classlabels_int64s",
    "classlabels_strings",
    "nodes_falsenodeids",
    "nodes_featureids",
    "nodes_hitrates",
    "nodes_missing_value_tracks_true",
    "nodes_modes",
    "nodes_nodeids",
    "nodes_treeids",
    "nodes_truenodeids",
    "nodes_values",
    "post_transform",
)


@op("TreeEnsembleClassifier", 1, domain=ML)
def tree_ensemble_classifier_1(
    xp: Any,
    X: Any,
    *,
    base_values: list[float] | None = None,
    class_ids: list[int] | None = None,
    class_nodeids: list[int] | None = None,
    class_treeids: list[int] | None = None,
    class_weights: list[float] | None = None,
    classlabels_int64s: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    post_transform: str = "NONE",
) -> Any:
    a = {k: v for k, v in locals().items() if k in _CLASSIFIER_V1}
    return _classifier(xp, X, a)


@op("TreeEnsembleClassifier", 3, domain=ML)
def tree_ensemble_classifier_3(
    xp: Any,
    X: Any,
    *,
    base_values: list[float] | None = None,
    base_values_as_tensor: Any = None,
    class_ids: list[int] | None = None,
    class_nodeids: list[int] | None = None,
    class_treeids: list[int] | None = None,
    class_weights: list[float] | None = None,
    class_weights_as_tensor: Any = None,
    classlabels_int64s: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_hitrates_as_tensor: Any = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    nodes_values_as_tensor: Any = None,
    post_transform: str = "NONE",
) -> Any:
    a = {k: v for k, v in locals().items() if k not in ("xp", "X")}
    return _classifier(xp, X, a)


# -- TreeEnsemble (ml opset 5) ----------------------------------------------------------------


@op("TreeEnsemble", 5, domain=ML)
def tree_ensemble(
    xp: Any,
    X: Any,
    *,
    aggregate_function: int = 1,
    leaf_targetids: list[int],
    leaf_weights: Any,
    membership_values: Any = None,
    n_targets: int | None = None,
    nodes_falseleafs: list[int],
    nodes_falsenodeids: list[int],
    nodes_featureids: list[int],
    nodes_hitrates: Any = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: Any,
    nodes_splits: Any,
    nodes_trueleafs: list[int],
    nodes_truenodeids: list[int],
    post_transform: int = 0,
    tree_roots: list[int],
    ctx: Any = None,
) -> Any:
    if not 0 <= aggregate_function < len(AGGREGATES):
        raise ValueError(f"aggregate_function {aggregate_function} is not in [0, {len(AGGREGATES) - 1}]")
    if not 0 <= post_transform < len(POST_TRANSFORMS):
        raise ValueError(f"post_transform {post_transform} is not in [0, {len(POST_TRANSFORMS) - 1}]")
    if n_targets is None or n_targets <= 0:
        raise ValueError("n_targets must be a positive number")
    _check_targets(X, len(nodes_featureids) + len(leaf_targetids), n_targets, ctx)
    aggregate = AGGREGATES[aggregate_function]
    key = (nodes_featureids, leaf_weights, tree_roots)

    def build() -> Forest:
        return build_v5(
            nodes_featureids=list(nodes_featureids),
            nodes_splits=nodes_splits,
            nodes_modes=nodes_modes,
            nodes_truenodeids=list(nodes_truenodeids),
            nodes_falsenodeids=list(nodes_falsenodeids),
            nodes_trueleafs=list(nodes_trueleafs),
            nodes_falseleafs=list(nodes_falseleafs),
            nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
            tree_roots=list(tree_roots),
            leaf_targetids=list(leaf_targetids),
            leaf_weights=leaf_weights,
            membership_values=membership_values,
            n_targets=n_targets,
        )

    forest = _cached(key, build)
    x = as_2d(X)
    # Splits are stored in the input's type; compare at that precision (float16 fits float32).
    xf = x.astype(xp.float64)
    scores, _ = _on_device(xp, forest, aggregate).scores(xf, aggregate)
    out = _regression_output(xp, scores, POST_TRANSFORMS[post_transform])
    return out.astype(X.dtype)
