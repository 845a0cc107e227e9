"""Credentials stay in the process: redacted wherever a config is written or shown.

A config may carry credentials, in a hook's arguments most often. What a run writes and
shows of its config (``config.yaml``, the checkpoints, console lines, ``error:`` lines, the
trackers' parameters, tags, artifacts and W&B's record of the command line) and what a
study stores and prints is redacted; the run itself uses the real values.

**Credential names.** A name is a credential's when one of its parts, read in any case
and any joining (``snake_case``, ``kebab-case``, ``dotted.keys``, camelCase with acronyms:
``HFToken`` is ``hf`` + ``token``, ``xAPIKey`` is ``x`` + ``api`` + ``key``; digits split
too: ``password2``), is

* one of the words ``token``, ``password``, ``passwd``, ``pwd``, ``pass``, ``passphrase``,
  ``secret(s)``, ``credential(s)``, ``creds``, ``authorization``, ``bearer``, ``cookie(s)``;
* or ``api``, ``access``, ``private``, ``account`` or ``secret`` followed by ``key(s)``
  (``api_key``, ``AccountKey``, ``AWS_SECRET_ACCESS_KEY``);
* or a part that ends in one of the longer words, run together: ``dbpassword``,
  ``hftoken``, ``apikey``, ``accountkey``, ``sessioncookie`` (``pass``, ``pwd`` and
  ``key`` count only as whole parts, so ``bypass``, ``compass``, ``passes`` and
  ``keywords`` are ordinary).

A plural ``tokens`` is a count in a model (``max_tokens``, ``reg_tokens``,
``tokens_per_step``), not a credential; ``tokenizer`` is no credential either. No key of the
config schema, of the built-in hooks or of a study file is a credential's name (a test
lists them all).

**Values.** Redacted, as ``<redacted>``:

* every non-empty string under a credential's name, at any depth: a dict or a list under
  ``credentials``/``creds``/``secrets`` has each of its strings hidden. Numbers, booleans
  and None are left alone (timm's ``class_token=True`` is no secret; write a numeric
  password as a string, ``'123456'``, and it is one);
* in any other string (``redact_text``): the user-info of a URI
  (``https://user:token@host`` becomes ``https://<redacted>@host``); ``NAME=value`` wherever
  it stands, so a URI's query parameters and fragment (``?user=alice&password=...``,
  ``#access_token=...``), environment-style strings (``HF_TOKEN=...`` in a list) and
  connection strings (``...;AccountKey=...;``); ``NAME: value`` at the start of the text or
  of a line, after a bracket, comma or semicolon, or with ``NAME`` quoted (a header
  ``Authorization: Bearer ...``, ``{'password': '...'}`` in an error line); and the word
  after ``Bearer``. A value ``True``, ``False``, ``None`` or ``null`` is kept there too;
* a ``KEY=VALUE`` string (a ``--set`` override, a study's ``set`` entry) is read as
  ``--set`` reads it, its value as YAML redacted under ``KEY`` (``hooks=[{...}]`` has its
  hooks' credentials hidden), written back as JSON when something was hidden.

A command line is redacted the same way (``redact_argv``: every argument, and the value of
an ``--option=value``), so any abbreviation of ``--set`` argparse accepts is covered.

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

from largebatch.config.derive import Derived
from largebatch.config.frozen import ConfigSection

REDACTED = "<redacted>"

# a credential's name: its parts (below), one of which is a word, a word run together at
# its end, or a qualifier followed by "key"
_WORDS = {"token", "password", "passwd", "pwd", "pass", "passphrase", "secret", "secrets", "credential", "credentials", "creds"}
_WORDS |= {"authorization", "bearer", "cookie", "cookies"}
_RUN_TOGETHER = tuple(w for w in _WORDS if len(w) >= 5) + ("apikey", "accesskey", "privatekey", "accountkey", "secretkey")
_KEY_QUALIFIERS = {"api", "access", "private", "account", "secret"}
# the parts of a name: an acronym (HF in HFToken), a capitalised or lowercase word, a number
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# scheme://userinfo@ : the user-info ends at the last '@' before the path, query or fragment
_URI_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s]*@")
_NAME = r"[A-Za-z_][\w-]*"
_QUOTED = r"'[^'\n]*'|\"[^\"\n]*\""
# NAME=value anywhere: the value (not a bracket) ends at a space, '&', ';', ',', a quote or a closing bracket
_ASSIGNED = re.compile(rf"(?<![\w-])(?P<name>{_NAME})(?P<sep>[ \t]*=[ \t]*)(?P<value>{_QUOTED}|[^\s&;,'\"\(\)\[\]{{}}][^\s&;,'\"\)\]}}]*)")
# NAME: value where a key starts (the text's or a line's start, after a bracket, comma or
# semicolon), or with NAME quoted; an unquoted value runs to the line's end or the next ',;' or closing bracket
_COLON_VALUE = rf"(?P<sep>[ \t]*:[ \t]*)(?P<value>{_QUOTED}|[^\s,;'\"\)\]}}][^\n,;'\"\)\]}}]*)"
_LABELLED = re.compile(rf"(?:^|(?<=[\[{{(,;]))(?P<lead>[ \t]*(?:-[ \t]+)?)(?P<name>{_NAME}){_COLON_VALUE}", re.M)
_QUOTED_LABEL = re.compile(rf"(?P<lead>(?P<q>['\"]))(?P<name>{_NAME})(?P=q){_COLON_VALUE}")
_BEARER = re.compile(r"(?i)\b(?P<name>bearer)(?P<sep>[ \t]+)(?P<value>[^\s'\",;\)\]}]+)")
_KEPT = {"", "''", '""', "True", "False", "None", "null", REDACTED, f"'{REDACTED}'", f'"{REDACTED}"'}
# a whole KEY=VALUE string (a --set override): KEY a dotted path
_OVERRIDE = re.compile(r"\s*(?P<key>[A-Za-z_][\w.\-\[\]]*)=(?P<value>.*)\Z", re.S)


def secret_key(key: object) -> bool:
    """Whether ``key`` (a config key, a query parameter, a variable) names a credential
    (the rule is the module docstring's)."""
    if not isinstance(key, str):
        return False
    parts = [p.lower() for p in _PARTS.findall(key) if not p.isdigit()]
    for part, following in zip(parts, [*parts[1:], ""]):
        if part in _WORDS or part.endswith(_RUN_TOGETHER) or (part in _KEY_QUALIFIERS and following in ("key", "keys")):
            return True
    return False


def _hide(match: re.Match[str]) -> str:
    """A ``NAME<sep>value`` match with its value hidden when ``NAME`` names a credential."""
    value = match["value"].rstrip()
    if value in _KEPT or value.startswith(REDACTED) or not secret_key(match["name"]):
        return match[0]
    quote = value[0] if value[0] in "'\"" else ""
    start = match.start("value") - match.start()
    return match[0][:start] + f"{quote}{REDACTED}{quote}" + match[0][start + len(value) :]


def _redact_plain(text: str) -> str:
    """``text`` with URI user-info and named credentials hidden (the module docstring)."""
    text = _URI_USERINFO.sub(rf"\1{REDACTED}@", text)
    for pattern in (_ASSIGNED, _LABELLED, _QUOTED_LABEL, _BEARER):
        text = pattern.sub(_hide, text)
    return text


def redact_text(text: str) -> str:
    """``text`` (an error line, a string value, a command-line argument) with the
    credentials in it replaced by ``<redacted>`` (the module docstring's rule)."""
    override = _OVERRIDE.match(text)
    if override is None:
        return _redact_plain(text)
    key, raw = override["key"], override["value"]
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return _redact_plain(text)
    redacted = redact(value, re.split(r"[.\[\]]+", key.strip(".[]"))[-1])
    if redacted == value:
        return _redact_plain(text)
    return f"{key}={redacted if isinstance(redacted, str) else json.dumps(redacted, default=str)}"


def redact(value: Any, key: object = None) -> Any:
    """A copy of ``value`` (a typed config or section, a config dict, a list, a scalar) with
    credentials redacted, as plain values; ``key`` is the name ``value`` is stored under."""
    return _redact(value.to_dict() if isinstance(value, ConfigSection) else value, secret_key(key))


def config_record(config: ConfigSection, derived: Derived, **more_derived: Any) -> dict[str, Any]:
    """The config as a run writes and shows it (``config.yaml``, ``largebatch config show``,
    the trackers' parameters): plain values, redacted, with the derived numbers (and
    ``more_derived``) under ``derived``."""
    return redact({**config.to_dict(), "derived": {**derived.to_dict(), **more_derived}})


def _redact(value: Any, secret: bool) -> Any:
    """``redact``, ``secret`` when ``value`` lies under a credential's name."""
    if isinstance(value, Mapping):
        return {k: _redact(v, secret or secret_key(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(v, secret) for v in value)
    if isinstance(value, str):
        return REDACTED if value and secret else redact_text(value)
    return value


def redact_argv(argv: list[str]) -> list[str]:
    """A command line redacted: every argument as ``redact_text`` does (``KEY=VALUE``
    overrides under their keys, whatever option precedes them: ``--set``, ``--se``, ``--s``),
    and the value of each ``--option=value``."""
    out: list[str] = []
    for arg in argv:
        option, sep, value = arg.partition("=")
        if arg.startswith("-") and sep:
            out.append(f"{option}={redact_text(value)}")
        else:
            out.append(redact_text(arg))
    return out


def unresolved(config: Any, path: str = "") -> list[str]:
    """The dotted keys (``hooks[0].tracking_uri``) of a config (typed or plain) whose
    values hold ``<redacted>``."""
    if isinstance(config, ConfigSection):
        return unresolved(config.to_dict(), path)
    if isinstance(config, Mapping):
        return [found for k, v in config.items() for found in unresolved(v, f"{path}.{k}" if path else str(k))]
    if isinstance(config, (list, tuple)):
        return [found for i, v in enumerate(config) for found in unresolved(v, f"{path}[{i}]")]
    return [path] if isinstance(config, str) and REDACTED in config else []


def restore(saved: Any, source: Any, key: object = None, *, secret: bool = False) -> Any:
    """``saved`` (a redacted config) with each redacted value taken from ``source`` where
    ``source`` holds, at the same place, a value that redacts to it (``secret``: ``saved``
    lies under a credential's name)."""
    secret = secret or secret_key(key)
    if saved != source and _redact(source, secret) == saved:
        return source
    if isinstance(saved, Mapping) and isinstance(source, Mapping):
        return {k: restore(v, source[k], k, secret=secret) if k in source else v for k, v in saved.items()}
    if isinstance(saved, (list, tuple)) and isinstance(source, (list, tuple)) and len(saved) == len(source):
        return type(saved)(restore(a, b, secret=secret) for a, b in zip(saved, source))
    return saved
