"""The model test's long profile (`make model`): at least 2,000 random sequences that ran all their 30
steps.

The sequences run in chunks, each a pytest process of its own, `--workers` at a time. Every chunk
appends one JSON line (its counts, the code it ran, the machine's load) to the results file, so a run
that was stopped (killed, or asked to by creating `<results>.stop`: the chunks under way finish
first) resumes where it left off: chunks recorded for the same code count towards the total. Only
the sequences that ran all their steps count (not one hypothesis gave up on before its last step);
chunks go on until they reach the total.
The code is named by a hash of what the model runs: the product's packages below the console and
Dagster (`MODEL_RUNS`) and the model's test files (`test_model.py` and every test module that is not
a `test_*.py` file). A commit that touches none of them (the CLI, Dagster's layer, other tests, docs,
the results file itself) keeps the chunks already run. A failing chunk
stops the run; its line holds its failure lines (the violation, the seed to replay it) and names the
log beside the results that keeps its whole output.

    .venv/bin/python tools/model_long.py [--workers N] [--sequences 2000] [--chunk 25] [--results F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "poison_pipeline_tests" / "results" / "model_long.jsonl"
# A chunk's sequences are those that ran all their steps (the model counts those and all it began).
FULL = "model full-length sequences"
COUNTS_LINE = re.compile(r"^fuzz \(long profile\): (.*)$", re.MULTILINE)
TAIL_LINES = 80
# The product code the model drives (operations in-process, cycles, kills and pauses); the CLI,
# `defs/` and `runs/` only call into it.
MODEL_RUNS = tuple(f"poison_pipeline/{name}" for name in (
    "domain", "storage", "broker", "engine", "operations", "handlers.py", "proc.py"))


def code_of(root: Path) -> dict[str, str]:
    """What a chunk runs: the product's git tree and the model's test files (a dirty tree is refused:
    it has no name)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    changed = [line for line in git("status", "--porcelain", "--", "poison_pipeline", "poison_pipeline_tests")
               .splitlines() if "poison_pipeline_tests/results/" not in line]
    if changed:
        raise SystemExit("model_long: the code has uncommitted changes; commit them (or run from a clean "
                         "worktree) so that the chunks name the code they ran:\n" + "\n".join(changed))
    model_files = [line for line in git("ls-tree", "-r", "HEAD", "poison_pipeline_tests").splitlines()
                   if "/results/" not in line and _runs_in_model(line.split("\t")[1])]
    return {"product": _hash(git("ls-tree", "-r", "HEAD", *MODEL_RUNS).splitlines()),
            "model_tests": _hash(model_files),
            "commit": git("rev-parse", "--short", "HEAD")}


def _hash(lines: list[str]) -> str:
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def _runs_in_model(path: str) -> bool:
    name = Path(path).name
    return name == "test_model.py" or not name.startswith("test_")


def parse_counts(output: str) -> Counter[str]:
    """The counts pytest's summary line prints ("fuzz (long profile): 1,234 model steps, ...")."""
    found = COUNTS_LINE.findall(output)
    counts: Counter[str] = Counter()
    if found:
        for part in found[-1].split(", "):
            number, _, kind = part.partition(" ")
            counts[kind] += int(number.replace(",", ""))
    return counts


def recorded(results: Path, code: dict[str, str], steps: int) -> list[dict[str, Any]]:
    """The chunks already run on this code, with sequences as long as asked."""
    if not results.exists():
        return []
    lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return [line for line in lines
            if line["product"] == code["product"] and line["model_tests"] == code["model_tests"]
            and line["steps_per_sequence"] >= steps]


