"""Every command in README.md and docs/*.md is executed by a test.

Which lines are commands is stated in ``tests/docs/markdown.py`` and docs/README.md.
Each command found there is, in this order:

1. run here, in this process, when it is cheap: ``largebatch config show|keys``, any
   ``--help``, and every ``$ `` command (whose shown output must be what it prints);
2. run in a scratch folder (``RUN_IN_SCRATCH``, slow tier): short CPU trainings and what
   reads their output, with ``.venv/bin`` on the PATH and the repository's configs,
   hooks, data and scripts linked in;
3. a pytest command: the files it names exist, and the bare one is the command CI runs;
4. registered as covered by a named test that runs it or its equivalent (``COVERED``;
   the test must exist), or as needing hardware this machine lacks (``HARDWARE_ONLY``,
   with the reason).

A command that is none of these fails, naming its page and line. Every command that is
not run here must at least parse: its train.py arguments go through train.py's parser
and the config it names loads and validates with its ``--set`` values; a ``largebatch``
command goes through the ``largebatch`` parser; a script it names exists.
"""

from __future__ import annotations

import ast
import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

from largebatch import cli, train_command
from largebatch.config import resolve_config
from largebatch.errors import UserError
from tests.conftest import clean_env
from tests.docs import markdown
from tests.docs.markdown import REPO

FMNIST = REPO / "data/fashion-mnist/dataset.json"

