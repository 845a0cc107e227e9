"""A catalogue of user mistakes, each run through the real entry points in this process.

Every case must end the same way: exit status 2, exactly one ``error:`` line on stderr
that names what is wrong (the key, flag or file) and, where there is one, the fix; no
traceback; nothing trained (no weights, no checkpoint); a run directory that already
held something is left as it was, and none is left empty behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import textwrap

import numpy as np
import pytest
import simplejpeg
import torch

from largebatch import cli, train_command
from tests.conftest import tiny_config, write_config
from tests.data.conftest import header_claiming, noise_jpeg, rewrite_record, write_unique_label_shards
from tests.importers.colossalai import shapes

TRAIN = "train.py"  # train_main's argv; anything else goes to ``largebatch``'s main


pytestmark = pytest.mark.usefixtures("preemption_handlers_restored")


def invoke(argv: list[str]) -> int:
    try:
        if argv and argv[0] == TRAIN:
            return train_command.train_main(argv[1:])
        return cli.main(argv)
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 1


def snapshot(folder: pathlib.Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def config_with(tmp_path: pathlib.Path, **overrides) -> str:
    return str(write_config(tmp_path, tiny_config(**overrides)))


def native_config(tmp_path: pathlib.Path, splits=("train",), replace=None, data_overrides=None, **overrides) -> str:
    """The tiny model over real TFRecord shards (16 records a split, label = record + 1;
    ``replace``: some records' JPEG bytes; ``data_overrides``: other ``data`` keys)."""
    root = write_unique_label_shards(tmp_path / "shards", dict.fromkeys(splits, 16), dict.fromkeys(splits, 2), replace=replace)
    data = {
        "loader": "native",
        "root": str(root),
        "image_size": 16,
        "channels": 3,
        "num_classes": 17,
        "label_offset": 0,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "num_workers": 0,
        **(data_overrides or {}),
    }
    return str(write_config(tmp_path, tiny_config(data=data, global_batch_size=8, micro_batch_size=4, **overrides)))


# ----------------------------------------------------------------------------- the cases
# Each case: (id, a function of tmp_path returning (argv, run_dir), fragments of the line).


def train(config: str, run_dir: pathlib.Path, *extra: str) -> list[str]:
    return [TRAIN, "--config", config, "--run-dir", str(run_dir), *extra]


def hook_file(tmp_path: pathlib.Path, body: str) -> str:
    path = tmp_path / "my_hooks.py"
    path.write_text("from largebatch.engine.hook import Hook\n\n" + textwrap.dedent(body))
    return str(path)


def case_argparse(*argv: str):
    return lambda tmp_path: (list(argv), tmp_path / "run")


def case_set(*sets: str, **config):
    def make(tmp_path):
        extra = [item for s in sets for item in ("--set", s)]
        return train(config_with(tmp_path, **config), tmp_path / "run", *extra), tmp_path / "run"

    return make


def case_config(**overrides):
    def make(tmp_path):
        return train(config_with(tmp_path, **overrides), tmp_path / "run"), tmp_path / "run"

    return make


def case_hook(spec):
    def make(tmp_path):
        resolved = spec(tmp_path) if callable(spec) else spec
        return train(config_with(tmp_path, hooks=[resolved]), tmp_path / "run"), tmp_path / "run"

    return make


def case_file(text: str, name: str):
    def make(tmp_path):
        path = tmp_path / name
        path.write_text(text)
        return train(str(path), tmp_path / "run"), tmp_path / "run"

    return make


def run_dir_is_a_file(tmp_path):
    (tmp_path / "taken").write_text("keep me\n")
    return train(config_with(tmp_path), tmp_path / "taken"), tmp_path / "taken"


def run_dir_under_a_file(tmp_path):
    (tmp_path / "taken").write_text("keep me\n")
    return train(config_with(tmp_path), tmp_path / "taken" / "run"), tmp_path / "taken"


def run_dir_with_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-4.pt").write_bytes(b"an earlier run's state")
    (run_dir / "metrics.jsonl").write_text('{"step": 4}\n')
    return train(config_with(tmp_path), run_dir), run_dir


def run_dir_with_a_runs_files(tmp_path):
    """A finished run whose checkpoints were removed: nothing to resume, everything to lose."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("config.yaml", "metrics.jsonl", "model.safetensors"):
        (run_dir / name).write_text("an earlier run's\n")
    return train(config_with(tmp_path), run_dir), run_dir


def resume_from_nothing(tmp_path):
    return train(config_with(tmp_path), tmp_path / "run", "--resume", str(tmp_path / "no-such-checkpoint")), tmp_path / "run"


def branch_from_nothing(tmp_path):
    return train(config_with(tmp_path), tmp_path / "run", "--branch-from", str(tmp_path / "no-such-checkpoint")), tmp_path / "run"


def trained_run(tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """A finished one-epoch run with its checkpoint (the starting point of resume mistakes)."""
    config = config_with(tmp_path, **{"checkpoint.at_end": True})
    run_dir = tmp_path / "run"
    assert invoke(train(config, run_dir)) == 0
    return config, run_dir


def resume_garbage_checkpoint(tmp_path):
    config = config_with(tmp_path)
    (tmp_path / "step-9.pt").write_bytes(b"not a checkpoint at all" * 10)
    return train(config, tmp_path / "run", "--resume", str(tmp_path / "step-9.pt")), tmp_path / "run"


def resume_truncated_checkpoint(tmp_path):
    config, run_dir = trained_run(tmp_path)
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    copy = tmp_path / checkpoint.name
    copy.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    return train(config, run_dir, "--resume", str(copy)), run_dir


class RunsCode:
    """Pickles as a call of ``os.system``: an unrestricted load would run the command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def resume_checkpoint_carrying_a_callable(tmp_path):
    """A checkpoint file whose hook state is a pickled call of ``os.system`` (``touch``)."""
    config, run_dir = trained_run(tmp_path)
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    payload = torch.load(checkpoint, weights_only=True)
    payload["hooks"]["LossAccuracyHook"] = {"sums": RunsCode(f"touch {tmp_path / 'it-ran'}")}
    torch.save(payload, tmp_path / "step-9.pt")
    return train(config, run_dir, "--resume", str(tmp_path / "step-9.pt")), run_dir


def resume_checkpoint_without_its_run_record(tmp_path):
    """A checkpoint file without the non-finite check's state (as written before the check was part of every step)."""
    config, run_dir = trained_run(tmp_path)
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    payload = torch.load(checkpoint, weights_only=True)
    del payload["nan_guard"]
    torch.save(payload, tmp_path / "step-9.pt")
    return train(config, run_dir, "--resume", str(tmp_path / "step-9.pt")), run_dir


def trained_run_with_a_planted_base(tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """A finished run whose config.yaml names a ``_base_`` planted beside it (``touch``)."""
    config, run_dir = trained_run(tmp_path)
    (run_dir / "notes.py").write_text(f"import pathlib\n\npathlib.Path({str(tmp_path / 'it-ran')!r}).touch()\n")
    (run_dir / "config.yaml").write_text("_base_: notes.py\n" + (run_dir / "config.yaml").read_text())
    return config, run_dir


def resume_saved_config_naming_a_base(tmp_path):
    config, run_dir = trained_run_with_a_planted_base(tmp_path)
    return train(config, run_dir, "--resume", "auto", "--set", "max_steps=8"), run_dir


def export_saved_config_naming_a_base(tmp_path):
    _, run_dir = trained_run_with_a_planted_base(tmp_path)
    return ["export", str(run_dir), "--out", str(tmp_path / "out")], run_dir


def init_from_dcp_folder(change):
    """``model.init_from`` naming a sharded (DCP) checkpoint whose ``.metadata`` was changed."""

    def make(tmp_path):
        import pickle
        import warnings

        import torch.distributed.checkpoint as dcp

        folder = tmp_path / "step-00000002"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": {"head.weight": torch.ones(4, 32)}}, checkpoint_id=str(folder), no_dist=True)
        (tmp_path / "hostname").write_bytes((folder / "__0_0.distcp").read_bytes())  # readable, were it read
        metadata = pickle.loads((folder / ".metadata").read_bytes())
        change(metadata)
        (folder / ".metadata").write_bytes(pickle.dumps(metadata))
        return train(config_with(tmp_path, **{"model.init_from": str(folder)}), tmp_path / "run"), tmp_path / "run"

    return make


def reading_outside(metadata) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = "../hostname"


def claiming_2_to_the_40(metadata) -> None:
    metadata.state_dict_metadata["model.head.weight"].size = torch.Size([2**20, 2**20])


def resume_auto_newest_carrying_a_callable(tmp_path):
    """The same in the run's own folder, as its newest checkpoint: refused, not skipped for an older one."""
    config, run_dir = trained_run(tmp_path)
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    payload = torch.load(checkpoint, weights_only=True)
    payload["counters"] = RunsCode(f"touch {tmp_path / 'it-ran'}")
    torch.save(payload, run_dir / "checkpoints" / "step-99999999.pt")
    return train(config, run_dir, "--resume", "auto"), run_dir


def credential_hook(tmp_path) -> dict:
    path = hook_file(
        tmp_path,
        """
        class Notify(Hook):
            def __init__(self, url: str = "", api_key: str = ""):
                super().__init__()
                self.url, self.api_key = url, api_key
        """,
    )
    return {"type": f"{path}:Notify", "url": "https://alice:s3cr3t@hooks.example.com/x", "api_key": "sk-live-123"}


def resume_without_the_redacted_credential(tmp_path):
    """A run whose hook was given credentials, continued from its config.yaml alone."""
    config = config_with(tmp_path, hooks=[credential_hook(tmp_path)], **{"checkpoint.at_end": True, "max_steps": 2})
    run_dir = tmp_path / "run"
    assert invoke(train(config, run_dir)) == 0
    return [TRAIN, "--run-dir", str(run_dir), "--resume", "auto", "--set", "max_steps=4"], run_dir


def resume_with_another_model(tmp_path):
    config, run_dir = trained_run(tmp_path)
    return train(config, run_dir, "--resume", "auto", "--set", "model.embed_dim=64"), run_dir


def resume_other_model_ignoring_config(tmp_path):
    config, run_dir = trained_run(tmp_path)
    return train(config, run_dir, "--resume", "auto", "--resume-ignore-config", "--set", "model.embed_dim=64"), run_dir


def resume_other_optimizer_ignoring_config(tmp_path):
    config, run_dir = trained_run(tmp_path)
    return train(config, run_dir, "--resume", "auto", "--resume-ignore-config", "--set", "optimizer.type=lamb"), run_dir


def tracker_case(hook, **variables: str):
    """A run with this tracker hook, under these environment variables."""

    def make(tmp_path):
        spec = hook(tmp_path) if callable(hook) else hook
        return train(config_with(tmp_path, hooks=[spec]), tmp_path / "run"), tmp_path / "run"

    make.env = variables
    return make


def store_under_a_file(tmp_path: pathlib.Path) -> dict:
    (tmp_path / "taken").write_text("a file, not a folder\n")
    return {"type": "mlflow", "tracking_uri": f"sqlite:///{tmp_path}/taken/mlflow.db"}


def closed_port() -> int:
    from tests.conftest import free_port

    return free_port()  # bound and released: nothing listens there


def launcher_env(**variables: str):
    """A plain launch under these launcher variables (the test sets them, then restores)."""

    def make(tmp_path):
        return train(config_with(tmp_path), tmp_path / "run"), tmp_path / "run"

    make.env = variables
    return make


def native_labels_beyond_num_classes(tmp_path):
    return train(native_config(tmp_path, splits=("train", "validation")), tmp_path / "run", "--set", "data.num_classes=8"), tmp_path / "run"


def native_corrupt_record(tmp_path):
    config = native_config(tmp_path, splits=("train", "validation"))
    shard = next(p for p in sorted((tmp_path / "shards").glob("train-*")) if p.suffix != ".idx")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return train(config, tmp_path / "run"), tmp_path / "run"


def native_oversized_jpeg_header(tmp_path):
    """Record 3's header claims 20000 x 15000 pixels (its data holds 64 x 64)."""
    small = simplejpeg.encode_jpeg(np.full((64, 64, 3), 90, dtype=np.uint8))
    config = native_config(tmp_path, splits=("train", "validation"), replace={3: header_claiming(small, 15000, 20000)})
    return train(config, tmp_path / "run"), tmp_path / "run"


def native_cut_jpeg_decoded_on_the_device(tmp_path):
    """Record 3's JPEG is cut in half (its header parses); the device decodes it (the CPU standing in)."""
    whole = noise_jpeg(np.random.default_rng(3), 64, 64)
    cut = whole[: len(whole) * 3 // 4]
    config = native_config(tmp_path, splits=("train", "validation"), replace={3: cut}, data_overrides={"decode": "device"})
    return train(config, tmp_path / "run"), tmp_path / "run"


def first_train_shard(tmp_path: pathlib.Path) -> pathlib.Path:
    return next(p for p in sorted((tmp_path / "shards").glob("train-*")) if p.suffix != ".idx")


def native_record_with(features: dict):
    """Record 2 of the first training shard holds ``features`` as they are."""

    def make(tmp_path):
        config = native_config(tmp_path, splits=("train", "validation"))
        rewrite_record(first_train_shard(tmp_path), 2, features)
        return train(config, tmp_path / "run"), tmp_path / "run"

    return make


def native_index_holding(content: bytes | None = None, size: int | None = None):
    """The first training shard's index replaced by ``content``, or sparse, ``size`` bytes long."""

    def make(tmp_path):
        config = native_config(tmp_path, splits=("train", "validation"))
        index = first_train_shard(tmp_path).with_name(first_train_shard(tmp_path).name + ".idx")
        if content is not None:
            index.write_bytes(content)
        if size is not None:
            with open(index, "r+b") as handle:
                handle.truncate(size)
        return train(config, tmp_path / "run"), tmp_path / "run"

    return make


def index_of_a_record_claiming_2_62_bytes(tmp_path):
    """``data index`` of a shard whose record 1 claims 2^62 bytes under a valid length CRC."""
    import struct

    from largebatch.data.tfrecord import masked_crc

    native_config(tmp_path)
    shard = first_train_shard(tmp_path)
    data = bytearray(shard.read_bytes())
    (offset, _), *_ = [line.split() for line in shard.with_name(shard.name + ".idx").read_text().splitlines()[1:]]
    length = struct.pack("<Q", 1 << 62)
    data[int(offset) : int(offset) + 12] = length + struct.pack("<I", masked_crc(length))
    shard.write_bytes(bytes(data))
    return ["data", "index", str(shard)], tmp_path / "shards"


SAFETENSORS_HEADERS = {"oversized": (1 << 40).to_bytes(8, "little") + b"{}", "malformed": (10).to_bytes(8, "little") + b"{not json}"}


def init_from_file(content):
    def make(tmp_path):
        weights = tmp_path / "weights.safetensors"
        if callable(content):
            content(weights)
        else:
            weights.write_bytes(content)
        return train(config_with(tmp_path, **{"model.init_from": str(weights)}), tmp_path / "run"), tmp_path / "run"

    return make


def int8_weights(path: pathlib.Path) -> None:
    from safetensors.torch import save_file

    from tests.conftest import model_of

    model = model_of(tiny_config())
    save_file({k: v.to(torch.int8).contiguous() for k, v in model.state_dict().items()}, str(path))


def export_with_weights(header: bytes):
    def make(tmp_path):
        _, run_dir = trained_run(tmp_path)
        (run_dir / "model.safetensors").write_bytes(header)
        return ["export", str(run_dir), "--out", str(tmp_path / "out")], run_dir

    return make


def plot_of(line: str):
    def make(tmp_path):
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text(f'{{"step": 1, "loss": 2.0}}\n{line}\n{{"step": 2, "loss": 1.0}}\n')
        return ["plot", str(run_dir)], run_dir

    return make


def plot_with_report(report: str):
    """``plot RUN --critical-batch STUDY`` with ``report`` as the study's report.json."""

    def make(tmp_path):
        _, run_dir = plot_of('{"step": 2, "loss": 1.5}')(tmp_path)
        (tmp_path / "study").mkdir()
        (tmp_path / "study" / "report.json").write_text(report)
        return ["plot", str(run_dir), "--critical-batch", str(tmp_path / "study")], run_dir

    return make


def native_root_missing(tmp_path):
    config = native_config(tmp_path)
    return train(config, tmp_path / "run", "--set", f"data.root={tmp_path / 'nowhere'}"), tmp_path / "run"


def native_eval_split_missing(tmp_path):
    return train(native_config(tmp_path), tmp_path / "run"), tmp_path / "run"


def raising_hook(tmp_path):
    path = hook_file(
        tmp_path,
        """
        class NeedsAGpu(Hook):
            def __init__(self):
                super().__init__()
                raise RuntimeError("no CUDA device visible")
        """,
    )
    return {"type": f"{path}:NeedsAGpu"}


def hook_with_typed_argument(tmp_path):
    path = hook_file(
        tmp_path,
        """
        class Every(Hook):
            def __init__(self, every: int = 10):
                super().__init__()
                self.every = every
        """,
    )
    return {"type": f"{path}:Every", "every": "often"}


def colossalai_config(tmp_path):
    config, _ = shapes.data_parallel(tmp_path)
    return train(str(config), tmp_path / "run"), tmp_path / "run"


def python_config_with(tmp_path, text: str, drop: str | None = None):
    """The tiny config as a Python file, ``text`` before it, the key ``drop`` left out."""
    cfg = tiny_config()
    cfg.pop(drop, None)
    path = tmp_path / "config.py"
    path.write_text(text + "".join(f"{key} = {value!r}\n" for key, value in cfg.items()))
    return train(str(path), tmp_path / "run"), tmp_path / "run"


def importing(*extra: str, script: bool = True, hybrid: bool = False):
    """``largebatch config import colossalai`` on an example-shaped config (and its train script)."""

    def make(tmp_path):
        config, train_script = (shapes.hybrid_parallel if hybrid else shapes.data_parallel)(tmp_path)
        argv = ["config", "import", "colossalai", str(config), *(["--train-script", str(train_script)] if script else []), *extra]
        return argv, tmp_path / "out"

    return make


def import_over_an_existing_file(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.py").write_text("keep me\n")
    argv, _ = importing("--world-size", "8", "--out", str(tmp_path / "out" / "mine.py"))(tmp_path)
    return argv, tmp_path / "out"


def study_case(*extra: str, **changes):
    """``largebatch study run`` on the tests' tiny study with ``changes`` to its file; nothing
    may train (its trials would land in ``trials/``)."""

    def make(tmp_path):
        from tests.study.helpers import write_study

        return ["study", "run", str(write_study(tmp_path, **changes)), *extra], tmp_path / "trials"

    return make


def study_with_another_thread_count(tmp_path):
    """A study whose storage recorded 3 threads per trial, resumed with 1."""
    from largebatch.study import checks, storage
    from largebatch.study.spec import load_study
    from tests.study.helpers import write_study

    spec = load_study(write_study(tmp_path))
    url = storage.default_url(spec.folder)
    checks.bind(spec, storage.create_or_load(storage.open_storage(url), spec.name), url, 3)
    return ["study", "run", str(spec.path), "--threads", "1"], tmp_path / "trials"


CASES = [
    # the command line
    ("flag-misspelt", case_argparse(TRAIN, "--config", "x.py", "--resum", "auto"), ["--resum", "did you mean --resume?"]),
    ("flag-misspelt-config", case_argparse(TRAIN, "--confg", "x.py"), ["--confg", "did you mean --config?"]),
    ("config-flag-missing", case_argparse(TRAIN), ["--config", "required"]),
    ("command-misspelt", case_argparse("trian"), ["trian", "did you mean 'train'?"]),
    ("subcommand-misspelt", case_argparse("config", "shw"), ["shw", "did you mean 'show'?"]),
    ("config-keys-unknown-prefix", case_argparse("config", "keys", "optimzer"), ["optimzer", "did you mean 'optimizer'?"]),
    ("flag-needs-a-value", case_argparse(TRAIN, "--config"), ["--config", "expected one argument"]),
    # the config file
    ("config-file-missing", lambda t: (train(str(t / "nope.py"), t / "run"), t / "run"), ["nope.py", "config file not found"]),
    ("config-py-syntax", case_file("epochs = (\n", "bad.py"), ["bad.py"]),
    ("config-py-raises", case_file("raise RuntimeError('half-written')\n", "raises.py"), ["raises.py", "half-written"]),
    ("config-yaml-syntax", case_file("epochs: [1,\n", "bad.yaml"), ["bad.yaml"]),
    ("config-yaml-not-a-mapping", case_file("- 1\n- 2\n", "list.yaml"), ["list.yaml"]),
    ("config-extension", case_file("epochs: 1\n", "config.txt"), ["config.txt"]),
    # a Colossal-AI config where a largebatch config belongs, and its import
    ("colossalai-config-to-train-py", colossalai_config, ["config.py", "imports colossalai", "largebatch config import colossalai"]),
    (
        "colossalai-keys-without-the-import",
        case_file("BATCH_SIZE = 256\nNUM_EPOCHS = 300\nfp16 = dict(mode='torch')\ngradient_accumulation = 16\n", "colossal.py"),
        ["colossal.py", "looks like a Colossal-AI config", "BATCH_SIZE, NUM_EPOCHS", "largebatch config import colossalai"],
    ),
    (
        "uppercase-name-ignored",
        lambda t: python_config_with(t, "NUM_EPOCHS = 3\n", drop="epochs"),
        ["NUM_EPOCHS is upper-case", "NUM_EPOCHS -> epochs"],
    ),
    ("import-source-misspelt", case_argparse("config", "import", "colossal", "x.py"), ["colossal", "did you mean 'colossalai'?"]),
    ("import-config-missing", case_argparse("config", "import", "colossalai", "nope.py"), ["nope.py", "does not exist"]),
    ("import-world-size-word", importing("--world-size", "eight"), ["--world-size", "eight"]),
    ("import-needs-world-size", importing(), ["config.py", "give --world-size N"]),
    ("import-world-size-indivisible", importing("--world-size", "6", hybrid=True), ["--world-size", "tensor 2 x pipeline 2"]),
    (
        "import-train-script-missing",
        importing("--train-script", "nope.py", "--world-size", "8", script=False),
        ["nope.py", "does not exist"],
    ),
    ("import-without-the-model", importing("--world-size", "8", script=False), ["model.name", "--train-script"]),
    ("import-set-invalid", importing("--world-size", "8", "--set", "optimizer.lr=-1"), ["optimizer.lr", "must be > 0"]),
    ("import-out-exists", import_over_an_existing_file, ["--out", "mine.py", "--force"]),
    # --set
    ("set-unclosed-list", case_set("optimizer.betas=[0.9, 0.99"), ["optimizer.betas", "not valid YAML"]),
    ("set-without-equals", case_set("optimizer.lr"), ["--set", "key.path=value"]),
    ("set-word-for-number", case_set("optimizer.eps=tiny"), ["optimizer.eps", "expected a number", "'tiny'"]),
    ("set-number-for-list", case_set("optimizer.betas=0.9"), ["optimizer.betas", "expected a list"]),
    ("set-list-too-long", case_set("optimizer.betas=[0.9, 0.99, 0.999]"), ["optimizer.betas", "a list of 2"]),
    ("set-model-word", case_set("model.drop_rate=high"), ["model.drop_rate", "expected a number"]),
    ("set-model-fraction-for-int", case_set("model.depth=2.5"), ["model.depth", "expected an integer"]),
    ("set-heads-do-not-divide-width", case_set("model.num_heads=3"), ["model", "num_heads=3", "dim should be divisible by num_heads"]),
    ("set-patch-zero", case_set("model.patch_size=0"), ["model", "patch_size=0", "ZeroDivisionError"]),
    ("set-depth-negative", case_set("model.depth=-1"), ["model", "depth=-1", "non-negative"]),
    ("set-unknown-key", case_set("optimizer.lrr=0.1"), ["optimizer.lrr", "did you mean 'optimizer.lr'"]),
    ("set-optimizer-type", case_set("optimizer.type=lamm"), ["optimizer.type", "lamm"]),
    ("set-argument-not-taken", case_set("optimizer.momentum=0.9"), ["optimizer.momentum", "adamw does not take"]),
    ("set-negative-lr", case_set("optimizer.lr=-1"), ["optimizer.lr", "must be > 0"]),
    ("set-lars-eta-word", case_set("optimizer.type=lars", "optimizer.eta=big"), ["optimizer.eta", "expected a number"]),
    # values in the config
    ("epochs-word", case_config(epochs="three"), ["epochs", "expected an integer"]),
    ("mixup-negative", case_config(**{"mixup.mixup_alpha": -1.0}), ["mixup.mixup_alpha", "must be >= 0"]),
    ("batch-not-divisible", case_config(global_batch_size=30), ["global_batch_size 30", "set global_batch_size to 24 or 32"]),
    ("warmup-too-long", case_config(**{"lr_schedule.warmup_steps": 50}), ["lr_schedule.warmup_steps", "warmup is 50 steps"]),
    # the batch schedule (tiny config: global batch 32, micro-batch 8, one process)
    (
        "batch-ramp-not-doubling",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 12, "ramp_samples": 64}),
        ["batch_schedule.start_batch_size", "does not reach global_batch_size 32", "e.g. 8 or 16"],
    ),
    (
        "batch-ramp-increment",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 8, "ramp_samples": 64, "increment": 5}),
        ["batch_schedule.increment", "a divisor of 24, e.g. 4"],
    ),
    (
        "batch-ramp-not-a-micro-batch-multiple",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 12, "ramp_samples": 64, "increment": 4}),
        ["batch_schedule.start_batch_size", "micro_batch_size 8 x world_size 1", "set it to 8 or 16"],
    ),
    (
        "batch-ramp-samples-missing",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 8}),
        ["batch_schedule.ramp_samples", "is required"],
    ),
    (
        "batch-ramp-start-too-large",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 64, "ramp_samples": 64}),
        ["batch_schedule.start_batch_size", "not below global_batch_size 32"],
    ),
    (
        "batch-key-of-another-type",
        case_config(batch_schedule={"type": "fixed", "ramp_samples": 64}),
        ["batch_schedule.ramp_samples", "set type to 'ramp'"],
    ),
    (
        "batch-start-required",
        case_config(batch_schedule={"type": "adaptive"}),
        ["batch_schedule.start_batch_size", "is required with type 'adaptive'"],
    ),
    (
        "batch-adaptive-no-room",
        case_config(hooks=["noise_scale"], batch_schedule={"type": "adaptive", "start_batch_size": 32}),
        ["batch_schedule.start_batch_size", "no room to grow"],
    ),
    (
        "batch-adaptive-max-not-doubling",
        case_config(hooks=["noise_scale"], batch_schedule={"type": "adaptive", "start_batch_size": 16, "max_batch_size": 48}),
        ["batch_schedule.max_batch_size", "does not reach max_batch_size 48", "e.g. 32 or 64"],
    ),
    (
        "batch-adaptive-without-the-hook",
        case_config(batch_schedule={"type": "adaptive", "start_batch_size": 16}),
        ["batch_schedule.criterion", 'add "noise_scale" to hooks'],
    ),
    (
        "batch-adaptive-start-accumulation-one",
        case_config(hooks=["noise_scale"], batch_schedule={"type": "adaptive", "start_batch_size": 8}),
        ["noise_scale hook", "batch_schedule.start_batch_size 8", "drop the hook"],
    ),
    (
        "batch-branch-samples-missing",
        case_config(batch_schedule={"type": "adaptive", "start_batch_size": 8, "criterion": "branch"}),
        ["batch_schedule.branch_samples", "is required with criterion 'branch'"],
    ),
    (
        "batch-branch-samples-not-a-step",
        case_config(batch_schedule={"type": "adaptive", "start_batch_size": 8, "criterion": "branch", "branch_samples": 48}),
        ["batch_schedule.branch_samples", "set it to a multiple of 32, e.g. 32"],
    ),
    (
        "batch-branch-no-heldout-samples",
        case_config(
            **{"data.eval_samples": 0},
            batch_schedule={"type": "adaptive", "start_batch_size": 8, "criterion": "branch", "branch_samples": 32},
        ),
        ["criterion 'branch'", "has no samples", "use criterion 'noise_scale'"],
    ),
    (
        "batch-adascale-without-the-hook",
        case_config(batch_schedule={"type": "ramp", "start_batch_size": 16, "ramp_samples": 64, "lr_scaling": "adascale"}),
        ["batch_schedule.lr_scaling", 'add "noise_scale" to hooks'],
    ),
    (
        "batch-wd-timescale-not-adamw",
        case_config(**{"optimizer.type": "sgd", "batch_schedule.keep_wd_timescale": True}),
        ["batch_schedule.keep_wd_timescale", "optimizer.type is 'sgd'"],
    ),
    (
        "batch-lr-rule",
        case_config(**{"batch_schedule.lr_scaling": "square"}),
        ["batch_schedule.lr_scaling", "allowed: 'sqrt', 'linear', 'none'"],
    ),
    ("model-name-misspelt", case_config(**{"model.name": "vit_tiny_patch16_22"}), ["model.name", "did you mean"]),
    ("model-argument-misspelt", case_config(**{"model.drop_rte": 0.1}), ["model.drop_rte", "did you mean 'model.drop_rate'"]),
    ("precision-unknown", case_config(precision="fp8"), ["precision", "fp8"]),
    ("device-unknown", case_config(device="tpu"), ["device", "tpu"]),
    ("compile-mode-misspelt", case_config(**{"cuda.compile_mode": "max_autotune"}), ["cuda.compile_mode", "did you mean 'max-autotune'"]),
    ("loader-unknown", case_config(**{"data.loader": "webdataset"}), ["data.loader", "webdataset"]),
    ("image-size-word", case_config(**{"data.image_size": "large"}), ["data.image_size", "expected an integer"]),
    ("seed-negative", case_config(seed=-1), ["seed", ">= 0"]),
    ("top-level-misspelt", case_config(epoch=2), ["epoch", "did you mean 'epochs'"]),
    ("section-not-a-dict", case_config(optimizer="lamb"), ["optimizer"]),
    # hooks
    ("hook-name-misspelt", case_hook("loggr"), ["hooks[0]", "did you mean 'logger'"]),
    ("hook-file-missing", case_hook({"type": "hooks/nowhere.py:Thing"}), ["hooks[0]", "hooks/nowhere.py"]),
    ("hook-unknown-argument", case_hook({"type": "logger", "colour": "red"}), ["hooks[0]", "colour"]),
    ("hook-priority", case_hook({"type": "logger", "priority": 500}), ["hooks[0].priority", "outside 0..100"]),
    ("hook-argument-type", case_hook({"type": "logger", "console": "maybe"}), ["hooks[0].console", "expected a boolean"]),
    ("hook-constructor-raises", case_hook(raising_hook), ["hooks[0]", "NeedsAGpu", "RuntimeError", "no CUDA device visible"]),
    ("custom-hook-argument-type", case_hook(hook_with_typed_argument), ["hooks[0].every", "expected an integer", "'often'"]),
    ("hook-checkpoint-keep-negative", case_hook({"type": "checkpoint", "keep": -1}), ["hooks[0].keep", "got -1; must be >= 1"]),
    ("hook-eval-interval-zero", case_hook({"type": "eval", "interval_steps": 0}), ["hooks[0].interval_steps", "must be >= 1"]),
    ("noise-scale-without-accumulation", case_set("global_batch_size=8", "hooks=[noise_scale]"), ["noise_scale", "accumulation"]),
    # the run directory and resuming
    ("run-dir-is-a-file", run_dir_is_a_file, ["--run-dir names a file", "taken"]),
    ("run-dir-under-a-file", run_dir_under_a_file, ["inside a file", "taken"]),
    ("run-dir-holds-checkpoints", run_dir_with_checkpoints, ["step-4.pt", "--resume auto"]),
    ("run-dir-holds-a-runs-files", run_dir_with_a_runs_files, ["config.yaml, metrics.jsonl, model.safetensors", "another --run-dir"]),
    ("resume-from-nothing", resume_from_nothing, ["no-such-checkpoint"]),
    ("resume-saved-config-names-a-base", resume_saved_config_naming_a_base, ["config.yaml", "_base_ 'notes.py'", "--trust-checkpoint"]),
    ("export-saved-config-names-a-base", export_saved_config_naming_a_base, ["config.yaml", "_base_ 'notes.py'", "remove the _base_"]),
    (
        "init-from-dcp-reading-outside",
        init_from_dcp_folder(reading_outside),
        ["step-00000002", "'../hostname'", "not a file of its folder"],
    ),
    (
        "init-from-dcp-claiming-2-to-the-40",
        init_from_dcp_folder(claiming_2_to_the_40),
        ["step-00000002", "model.head.weight", "[1048576, 1048576]", "more than its data files hold"],
    ),
    ("branch-from-nothing", branch_from_nothing, ["--branch-from", "no-such-checkpoint", "checkpoint not found"]),
    ("resume-garbage-file", resume_garbage_checkpoint, ["step-9.pt"]),
    ("resume-truncated-file", resume_truncated_checkpoint, ["step-"]),
    ("resume-without-run-record", resume_checkpoint_without_its_run_record, ["step-9.pt", "has no nan_guard", "model.init_from"]),
    ("resume-changed-model", resume_with_another_model, ["model.embed_dim", "--resume-ignore-config"]),
    ("resume-other-model-ignoring-config", resume_other_model_ignoring_config, ["step-"]),
    ("resume-other-optimizer-ignoring-config", resume_other_optimizer_ignoring_config, ["adamw's state", "lamb"]),
    ("resume-checkpoint-carrying-a-callable", resume_checkpoint_carrying_a_callable, ["step-9.pt", "posix.system", "--trust-checkpoint"]),
    ("resume-auto-newest-carrying-a-callable", resume_auto_newest_carrying_a_callable, ["step-99999999.pt", "--trust-checkpoint"]),
    (
        "resume-without-the-redacted-credential",
        resume_without_the_redacted_credential,
        ["config.yaml", "hooks[0].url, hooks[0].api_key", "'<redacted>'", "--config", "MLFLOW_TRACKING_USERNAME"],
    ),
    # trackers that cannot start: one line before the first step
    (
        "mlflow-server-unreachable",
        tracker_case(lambda t: {"type": "mlflow", "tracking_uri": f"http://127.0.0.1:{closed_port()}"}),
        ["the mlflow hook cannot start", "tracking_uri", "server is up"],
    ),
    ("mlflow-store-unopenable", tracker_case(store_under_a_file), ["the mlflow hook cannot start", "taken"]),
    (
        "wandb-online-without-credentials",
        tracker_case({"type": "wandb", "mode": "online", "project": "p"}, HOME="/nonexistent-home", WANDB_API_KEY="", WANDB_MODE="online"),
        ["the wandb hook cannot start", "API key", "WANDB_API_KEY", "mode='offline'"],
    ),
    # the launch environment
    ("rank-outside-world", launcher_env(RANK="3", WORLD_SIZE="2", LOCAL_RANK="0"), ["RANK=3", "outside 0..1"]),
    ("world-size-not-a-number", launcher_env(RANK="0", WORLD_SIZE="two", LOCAL_RANK="0"), ["WORLD_SIZE", "not integers"]),
    ("torchrun-variables-half-set", launcher_env(RANK="0", WORLD_SIZE="2"), ["LOCAL_RANK", "torchrun"]),
    ("slurm-rank-outside", launcher_env(SLURM_PROCID="4", SLURM_NTASKS="4", SLURM_LOCALID="0"), ["SLURM_PROCID=4"]),
    # data
    ("data-root-missing", native_root_missing, ["nowhere"]),
    ("eval-split-missing", native_eval_split_missing, ["validation"]),
    ("labels-beyond-num-classes", native_labels_beyond_num_classes, ["data.num_classes"]),
    ("corrupt-record", native_corrupt_record, ["train-", "record", "offset"]),
    ("oversized-jpeg-header", native_oversized_jpeg_header, ["train-", "record", "offset", "20000x15000 pixels", "data.max_pixels"]),
    ("jpeg-cut-decoded-on-the-device", native_cut_jpeg_decoded_on_the_device, ["train-", "record", "offset", "JPEG does not decode"]),
    (
        "decode-device-with-dali",
        case_config(**{"data.loader": "dali", "data.root": "shards", "data.decode": "device"}),
        ["data.decode", "data.loader='native' only", "leave data.decode at 'auto'"],
    ),
    (
        "decode-device-with-a-pixel-policy",
        case_config(**{"data.loader": "native", "data.root": "shards", "data.decode": "device", "data.auto_augment": "rand-m9"}),
        ["data.decode", "data.auto_augment", "set data.decode to 'cpu'"],
    ),
    ("label-float", native_record_with({"image/class/label": [1.5]}), ["train-", "record 2", "holds 1 float value (1.5)", "int64"]),
    ("label-bytes", native_record_with({"image/class/label": [b"3"]}), ["train-", "record 2", "holds 1 bytes value", "int64"]),
    ("image-int64", native_record_with({"image/encoded": [7]}), ["train-", "record 2", "image/encoded holds 1 int64 value"]),
    ("index-superscript", native_index_holding("0 \u00b2\n".encode()), [".idx", "line 1", "largebatch data index"]),
    ("index-beyond-int64", native_index_holding(b"0 100000000000000000000000\n"), [".idx", "line 1", "largebatch data index"]),
    ("index-sparse-4gib", native_index_holding(b"", size=4 << 30), [".idx", f"{4 << 30} bytes", "largebatch data index"]),
    ("data-index-length-2-62", index_of_a_record_claiming_2_62_bytes, ["train-", "record 1", "truncated data", "header is corrupt"]),
    # weights files
    *(
        (f"init-from-{name}-header", init_from_file(header), ["weights.safetensors", "not a readable safetensors file"])
        for name, header in SAFETENSORS_HEADERS.items()
    ),
    ("init-from-int8", init_from_file(int8_weights), ["model.init_from", "as I8, the model's is F32"]),
    *(
        (f"export-{name}-header", export_with_weights(header), ["model.safetensors", "not a readable safetensors file"])
        for name, header in SAFETENSORS_HEADERS.items()
    ),
    # metrics.jsonl
    ("plot-a-list", plot_of("[1, 2]"), ["metrics.jsonl", "line 2 is not a metrics record"]),
    ("plot-a-number-beyond-float", plot_of("1e400"), ["metrics.jsonl", "line 2 is not a metrics record"]),
    ("plot-not-json", plot_of('{"step": 3, "lo'), ["metrics.jsonl", "line 2 is not JSON"]),
    ("plot-critical-batch-not-json", plot_with_report('{"branches": '), ["report.json", "is not JSON"]),
    (
        "plot-critical-batch-of-another-run",
        plot_with_report('{"branches": {"run": "../other", "rows": []}}'),
        ["report.json", "measured along '../other'", "whose branches.run is this run"],
    ),
    (
        "plot-critical-batch-bad-row",
        plot_with_report('{"branches": {"run": "../run", "rows": [{"samples": 10, "base_batch": 8, "critical_batch": "x"}]}}'),
        ["report.json", "branches.rows[1].critical_batch is 'x'"],
    ),
    # studies: every mistake before the first trial
    (
        "study-unknown-optimizer",
        study_case(optimizers={"lamb": {}, "adafactor": {}}),
        ["optimizers.adafactor", "unknown optimizer 'adafactor'"],
    ),
    ("study-empty-range", study_case(search={"lr": {"low": 0.03, "high": 0.003}}), ["search.lr", "the range [0.03, 0.003] is empty"]),
    (
        "study-target-not-measured",
        study_case(target={"metric": "auc", "value": 0.9}),
        ["target.metric", "does not measure 'auc'", "top1"],
    ),
    (
        "study-test-split-without-shards",
        study_case(data={"test": "validation"}),
        ["data.test", "the synthetic loader has one evaluation set"],
    ),
    (
        "study-storage-unopenable",
        study_case("--storage", "postgresql://nobody@127.0.0.1:9/none"),
        ["storage", "'postgresql://<redacted>@127.0.0.1:9/none' cannot be opened"],
    ),
    ("study-storage-folder-missing", study_case("--storage", "journal:/no/such/folder/study.log"), ["storage", "does not exist"]),
    (
        "study-targets-of-two-metrics",
        study_case(target=None, targets=[{"metric": "top1", "value": 0.7}, {"metric": "loss", "value": 0.5}]),
        ["targets", "distinct values of one metric and mode"],
    ),
    (
        "study-pilot-scale-without-pilot",
        study_case(search={"lr": {"low": 0.003, "high": 0.03}, "epochs": {"low": 2, "high": 3, "scale": "pilot"}}),
        ["search.epochs.scale", "pilot = dict(<optimizer>=dict(s_min=..., b_crit=...))"],
    ),
    ("study-threads-changed", study_with_another_thread_count, ["run with 3 thread(s) per trial", "--threads 3"]),
    ("study-branches-without-k1", study_case(branches={"run": "source", "ks": [2, 4], "samples": 64}), ["branches.ks", "must hold 1"]),
    ("study-branches-run-missing", study_case(branches={"run": "nowhere", "samples": 64}), ["branches.run", "nowhere", "holds no run"]),
    (
        "study-branches-only-with-a-cells-key",
        study_case(branches={"run": "source", "samples": 64}, optimizers=None, batches=None, search=None, target=None),
        ["micro_batch_size", "has no effect in a study of branches only", "remove it"],
    ),
    (
        "study-arms-only-with-a-cells-key",
        study_case(arms={"a": {}, "b": {"set": ["global_batch_size=16"]}}, optimizers=None, batches=None, search=None),
        ["micro_batch_size", "has no effect in a study of arms only", "remove it"],
    ),
    ("study-arms-one-arm", study_case(arms={"a": {"set": ["global_batch_size=16"]}}), ["arms", "at least two recipes"]),
    (
        "study-arm-bad-config",
        study_case(arms={"a": {}, "b": {"set": ["global_batch_size=20"]}}),
        ["arms.b.set", "arm 'b'", "20"],
    ),
]


