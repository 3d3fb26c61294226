"""onnx's backend node suite through InferenceSession. The known-failure list only shrinks:
a listed case that passes fails the run until it is removed from known_failures.txt, except a
case whose reason starts with "[chance]": its expected values were drawn at random, and a random
output matches them now and then (Bernoulli over 10 values: about 1 run in 150)."""

from __future__ import annotations

import pytest

from .suite import known_failures, node_cases, run_case

CASES = sorted(node_cases())
KNOWN = known_failures()


@pytest.mark.parametrize("name", CASES)
def test_node_case(name: str) -> None:
    case = node_cases()[name]
    if name in KNOWN:
        try:
            run_case(case)
        except Exception:  # noqa: BLE001 - a listed failure is expected to fail
            pytest.xfail(KNOWN[name])
        if KNOWN[name].startswith("[chance]"):
            return  # a random draw that happened to match the recorded one
        pytest.fail(f"{name} passes now: remove it from known_failures.txt (reason was: {KNOWN[name]})")
    run_case(case)


def test_known_failures_are_real_cases() -> None:
    unknown = sorted(set(KNOWN) - set(CASES))
    assert not unknown, f"known_failures.txt lists cases that do not exist: {unknown}"