# Command -> the test that runs it, or the equivalent it runs (said after "#").
COVERED = {
    "bash scripts/setup.sh": "tests/test_train_runs.py::test_torchrun_two_ranks_end_with_identical_weights"
    "  # CI (.ci/run) runs its first half, scripts/install.sh; the test runs its second, the demo's two-rank torchrun launch"
    " (on the synthetic demo config)",
    "torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-fmnist.py": (
        "tests/test_train_runs.py::test_torchrun_two_ranks_end_with_identical_weights"
        "  # the same launch on configs/demo/vit-tiny-synthetic.py; this one is scripts/setup.sh's demo"
    ),
    "torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-synthetic.py": (
        "tests/test_train_runs.py::test_torchrun_two_ranks_end_with_identical_weights"
    ),
    "torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-synthetic.py --set dist.strategy=fsdp": (
        "tests/sharding/test_fsdp_runs.py::test_fsdp_run_equals_ddp_run_with_lamb_accumulation_and_clipping"
        "  # two ranks under torchrun with dist.strategy fsdp, on a small LAMB config"
    ),
    'srun python train.py --config "$CONFIG" --run-dir runs/$SLURM_JOB_NAME-$SLURM_JOB_ID --resume auto --set slurm.requeue=true': (
        "tests/test_slurm.py::test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly  # the srun line of slurm/cpu-test.sbatch"
    ),
    "scancel --signal=USR1 <job id>": "tests/test_slurm.py::test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly",
    "srun --nodes=2 --ntasks-per-node=2 python train.py --config configs/demo/vit-tiny-synthetic.py"
    " --set dist.strategy=hsdp --set dist.shard_size=2": (
        "tests/test_slurm.py::test_hsdp_on_two_nodes_shards_within_a_node_and_matches_torchrun_ddp"
        "  # on a two-node Slurm cluster, with a small LAMB config (its fixture runs the srun)"
    ),
    "sbatch --nodes=2 slurm/cpu-test.sbatch configs/demo/vit-tiny-synthetic.py": (
        "tests/test_slurm.py::test_sbatch_on_two_nodes_preempted_with_usr1_resumes_exactly  # with a small hsdp config, preempted and requeued"
    ),
    "torchrun --nnodes=2 --nproc-per-node=2 --node-rank=0 --master-addr=node-0 --master-port=29500 train.py"
    " --config configs/demo/vit-tiny-synthetic.py": (
        "tests/test_train_runs.py::test_torchrun_on_two_nodes_of_two_matches_one_node_of_four"
        "  # both agents on one machine, --master-addr=127.0.0.1, a small LAMB config"
    ),
    "scontrol update JobId=<job id> StartTime=now": "tests/test_slurm.py::test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly",
    "python data/prepare_fmnist.py": "tests/shards/test_convert.py::test_fashion_mnist_subset  # its converter on Debian's files, 64 images",
    "largebatch data convert folder /path/imagenet --out data/imagenet": "tests/shards/test_convert.py::test_cli_convert_index_verify",
    "largebatch data convert folder /path/imagenet --out data/imagenet --val-labels LOC_val_solution.csv": (
        "tests/shards/test_convert.py::test_a_flat_validation_folder_with_either_labels_file_makes_the_foldered_shards"
    ),
    "largebatch data convert fashion-mnist --out data/fashion-mnist": "tests/shards/test_convert.py::test_fashion_mnist_subset",
    "largebatch data index data/other/train-00000-of-00004": "tests/shards/test_convert.py::test_cli_convert_index_verify",
    "largebatch data verify data/imagenet": "tests/shards/test_convert.py::test_cli_convert_index_verify",
    "largebatch config keys --write docs/configs.md": "tests/config/test_reference.py::test_docs_configs_page_matches_the_schema",
    "largebatch config import colossalai config.py --train-script train.py --world-size 8 --out vit-b16-largebatch.py": (
        "tests/importers/colossalai/test_importer.py::test_the_command_writes_a_file_config_show_loads_and_refuses_to_overwrite_it"
        "  # on a config and train script in the shape of Colossal-AI's data-parallel ViT example, then config show on the result"
    ),
    "largebatch config import colossalai vit_1d_tp2_pp2.py --train-script train_with_engine.py --world-size 64 --out vit-hybrid.py": (
        "tests/importers/colossalai/test_importer.py::test_the_command_writes_a_file_config_show_loads_and_refuses_to_overwrite_it"
        "  # on a config and engine script in the shape of Colossal-AI's hybrid-parallel ViT example"
    ),
    "torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/finetune-vit-tiny-fmnist.py": (
        "tests/test_finetune.py::test_the_shipped_fine_tune_config_starts_from_the_run_the_readmes_first_command_writes"
        "  # this config after setup.sh's demo command, both shortened to two steps on a small shard set"
    ),
    "python -m bench": "tests/bench/test_bench_scripts.py::test_the_whole_quick_suite_runs_every_benchmark  # the same at --quick sizes",
    "python -m bench --quick": "tests/bench/test_bench_scripts.py::test_the_whole_quick_suite_runs_every_benchmark",
    "python -m bench --only mfu timm_train": "tests/bench/test_bench_scripts.py::test_the_suite_fails_when_one_benchmark_fails  # --quick --only",
    "python -m bench --device cpu --quick": (
        "tests/bench/test_accelerator.py::test_gpu_pack_then_check_rehearse_every_section_on_the_cpu"
        "  # scripts/gpu-check.sh with GPU_CHECK_DEVICE=cpu runs it, with --budget"
    ),
    "bash scripts/gpu-pack.sh": "tests/bench/test_accelerator.py::test_gpu_pack_then_check_rehearse_every_section_on_the_cpu",
    "bash scripts/gpu-check.sh OUT_DIR 420": (
        "tests/bench/test_accelerator.py::test_gpu_pack_then_check_rehearse_every_section_on_the_cpu"
        "  # with GPU_CHECK_DEVICE=cpu; without it and without a GPU:"
        " tests/bench/test_accelerator.py::test_gpu_check_installs_the_carried_wheels_then_stops_with_the_suites_refusal_without_a_gpu"
    ),
    "largebatch study run studies/fashion-mnist/study.py --jobs 2": (
        "tests/study/test_study_runs.py::test_a_tiny_study_reports_its_cells_seeds_fit_and_edge_marks"
        "  # `study run --jobs 2` on the tests' tiny study (2 optimizers x 2 batches x 3 trials x 2 seeds)"
    ),
    "OMP_NUM_THREADS=1 largebatch study run studies/fashion-mnist/study.py --jobs 2": (
        "tests/study/test_study_runs.py::test_a_tiny_study_reports_its_cells_seeds_fit_and_edge_marks"
        "  # the same command on the tests' tiny study; the shipped study takes hours"
    ),
    "largebatch study run studies/fashion-mnist-16k/study.py --jobs 2": (
        "tests/study/test_shipped_study.py::test_the_16k_studys_longest_budgets_are_at_least_twice_the_first_studys_fit_at_every_batch"
        "  # its design checked; running it takes hours (in sittings: it resumes), the command is the tiny study's above"
    ),
    "python studies/fashion-mnist-cbs/source.py": (
        "tests/study/test_study_branches.py::test_branches_run_as_trials_and_the_report_has_the_critical_batch_along_training"
        "  # a source run with checkpoints and the noise_scale hook, on the tests' tiny problem; this one trains two CPU minutes"
    ),
    "largebatch study run studies/fashion-mnist-cbs/study.py --jobs 1": (
        "tests/study/test_study_branches.py::test_branches_run_as_trials_and_the_report_has_the_critical_batch_along_training"
        "  # `study run` on a study of branches only, on the tests' tiny source run; the shipped one runs 60 branches"
    ),
    "largebatch study report studies/fashion-mnist-16k/study.py": (
        "tests/study/test_shipped_study.py::test_a_shipped_study_reproduces_its_report_from_its_storage_alone[cells]"
    ),
    "largebatch study report studies/fashion-mnist-cbs/study.py": (
        "tests/study/test_shipped_study.py::test_a_shipped_study_reproduces_its_report_from_its_storage_alone[branches]"
    ),
    "largebatch study report studies/fashion-mnist-adaptive/study.py": (
        "tests/study/test_shipped_study.py::test_a_shipped_study_reproduces_its_report_from_its_storage_alone[arms]"
    ),
    "largebatch study run studies/fashion-mnist-adaptive/study.py --jobs 2": (
        "tests/study/test_study_arms.py::test_an_arms_study_reports_each_arm_from_its_trials_own_records_and_resumes_a_killed_trial  # `study run` of arms on the tests' tiny problem; the shipped one trains 25 runs, 31 minutes on two cores"
    ),
    "largebatch study status studies/fashion-mnist/study.py": "tests/study/test_study_runs.py::test_status_lists_every_cell",
    "largebatch study report studies/fashion-mnist/study.py": (
        "tests/study/test_study_runs.py::test_the_report_is_written_again_from_the_storage_alone"
    ),
    "largebatch study run studies/fashion-mnist/study.py --retry-failed": (
        "tests/study/test_study_runs.py::test_a_failed_trial_is_recorded_and_waits_for_the_users_choice"
    ),
    "sbatch --array=0-3 slurm/study-array.sbatch studies/fashion-mnist/study.py --storage journal:studies/fashion-mnist/study.journal": (
        "tests/study/test_study_slurm.py::test_two_array_tasks_finish_one_study_together_and_no_trial_runs_twice"
        "  # two array tasks of the same script on the tests' small study, on a real one-node cluster"
    ),
}

