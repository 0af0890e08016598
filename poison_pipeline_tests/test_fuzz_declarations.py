"""Fuzzed declarations, as data and as YAML files: each is accepted or refused with a
DeclarationError naming the field path and the rule, never another exception."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from poison_pipeline.domain.declaration import (
    Declaration,
    DeclarationError,
    field_path,
    load_declaration,
    parse_declaration,
)
from poison_pipeline.domain.durations import LONGEST
from poison_pipeline.operations.records import parse_texts
from poison_pipeline_tests.fuzz_commands import BASE, Mutation, declarations
from poison_pipeline_tests.fuzz_support import COUNTS, fuzz_settings

_LINE = re.compile(r"^  (?P<path>\S(?:.*?\S)?) = (?P<input>.*?): (?P<rule>.+)$")


def _related(path: str, mutations: list[Mutation]) -> bool:
    return any(path == m.path or path.startswith(m.path + ".") or m.path.startswith(path + ".")
               for m in mutations)


def check_refusal(text: str, mutations: list[Mutation]) -> None:
    head, *lines = text.split("\n")
    assert head.startswith("invalid declaration") or head.startswith("declaration "), text
    if not lines:  # the top level is no mapping, the file is no YAML or no UTF-8
        assert "mapping" in head or "YAML" in head or "UTF-8" in head, text
        return
    paths = []
    for line in lines:
        found = _LINE.match(line)
        assert found, f"an error line without a field path and a rule: {line!r} in\n{text}"
        paths.append(found["path"])
    assert any(_related(path, mutations) for path in paths), f"no error names a changed field {mutations}:\n{text}"


def check_accepted(declaration: Declaration) -> None:
    for name, queue in declaration.queues.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name), name
        policy = queue.policy
        for duration in (policy.retry_cycle_delay, policy.time_to_live, policy.handler_timeout, policy.dedup_window,
                         queue.checks.oldest_waiting.warn, queue.checks.oldest_waiting.error,
                         *queue.retention.values()):
            assert duration is None or timedelta(0) <= duration <= LONGEST, (name, duration)
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in (
            policy.receive_retry_count, policy.max_retry_cycles, policy.max_body_bytes, policy.outage_threshold))
    assert timedelta(0) <= declaration.lease.wait <= LONGEST
    for name, queue in declaration.queues.items():  # its policy takes an envelope down the vectorised path
        parsed, _ = parse_texts(pa.array([_PLAIN], pa.large_string()), np.array([1]), queue.policy, NOW)
        assert len(parsed.lines) == (1 if queue.policy.max_body_bytes >= 2 else 0), name


_PLAIN = '{"message_id":"m","message_type":"t","body":{}}'
NOW = datetime(2026, 11, 23, tzinfo=UTC)


_NAN_DELAY = ({**BASE, "queues": {"q": {"handler": BASE["queues"]["q"]["handler"],
                                        "policy": {"retry_cycle_delay": math.nan}}}},
              [Mutation("queues.q.policy.retry_cycle_delay", math.nan)])


@fuzz_settings("declarations")
@given(case=declarations())
# An OverflowError, not a DeclarationError, came out of these before durations were bounded.
@example(case=({**BASE, "lease": {"wait": "99999999999999999999d"}}, [Mutation("lease.wait", "99999999999999999999d")]))
@example(case=({**BASE, "lease": {"expiry": 1e308}}, [Mutation("lease.expiry", 1e308)]))
@example(case=_NAN_DELAY)
# The error line read `storage_options.  = None`: a blank key left unquoted.
@example(case=({**BASE, "storage_options": {" ": None}}, [Mutation("storage_options", {" ": None})]))
# Accepted, then every enqueue failed: pyarrow cannot compare a body's length with 10**30.
@example(case=({**BASE, "queues": {"q": {**BASE["queues"]["q"], "policy": {"max_body_bytes": 10**30}}}},
               [Mutation("queues.q.policy.max_body_bytes", 10**30)]))
# A queue named "q\n" was accepted: `re.match` lets "$" match before a final newline.
@example(case=({**BASE, "queues": {"q\n": BASE["queues"]["q"]}}, [Mutation("queues.q\n", "renamed")]))
def test_a_declaration_is_accepted_or_refused_naming_the_field(case: tuple[dict[str, Any], list[Mutation]],
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    data, mutations = case
    COUNTS["declarations"] += 1
    try:
        declaration = parse_declaration(data, "<fuzz>", base_dir=Path("/nonexistent-base"))
    except DeclarationError as error:
        check_refusal(str(error), _rendered(mutations))
    else:
        check_accepted(declaration)


def _rendered(mutations: list[Mutation]) -> list[Mutation]:
    """Mutation paths as errors write them (a part that is not printable text quoted)."""
    out = []
    for m in mutations:
        if m.value == "renamed":
            name = m.path.removeprefix("queues.")
            out.append(Mutation(field_path(("queues", name)), m.value))
        else:
            out.append(m)
    return out


_DAMAGE = ["none", "truncate", "tab", "python_tag", "not_mapping", "empty", "latin1", "binary", "duplicate"]


@fuzz_settings("yaml")
@given(case=declarations(), damage=st.sampled_from(_DAMAGE), at=st.floats(0, 1))
@example(case=(BASE, []), damage="latin1", at=0.5)  # a UnicodeDecodeError came out of load_declaration
def test_a_declaration_file_is_loaded_or_refused(case, damage: str, at: float, tmp_path_factory) -> None:
    data, mutations = case
    COUNTS["declaration_files"] += 1
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode()
    cut = int(len(text) * at)
    text = {
        "none": text, "truncate": text[:cut], "tab": text[:cut] + b"\t" + text[cut:],
        "python_tag": b"lake_root: !!python/object/apply:os.system ['touch /tmp/never']\n" + text,
        "not_mapping": b"- " + text.replace(b"\n", b"\n  "), "empty": b"",
        "latin1": text + b"# caf\xe9\n", "binary": bytes(range(256)), "duplicate": text + text,
    }[damage]
    path = tmp_path_factory.mktemp("declaration") / "poison_pipeline.yaml"
    path.write_bytes(text)
    try:
        declaration = load_declaration(path)
    except DeclarationError as error:
        if damage == "none":
            check_refusal(str(error), _rendered(mutations))
        else:
            assert str(error).startswith(("invalid declaration", "declaration ")), error
    else:
        check_accepted(declaration)
    assert not Path("/tmp/never").exists()
