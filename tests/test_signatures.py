"""The recorded constructor signatures (largebatch/signatures.py) are the installed
classes' own, and are used only with the library version they were read from."""

from __future__ import annotations

import torch

from largebatch import record_signatures, signatures
from largebatch.config.arguments import Expected, RecordedFrom, read_signature
from largebatch.optim import optimizer_signature
from largebatch.optim.lamb import Lamb


def test_the_recorded_signatures_are_the_installed_classes():
    written = record_signatures.SIGNATURES_FILE.read_text()
    assert written == record_signatures.render_signatures(), (
        f"largebatch/signatures.py differs from the installed classes; run `{record_signatures.REGENERATE}`"
    )


def test_checking_a_recorded_value_imports_nothing_but_builtins():
    def classes(expected: Expected):
        yield expected.of
        for item in expected.items:
            yield from classes(item)

    recorded = [s for _, s in signatures.OPTIMIZERS.values()] + [signatures.VISION_TRANSFORMER]
    named = {of.partition(":")[0] for signature in recorded for p in signature.parameters for of in classes(p.expected) if of}
    assert named <= {"builtins", "collections.abc"}


def test_another_torch_version_reads_the_class(monkeypatch):
    assert optimizer_signature("adamw") is signatures.OPTIMIZERS["adamw"][1]
    monkeypatch.setattr(signatures, "OPTIMIZERS", {**signatures.OPTIMIZERS, "adamw": (RecordedFrom("torch", "0.0.1"), None)})
    assert optimizer_signature("adamw") == read_signature(torch.optim.AdamW)
    assert optimizer_signature("lamb") is signatures.OPTIMIZERS["lamb"][1] == read_signature(Lamb)
