"""Strategies for the fuzz tests of what operators write: declarations (as data and as YAML) and the
`poison-pipeline` command's argument lists."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from poison_pipeline_tests.fuzz_support import unicode_text
from poison_pipeline_tests.support import HANDLER

BASE: dict[str, Any] = {
    "lake_root": "lake",
    "queues": {
        "q": {"handler": HANDLER, "policy": {"receive_retry_count": 1}},
        "r": {"handler": HANDLER, "sends_to": []},
    },
}
_POLICY = {
    "receive_retry_count": "int", "max_retry_cycles": "int", "retry_cycle_delay": "duration",
    "receive_error_handling": "enum", "time_to_live": "duration", "handler_timeout": "duration",
    "unrecoverable.exceptions": "exceptions", "unrecoverable.codes": "list", "unrecoverable.route": "enum",
    "ordering": "enum", "on_conversation_poison": "enum", "conversation_error_code": "int",
    "outage_threshold": "int", "outage_errors": "exceptions", "on_undefined_error": "enum",
    "dedup_window": "duration", "max_body_bytes": "int", "max_redrives": "int",
}
# Every field of a declaration, by path, and the kind of value it takes.
FIELDS: dict[str, str] = {
    "lake_root": "text", "storage_options": "map", "spark.master": "text", "spark.remote": "text",
    "spark.app_name": "text", "spark.config": "map", "alert_hook": "callable", "lease.wait": "duration",
    "lease.expiry": "duration", "small_cycles.max_messages": "int",
    "queues.q.handler": "callable", "queues.q.on_conversation_end": "callable", "queues.q.message_types": "list",
    "queues.q.sends_to": "list", "queues.q.retention": "retention", "queues.q.checks.poison_growth": "int",
    "queues.q.checks.dead_letter_growth": "int", "queues.q.checks.oldest_waiting": "duration",
    "queues.q.checks.oldest_waiting.error": "duration",
    **{f"queues.q.checks.{table}.{level}": "int" for table in ("poison", "dead_letter", "quarantine")
       for level in ("warn", "error")},
    **{f"queues.q.policy.{name}": kind for name, kind in _POLICY.items()},
    "queues.q.poison_queue.handler": "callable", "queues.q.poison_queue.receive_retry_count": "int",
    "queues.q.poison_queue.receive_error_handling": "enum", "queues.q.poison_queue.handler_timeout": "duration",
}
_DURATIONS = ["0", "90", "-5", "-5m", "500ms", "30s", "30m", "1h", "2d", "PT30M", "P1D", "PT0.5S", "PT", "P",
              " 30m ", "30M", "1 h", ".5s", "1e3s", "1e400d", "99999999999999999999d", "P99999999999D", "365001d",
              "nan", "inf", "-inf", "forever", "", 1e308, float("nan"), float("inf"), -1, 0, 10**30, 3.5]
_CALLABLES = [HANDLER, "poison_pipeline_tests.handlers:accept", "zz_no_such_module.sub:fn", "os:no_such_name",
              "poison_pipeline.domain.envelope:FIELDS", "ValueError", "print", "not a path", "a:b:c", ":x", "x:",
              "poison_pipeline_tests.handlers:scripted\n", "poison_pipeline_tests.recording_handlers:recording_batch"]
_EXCEPTIONS = ["ValueError", "ConnectionError", "poison_pipeline_tests.handlers:Unfixable", "print",
               "poison_pipeline_tests.handlers:accept", "zz_no_such_module:E", "NotAThing", "os:path"]
_ENUMS = ["fault", "drop", "reject", "move", "final_disposition", "quarantine", "none", "conversation",
          "retry_whole", "end_conversation", "resend", "dead_letter", "FAULT", "Move", "", "move "]
_QUEUE_NAMES = ["q2", "Q", "1q", "_q", "q-1", "q.1", "q\n", "q ", "", "é", "q" * 63, "q" * 64, "con", "q/../x",
                "inbound", "a b"]

wild = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 2**31, 2**63, 10**40])
    | st.floats() | st.text(unicode_text, max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(unicode_text, max_size=6), inner, max_size=3),
    max_leaves=5,
)


def values_for(kind: str) -> st.SearchStrategy[Any]:
    """Values a field of `kind` may be given: plausible ones, extreme ones, and anything at all."""
    typed = {
        "int": st.integers(-5, 2000) | st.sampled_from([2**31, 2**63, 10**30, -(10**30), 1.0, 2.5, "5", True]),
        "duration": st.sampled_from(_DURATIONS) | st.integers(-10**12, 10**12).map(str),
        "enum": st.sampled_from(_ENUMS),
        "callable": st.sampled_from(_CALLABLES) | st.none(),
        "exceptions": st.lists(st.sampled_from(_EXCEPTIONS), max_size=3),
        "list": st.lists(st.sampled_from(["q", "r", "t", "", 5, None, "zz"]), max_size=3) | st.none(),
        "map": st.dictionaries(st.text(unicode_text, max_size=6), wild, max_size=3),
        "retention": st.dictionaries(st.sampled_from(["poison", "dead_letter", "quarantine", "inbound", "x"]),
                                     st.sampled_from(_DURATIONS), max_size=3),
        "text": st.text(unicode_text, max_size=20) | st.sampled_from(["sc://host:15002", "local[*]", "s3://b/x"]),
    }[kind]
    return st.one_of(typed, typed, wild)


@dataclass(frozen=True)
class Mutation:
    path: str  # dotted, as the declaration error writes it
    value: Any  # REMOVED to delete the key


REMOVED = object()


def _put(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = data
    for part in parents:  # a section not there is made, a queue not there is not (it would lack a handler)
        if not isinstance(node.get(part), dict):
            if part in ("q", "r"):
                raise KeyError(part)
            node[part] = {}
        node = node[part]
    if value is REMOVED:
        node.pop(last, None)
    else:
        node[last] = value


@st.composite
def declarations(draw: st.DrawFn) -> tuple[dict[str, Any], list[Mutation]]:
    """The base declaration with one to three fields changed, an unknown key added, a required key
    removed or a queue renamed; and what was changed."""
    data = copy.deepcopy(BASE)
    mutations: list[Mutation] = []
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["field"] * 6 + ["unknown", "remove", "rename"]))
        if what == "field":
            path = draw(st.sampled_from(sorted(FIELDS)))
            mutation = Mutation(path, draw(values_for(FIELDS[path])))
        elif what == "unknown":
            parent = draw(st.sampled_from(["", "spark.", "lease.", "queues.q.", "queues.q.policy.",
                                           "queues.q.poison_queue.", "queues.q.checks.", "small_cycles."]))
            key = draw(st.text(st.characters(categories=("Ll", "Nd")) | st.just("_"), min_size=1, max_size=8))
            mutation = Mutation(parent + key, draw(wild))
        elif what == "remove":
            mutation = Mutation(draw(st.sampled_from(["lake_root", "queues", "queues.q.handler", "queues.r.handler"])),
                                REMOVED)
        else:
            name = draw(st.sampled_from(_QUEUE_NAMES) | st.text(unicode_text, min_size=1, max_size=8))
            queues = data.get("queues") if isinstance(data.get("queues"), dict) else None
            if queues is None or "q" not in queues or name in queues:
                continue
            queues[name] = queues.pop("q")
            mutations.append(Mutation(f"queues.{name}", "renamed"))
            continue
        try:
            _put(data, mutation.path, mutation.value)
        except (AttributeError, TypeError, KeyError):  # an earlier change removed or replaced a parent
            continue
        mutations.append(mutation)
    return data, mutations


# ------------------------------------------------------------------------------------------- argv

_ANY = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20)
# Real argv can hold bytes that are not UTF-8: Python gives them as lone surrogates (surrogateescape).
_ODD = st.sampled_from(["", "-", "--", "-1", "0", "1e400", "nan", "inf", "-inf", "99999999999999999999", "\udcff",
                        "caf\udce9", "../../etc/passwd", "--json", "-h", "q\n", " q", "'; drop", "2026-02-30",
                        "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00", "PT", "1e400d"])
_QUEUES = st.sampled_from(["q"] * 4 + ["r"] * 3 + ["nosuch", "Q", ""])
_TABLES = st.sampled_from(["poison", "dead_letter", "quarantine"] * 3 + ["inbound", "processed", "x"])
_TIMES = st.sampled_from(["2026-11-22T10:00Z", "2026-11-22", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00",
                          "tomorrow", "2026-13-40", "12"])
_AGES = st.sampled_from(["30d", "0", "-1", "1e400d", "99999999999999999999d", "PT1H", "nan", "inf", "365001d", "1h"])
_NUMBERS = st.sampled_from(["0", "1", "-5", "10", "99999999999999999999", "2147483648", "9223372036854775808",
                            "-9223372036854775809", "1.5", "x", "nan"])
_SELECTION = {"--group": st.sampled_from(["abcd1234", "zzzz", "", "abcd1234@1", "abcd1234@99999999999999999999999"]),
              "--as-of-version": _NUMBERS, "--error-type": _ANY, "--message-type": _ANY,
              "--conversation": _ANY, "--failed-after": _TIMES, "--failed-before": _TIMES,
              "--ids": st.sampled_from(["IDS", "/nonexistent/ids", "/", "BAD"]),
              "--where": st.sampled_from(["message_id = 'a'", "1 = 1", "no_such_column = 1", "message_id ==", ";",
                                          "message_id = 'a' OR 1=1; DROP TABLE x", "abort_count > 99999999999999999999",
                                          "'"])}
# Per command: its positional values and its options with the values they take (None: a flag).
COMMANDS: dict[str, tuple[list[st.SearchStrategy[str]], dict[str, st.SearchStrategy[str] | None]]] = {
    "enqueue": ([st.sampled_from(["IN", "/nonexistent.jsonl", "/", "BAD"])], {"--queue": _QUEUES}),
    "status": ([], {"--queue": _QUEUES, "--json": None}),
    "groups": ([], {"--queue": _QUEUES, "--table": _TABLES, "--json": None}),
    "inspect": ([_ANY | st.sampled_from(["m-0", "m-1", "m-2"])],
                {"--json": None, "--stack": None, "--as-of": _NUMBERS | _TIMES, "--table": _TABLES,
                 "--queue": _QUEUES}),
    "edit": ([_ANY | st.sampled_from(["m-1"])], {"--body-file": st.sampled_from(["BODY", "/nonexistent", "/"]),
                                                 "--header": _ANY | st.sampled_from(["k=v", "=v", "k", "k="]),
                                                 "--queue": _QUEUES, "--from": _TABLES, "--id": _ANY,
                                                 "--actor": _ANY, "--json": None}),
    "history": ([_ANY | st.sampled_from(["m-0", "m-1"])], {"--json": None}),
    "enable": ([_QUEUES], {"--reason": _ANY, "--actor": _ANY}),
    "redrive": ([_QUEUES], {"--from": _TABLES, "--to": _QUEUES, **_SELECTION, "--dry-run": None,
                            # Rates so slow the due times would overflow or pass the longest duration.
                            "--rate": _NUMBERS | st.sampled_from(["50/s", "0/s", "-1/s", "inf", "1e-300", "1e-12/s",
                                                                  "1e-9/s", "3.2e-11/s", "1e-10"]),
                            "--limit": _NUMBERS, "--id": _ANY, "--force": None, "--actor": _ANY, "--json": None,
                            "--ramp": st.sampled_from(["1,10,all", "1,99999999999999999999999", "1,9223372036854775808",
                                                       "0,1", "2,1", "all,1", ""]),
                            "--max-failures": _NUMBERS}),
    "purge": ([_QUEUES], {"--table": _TABLES, "--older-than": _AGES, **_SELECTION, "--yes": None, "--id": _ANY,
                          "--actor": _ANY, "--json": None}),
    "undo": ([_ANY | st.sampled_from(["redrive-x", "purge-x", "edit-x", "enable-x"])],
             {"--actor": _ANY, "--json": None}),
    "actions": ([], {"--queue": _QUEUES, "--json": None}),
    "end-conversation": ([_ANY | st.sampled_from(["c-1"])], {"--code": _NUMBERS, "--description": _ANY,
                                                             "--queue": _QUEUES, "--actor": _ANY, "--json": None}),
    "maintain": ([_QUEUES], {"--retention": _AGES, "--no-vacuum": None, "--json": None}),
}


def _mostly(values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The option's own values four times in five, an odd token otherwise."""
    return st.integers(0, 4).flatmap(lambda roll: _ODD if roll == 0 else values)


