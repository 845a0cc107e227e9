"""The held-out split, carved from the training shards: the study chooses on it, never on the test set.

With ``data = dict(carve=N)`` a study makes ``<study folder>/data/``: the training split's
shards but the last ``N`` as the training split, the last ``N`` as the held-out split
(``data.heldout``), and every other split (the test set) as it is, all symbolic links to
the original shards and their index files, with a ``dataset.json`` counting the new
splits. Trials then read ``data.root=<study folder>/data``. Nothing is copied; making it
again (every ``study run``) gives the same folder.
"""

from __future__ import annotations

import json
import os
import pathlib

from largebatch.errors import UserError


def carve(source: pathlib.Path, train_split: str, heldout: str, shards: int, out: pathlib.Path) -> dict[str, int]:
    """Link ``source``'s shards into ``out`` with the last ``shards`` training shards as ``heldout``.

    Returns:
        Records per split in ``out``.

    Raises:
        UserError: the source has too few training shards, or already a split named ``heldout``.
    """
    from largebatch.data.tfrecord import SHARD_NAME_PATTERN, count_records, index_path_for, list_shards, shard_name

    train = list_shards(source, train_split)
    if len(train) <= shards:
        raise UserError(
            f"carve={shards} would leave no training shard: {source} has {len(train)} {train_split!r} shard(s); "
            "carve fewer, or convert the data into more shards (largebatch data convert --shards)",
            key="data.carve",
        )
    others: dict[str, list[pathlib.Path]] = {}
    for path in sorted(source.iterdir()):
        match = SHARD_NAME_PATTERN.match(path.name)
        if match and path.is_file() and match.group("split") != train_split:
            others.setdefault(match.group("split"), []).append(path)
    if heldout in others:
        raise UserError(f"{source} already has a split {heldout!r}; set data.carve to None to use it", key="data.heldout")
    kept, held = train[:-shards], train[-shards:]
    layout = {shard_name(train_split, i, len(kept)): p for i, p in enumerate(kept)}
    layout.update({shard_name(heldout, i, len(held)): p for i, p in enumerate(held)})
    layout.update({p.name: p for paths in others.values() for p in paths})
    out.mkdir(parents=True, exist_ok=True)
    wanted = {out / name: target for name, target in layout.items()}
    wanted.update({index_path_for(out / name): index_path_for(target) for name, target in layout.items()})
    for stale in out.iterdir():
        if stale.is_symlink() and stale not in wanted and SHARD_NAME_PATTERN.match(stale.name.removesuffix(".idx")):
            stale.unlink(missing_ok=True)
    for link, real in wanted.items():
        _link(link, real.resolve())
    splits = [train_split, heldout, *others]
    counts = {split: count_records(out, split) for split in splits}
    meta_path = source / "dataset.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta["splits"] = {split: {"records": counts[split], "shards": sum(1 for n in layout if n.startswith(f"{split}-"))} for split in splits}
    meta["carved_from"] = f"{source.resolve()}: {heldout!r} is the last {shards} {train_split!r} shard(s)"
    _write(out / "dataset.json", json.dumps(meta, indent=2) + "\n")
    return counts


def _link(link: pathlib.Path, real: pathlib.Path) -> None:
    """``link`` -> ``real``, replaced atomically (workers on several machines may carve at once)."""
    if link.is_symlink() and os.readlink(link) == str(real):
        return
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    os.symlink(real, temporary)
    os.replace(temporary, link)


def _write(path: pathlib.Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)
