"""A long fuzz campaign: batches of test_fuzz.py, each in its own process with a fresh seed,
until a time budget is spent. A batch that fails keeps hypothesis's report; one that crashes
the interpreter (a segfault in a C extension) keeps the model it was running.

    python -m tests.robustness.fuzz_campaign --minutes 25 --batch 3000 --out /tmp/fuzz

Prints a summary (examples, outcomes, failures) at the end; docs/testing.md records the last
campaign's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--batch", type=int, default=3000, help="examples per process")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=Path("fuzz-campaign"))
    ap.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit of each batch")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    totals: Counter[str] = Counter()
    failures: list[str] = []
    batches = 0
    seed = args.first_seed
    while time.monotonic() < deadline - 30:
        stats = args.out / f"stats-{seed}.json"
        last = args.out / f"last-{seed}.onnx"
        env = dict(
            os.environ,
            ONNXPY_FUZZ_EXAMPLES=str(args.batch),
            ONNXPY_FUZZ_SEED=str(seed),
            ONNXPY_FUZZ_STATS=str(stats),
            ONNXPY_FUZZ_LAST_MODEL=str(last),
        )
        limit = int(args.memory_gb * (1 << 30))
        cmd = [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            "import resource, sys, pytest; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
            "sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', '-p', 'no:warnings', "
            "'tests/robustness/test_fuzz.py']))",
        ]
        remaining = max(60.0, deadline - time.monotonic())
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=remaining + 120)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, output = -1, f"batch timed out\n{e.stdout or ''}{e.stderr or ''}"
        batches += 1
        if stats.exists():
            totals.update(json.loads(stats.read_text()))
        if rc != 0:
            report = args.out / f"failure-{seed}.txt"
            report.write_text(output)
            if rc < 0 or "Fatal Python error" in output:
                if last.exists():
                    shutil.copy(last, args.out / f"crash-{seed}.onnx")
                    shutil.copy(str(last) + ".txt", args.out / f"crash-{seed}.txt")
            failures.append(f"seed {seed}: exit {rc}, see {report}")
        for p in (last, Path(str(last) + ".txt")):
            if p.exists():
                p.unlink()
        seed += 1
    elapsed = time.monotonic() - started
    summary = {
        "minutes": round(elapsed / 60, 1),
        "batches": batches,
        "examples": sum(totals.values()),
        "outcomes": dict(totals.most_common()),
        "failures": failures,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