def run_chunk(root: Path, sequences: int, steps: int) -> tuple[bool, str, float]:
    # Spark's workers and the killed subprocesses import the package from `root` too, not from wherever
    # the interpreter's editable install points (a worktree runs its own code).
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, HYPOTHESIS_PROFILE="long", MODEL_SEQUENCES=str(sequences), MODEL_STEPS=str(steps),
               PYTHONPATH=path)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "model",
         "poison_pipeline_tests/test_model.py", "-k", "test_lake_model and not s3"],
        cwd=root, env=env, capture_output=True, text=True)
    return done.returncode == 0, done.stdout + done.stderr, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sequences", type=int, default=2000, help="the total to reach on this code")
    parser.add_argument("--steps", type=int, default=30, help="steps per sequence")
    parser.add_argument("--chunk", type=int, default=25, help="sequences per pytest process")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if min(args.workers, args.sequences, args.steps, args.chunk) < 1:
        parser.error("--workers, --sequences, --steps and --chunk must be at least 1")

    code = code_of(ROOT)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    before = recorded(args.results, code, args.steps)
    if any(not line["passed"] for line in before):
        print("model_long: a chunk on this code failed already; read its line in", args.results)
        return 1
    done = sum(line["sequences"] for line in before)
    print(f"model_long: {len(before)} chunks recorded on this code ({done:,} full-length sequences of "
          f"{args.sequences:,}), {args.workers} at a time", flush=True)
    lock = threading.Lock()
    failed = threading.Event()
    in_flight = [0]  # sequences asked of the chunks under way in this process

    stop = args.results.with_name(args.results.name + ".stop")
    stop.unlink(missing_ok=True)  # it stopped an earlier run

    def next_chunk() -> int:
        """How many sequences the next chunk asks for, or 0 when none is needed. The file is read
        again each time: other runs append to it, and a chunk yields fewer full-length sequences
        than it asks for, so chunks go on until the total is reached."""
        with lock:
            if failed.is_set() or stop.exists():
                return 0
            done = sum(line["sequences"] for line in recorded(args.results, code, args.steps))
            size = min(args.chunk, args.sequences - done - in_flight[0])
            in_flight[0] += max(size, 0)
            return max(size, 0)

    def one(sequences: int) -> None:
        load = os.getloadavg()
        passed, output, seconds = run_chunk(ROOT, sequences, args.steps)
        counts = parse_counts(output)
        # A chunk without a full-length sequence (or without its counts line) would count for nothing
        # and be run again for ever: it fails the run instead, with its output kept.
        passed = passed and counts[FULL] > 0
        line: dict[str, Any] = {
            **code, "passed": passed, "sequences": counts[FULL] if passed else sequences,
            "steps_per_sequence": args.steps, "counts": dict(sorted(counts.items())),
            "seconds": round(seconds, 1), "load_avg_start": [round(x, 2) for x in load],
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if not passed:
            # What failed and how to replay it; the whole output goes to a log of its own beside the results.
            log = args.results.with_name(f"model_long-{line['at'].replace(':', '')}.log")
            log.write_text(output)
            lines = output.splitlines()
            line["log"] = str(log)
            line["failure"] = [text for text in lines
                               if re.search(r"Violation|reproduce_failure|hypothesis-seed|Error:", text)][:20]
            line["output_tail"] = lines[-TAIL_LINES:]
            failed.set()
        with lock:
            with args.results.open("a") as out:
                out.write(json.dumps(line) + "\n")
            in_flight[0] -= sequences
            print(f"model_long: chunk {'passed' if passed else 'FAILED'}: {line['sequences']} full-length sequences "
                  f"of {counts['model sequences']}, {counts['model steps']:,} steps, {seconds:.0f} s", flush=True)

    def worker() -> None:
        while sequences := next_chunk():
            one(sequences)

    with ThreadPoolExecutor(args.workers) as pool:
        for running in [pool.submit(worker) for _ in range(args.workers)]:
            running.result()

    lines = recorded(args.results, code, args.steps)
    totals: Counter[str] = Counter()
    for line in lines:
        totals.update(line["counts"])
    print(f"model_long: {len(lines)} chunks on product {code['product'][:12]}, tests {code['model_tests'][:12]}, "
          f"{sum(line['sequences'] for line in lines):,} full-length sequences, "
          f"{sum(not line['passed'] for line in lines)} failed")
    print("fuzz (long profile): " + ", ".join(f"{n:,} {kind}" for kind, n in sorted(totals.items())))
    return 1 if failed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
