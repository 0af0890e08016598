"""Secrets never leave (issue 43): whatever a store's error repeats of a declaration's storage
options (a password in an endpoint's userinfo, a SAS token in a URL's query string, a key) is hidden
in every error the command line prints, in a StorageFailure and in the lease's warnings, for every
kind of store error."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from deltalake.exceptions import DeltaError

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import operator_job_name, operator_op_name
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.domain.redaction import MASK, is_secret, redact, remember
from poison_pipeline.storage import lease
from poison_pipeline.storage.faults import StorageFailure, redacted_failures, store_problem, writing
from poison_pipeline_tests.dagster_support import failure_text
from poison_pipeline_tests.test_fuzz_envelopes import run_cli

PASSWORD = "redact-password-5e1b"
SIGNATURE = "redact-signature-0c9d"
# A credential in every option that can hold one; the endpoint's only in its userinfo.
OPTIONS = {
    "AWS_ACCESS_KEY_ID": "AKIAREDACTKEYID77",
    "AWS_SECRET_ACCESS_KEY": "redact-secret-access-key-41f2",
    "AWS_SESSION_TOKEN": "redact-session-token-93aa",
    "AZURE_STORAGE_ACCOUNT_KEY": "redact-account-key-2b7c",
    "AZURE_STORAGE_SAS_KEY": f"sv=2022-11-02&ss=b&sig={SIGNATURE}",
    "GOOGLE_SERVICE_ACCOUNT_KEY": '{"private_key": "redact-google-key-6d10"}',
    "AWS_ENDPOINT_URL": f"http://proxyuser:{PASSWORD}@127.0.0.1:9",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}
SECRETS = [PASSWORD, SIGNATURE, *(v for k, v in OPTIONS.items() if k not in ("AWS_ENDPOINT_URL", "AWS_REGION",
                                                                             "AWS_ALLOW_HTTP"))]
ENDPOINT = OPTIONS["AWS_ENDPOINT_URL"]
SAS_URL = f"https://acct.blob.core.windows.net/box/lake/q/_delta_log/_last_checkpoint?sv=2022-11-02&sig={SIGNATURE}"

# What delta-rs and object_store say, as they say it, for each kind of store error.
ERRORS = {
    "unreachable store": f"Generic S3 error: Error performing HEAD {ENDPOINT}/acme-queues/lake/q/_delta_log/"
                         "_last_checkpoint in 1.2s, after 10 retries, max_retries: 10, retry_timeout: 180s - "
                         "HTTP error: error sending request: tcp connect error: Connection refused (os error 111)",
    "access denied": f"Generic S3 error: Error performing GET {ENDPOINT}/acme-queues/lake/q/_delta_log/?list-type=2"
                     f"&X-Amz-Credential={OPTIONS['AWS_ACCESS_KEY_ID']} in 3ms - Server returned non-2xx status "
                     "code: 403 Forbidden: <Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>",
    "azure token refused": f"Generic MicrosoftAzure error: Error performing GET {SAS_URL} in 25ms - Server returned "
                           "non-2xx status code: 403 Forbidden: <Error><Code>AuthenticationFailed</Code></Error>",
    "raw library text": f"Generic DeltaTable error: Failed to read checkpoint at {SAS_URL} from "
                        f"http://user:{PASSWORD}@gateway:8080/x: key {OPTIONS['AWS_SECRET_ACCESS_KEY']} "
                        f"token {OPTIONS['AWS_SESSION_TOKEN']} account key {OPTIONS['AZURE_STORAGE_ACCOUNT_KEY']} "
                        f"sas {OPTIONS['AZURE_STORAGE_SAS_KEY']} google {OPTIONS['GOOGLE_SERVICE_ACCOUNT_KEY']}",
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "declaration.yaml"
    path.write_text(yaml.safe_dump({"lake_root": str(tmp_path / "lake"), "storage_options": OPTIONS,
                                    "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept"}}}))
    load_declaration(path)  # the options known, as any command's own loading makes them
    return path


def _leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_redact_hides_userinfo_query_strings_and_the_declarations_credentials(config: Path) -> None:
    text = " ".join(ERRORS.values())
    shown = redact(text)
    assert _leaked(shown) == []
    assert "http://***@127.0.0.1:9/acme-queues/lake" in shown  # the endpoint itself stays, to be checked
    assert "https://acct.blob.core.windows.net/box/lake/q/_delta_log/_last_checkpoint?***" in shown
    assert "us-east-1" not in SECRETS and MASK in shown
    # Settings are shown; values too plain to be a credential never mask a message's words.
    assert not is_secret("AWS_REGION", "us-east-1") and not is_secret("AWS_SKIP_SIGNATURE", "true")
    assert not is_secret("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1") and is_secret("token", "abcdef")
    assert redact("no URL, no secret: 0 true 30s") == "no URL, no secret: 0 true 30s"
    # A credential is hidden where it stands whole, never inside a longer word such as a path's.
    remember({"AWS_SECRET_ACCESS_KEY": "lakepart77"})
    assert redact("s3://b/lake/q_lakepart77/_delta_log 'lakepart77'") == "s3://b/lake/q_lakepart77/_delta_log '***'"
    assert not is_secret("DELTA_DYNAMO_TABLE_NAME", "delta_log")


@pytest.mark.parametrize("kind", list(ERRORS))
@pytest.mark.parametrize("command", [["status"], ["status", "--json"]])
def test_the_command_line_never_repeats_a_credential_for_any_store_error(
        config: Path, monkeypatch: pytest.MonkeyPatch, kind: str, command: list[str]) -> None:
    def failing(*_: object) -> None:
        raise DeltaError(ERRORS[kind])

    monkeypatch.setattr("poison_pipeline.cli.status.queue_status", failing)
    code, out, err = run_cli(["--config", str(config), *command])
    assert code == 1, (out, err)
    assert "error:" in err and "Traceback" not in err
    assert _leaked(out + err) == [], err


@pytest.mark.parametrize("kind", list(ERRORS))
def test_a_storage_failure_and_the_store_problem_never_repeat_a_credential(config: Path, kind: str) -> None:
    with pytest.raises(StorageFailure) as failed, writing("reading a table", "table inbound of queue 'q'"):
        raise OSError(ERRORS[kind])  # a fault whatever its words
    failure = failed.value
    assert _leaked(str(failure) + repr(failure) + failure.cause + str(failure.meaning("stopped"))) == []
    assert _leaked(store_problem(DeltaError(ERRORS[kind])) or "") == []


def test_the_lease_warnings_never_repeat_a_credential(config: Path, caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(lease.Lease, "acquire", lambda self, on_wait=None: None)

    def refused(self: lease.Lease) -> None:
        raise DeltaError(ERRORS["raw library text"])

    monkeypatch.setattr(lease.Lease, "release", refused)
    declaration = load_declaration(config)
    with lease.queue_lease(str(config.parent / "lake" / "q" / "_lease"), "q", dict(OPTIONS),
                           declaration.lease, "testing"):
        pass
    assert "could not release the lease" in caplog.text
    assert _leaked(caplog.text) == []


@pytest.mark.parametrize("kind", list(ERRORS))
def test_a_storage_error_leaves_for_dagster_without_the_library_errors_under_it(config: Path, kind: str) -> None:
    # Dagster records an error with its causes and context: neither may be delta-rs's own.
    for raised in (DeltaError(ERRORS[kind]), OSError(ERRORS[kind])):
        with pytest.raises(OSError) as failed, redacted_failures():
            raise raised
        assert failed.value.__cause__ is None and failed.value.__suppress_context__
        assert _leaked("".join(traceback.format_exception(failed.value))) == []
    with pytest.raises(StorageFailure) as worded, redacted_failures(), writing("reading", "table inbound"):
        raise OSError(ERRORS[kind])
    assert _leaked("".join(traceback.format_exception(worded.value))) == []


def test_a_dagster_run_on_an_unreachable_store_logs_no_credential(tmp_path: Path) -> None:
    config = tmp_path / "declaration.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "s3://redact-bucket/lake", "lease": {"wait": "1s"},
                                      "storage_options": {**OPTIONS, "AWS_REGION": "us-east-1", "max_retries": "0"},
                                      "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept"}}}))
    declaration = load_declaration(config)
    job = build_definitions(declaration).resolve_job_def(operator_job_name("q", "enable"))
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config={
            "ops": {operator_op_name("q", "enable"): {"config": {"reason": "back"}}}})
    assert not result.success
    text = failure_text(result)
    assert "127.0.0.1:9" in text, text  # the failure names the store
    assert _leaked(text) == [], text
