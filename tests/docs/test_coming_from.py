"""docs/coming-from.md's Colossal-AI column says where each setting lives in Colossal-AI's
legacy examples, their config or their train script, and the constants it places in the
config are ones ``largebatch config import colossalai`` knows."""

from __future__ import annotations

import re

from largebatch.config.loader import CONSTANT_KEYS
from largebatch.importers.colossalai.reader import AmpType
from largebatch.importers.colossalai.vocabulary import UNMAPPED
from tests.docs.markdown import REPO

PAGE = REPO / "docs/coming-from.md"
COLUMN = "Colossal-AI legacy example: config or train script"
WHERE = ("config:", "train script:", "not offered", "data parallel", "the launch's")
# Rows whose setting the ViT examples make in the train script, not the config.
IN_THE_SCRIPT = ("`optimizer.type`", "`optimizer.lr`", "`lr_schedule.type`", "`lr_schedule.warmup_epochs`", "`model.name`")


def colossalai_cells() -> list[tuple[str, str]]:
    """(largebatch cell, Colossal-AI cell) of every table row that has the column."""
    rows, header = [], None
    for line in PAGE.read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if header is None:
            header = cells
        elif COLUMN in header and not set(line) <= set("|-: "):
            rows.append((cells[0], cells[header.index(COLUMN)]))
    return rows


def test_each_colossalai_cell_says_where_the_setting_lives():
    cells = colossalai_cells()
    assert len(cells) >= 30
    unplaced = [f"{key}: {cell}" for key, cell in cells if not cell.startswith(WHERE)]
    assert not unplaced, "say whether the example sets it in its config or its train script:\n" + "\n".join(unplaced)


def test_the_optimizer_schedule_and_model_are_the_train_script_s():
    cells = dict(colossalai_cells())
    for key in IN_THE_SCRIPT:
        cell = next(cell for row, cell in cells.items() if row.startswith(key))
        assert cell.startswith("train script:"), f"{key}: {cell}"


def test_the_constants_it_places_in_the_config_are_known_to_the_import():
    known = set(CONSTANT_KEYS) | set(UNMAPPED) | {mode.name for mode in AmpType}
    for key, cell in colossalai_cells():
        for part in re.findall(r"config:? ([^;]*)", cell):
            for name in re.findall(r"`([A-Z][A-Z_]+)`", part):
                assert name in known, f"{key}: {name} is placed in the config, but the import does not know it"