# Command -> why it cannot run on a CPU machine (it still has to parse).
_GAUDI = "needs Gaudi HPUs, Habana's PyTorch bridge and media pipeline, and ImageNet shards"
_GPUS = "needs CUDA GPUs and ImageNet shards"
HARDWARE_ONLY = {
    "python -m bench --device cuda": (
        "needs a CUDA GPU; without one it stops with one error line:"
        " tests/bench/test_accelerator.py::test_cuda_without_a_gpu_is_one_error_line_and_status_2"
    ),
    "python -m bench --device hpu": (
        "needs a Gaudi and Habana's PyTorch bridge; without them it stops with one error line:"
        " tests/bench/test_accelerator.py::test_hpu_without_habana_is_one_error_line_and_status_2"
    ),
    "torchrun --nproc_per_node=8 train.py --config configs/vit-b16.py": _GPUS,
    "torchrun --standalone --nproc_per_node=8 train.py --config configs/vit-b16.py": _GPUS,
    "python train.py --config configs/vit-b16.py": _GPUS,
    "torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=gpu-node-0 --master_port=29500 train.py"
    " --config configs/vit-b16.py": _GPUS + " on two machines",
    "sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=10 --wrap"
    ' "srun python -u train.py --config configs/vit-b16.py --resume auto"': _GPUS + " on a Slurm cluster",
    "srun --ntasks=8 --gpus-per-task=1 python train.py --config configs/vit-b16.py": (
        _GPUS + "; srun itself: tests/test_slurm.py::test_srun_two_tasks_match_torchrun (2 CPU tasks)"
    ),
    "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8 --rdzv-backend=c10d"
    " --rdzv-endpoint=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1):29500 --rdzv-id=$SLURM_JOB_ID train.py"
    " --config configs/vit-b16.py": _GPUS + " on several Slurm nodes",
    "sbatch slurm/gpu-1node.sbatch configs/vit-b16.py --set optimizer.lr=0.003": (
        _GPUS + " on a Slurm cluster; tests/test_slurm.py::test_sbatch_job_preempted_with_usr1_requeues_and_resumes_exactly"
        " submits slurm/cpu-test.sbatch, the same script for 2 CPU ranks"
    ),
    "sbatch --nodes=8 slurm/gpu-multinode.sbatch configs/vit-b16.py": _GPUS + " on 8 Slurm nodes",
    "mpirun -n 8 --bind-to core --map-by socket:PE=6 --rank-by core --allow-run-as-root python train.py"
    " --config configs/vit-b16.py --set device=hpu": _GAUDI + "; mpirun itself: tests/test_mpi.py (2 CPU ranks)",
    "python train.py --config configs/vit-b16.py --set data.loader=mediapipe": _GAUDI,
    "torchrun --standalone --nproc_per_node=8 train.py --config configs/vit-b16.py --set data.loader=mediapipe": _GAUDI,
    "mpirun -n 8 --bind-to core --map-by socket:PE=6 --rank-by core --report-bindings --allow-run-as-root python -u train.py"
    " --config configs/vit-b16.py --set data.loader=mediapipe": _GAUDI,
    "mpirun -n 16 --hostfile hosts --map-by ppr:8:node --bind-to core --allow-run-as-root -x MASTER_ADDR=gaudi-node-0"
    " -x MASTER_PORT=29500 python -u train.py --config configs/vit-b16.py --set data.loader=mediapipe": _GAUDI + " on two machines",
    "sbatch --nodes=2 --ntasks-per-node=8 --cpus-per-task=10 --wrap"
    ' "srun python -u train.py --config configs/vit-b16.py --set data.loader=mediapipe --resume auto"': _GAUDI + " on a Slurm cluster",
}

