"""Writes docs/reference/definitions.md: every Dagster definition the example declaration builds,
per queue (its assets, checks, jobs, sensors and schedules), generated from the code so that it
cannot drift; `test_reference_docs.py` fails when the page and the code disagree.

    .venv/bin/python tools/definitions_page.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "definitions.md"
HEAD = """\
# Dagster definitions

What the example declaration (`poison_pipeline.yaml`) gives Dagster, queue by queue: the same
definitions `make ui` shows and a `dg` project's `PoisonQueuesComponent` builds from the same
attributes. Any declaration gives each of its queues the same kinds of definitions, named after the
queue. This page is generated (`.venv/bin/python tools/definitions_page.py`); a test fails when it
and the code disagree.
"""


def render() -> str:
    from poison_pipeline.defs.component import PoisonQueuesComponent
    from poison_pipeline.defs.naming import simulation_asset_key
    from poison_pipeline.domain.declaration import load_declaration

    declaration = load_declaration(ROOT / "poison_pipeline.yaml", import_code=False)
    repository = PoisonQueuesComponent(declaration).definitions().get_repository_def()
    graph = repository.asset_graph
    rows: dict[str, list[str]] = defaultdict(list)

    def add(queue: str, kind: str, name: str, what: str | None) -> None:
        rows[queue].append(f"| {kind} | `{name}` | {(what or '').split(chr(10), 1)[0]} |")

    def queue_of(name: str) -> str:
        return name.split("__", 1)[0] if "__" in name else name.split("/", 1)[0]

    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        add(queue_of(key.to_user_string()), "asset", key.to_user_string(), graph.get(key).description)
    for check in sorted(graph.asset_check_keys, key=lambda c: c.to_user_string()):
        add(queue_of(check.asset_key.to_user_string()), "check", check.to_user_string(),
            graph.get_check_spec(check).description)
    for job in sorted(repository.get_all_jobs(), key=lambda j: j.name):
        if not job.name.startswith("__"):  # Dagster's own asset job
            add(queue_of(job.name), "job", job.name, job.description)
    for queue in declaration.queues:
        # Materialized by a job, not defined: it is in no asset graph, so it is listed here.
        add(queue, "reported asset", simulation_asset_key(queue).to_user_string(),
            f"The report of the latest `{queue}__simulate` run (a Markdown table and the counts), recorded by that "
            "job; not in the asset graph.")
    for sensor in sorted(repository.sensor_defs, key=lambda s: s.name):
        add(queue_of(sensor.name), "sensor", sensor.name, sensor.description)
    for schedule in sorted(repository.schedule_defs, key=lambda s: s.name):
        add(queue_of(schedule.name), "schedule", schedule.name,
            f"`{schedule.cron_schedule}`, {schedule.default_status.value.lower()} by default")
    parts = [HEAD]
    for queue in sorted(rows):
        title = f"## {queue}" if queue in declaration.queues else f"## {queue} (every queue)"
        parts.append(f"{title}\n\n| kind | name | what it is |\n| --- | --- | --- |\n" + "\n".join(rows[queue]) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is current (exit 1 if not)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.exists() and PAGE.read_text() == text
        print("current" if current else f"{PAGE} is out of date: run tools/definitions_page.py")
        return 0 if current else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
