"""Developer tool: run onnx's node suite (or the cases whose names contain any PATTERN) and
print each failure with its first error line, then a summary.

    python -m tests.conformance.report [PATTERN ...] [--list-passing] [--runtime onnxruntime]

``--runtime onnxruntime`` runs the same cases, inputs and tolerances through onnxruntime (the
figure the README compares with).
"""

from __future__ import annotations

import sys
import time

from .suite import node_cases, run_case


def main(argv: list[str]) -> int:
    show_pass = "--list-passing" in argv
    runtime = None
    if "--runtime" in argv:
        import importlib

        at = argv.index("--runtime")
        runtime = importlib.import_module(argv[at + 1])
        if hasattr(runtime, "set_default_logger_severity"):
            runtime.set_default_logger_severity(4)  # its own warnings would bury the report
        argv = argv[:at] + argv[at + 2 :]
    patterns = [a for a in argv if not a.startswith("--")]
    cases = node_cases()
    names = sorted(n for n in cases if not patterns or any(p in n for p in patterns))
    failed = 0
    started = time.perf_counter()
    for name in names:
        try:
            run_case(cases[name], runtime)
        except Exception as e:  # noqa: BLE001 - report every failure kind
            failed += 1
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            print(f"FAIL {name} | {type(e).__name__}: {first}")
        else:
            if show_pass:
                print(f"pass {name}")
    took = time.perf_counter() - started
    print(f"{len(names) - failed} passed, {failed} failed of {len(names)} ({took:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