_NOISE = "python train.py --config configs/demo/vit-tiny-fmnist.py --run-dir runs/noise --set 'hooks=[\"noise_scale\"]' --set max_steps=60"
_HOOKS_DEMO = (
    "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/demo"
    ' --set \'hooks=["memory", "csv", "hook_timer", {"type": "eval", "interval_steps": 8}]\''
)
_FIRST = "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/first --set max_steps=8"
_SHORT = "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/short --set max_steps=8"
_SOURCE = (
    "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/source --set max_steps=8 --set checkpoint.interval_steps=4"
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
    """A working folder with the repository's inputs (and tests/support) linked in; runs/ lands here."""
    folder = tmp_path_factory.mktemp("docs-scratch")
    for name in ("configs", "hooks", "data", "bench", "slurm", "scripts", "tests", "train.py"):
        (folder / name).symlink_to(REPO / name)
    return folder


# Command -> (the command it reads the output of, or None; whether it needs data/fashion-mnist).
RUN_IN_SCRATCH = {
    "python train.py --config configs/demo/vit-tiny-synthetic.py": (None, False),
    _FIRST: (None, False),
    "python train.py --run-dir runs/first --resume auto --set max_steps=16": (_FIRST, False),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --set max_steps=4"
    " --set \"hooks=[{type: 'hooks/loss_spike.py:LossSpikeHook', factor: 4.0}]\"": (None, False),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --set max_steps=4"
    " --set \"hooks=[{type: 'hooks/grad_stats.py:GradStatsHook', interval: 2}]\"": (None, False),
    _HOOKS_DEMO: (None, False),
    "largebatch plot runs/demo": (_HOOKS_DEMO, False),
    "largebatch plot runs/demo --out plots/demo": (_HOOKS_DEMO, False),
    _NOISE: (None, True),
    "python -c \"import json,sys; [print(r['step'], round(r['noise_scale/b_simple'])) for r in map(json.loads, open(sys.argv[1]))"
    " if 'noise_scale/b_simple' in r]\" runs/noise/metrics.jsonl": (_NOISE, True),
    "mkdir -p runs": (None, False),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/tracked --set max_steps=4"
    ' --set "hooks=[{type: wandb, mode: offline}]"': (None, False),
    "largebatch export runs/first --out exports/first": (_FIRST, False),
    _SHORT: (None, False),
    "python train.py --run-dir runs/short --resume auto": (_SHORT, False),
    _SOURCE: (None, False),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/branch-k2 --branch-from runs/source/checkpoints/step-00000004.pt"
    " --set global_batch_size=512 --set optimizer.lr=0.0028 --set lr_schedule.type=constant --set lr_schedule.warmup_steps=0"
    " --set max_steps=2": (_SOURCE, False),
    "python train.py --run-dir runs/short --resume auto --set max_steps=16": (_SHORT, False),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --set checkpoint.interval_steps=2 --set checkpoint.async_save=true": (
        None,
        False,
    ),
    "python train.py --config configs/demo/vit-tiny-synthetic.py --run-dir runs/mse --set task.type=tests/support/onehot_mse.py:OneHotMSE": (
        None,
        False,
    ),
}

