"""The sequences of the issue "nothing lost, whatever operators do and however long a process
pauses", one test each, asserting the correct outcome: every message in exactly one place (or the
command refused with a clear error). Kills and pauses are placed at each of the first few commit
points of the operation (model_support counts them at delta-rs and file-system level), so the tests
do not depend on where the product's private functions are."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from poison_pipeline_tests import model_support as ms

pytestmark = pytest.mark.e2e
MOVE = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}
REJECT = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "reject"}


def _lake(folder: Path, queues: dict[str, dict[str, Any]], expiry: float = ms.EXPIRY_SECONDS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return ms.write_declaration(folder, queues, expiry=expiry)


def _enqueue(config: Path, queue: str, ids: list[str], fail: str = "always", sleep: float = 0.0) -> None:
    ms.run_op(str(config), "enqueue", {"queue": queue, "lines": ms.lines_for(config.parent, ids, fail, sleep=sleep)})


def _op(config: Path, op: str, **args: Any) -> str:
    return ms.run_op(str(config), op, args)


def _refused_or_done(config: Path, op: str, **args: Any) -> str:
    """A command that may be refused (a clear error is a correct outcome); its lake is judged after."""
    try:
        return _op(config, op, **args)
    except (ValueError, LookupError) as error:
        assert str(error), "a refusal says why"
        return f"refused: {error}"


def _balanced(config: Path, ids: list[str], purged_ok: bool = True) -> None:
    where = ms.places(config)
    wrong = {m: where.get(m, []) for m in ids if len(where.get(m, [])) != 1}
    assert not wrong, f"not in exactly one place: {wrong}"
    if not purged_ok:
        assert not [m for m in ids if where[m][0][1] == "purged"]
    lines = ms.product_lines(config)
    for received, accounted, line in lines.values():
        assert received is None or received == accounted, line
    assert sum(accounted for _, accounted, _ in lines.values()) == len(ids), [line for *_, line in lines.values()]


def _each_point(tmp_path: Path, points: range, sequence: Callable[[Path, int], None]) -> None:
    for at in points:
        sequence(tmp_path / f"at-{at}", at)


def test_redrive_after_undo(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"q": MOVE})
    _enqueue(config, "q", ["m1", "m2"])
    _op(config, "cycle", queue="q", table="inbound")
    _op(config, "redrive", queue="q", source="poison")
    action = next(a for a in ms.actions(config) if a.kind == "redrive")
    _op(config, "undo", id=action.action_id)
    _balanced(config, ["m1", "m2"])
    _refused_or_done(config, "redrive", queue="q", source="poison")
    _balanced(config, ["m1", "m2"])


def test_redrive_id_reuse(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"a": MOVE, "b": MOVE, "z": MOVE})
    _enqueue(config, "a", ["a1"])
    _enqueue(config, "b", ["b1"])
    _op(config, "cycle", queue="a", table="inbound")
    _op(config, "cycle", queue="b", table="inbound")
    _op(config, "redrive", queue="a", source="poison", to="z", id="fix1")
    _refused_or_done(config, "redrive", queue="b", source="poison", to="z", id="fix1")
    _balanced(config, ["a1", "b1"])


def _pause_then_take_over(config: Path, op: str, args: dict[str, Any], at: int,
                          take_over: Callable[[], None]) -> ms.Child | None:
    """Pause `op` before its `at`-th commit point, past its expiry; `take_over`; resume it."""
    child = ms.start_child(config, op, args, "pause", at)
    if child.wait_paused_or_done() != "paused":
        child.finish()
        return None
    time.sleep(ms.PAST_EXPIRY)
    take_over()
    resumed = time.time()
    child.resume()
    late = [e for e in ms.effects(config.parent) if e.driver == child.pid and e.what == "ok" and e.at >= resumed]
    assert len(late) <= 1, f"the resumed holder delivered {len(late)} messages after losing its lease: {late}"
    return child


def test_stale_holder(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"q": MOVE})
        _enqueue(config, "q", ["m1", "m2"], "never")

        def take_over() -> None:
            _op(config, "cycle", queue="q", table="inbound")
            _enqueue(config, "q", ["n1", "n2"], "never")

        _pause_then_take_over(config, "cycle", {"queue": "q", "table": "inbound"}, at, take_over)
        _op(config, "cycle", queue="q", table="inbound")
        _balanced(config, ["m1", "m2", "n1", "n2"])
        assert ms.ids_in(config, "q", "processed") == ["m1", "m2", "n1", "n2"]

    _each_point(tmp_path, range(1, 8), sequence)


def test_stale_redrive(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"q": MOVE})
        _enqueue(config, "q", ["m1", "m2"])
        _op(config, "cycle", queue="q", table="inbound")
        _pause_then_take_over(config, "redrive", {"queue": "q", "source": "poison", "id": "r2"}, at,
                              lambda: _op(config, "cycle", queue="q", table="poison"))
        _op(config, "cycle", queue="q", table="inbound")
        _balanced(config, ["m1", "m2"])

    _each_point(tmp_path, range(1, 5), sequence)


def test_redrive_vs_purge(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"q": MOVE})
        _enqueue(config, "q", ["m1", "m2"])
        _op(config, "cycle", queue="q", table="inbound")
        ms.start_child(config, "redrive", {"queue": "q", "source": "poison", "id": "r1"}, "kill", at).finish()
        _refused_or_done(config, "purge", queue="q", table="poison", older_than=0)
        _op(config, "cycle", queue="q", table="inbound")
        _balanced(config, ["m1", "m2"])
        delivered = [e.message_id for e in ms.effects(folder) if e.what == "start"]
        purged = ms.ids_in(config, "q", "purged")
        assert not [m for m in purged if delivered.count(m) > 1], "a purged message was delivered again"

    _each_point(tmp_path, range(1, 5), sequence)


def test_undo_rerun(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"q": MOVE})
        _enqueue(config, "q", ["m1", "m2"])
        _op(config, "cycle", queue="q", table="inbound")
        _op(config, "redrive", queue="q", source="poison", id="r1")
        ms.start_child(config, "undo", {"id": "r1"}, "kill", at).finish()
        _enqueue(config, "q", ["n1"])
        _refused_or_done(config, "undo", id="r1")
        _balanced(config, ["m1", "m2", "n1"])
        _op(config, "cycle", queue="q", table="inbound")
        _balanced(config, ["m1", "m2", "n1"])

    _each_point(tmp_path, range(1, 4), sequence)


def test_clock_skew(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"q": MOVE}, expiry=3.0)
    _enqueue(config, "q", ["m1"], "never", sleep=4.0)
    first = ms.start_child(config, "cycle", {"queue": "q", "table": "inbound", "run_id": "A"}, "run", 0)
    for _ in range(300):
        if any(e.what == "start" for e in ms.effects(tmp_path)):
            break
        time.sleep(0.05)
    second = ms.start_child(config, "cycle", {"queue": "q", "table": "inbound", "run_id": "B"}, "run", 0,
                            prepare="poison_pipeline_tests.model_support:skew_clock")
    first.finish()
    second.finish()
    spans: dict[int, list[float]] = {}
    for effect in ms.effects(tmp_path):
        spans.setdefault(effect.driver, []).append(effect.at)
    assert len(spans) <= 1 or _apart(list(spans.values())), f"two holders delivered at once: {spans}"
    _balanced(config, ["m1"])


def _apart(spans: list[list[float]]) -> bool:
    (a, b) = sorted(spans)[:2]
    return max(a) <= min(b) or max(b) <= min(a)


def test_vacuum_truncation(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"q": MOVE})
    _enqueue(config, "q", ["m1"], "never")
    _op(config, "cycle", queue="q", table="inbound")
    _refused_or_done(config, "maintain", queue="q", vacuum=True, retention=1800)
    rows = DeltaTable(str(tmp_path / "lake" / "q" / "inbound"), version=1).to_pyarrow_table().num_rows
    assert rows == 1


def test_purge_older_than_zero_seconds(tmp_path: Path) -> None:
    from poison_pipeline.domain.declaration import load_declaration
    from poison_pipeline.operations.purge import purge_table
    config = _lake(tmp_path, {"q": MOVE})
    _enqueue(config, "q", ["m1"])
    _op(config, "cycle", queue="q", table="inbound")
    purge_table(load_declaration(str(config)), "q", "poison", "0")
    assert ms.ids_in(config, "q", "purged") == ["m1"]


def test_where_is_an_expression_not_sql(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"q": MOVE})
    _enqueue(config, "q", ["m1"])
    _op(config, "cycle", queue="q", table="inbound")
    for where in ("1=0) UNION ALL SELECT * FROM t --",
                  "NOT EXISTS (SELECT 1 FROM generate_series(1, 100000000000) WHERE value < 0)"):
        child = ms.start_child(config, "redrive", {"queue": "q", "source": "poison", "id": "w1",
                                                   "selection": {"where": where}}, "run", 0)
        child.process.join(20)
        hung = child.process.is_alive()
        child.finish(0)
        assert not hung, f"--where {where!r} ran for 20 s"
        assert child.outcome().startswith("FAILED"), f"--where {where!r} was not refused: {child.outcome()}"
        assert ms.ids_in(config, "q", "poison") == ["m1"]


def test_undo_of_redrive_into_new_queue(tmp_path: Path) -> None:
    config = _lake(tmp_path, {"qb": REJECT, "qc": MOVE})
    _enqueue(config, "qb", ["m1"])
    _op(config, "cycle", queue="qb", table="inbound")
    _op(config, "redrive", queue="qb", source="dead_letter", to="qc", id="t1")
    _refused_or_done(config, "undo", id="t1")
    _balanced(config, ["m1"])


def test_killed_purge_then_redrive(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"qb": REJECT})
        _enqueue(config, "qb", ["m1", "m2"])
        _op(config, "cycle", queue="qb", table="inbound")
        ms.start_child(config, "purge", {"queue": "qb", "table": "dead_letter", "older_than": 0}, "kill", at).finish()
        _refused_or_done(config, "redrive", queue="qb", source="dead_letter")
        _op(config, "cycle", queue="qb", table="inbound")
        _balanced(config, ["m1", "m2"])

    _each_point(tmp_path, range(1, 5), sequence)


def test_killed_cycle_then_undo(tmp_path: Path) -> None:
    def sequence(folder: Path, at: int) -> None:
        config = _lake(folder, {"qb": REJECT})
        _enqueue(config, "qb", ["m1"], "fixable")
        _op(config, "cycle", queue="qb", table="inbound")
        (folder / "fixed").touch()
        _op(config, "redrive", queue="qb", source="dead_letter", id="r1")
        ms.start_child(config, "cycle", {"queue": "qb", "table": "inbound"}, "kill", at).finish()
        _refused_or_done(config, "undo", id="r1")
        _op(config, "cycle", queue="qb", table="inbound")
        _balanced(config, ["m1"])

    _each_point(tmp_path, range(1, 8), sequence)