def test_the_catalogue_is_large_and_its_ids_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


@pytest.mark.parametrize(("make", "fragments"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_mistake_is_one_error_line_and_loses_nothing(tmp_path, capsys, monkeypatch, make, fragments):
    monkeypatch.chdir(tmp_path)  # relative paths (and a default run directory) stay in here
    argv, run_dir = make(tmp_path)
    for name, value in getattr(make, "env", {}).items():
        monkeypatch.setenv(name, value)
    before, existed = snapshot(run_dir), run_dir.exists()
    status = invoke(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    after = snapshot(run_dir)
    assert {k: v for k, v in after.items() if k in before} == before, "an existing file was changed"
    assert not any(name.endswith(".safetensors") or name.startswith("checkpoints/") for name in set(after) - set(before))
    assert not (tmp_path / "it-ran").exists()  # a checkpoint's pickled call, or a file planted in a run directory, never ran
    assert existed or not run_dir.exists() or any(run_dir.iterdir()), "a refused command left an empty run directory behind"


def test_evaluation_switched_off_needs_no_eval_split(tmp_path, capsys):
    """Only a train split: a run that never evaluates trains; one that does names the split."""
    config = native_config(tmp_path, **{"eval.at_end": False, "eval.interval_epochs": 0})
    assert invoke(train(config, tmp_path / "run")) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "model.safetensors").exists()


# ----------------------------------------------------------------------------- credentials

NOTIFY = """
import json


class Notify(Hook):
    def __init__(self, url: str = "", api_key: str = "", out: str = ""):
        super().__init__()
        self.url, self.api_key, self.out = url, api_key, out

    def before_run(self, state):
        with open(self.out, "w") as handle:  # what the run uses, outside the run directory
            json.dump({"url": self.url, "api_key": self.api_key}, handle)

    def after_step(self, state):
        state.current.metrics["notify/endpoint"] = f"posting to {self.url}"  # a text metric
"""


def test_an_error_line_about_a_credential_shows_no_part_of_it(tmp_path, capsys):
    """A value of the wrong type under a credential's name: the error line names the key and
    the type it wanted, and shows ``<redacted>`` where the value would be."""
    hook = credential_hook(tmp_path) | {"api_key": ["sk-live-123", "sk-live-456"]}  # a list where a string is taken
    assert invoke(train(config_with(tmp_path, hooks=[hook]), tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "hooks[0].api_key" in err and "expected a string" in err and "<redacted>" in err, err
    assert "sk-live" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_credentials_reach_the_run_and_nothing_it_writes_or_tells_a_tracker(tmp_path, monkeypatch, capfd):
    """A URI with user-info and keys named like credentials, in hook arguments given on the
    command line: the hook gets them as given, and no file under the run directory (config.yaml,
    checkpoints, metrics, MLflow's SQLite store and artifacts, W&B's offline files), no MLflow
    parameter or tag, no W&B record and no console line holds them; a requeued run (the same
    command with --resume auto) gets them again."""
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    secrets = ["s3cr3t-token", "sk-live-123", "hf-tok-456", "bob:pw"]
    url = "https://alice:s3cr3t-token@hooks.example.com/post"
    received = tmp_path / "received.json"
    notify = hook_file(tmp_path, NOTIFY)
    hooks = [
        {"type": f"{notify}:Notify", "url": url, "api_key": "sk-live-123", "out": str(received)},
        {"type": "mlflow", "plots": False, "tags": {"source": "https://bob:pw@git.example.com/r.git", "hf_token": "hf-tok-456"}},
        {"type": "wandb", "mode": "offline", "plots": False},
    ]
    config = config_with(tmp_path, **{"checkpoint.at_end": True, "max_steps": 2, "log.console": True})
    run_dir = tmp_path / "run"
    argv = train(config, run_dir, "--set", "hooks=" + json.dumps(hooks))
    monkeypatch.setattr(sys, "argv", argv)  # W&B records the command line

    def check(status: int) -> None:
        assert status == 0
        assert json.loads(received.read_text()) == {"url": url, "api_key": "sk-live-123"}  # the real values were used
        out = capfd.readouterr()
        leaked = [(p, s) for p in sorted(run_dir.rglob("*")) if p.is_file() for s in secrets if s.encode() in p.read_bytes()]
        leaked += [("console", s) for s in secrets if s in out.out + out.err]
        assert not leaked
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
        (tracked,) = client.search_runs([client.get_experiment_by_name("largebatch").experiment_id])
        shown = json.dumps([tracked.data.params, tracked.data.tags])
        assert not [s for s in secrets if s in shown]
        assert "https://<redacted>@hooks.example.com/post" in tracked.data.params["hooks"]
        assert tracked.data.tags["source"] == "https://<redacted>@git.example.com/r.git" and tracked.data.tags["hf_token"] == "<redacted>"

    check(invoke(argv))
    saved = (run_dir / "config.yaml").read_text()
    assert "url: https://<redacted>@hooks.example.com/post" in saved and "api_key: <redacted>" in saved
    assert '"notify/endpoint": "posting to https://<redacted>@hooks.example.com/post"' in (run_dir / "metrics.jsonl").read_text()
    received.unlink()
    check(invoke([*argv, "--resume", "auto", "--set", "max_steps=4"]))  # a requeue: the same command, resumed
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_a_checkpoint_holding_more_than_data_resumes_when_trusted(tmp_path, capsys):
    """A checkpoint of an earlier version whose hook state holds an object a weights-only
    load refuses (harmless here): refused by default, resumed with --trust-checkpoint."""
    import collections

    run_dir = tmp_path / "run"
    config = config_with(tmp_path, **{"checkpoint.at_end": True, "max_steps": 2})
    assert invoke(train(config, run_dir)) == 0
    (checkpoint,) = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    payload = torch.load(checkpoint, weights_only=True)
    payload["hooks"]["CheckpointHook"]["recent"] = collections.deque([1, 2])
    torch.save(payload, checkpoint)
    capsys.readouterr()
    resume = [TRAIN, "--run-dir", str(run_dir), "--resume", "auto", "--set", "max_steps=4"]
    assert invoke(resume) == 2
    assert "collections.deque" in capsys.readouterr().err
    assert invoke([*resume, "--trust-checkpoint"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert [p.name for p in sorted((run_dir / "checkpoints").glob("step-*.pt"))][-1] == "step-00000004.pt"
