"""Enqueue of a JSON Lines file of envelopes (200-byte JSON bodies) into a fresh queue, against the floor.

Data (not timed): `--messages` envelopes written as a JSON Lines file the way a producer writes them
(`json.dumps`, one a line). Timed, each into a fresh lake, in this order:
- `floor`: pyarrow's JSON reader over the file and one `write_deltalake` of what it read (same row
  group size as the product): the fastest honest way to land those lines in a Delta table, with no
  validation at all;
- `python_file`: `operations.records.enqueue(declaration, queue, path)`, the Python API given the file;
- `python`: `operations.records.enqueue(declaration, queue, path.read_text().splitlines())`, the Python
  API given the lines as texts (reading and splitting the file included);
- `python_dicts`: the Python API given the envelopes as decoded dicts (decoded before the clock):
  what an application that builds its messages in Python hands over;
- `cli`: `poison-pipeline enqueue FILE --queue Q` in a subprocess (its interpreter start included);
- `python_chunks`: the Python API given the same texts (split before the clock) in calls of
  `--chunk` (100,000), as `broker_drain.py` enqueues: what a call costs beyond its lines.
Prints one JSON line: msg/s of each, their ratios to the floor, the 200,000 msg/s target (met when
the CLI and the Python API given the file reach it; `within_target_objects` says it of the texts
and the dicts),
and the CPU seconds of each (all threads; the CLI's from its process): on a shared machine the wall
clock says little, the CPU seconds say what the work costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.json as pj
from deltalake import WriterProperties, write_deltalake

sys.path.insert(0, os.path.dirname(__file__))
import bench_handler  # noqa: E402
from cycle_throughput import emit  # noqa: E402

from poison_pipeline.domain.declaration import parse_declaration  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402

QUEUE = "bench"
TARGET = 200_000


def write_envelopes(path: Path, messages: int, prefix: str = "m") -> None:
    """`messages` envelopes whose JSON bodies are 200 bytes once compact, one a line."""
    with path.open("w") as out:
        for i in range(messages):
            body = {"order": i, "sku": f"SKU-{i % 9973:05d}", "quantity": i % 17 + 1, "price": 12.5,
                    "customer": f"C{i % 100_003:06d}", "note": ""}
            compact = len(json.dumps(body, separators=(",", ":")))
            body["note"] = "x" * (200 - compact)
            out.write(json.dumps({"message_id": f"{prefix}-{i}", "message_type": "order", "body": body}) + "\n")


def _config(folder: Path, name: str) -> Path:
    config = folder / f"{name}.yaml"
    config.write_text(json.dumps({"lake_root": str(folder / name), "queues": {QUEUE: {
        "handler": bench_handler.HANDLER, "policy": {"max_retry_cycles": 1}}}}))
    return config


def _floor(source: Path, target: Path) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    table = pj.read_json(source)
    write_deltalake(str(target), table, mode="append", writer_properties=WriterProperties(max_row_group_size=65_536))
    return time.perf_counter() - started, time.process_time() - cpu


def _python(source: Path, folder: Path, messages: int, given_file: bool) -> tuple[float, float]:
    declaration = parse_declaration(json.loads(_config(folder, "python_file" if given_file else "python").read_text()))
    started, cpu = time.perf_counter(), time.process_time()
    result = enqueue(declaration, QUEUE, source if given_file else source.read_text().splitlines())
    elapsed, spent = time.perf_counter() - started, time.process_time() - cpu
    assert result.accepted == messages and not result.refused, (result.accepted, result.refused[:3])
    return elapsed, spent


def _python_dicts(source: Path, folder: Path, messages: int) -> tuple[float, float]:
    declaration = parse_declaration(json.loads(_config(folder, "python_dicts").read_text()))
    records = [json.loads(line) for line in source.read_text().splitlines()]
    started, cpu = time.perf_counter(), time.process_time()
    result = enqueue(declaration, QUEUE, records)
    elapsed, spent = time.perf_counter() - started, time.process_time() - cpu
    assert result.accepted == messages and not result.refused, (result.accepted, result.refused[:3])
    return elapsed, spent


def _python_chunks(source: Path, folder: Path, messages: int, chunk: int) -> tuple[float, float]:
    declaration = parse_declaration(json.loads(_config(folder, "python_chunks").read_text()))
    lines = source.read_text().splitlines()
    chunks = [lines[first:first + chunk] for first in range(0, len(lines), chunk)]
    del lines
    started, cpu = time.perf_counter(), time.process_time()
    accepted = sum(enqueue(declaration, QUEUE, part).accepted for part in chunks)
    elapsed, spent = time.perf_counter() - started, time.process_time() - cpu
    assert accepted == messages, accepted
    return elapsed, spent


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cli(source: Path, folder: Path, messages: int) -> tuple[float, float]:
    config = _config(folder, "cli")
    command = [sys.executable, "-m", "poison_pipeline.cli", "--config", str(config), "enqueue", str(source),
               "--queue", QUEUE]
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed, spent = time.perf_counter() - started, _children_cpu() - cpu
    assert done.returncode == 0 and f"enqueued {messages} of {messages}" in done.stdout, done.stderr[-2000:]
    return elapsed, spent


def measure(messages: int, chunk: int) -> Any:
    def compute(workdir: str) -> dict[str, Any]:
        load_start = os.getloadavg()
        folder = Path(workdir)
        source = folder / "envelopes.jsonl"
        write_envelopes(source, messages)
        floor, floor_cpu = _floor(source, folder / "floor")
        python_file, python_file_cpu = _python(source, folder, messages, given_file=True)
        python, python_cpu = _python(source, folder, messages, given_file=False)
        dicts, dicts_cpu = _python_dicts(source, folder, messages)
        cli, cli_cpu = _cli(source, folder, messages)
        chunks, chunks_cpu = _python_chunks(source, folder, messages, chunk)
        rates = {name: round(messages / seconds) for name, seconds in
                 (("floor", floor), ("python_file", python_file), ("python", python), ("python_dicts", dicts),
                  ("cli", cli), ("python_chunks", chunks))}
        return {
            "benchmark": "enqueue_throughput",
            "messages": messages,
            "file_bytes": source.stat().st_size,
            "chunk": chunk,
            "seconds": {"floor": round(floor, 3), "python_file": round(python_file, 3), "python": round(python, 3),
                        "python_dicts": round(dicts, 3), "cli": round(cli, 3), "python_chunks": round(chunks, 3)},
            "msg_per_s": rates,
            "ratio_to_floor": {"python_file": round(python_file / floor, 2), "python": round(python / floor, 2),
                               "python_dicts": round(dicts / floor, 2), "cli": round(cli / floor, 2)},
            "cpu_seconds": {"floor": round(floor_cpu, 2), "python_file": round(python_file_cpu, 2),
                            "python": round(python_cpu, 2), "python_dicts": round(dicts_cpu, 2),
                            "cli": round(cli_cpu, 2), "python_chunks": round(chunks_cpu, 2)},
            "target_msg_per_s": TARGET,
            "within_target": rates["python_file"] >= TARGET and rates["cli"] >= TARGET,
            "within_target_objects": rates["python"] >= TARGET and rates["python_dicts"] >= TARGET,
            "cpus": os.cpu_count(),
            "load_avg": {"start": load_start, "end": os.getloadavg()},
        }
    return compute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=100_000, help="messages per call of `python_chunks`")
    parser.add_argument("--quick", action="store_true", help="50,000 messages (CI: asserts nothing about time)")
    parser.add_argument("--workdir", help="keep the file and the lakes here")
    args = parser.parse_args()
    messages, chunk = (50_000, 10_000) if args.quick else (args.messages, args.chunk)
    return emit(measure(messages, chunk), args.workdir, "enqueue-throughput-")


if __name__ == "__main__":
    raise SystemExit(main())
