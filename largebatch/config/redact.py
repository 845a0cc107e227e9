"""Credentials stay in the process: redacted wherever a config is written or shown.

A config may carry credentials, in a hook's arguments most often. What a run writes and
shows of its config (``config.yaml``, the checkpoints, console lines, the trackers'
parameters and artifacts) is redacted; the run itself uses the real values. Two kinds of
value are redacted, anywhere in the config:

* the user-info of a URI: ``https://user:token@host/path`` becomes
  ``https://<redacted>@host/path`` (in any string, so error lines too: ``redact_text``);
* the string value of a key whose name holds one of the words ``token``, ``password``,
  ``passwd``, ``secret`` or ``credential(s)``, or ``api_key``, ``access_key`` or
  ``private_key`` (in any case, ``_``/``-`` or camelCase: ``hf_token``, ``apiKey``,
  ``client_secret``, ``AWS_SECRET_ACCESS_KEY``) becomes ``<redacted>``. Numbers and
  booleans are left alone (timm's ``class_token=True`` is no secret). An error line that
  shows such a key's value (of a type the key does not take) shows it redacted too.

A command line is redacted the same way (``redact_argv``: each ``--set`` value under its
key), for the trackers that record it.

A redacted config is short of those values, so a run refuses to start from one (a run's
saved ``config.yaml``) unless the real value is given again: ``restore`` takes it from
the config file the command names when that file's value redacts to the saved one, and
``unresolved`` names what is still missing. The trackers take credentials from their own
environment variables (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``,
``WANDB_API_KEY``), which never reach a config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

REDACTED = "<redacted>"

# scheme://userinfo@ : the user-info ends at the last '@' before the path, query or fragment
_URI_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s]*@")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SECRET_WORDS = re.compile(r"(?:^|_)(?:token|password|passwd|secret|credentials?)(?:_|$)|(?:^|_)(?:api|access|private)_?key(?:_|$)")


def secret_key(key: object) -> bool:
    """Whether a config key names a credential (the module docstring's words)."""
    return isinstance(key, str) and bool(_SECRET_WORDS.search(_CAMEL.sub("_", key).replace("-", "_").lower()))


def redact_text(text: str) -> str:
    """``text`` with the user-info of every URI in it replaced by ``<redacted>``."""
    return _URI_USERINFO.sub(rf"\1{REDACTED}@", text)


def redact(value: Any, key: object = None) -> Any:
    """A copy of ``value`` (a config dict, a list, a scalar) with credentials redacted;
    ``key`` is the name ``value`` is stored under."""
    if isinstance(value, Mapping):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, key) for v in value)
    if isinstance(value, str):
        return REDACTED if value and secret_key(key) else redact_text(value)
    return value


def redact_override(override: str) -> str:
    """A ``--set key.path=value`` string redacted: its value read as YAML (as ``--set`` reads
    it) and redacted under its key, or its text's URIs when it does not parse."""
    key, sep, text = override.partition("=")
    if not sep:
        return redact_text(override)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return redact_text(override)
    redacted = redact(value, key.strip().rsplit(".", 1)[-1])
    if redacted == value:
        return redact_text(override)
    return f"{key}={redacted if isinstance(redacted, str) else json.dumps(redacted)}"


def redact_argv(argv: list[str]) -> list[str]:
    """A command line redacted: each ``--set`` value as ``redact_override`` does, URIs elsewhere."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == "--set":
            out.append(redact_override(arg))
        elif arg.startswith("--set="):
            out.append("--set=" + redact_override(arg.removeprefix("--set=")))
        else:
            out.append(redact_text(arg))
    return out


def unresolved(config: Any, path: str = "") -> list[str]:
    """The dotted keys (``hooks[0].tracking_uri``) whose values hold ``<redacted>``."""
    if isinstance(config, Mapping):
        return [found for k, v in config.items() for found in unresolved(v, f"{path}.{k}" if path else str(k))]
    if isinstance(config, (list, tuple)):
        return [found for i, v in enumerate(config) for found in unresolved(v, f"{path}[{i}]")]
    return [path] if isinstance(config, str) and REDACTED in config else []


def restore(saved: Any, source: Any, key: object = None) -> Any:
    """``saved`` (a redacted config) with each redacted value taken from ``source`` where
    ``source`` holds, at the same place, a value that redacts to it."""
    if isinstance(saved, Mapping) and isinstance(source, Mapping):
        return {k: restore(v, source[k], k) if k in source else v for k, v in saved.items()}
    if isinstance(saved, (list, tuple)) and isinstance(source, (list, tuple)) and len(saved) == len(source):
        return type(saved)(restore(a, b, key) for a, b in zip(saved, source))
    if isinstance(saved, str) and REDACTED in saved and redact(source, key) == saved:
        return source
    return saved
