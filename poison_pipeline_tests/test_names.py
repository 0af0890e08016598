"""Names that cannot collide: an action's id, its batches and its app transactions are values built
and parsed in one place (domain/names.py), each kind in a namespace no operator id reaches, and a
lookup matches a whole name, never a prefix."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from poison_pipeline import cli
from poison_pipeline.domain.names import (
    ActionName,
    AppTransaction,
    BatchName,
    ConversationName,
    ResendName,
    ReservedName,
    SentName,
    check_operator_id,
)
from poison_pipeline.domain.paths import UnsafeName, operator_id
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations import redrive as redrive_module
from poison_pipeline.operations.actions import begin_action, find_action
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import EditRequest
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveRequest, redrive_table
from poison_pipeline.operations.requests import DERIVED_ID
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import queue_writer
from poison_pipeline_tests.support import rows
from poison_pipeline_tests.test_redrive import POLICY, RECORDING, lake  # noqa: F401 - the shared fixture

# Ids as operators choose them: sharing prefixes and separators with each other and with the ids the
# product derives, and the product's own words.
OPERATOR_WORDS = ["fix", "fix-2", "fix-poison", "fix-redrive", "fix-0", "fix.1", "undo-fix", "redrive",
                  "fence", "inbound", "transmission", "retry_1", "queue_state", "intake", "opening", "parked",
                  "restore", "step1", "poison", "dead_letter", "undo"]


def ids_in(declaration, table: str, queue: str = "q") -> list[str]:
    return sorted(r["message_id"] for r in rows(declaration, table, queue))


def test_undo_takes_back_only_its_own_batches_not_those_of_an_id_it_prefixes(lake):  # noqa: F811
    declaration, _ = lake
    redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="fix")
    redrive_table(declaration, "q", "poison", Selection(ids=("db-1",)), redrive_id="fix-2")
    result = undo_action(declaration, "fix")
    assert result.restored == 1
    assert ids_in(declaration, "poison") == ["db-0", "db-2", "own-1"]
    assert ids_in(declaration, "inbound") == ["db-1"]  # redrive fix-2 was not undone
    assert conservation(QueueTables.of(declaration, "q")).accounted == 4


def test_undo_of_a_redrive_leaves_the_copies_of_a_multi_table_redrive_from_the_same_id_alone(lake):  # noqa: F811
    declaration, _ = lake
    redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="fix")
    report = redrive_module.redrive(declaration, RedriveRequest(queue="q", source_tables=["poison", "dead_letter"],
                                                                ids=["db-1"], id="fix"))
    assert [(r.redrive_id, r.moved) for r in report.results] == [("fix--poison", 1), ("fix--dead_letter", 0)]
    assert undo_action(declaration, "fix").restored == 1
    assert ids_in(declaration, "inbound") == ["db-1"]


@pytest.mark.parametrize("given_id", ["fence", "inbound", "queue_state", "retry_1"])
def test_a_redrive_named_like_the_products_own_transactions_moves_every_message(lake, given_id):  # noqa: F811
    declaration, _ = lake
    result = redrive_table(declaration, "q", "poison", redrive_id=given_id)
    assert result.moved == 4
    assert ids_in(declaration, "inbound") == ["db-0", "db-1", "db-2", "own-1"]
    assert ids_in(declaration, "poison") == []
    assert conservation(QueueTables.of(declaration, "q")).accounted == 4


@pytest.mark.parametrize("given_id", ["fix--poison", "fix--undo", "redrive--0123456789ab", "fix-",
                                      "purge--run-4f1c2b9a-0d3e-4c55-9a61-2b7f0e8d9c10"])
def test_an_id_the_product_could_derive_is_refused_at_the_door(lake, given_id, tmp_path, capsys):  # noqa: F811
    declaration, _ = lake
    with pytest.raises(ValueError, match="no '--' inside"):
        RedriveRequest(queue="q", id=given_id)
    with pytest.raises(ValueError, match="no '--' inside"):
        EditRequest(message_id="db-0", body="{}", id=given_id)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--id", given_id]) == cli.EXIT_USAGE
    assert "no '--' inside" in capsys.readouterr().err
    assert ids_in(declaration, "inbound") == []


def test_a_multi_table_redrive_names_each_table_s_redrive_apart_from_any_operator_id(lake):  # noqa: F811
    declaration, _ = lake
    report = redrive_module.redrive(declaration, RedriveRequest(queue="q", source_tables=["poison", "dead_letter"],
                                                                ids=["db-0"], id="fix"))
    assert [r.redrive_id for r in report.results] == ["fix--poison", "fix--dead_letter"]
    # An operator's fix-poison is another redrive, not the one fix made of table poison.
    assert redrive_table(declaration, "q", "poison", Selection(ids=("db-1",)), redrive_id="fix-poison").moved == 1
    assert ids_in(declaration, "inbound") == ["db-0", "db-1"]


def test_a_lake_written_before_the_namespaces_is_still_undone(lake, monkeypatch):  # noqa: F811
    """Redrives recorded by an earlier version (batches `<id>-<chunk>`, app transaction
    `poison_pipeline/<queue>/<id>`): `undo fix` finds fix's copies and not those of fix-2."""
    declaration, _ = lake

    class Earlier(BatchName):
        def __str__(self) -> str:
            return self.spelled(legacy=True)

    monkeypatch.setattr(redrive_module, "BatchName", Earlier)
    redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="fix")
    redrive_table(declaration, "q", "poison", Selection(ids=("db-1",)), redrive_id="fix-2")
    monkeypatch.undo()
    inbound = {r["message_id"]: r["batch_id"] for r in rows(declaration, "inbound")}
    assert inbound == {"db-0": "fix-0", "db-1": "fix-2-0"}
    tables = QueueTables.of(declaration, "q")
    assert tables.open("inbound").transaction_version("poison_pipeline/q/fix") == 1
    assert undo_action(declaration, "fix").restored == 1
    assert ids_in(declaration, "inbound") == ["db-1"]
    assert find_action(tables, "fix--undo") is not None


