"""Credentials never leave: the one place that decides what of a declaration's secrets may be shown.

A storage option's value may be a credential (a key, a SAS token, a password in an endpoint's
userinfo), and delta-rs and object_store repeat what they were given in their errors: the URL of the
request that failed, with its userinfo and its query string (an Azure SAS token is one:
`?sv=...&sig=...`). Every error or log line that may carry a URL or a storage error's text goes
through `redact` before anyone sees it (the command line's errors, `StorageFailure`, the lease's
warnings), and a declaration's repr and its validation errors show its options through `masked`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

MASK = "***"

# Spark's own default `spark.redaction.regex`: the config keys whose values Spark hides in its UI
# and logs; a declaration's repr and its errors hide the same ones.
SECRET_KEY = re.compile(r"(?i)secret|password|token|access[.]?key")

# The storage options whose values are settings rather than credentials: a message may name them
# (the endpoint to check, the region, the account). Every other value is taken for a credential, so
# an option this list does not know is hidden rather than shown. A URL among them is still shown
# without its userinfo and query string (the rule for every URL below).
_SETTING_KEY = re.compile(r"(?i)(^|_)(endpoint|url|region|account_name|bucket|container|allow_http|"
                          r"allow_invalid_certificates|timeout|retries|retry|proxy_url|skip_signature|"
                          r"virtual_hosted_style_request|use_emulator|use_fabric_endpoint|use_azure_cli|"
                          r"conditional_put|copy_if_not_exists|locking_provider|table_name|profile|"
                          r"dynamo_lock_\w+)($|_)")
# Values too short or too plain to be a credential, and which masking would wreck a message with
# ("true", "0", "30s"): never taken for one.
_PLAIN_VALUE = re.compile(r"(?i).{0,3}|true|false|yes|no|on|off|\d+(\.\d+)?[a-z]{0,3}")

# A URL's userinfo (`scheme://user:password@host`) and its query string (`?sv=...&sig=...`, a
# presigned request's `X-Amz-Signature=...`): the first ends at the host, the second at the URL's end.
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s?#@'\"<>]*@")
_QUERY = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s?#'\"<>]*)\?[^\s#'\"<>]*")

# Every credential of every declaration this process has loaded: an error is raised far from the
# declaration whose options it repeats (deep in delta-rs, on a renewer thread), so the values are
# known process-wide. Each is hidden where it stands whole (not inside a longer word: a value that
# happens to be part of a path, `_delta_log`, leaves the path alone), longest first.
_known: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def is_secret(key: str, value: str) -> bool:
    """Whether a storage option's value is taken for a credential (and never shown)."""
    return not _SETTING_KEY.search(key) and not _PLAIN_VALUE.fullmatch(value.strip())


def remember(options: Mapping[str, str]) -> None:
    """Note the credentials among a declaration's storage options, for `redact` to hide."""
    global _pattern
    found = {value for key, value in options.items() if is_secret(str(key), str(value))}
    with _lock:
        if found - _known:
            _known.update(found)
            values = "|".join(re.escape(value) for value in sorted(_known, key=len, reverse=True))
            _pattern = re.compile(rf"(?<!\w)(?:{values})(?!\w)")


def redact(text: str) -> str:
    """`text` as it may be shown: every URL without its userinfo and query string, and every
    credential of the declarations loaded in this process replaced by MASK."""
    if _pattern is not None:
        text = _pattern.sub(MASK, text)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    return _QUERY.sub(rf"\1?{MASK}", text)


def masked(options: object) -> object:
    """Storage options as they may be shown: their keys, never their values (credentials)."""
    return {str(k): MASK for k in options} if isinstance(options, dict) else MASK


def redacted(config: object) -> object:
    """Spark settings as they may be shown: a value whose key names a credential replaced by MASK."""
    if not isinstance(config, dict):
        return config
    return {k: MASK if SECRET_KEY.search(str(k)) else v for k, v in config.items()}