ALL = [command for page in markdown.pages() for command in markdown.commands(page)]
IN_PROCESS = {"largebatch": [], "python -m largebatch": [], "python train.py": ["train.py"]}


def _words(text: str) -> list[str]:
    return shlex.split(text)


def _program(words: list[str]) -> tuple[str, list[str]] | None:
    """Which in-process entry point a command calls, and its arguments."""
    for prefix in IN_PROCESS:
        size = len(prefix.split())
        if words[:size] == prefix.split():
            return prefix, IN_PROCESS[prefix] + words[size:]
    return None


def runs_here(command: markdown.Command) -> bool:
    words = _words(command.text)
    found = _program(words)
    if found is None or any(op in command.text for op in ("|", ">", "$(", "&&", ";")):
        return False
    argv = found[1]
    cheap = argv[:2] in (["config", "show"], ["config", "keys"]) and "--write" not in argv
    return command.prompted or cheap or "--help" in argv


def is_pytest(command: markdown.Command) -> bool:
    return command.text.startswith(".venv/bin/python -m pytest")


def _node_exists(node: str) -> bool:
    path, *names = node.split("  #")[0].strip().split("::")
    file = REPO / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    scope = tree.body
    for name in names:
        match = [n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name.split("[")[0]]
        if not match:
            return False
        scope = match[0].body
    return True