def test_an_undo_an_earlier_version_began_completes_under_its_names(lake):  # noqa: F811
    """Killed after its record (`undo-fix`, planned) under an earlier version: it completes as begun."""
    declaration, _ = lake
    redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="fix")
    tables = QueueTables.of(declaration, "q")
    with queue_writer(tables, "test") as writer:
        begin_action(writer, "undo", "dave", {"action_id": "fix", "how": "compensate"},
                     [(tables, "poison"), (tables, "inbound")], action_id="undo-fix")
    result = undo_action(declaration, "fix")
    assert (result.undo_id, result.restored) == ("undo-fix", 1)
    assert find_action(tables, "undo-fix").state == "done" and find_action(tables, "fix--undo") is None
    assert tables.open("poison").transaction_version("poison_pipeline/undo-fix") == 1
    assert ids_in(declaration, "poison") == ["db-0", "db-1", "db-2", "own-1"]


FORWARD = "poison_pipeline_tests.handlers:forwarding"
ACCEPT = "poison_pipeline_tests.handlers:accept"
FAST = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0, "receive_error_handling": "drop"}


def test_two_queues_messages_with_one_id_send_two_messages_and_a_redelivery_sends_none(spark, make_declaration):
    declaration = make_declaration({"orders": {"handler": FORWARD, "policy": FAST},
                                    "refunds": {"handler": FORWARD, "policy": FAST},
                                    "target": {"handler": ACCEPT, "policy": FAST}})
    send = {"message_id": "1001", "message_type": "t", "body": {"sends": [{"to": "target", "type": "t"}]}}
    for queue in ("orders", "refunds"):
        assert not enqueue(declaration, queue, [send]).refused
        run_cycle(spark, declaration, queue, "inbound")
        run_cycle(spark, declaration, "target", "inbound")
    ledger = {r["message_id"]: r["disposition"] for r in rows(declaration, "processed", "target")}
    assert ledger == {"orders:1001/1": "processed", "refunds:1001/1": "processed"}
    conversations = {r["conversation_id"] for r in rows(declaration, "processed", "target")}
    assert conversations == {"conv:orders/1001", "conv:refunds/1001"}
    # orders' 1001 handled again (a redelivery) sends the same message: the target drops the copy.
    assert not enqueue(declaration, "orders", [{**send, "message_id": "1001"}]).refused
    run_cycle(spark, declaration, "orders", "inbound")
    report = run_cycle(spark, declaration, "target", "inbound")
    assert not report.counts.get("processed")


