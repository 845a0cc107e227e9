"""Writes ``largebatch/signatures.py``: the constructor signatures a config is checked
against that live behind torch or timm, read from the installed classes.

    python -m largebatch.record_signatures

Recorded: each ``optimizer.type``'s class (``largebatch.optim.optimizer_class``), and for
the ViT sizes of ``largebatch.vit`` the keywords their models take and
``VisionTransformer``'s signature (``largebatch.models.read_model_arguments``), each
with the library version it was read from. ``render_signatures`` gives the source; a
test compares it with the file, so a changed class or another torch or timm version
asks for this command.
"""

from __future__ import annotations

import json
import pathlib

from largebatch.config.arguments import ANY, Expected, RecordedFrom, Signature, installed_version, read_signature
from largebatch.config.schema import SCHEMA, Field, Section
from largebatch.models import read_model_arguments
from largebatch.optim import optimizer_class
from largebatch.vit import NAMED_SIZES

SIGNATURES_FILE = pathlib.Path(__file__).with_name("signatures.py")
REGENERATE = "python -m largebatch.record_signatures"


def _expected_source(expected: Expected) -> str:
    if expected == ANY:
        return "ANY"
    args = [json.dumps(expected.kind)]
    if expected.items:
        items = ", ".join(_expected_source(item) for item in expected.items)
        args.append(f"({items},)" if len(expected.items) == 1 else f"({items})")
    if expected.fixed:
        args.append("fixed=True")
    if expected.of:
        args.append(f"of={json.dumps(expected.of)}")
    return f"Expected({', '.join(args)})"


def _signature_source(signature: Signature, indent: str, opening: str = "", closing: str = ",") -> list[str]:
    lines = [f"{indent}{opening}Signature(", f"{indent}    {json.dumps(signature.owner)},", f"{indent}    ("]
    for p in signature.parameters:
        lines.append(
            f"{indent}        Parameter({json.dumps(p.name)}, {_expected_source(p.expected)}, {json.dumps(p.described)}, {json.dumps(p.default)}),"
        )
    return [*lines, f"{indent}    ),", f"{indent}){closing}"]


def _recorded_from(cls: type) -> RecordedFrom:
    library = cls.__module__.partition(".")[0]
    return RecordedFrom() if library == "largebatch" else RecordedFrom(library, installed_version(library))


def read_optimizers() -> dict[str, tuple[RecordedFrom, Signature]]:
    """Each ``optimizer.type``'s class signature, read from the class."""
    section = SCHEMA.fields["optimizer"]
    assert isinstance(section, Section) and isinstance(section.fields["type"], Field)
    read = {}
    for name in section.fields["type"].choices or ():
        cls = optimizer_class(name)
        signature = read_signature(cls)
        assert signature is not None, name
        read[name] = (_recorded_from(cls), signature)
    return read


def read_vision_transformer() -> tuple[RecordedFrom, tuple[str, ...], Signature]:
    """The keywords and the model class signature of every name in ``largebatch.vit.NAMED_SIZES``
    (one module's, so one answer), read from timm."""
    import timm

    answers = {read_model_arguments(timm, name) for name in NAMED_SIZES}
    if len(answers) != 1:
        raise AssertionError(f"the names of largebatch.vit.NAMED_SIZES come from more than one timm module: {sorted(NAMED_SIZES)}")
    keywords, signature = answers.pop()
    assert signature is not None
    return RecordedFrom("timm", installed_version("timm")), keywords, signature


def render_signatures() -> str:
    """The source of ``largebatch/signatures.py`` for the installed classes."""
    optimizers = read_optimizers()
    timm, keywords, vision_transformer = read_vision_transformer()
    libraries = {source.library: source for source, _ in optimizers.values() if source.library} | {"timm": timm}
    names = {source: library.upper() for library, source in libraries.items()} | {RecordedFrom(): "OURS"}
    lines = [
        '"""Signatures of the constructors a config hands values to that live behind torch or timm, so',
        "that checking a config imports neither. Generated from the installed classes by",
        f"``{REGENERATE}`` (a test fails when they differ); each is used only while",
        "its library is the version named here (``RecordedFrom.matches_installed``).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from largebatch.config.arguments import ANY, Expected, Parameter, RecordedFrom, Signature",
        "",
        "OURS = RecordedFrom()  # largebatch's own classes",
        *(
            f"{names[source]} = RecordedFrom({json.dumps(library)}, {json.dumps(source.version)})"
            for library, source in sorted(libraries.items())
        ),
        "",
        "# largebatch.optim.optimizer_class(name) for each optimizer.type",
        "OPTIMIZERS: dict[str, tuple[RecordedFrom, Signature]] = {",
    ]
    for name, (source, signature) in optimizers.items():
        lines += [f"    {json.dumps(name)}: (", f"        {names[source]},", *_signature_source(signature, " " * 8), "    ),"]
    lines += [
        "}",
        "",
        "# The model class of largebatch.vit.NAMED_SIZES (timm.models.vision_transformer), read from TIMM",
        *_signature_source(vision_transformer, "", opening="VISION_TRANSFORMER = ", closing=""),
        "# every keyword those models take: timm.create_model's and those of the module's model classes",
        "VISION_TRANSFORMER_KEYWORDS = (",
        *(f"    {json.dumps(keyword)}," for keyword in keywords),
        ")",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    SIGNATURES_FILE.write_text(render_signatures())
    print(f"wrote {SIGNATURES_FILE}")