def _call(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "train.py":
            return train_command.train_main(argv[1:])
        return cli.main(argv)
    except SystemExit as exc:  # argparse: --help, or a mistake
        return exc.code if isinstance(exc.code, int) else 1


def _argv_after_train_py(words: list[str]) -> list[str] | None:
    """The arguments a command gives train.py (or ``largebatch train``), looking inside
    ``--wrap "..."`` strings; None when it does not run train.py."""
    for i, word in enumerate(words):
        if " " in word:
            inner = _argv_after_train_py(_words(word))
            if inner is not None:
                return inner
        script_argument = i and words[i - 1] == "--train-script"  # a file the command reads, not the program it runs
        if (word.endswith("train.py") and not script_argument) or (word == "train" and i and words[i - 1] == "largebatch"):
            rest = words[i + 1 :]
            stop = [j for j, w in enumerate(rest) if w in ("|", "&&", ";", "||", ">")]
            return rest[: stop[0]] if stop else rest
    return None


# Batch scripts that run a ``largebatch`` command (the rest run train.py): script -> its subcommand.
SBATCH_LARGEBATCH = {"slurm/study-array.sbatch": ["study", "run"]}


def _placeholder(path: str) -> bool:
    return "$" in path or path.isupper() or "<" in path


def check_parses(command: markdown.Command) -> None:
    """train.py's parser takes the arguments, the config loads with its --set values, a
    ``largebatch`` command parses, and the scripts and files named exist."""
    words = _words(command.text)
    argv = _argv_after_train_py(words)
    sbatch_script = next((w for w in words if w.endswith(".sbatch")), None)
    if sbatch_script is not None:
        assert (REPO / sbatch_script).is_file(), f"{command.where}: no script {sbatch_script}"
        rest = words[words.index(sbatch_script) + 1 :]
        if sbatch_script in SBATCH_LARGEBATCH:  # the script runs a largebatch command with its arguments
            words = ["largebatch", *SBATCH_LARGEBATCH[sbatch_script], *rest]
            rest = []
        argv = ["--config", *rest] if rest else None
    if argv is not None:
        parser = train_command.ArgumentParser(prog="train.py")
        train_command.add_train_arguments(parser)
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{command.where}: train.py does not take the arguments of `{command.text}`")
        if args.config is not None and not _placeholder(args.config):  # None: a resume, with the saved config
            try:
                resolve_config(str(REPO / args.config), args.overrides)
            except UserError as exc:
                pytest.fail(f"{command.where}: `{command.text}`: {exc}")
        return
    found = _program(words)
    if found is not None and found[0] != "python train.py":
        try:
            cli.build_parser().parse_args(found[1])
        except SystemExit:
            pytest.fail(f"{command.where}: `largebatch` does not take the arguments of `{command.text}`")
    for word in words:
        if word.endswith((".py", ".sh")) and "/" in word and not _placeholder(word) and not word.startswith("/"):
            assert (REPO / word).is_file(), f"{command.where}: `{command.text}` names {word}, which does not exist"


@pytest.mark.parametrize("command", ALL, ids=[c.where for c in ALL])
def test_every_command_is_run_or_registered(command, capsys, monkeypatch, preemption_handlers_restored):
    if runs_here(command):
        monkeypatch.chdir(REPO)
        capsys.readouterr()
        status = _call(_program(_words(command.text))[1])
        out = capsys.readouterr()
        printed = "\n".join(line.rstrip() for line in (out.out + out.err).strip("\n").split("\n"))
        if command.output:
            assert printed == command.output, f"{command.where}: `{command.text}` printed\n{printed}\nbut the page shows\n{command.output}"
            assert status == (2 if printed.startswith("error:") else 0), f"{command.where}: `{command.text}` ended with status {status}"
        else:
            assert status == 0, f"{command.where}: `{command.text}` ended with status {status}:\n{printed[-2000:]}"
        return
    if is_pytest(command):
        for word in _words(command.text)[3:]:
            if word.startswith("tests/"):
                assert (REPO / word).exists(), f"{command.where}: `{command.text}` names {word}, which does not exist"
        if command.text == ".venv/bin/python -m pytest":
            assert command.text in (REPO / ".ci/run").read_text().splitlines(), f"{command.where}: .ci/run no longer runs `{command.text}`"
        return
    assert any(command.text in table for table in (RUN_IN_SCRATCH, COVERED, HARDWARE_ONLY)), (
        f"{command.where}: `{command.text}` is neither run by tests/docs/test_commands.py nor registered there; add it to "
        "RUN_IN_SCRATCH (a short CPU run), COVERED (the test that runs it) or HARDWARE_ONLY (why it cannot run here)"
    )
    if command.text in COVERED:
        node = COVERED[command.text]
        assert _node_exists(node), f"{command.where}: `{command.text}` is registered as covered by {node}, which does not exist"
    check_parses(command)


def test_every_registered_command_is_still_in_the_docs():
    texts = {command.text for command in ALL}
    for table in (COVERED, HARDWARE_ONLY, RUN_IN_SCRATCH):
        stale = sorted(set(table) - texts)
        assert not stale, f"registered in tests/docs/test_commands.py but in no page any more (remove them): {stale}"


def test_no_command_hides_in_an_untagged_block():
    stray = [line for page in markdown.pages() for line in markdown.stray_commands(page)]
    assert not stray, "commands in a block without a language and without `$ ` prompts; tag the block bash (or text): " + "; ".join(stray)


_DONE: dict[str, str] = {}  # command -> its scratch output, once it has run in this session


def _run_in_scratch(text: str, where: str, folder: pathlib.Path) -> None:
    if text in _DONE:
        return
    env = clean_env(PATH=f"{REPO / '.venv/bin'}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", "-c", text], cwd=folder, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{where}: `{text}` ended with status {result.returncode}:\n{(result.stdout + result.stderr)[-3000:]}"
    _DONE[text] = result.stdout


SCRATCH = [c for c in ALL if c.text in RUN_IN_SCRATCH and not runs_here(c)]


@pytest.mark.slow
@pytest.mark.parametrize("command", SCRATCH, ids=[c.where for c in SCRATCH])
def test_scratch_commands_run(command, scratch):
    after, needs_fmnist = RUN_IN_SCRATCH[command.text]
    if needs_fmnist and not FMNIST.exists():
        pytest.skip("needs data/fashion-mnist (python data/prepare_fmnist.py, or bash scripts/setup.sh)")
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    if after is not None:
        _run_in_scratch(after, command.where, scratch)
    _run_in_scratch(command.text, command.where, scratch)