# --- the name types -------------------------------------------------------------------------------

_SEGMENT = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,12}", fullmatch=True)
queues = st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True)
derivations = st.one_of(st.sampled_from(list(FAILURE_TABLES)), st.just("redrive"), st.just("undo"),
                        st.integers(1, 12).map(lambda k: f"step{k}"))


def _may_be_given(value: str) -> bool:
    try:
        check_operator_id(value)
    except ReservedName:
        return False
    return True


operator_ids = st.one_of(st.sampled_from(OPERATOR_WORDS), _SEGMENT).filter(_may_be_given)


@st.composite
def action_names(draw: st.DrawFn) -> ActionName:
    if draw(st.booleans()):
        name = ActionName(draw(operator_ids))
    else:
        # A default id, as ActionName.default draws it.
        kind = draw(st.sampled_from(["redrive", "purge", "edit", "ramp", "archive"]))
        name = ActionName(kind, (draw(st.from_regex(r"[0-9a-f]{12}", fullmatch=True)),))
    for step in draw(st.lists(derivations, max_size=3)):
        name = name.derived(step)
    return name


names = st.one_of(
    action_names().map(lambda n: ("action", n)),
    st.tuples(action_names(), st.integers(0, 30)).map(lambda t: ("batch", BatchName.chunk(str(t[0]), t[1]))),
    action_names().map(lambda n: ("batch", BatchName.parked(str(n)))),
    st.tuples(queues, action_names()).map(lambda t: ("app", AppTransaction.redrive(t[0], str(t[1])))),
    action_names().map(lambda n: ("app", AppTransaction.undo(str(n)))),
    action_names().map(lambda n: ("app", AppTransaction.restore(str(n)))),
    action_names().map(lambda n: ("app", AppTransaction.parked(str(n)))),
    action_names().map(lambda n: ("app", AppTransaction.action(str(n)))),
    queues.map(lambda q: ("app", AppTransaction.transmission(q))),
    action_names().map(lambda n: ("app", AppTransaction.removed(str(n)))),
    st.tuples(queues, st.text(max_size=12), st.integers(1, 20)).map(lambda t: ("sent", SentName(*t))),
    st.tuples(queues, st.text(max_size=12)).map(lambda t: ("conversation", ConversationName(*t))),
    st.tuples(st.text(min_size=1, max_size=12).filter(lambda t: ResendName.parse(t) is None),
              st.integers(1, 20)).map(lambda t: ("resend", ResendName(*t))),
)
_PARSERS = {"action": ActionName.parse, "batch": BatchName.parse, "app": AppTransaction.parse,
            "sent": SentName.parse, "conversation": ConversationName.parse, "resend": ResendName.parse}


@given(names, names)
def test_distinct_names_differ_whatever_their_kind(one, other):
    if one != other:
        assert str(one[1]) != str(other[1])


@given(names)
def test_parsing_a_name_gives_back_its_parts(name):
    kind, value = name
    assert _PARSERS[kind](str(value)) == value


@given(operator_ids, action_names())
def test_a_derived_id_is_never_one_an_operator_may_give(given_id, name):
    assert operator_id(given_id) == given_id
    if name.steps:
        with pytest.raises(UnsafeName):
            operator_id(str(name))


@given(queues, operator_ids, st.sampled_from(["fence", "queue_state", "inbound", "retry_1", "intake"]))
def test_an_operator_actions_transaction_is_none_of_the_products_own(queue, given_id, word):
    own = {f"poison_pipeline/{queue}/{word}", str(AppTransaction.transmission(queue)), "poison_pipeline/intake/opening"}
    for app in (AppTransaction.redrive(queue, given_id), AppTransaction.undo(given_id),
                AppTransaction.restore(given_id), AppTransaction.parked(given_id), AppTransaction.action(given_id),
                AppTransaction.removed(given_id)):
        assert str(app) not in own


def test_a_resend_is_named_apart_from_a_default_conversation_and_its_earlier_spelling_is_read():
    resend = ResendName("conv:q/x", 1)
    assert str(resend) == "resend:1:conv:q/x" != str(ConversationName("q", "x~resend-1"))
    assert ResendName.parse("conv:q/x~resend-2") == ResendName("conv:q/x", 2)
    assert ResendName.parse("resend:0:c") is None and ResendName.parse("c") is None


