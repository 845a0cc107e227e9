"""Where a study's trials live: an Optuna storage, opened once and checked before any trial.

* default: an SQLite file in the study's folder, ``sqlite:///<folder>/study.db``: nothing
  to start. Its transactions begin with ``BEGIN IMMEDIATE``, so claiming a waiting trial
  (read its state, then set it running) is one atomic step even for workers in several
  processes; Optuna's own SQLite setup reads outside a transaction, where two workers can
  both see a trial waiting and both run it.
* any SQLAlchemy URL Optuna's ``RDBStorage`` takes (``postgresql://...``,
  ``mysql+pymysql://...``): for many workers on many machines; the database's row locks
  make the claim atomic.
* ``journal:PATH``: Optuna's ``JournalStorage`` on an append-only file (its own file lock),
  for a shared filesystem without a database server. Its log order decides every claim.

A URL that cannot be opened (a missing driver, an unreachable server, a folder that does
not exist) is a ``UserError`` naming it.
"""

from __future__ import annotations

import pathlib
from typing import Any

from largebatch.errors import UserError

JOURNAL = "journal:"
SQLITE_TIMEOUT_SECONDS = 120  # how long a writer waits for another's transaction


def default_url(folder: pathlib.Path) -> str:
    return f"sqlite:///{folder.resolve() / 'study.db'}"


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url``.

    Raises:
        UserError: the URL cannot be opened (the message says why and what to check).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if url.startswith(JOURNAL):
            path = pathlib.Path(url[len(JOURNAL) :].removeprefix("//"))
            if not path.parent.is_dir():
                raise UserError(f"the folder of journal file {str(path)!r} does not exist; create it or fix the path", key="storage")
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            return optuna.storages.JournalStorage(backend)
        if url.startswith("sqlite:"):
            return _sqlite(url)
        storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        optuna.study.get_all_study_names(storage)  # reach the server now, not at the first trial
        return storage
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - drivers raise anything; the user's fix is the URL
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UserError(
            f"{url!r} cannot be opened: {detail}; give an SQLAlchemy URL Optuna's RDBStorage takes "
            "(sqlite:///PATH, postgresql://..., with its driver installed) or journal:PATH",
            key="storage",
        ) from exc


def _sqlite(url: str) -> Any:
    import optuna
    import sqlalchemy

    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path and path != ":memory:" and not pathlib.Path(path).parent.is_dir():
        raise UserError(f"the folder of SQLite file {path!r} does not exist; create it or fix the URL", key="storage")
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_SECONDS}})
    sqlalchemy.event.listen(storage.engine, "connect", _driver_autocommit)
    sqlalchemy.event.listen(storage.engine, "begin", _begin_immediate)
    storage.engine.dispose()  # connections made before the listeners: drop them
    return storage


def _driver_autocommit(dbapi_connection: Any, _record: Any) -> None:
    """sqlite3 begins no transactions of its own: SQLAlchemy's ``begin`` says how."""
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Any) -> None:
    """Take the write lock before the first read of a transaction."""
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def create_or_load(storage: Any, name: str) -> Any:
    """The Optuna study ``name`` in ``storage`` (made on first use; several workers may race to make it)."""
    import optuna

    try:
        return optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
    except optuna.exceptions.DuplicatedStudyError:  # another worker made it between the check and the insert
        return optuna.load_study(study_name=name, storage=storage)


def load_existing(storage: Any, name: str, url: str) -> Any:
    """The Optuna study ``name``, which must exist (``status`` and ``report`` start nothing).

    Raises:
        UserError: ``storage`` holds no study of that name.
    """
    import optuna

    names = optuna.study.get_all_study_names(storage)
    if name not in names:
        found = f"it holds {', '.join(names)}" if names else "it holds no study"
        raise UserError(f"{url!r} has no study {name!r} ({found}); run `largebatch study run` first", key="storage")
    return optuna.load_study(study_name=name, storage=storage)