REQUIRED = {"enqueue": ["--queue"], "edit": ["--body-file"], "redrive": ["--from"],
            "purge": ["--table", "--older-than"],
            "end-conversation": ["--code", "--description"]}


@st.composite
def argv_lists(draw: st.DrawFn) -> list[str]:
    """An argument list for one command (CONFIG stands for the declaration file): its positionals and
    any of its options in any order, sometimes one dropped, one unknown, or a stray token."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    positionals, options = COMMANDS[command]
    groups = [[draw(_mostly(strategy))] for strategy in positionals]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=4, unique=True))
    if draw(st.integers(0, 4)):  # mostly with the options it requires, so that it runs
        chosen += [option for option in REQUIRED.get(command, []) if option not in chosen]
    for option in chosen:
        values = options[option]
        groups.append([option] if values is None else [option, draw(_mostly(values))])
    if draw(st.booleans()):  # options before, between or after the positionals
        groups = draw(st.permutations(groups))
    argv = [token for group in groups for token in group]
    roll = draw(st.integers(0, 9))
    if roll == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(_ODD | st.sampled_from(["--no-such-option", "--help"])))
    elif roll == 1 and argv:
        argv.pop(draw(st.integers(0, len(argv) - 1)))
    config = ["--config", draw(st.sampled_from(["CONFIG"] * 20 + ["/nonexistent.yaml", "BADCONFIG", "/"]))]
    return config + [command, *argv] if draw(st.booleans()) else [command, *argv, *config]