def test_a_batch_of_a_redrive_matches_by_its_whole_name_in_either_form():
    fix, earlier = re.compile(BatchName.pattern("fix")), re.compile(BatchName.pattern("fix", earlier=True))
    assert all(fix.match(b) for b in ("fix/0", "fix/12")) and not any(fix.match(b) for b in ("fix-0", "fix-12"))
    assert all(earlier.match(b) for b in ("fix/0", "fix/12", "fix-0", "fix-12"))
    for pattern in (fix, earlier):
        assert not any(pattern.match(b) for b in ("fix-2/0", "fix-2-0", "fix--poison/0", "fix/parked", "fixed/0"))
    # This version's transmissions and cycles: of no redrive this version made.
    assert not re.match(BatchName.pattern("tx-orders"), "tx-orders-5")
    assert BatchName.parse("fix-2-0") == BatchName("fix-2", "0")
    assert BatchName.parse("inbound-3-1a2b3c4d") is None
    assert ActionName.parse("undo-fix") == ActionName("undo-fix")
    assert ActionName("fix").undo().legacy() == "undo-fix"
    assert ActionName("r").ramp_step(2).legacy() == "r-2"
    assert ActionName("e").edit_redrive().legacy() == "e-redrive"
    # What is committed is read under both names: an action an earlier version began completes.
    assert AppTransaction.action("p1").spellings() == ("poison_pipeline:action/p1", "poison_pipeline/p1")
    assert AppTransaction.redrive("q", "r1", legacy=True).name == "poison_pipeline/q/r1"


def test_undo_leaves_alone_a_transmission_s_batch_named_like_the_redrive(spark, make_declaration, tmp_path):
    """`tx-orders-5` is the batch of orders' sends delivered to target's inbound, not chunk 5 of a
    redrive an operator named tx-orders: its undo takes back only its own copies."""
    declaration = make_declaration({"orders": {"handler": FORWARD, "policy": FAST},
                                    "target": {"handler": RECORDING, "policy": POLICY}})
    failing = {"message_id": "own-1", "message_type": "refund", "body": {"fail": True, "log": str(tmp_path / "log")}}
    assert not enqueue(declaration, "target", [failing]).refused
    run_cycle(spark, declaration, "target", "inbound")
    assert ids_in(declaration, "poison", "target") == ["own-1"]
    send = {"message_id": "1001", "message_type": "t", "body": {"sends": [{"to": "target", "type": "t"}]}}
    assert not enqueue(declaration, "orders", [send]).refused
    run_cycle(spark, declaration, "orders", "inbound")
    sent = {r["message_id"]: r["batch_id"] for r in rows(declaration, "inbound", "target")}
    assert list(sent) == ["orders:1001/1"] and re.fullmatch(r"tx-orders-[0-9]+", sent["orders:1001/1"])
    assert redrive_table(declaration, "target", "poison", redrive_id="tx-orders").moved == 1
    assert undo_action(declaration, "tx-orders").restored == 1
    assert ids_in(declaration, "inbound", "target") == ["orders:1001/1"]
    assert ids_in(declaration, "poison", "target") == ["own-1"]


def test_a_dagster_runs_action_is_named_after_its_run_chain_and_by_nothing_an_operator_may_type() -> None:
    root = "4f1c2b9a-0d3e-4c55-9a61-2b7f0e8d9c10"
    name = ActionName.of_run("redrive", root)
    assert str(name) == f"redrive--run-{root}" and ActionName.parse(str(name)) == name
    # No earlier spelling: `redrive-<root>`, an earlier version's name for the run's redrive, is an
    # id an operator may type; neither it nor its undo or ramp steps are looked up for this action.
    assert name.spellings() == (f"redrive--run-{root}",)
    assert name.undo().spellings() == (f"redrive--run-{root}--undo",)
    assert name.ramp_step(1).spellings() == (f"redrive--run-{root}--step1",)
    assert name.is_run and not name.is_default
    # The product may give a request this id; an operator may not (above).
    assert RedriveRequest.model_validate({"queue": "q", "id": str(name)}, context=DERIVED_ID).id == str(name)
