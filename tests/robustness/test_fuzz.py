"""Fuzzing: mutated models and random inputs either work or raise an onnxpy error (an
OnnxpyError subclass) -- never another exception class, a crash or a hang. See fuzz.py.

In CI this runs a fixed set of ~200 examples (derandomized, so every run checks the same
ones). A longer campaign raises the count and draws fresh examples:

    ONNXPY_FUZZ_EXAMPLES=20000 ONNXPY_FUZZ_SEED=7 python -m pytest tests/robustness/test_fuzz.py

(tests/robustness/fuzz_campaign.py runs such batches for a given time, one process each, and
keeps the model of an example that crashes the interpreter.)
"""

from __future__ import annotations

import json
import os
import traceback
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.robustness import fuzz

EXAMPLES = fuzz.env_int("ONNXPY_FUZZ_EXAMPLES", 200)
CAMPAIGN = "ONNXPY_FUZZ_EXAMPLES" in os.environ
SEED = fuzz.env_int("ONNXPY_FUZZ_SEED", 0)
# Where a campaign writes each example's model before running it (a crash leaves it behind),
# and the tally of outcomes.
LAST_MODEL = os.environ.get("ONNXPY_FUZZ_LAST_MODEL")
STATS = os.environ.get("ONNXPY_FUZZ_STATS")
PER_EXAMPLE_SECONDS = 20.0

_tally: Counter[str] = Counter()


def _log(source: bytes, outcome: fuzz.Outcome) -> None:
    if LAST_MODEL:
        with open(LAST_MODEL, "wb") as f:
            f.write(source)
        with open(LAST_MODEL + ".txt", "w") as f:
            f.write(f"{outcome.seed}: {outcome.mutations}\n")


@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not CAMPAIGN,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
@given(st.data())
def test_mutated_models_raise_only_onnxpy_errors(data: Any) -> None:
    with fuzz.small_budgets(), fuzz.watchdog(PER_EXAMPLE_SECONDS):
        try:
            outcome = fuzz.run_example(data, _log if LAST_MODEL else None)
        except fuzz.Hang:
            raise
        except Exception as e:
            # Not an OnnxpyError: the bug this test exists to find. Show where it came from.
            raise AssertionError(
                f"{type(e).__name__} escaped onnxpy: {e}\n{''.join(traceback.format_exc(limit=-8))}"
            ) from e
    key = f"{outcome.stage}:{outcome.error}" if outcome.error else outcome.stage
    _tally[key] += 1
    if STATS:
        with open(STATS, "w") as f:
            json.dump(dict(_tally), f)
