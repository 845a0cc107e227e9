"""Credentials redacted (``largebatch/config/redact.py``): URIs' user-info and the values of
keys named like credentials, anywhere in a config; what is missing after redaction, and
the real values taken back from the config file that holds them."""

from __future__ import annotations

import pytest

from largebatch.config.redact import REDACTED, redact, redact_argv, redact_text, restore, secret_key, unresolved


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:token@host.example.com:5000/path?q=1", "https://<redacted>@host.example.com:5000/path?q=1"),
        ("http://token@github.com/org/repo.git", "http://<redacted>@github.com/org/repo.git"),  # a user name alone may be the token
        ("postgresql://me:p@ss@db:5432/mlflow", "postgresql://<redacted>@db:5432/mlflow"),  # the last @ ends the user-info
        (
            "cannot reach https://u:p@a.example.com and s3://k:s@bucket/x",
            "cannot reach https://<redacted>@a.example.com and s3://<redacted>@bucket/x",
        ),
        ("http://host/path?who=a@b.c", "http://host/path?who=a@b.c"),  # an @ after the host is not user-info
        ("sqlite:///runs/x/mlflow.db", "sqlite:///runs/x/mlflow.db"),
        ("user@example.com", "user@example.com"),
        ("https://<redacted>@host", "https://<redacted>@host"),  # idempotent
        # query parameters and fragments named like credentials
        ("sqlite:///x.db?user=alice&password=pw1", "sqlite:///x.db?user=alice&password=<redacted>"),
        ("postgresql://h/db?password=a1&sslpassword=b2", "postgresql://h/db?password=<redacted>&sslpassword=<redacted>"),
        ("https://h/cb#access_token=t9&state=1", "https://h/cb#access_token=<redacted>&state=1"),
        ("https://u:p@h/x?token=t1", "https://<redacted>@h/x?token=<redacted>"),
        # NAME=value and NAME: value
        ("HF_TOKEN=abc", "HF_TOKEN=<redacted>"),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc+/==;EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=<redacted>;EndpointSuffix=core.windows.net",
        ),
        ('["HF_TOKEN=abc", "OMP_NUM_THREADS=1"]', '["HF_TOKEN=<redacted>", "OMP_NUM_THREADS=1"]'),
        ("Authorization: Bearer xyz", "Authorization: <redacted>"),
        ("password: abc def\n  - token: 'x y'\nother: 1", "password: <redacted>\n  - token: '<redacted>'\nother: 1"),
        ("got {'password': 'pw', 'n': 1, 'class_token': True}", "got {'password': '<redacted>', 'n': 1, 'class_token': True}"),
        ("sent as bearer xyz", "sent as bearer <redacted>"),
        ("password=123456", "password=<redacted>"),  # in a text, a number may be the password
        # a --set override: its value read as YAML, redacted under its key
        ("hooks=[{type: x, api_key: sk1}]", 'hooks=[{"type": "x", "api_key": "<redacted>"}]'),
        ("hooks.0.credentials={user: a, pass: b}", 'hooks.0.credentials={"user": "<redacted>", "pass": "<redacted>"}'),
        # left alone: no value, the placeholder, a boolean, a key in an error line's middle, ordinary names
        ("Notify takes api_key='' by default", "Notify takes api_key='' by default"),
        ("x.db?password=<redacted>&token=None", "x.db?password=<redacted>&token=None"),
        ("class_token=True", "class_token=True"),
        ("hooks[0].api_key: expected a string, got '<redacted>' (list)", "hooks[0].api_key: expected a string, got '<redacted>' (list)"),
        ("max_tokens=4096, passes=3, bypass: yes", "max_tokens=4096, passes=3, bypass: yes"),
        ("optimizer.lr=0.1", "optimizer.lr=0.1"),
    ],
)
def test_credentials_in_text_are_redacted(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # idempotent


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("token", True),
        ("hf_token", True),
        ("access-token", True),
        ("password", True),
        ("db_passwd", True),
        ("client_secret", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("api_key", True),
        ("apiKey", True),
        ("wandbApiKey", True),
        ("apikey", True),
        ("accessKeyId", True),
        ("private_key", True),
        ("credentials", True),
        # camelCase with acronyms, run together, with digits
        ("HFToken", True),
        ("AWSSecretKey", True),
        ("xAPIKey", True),
        ("AccountKey", True),
        ("dbpassword", True),
        ("sslpassword", True),
        ("mytoken", True),
        ("password2", True),
        ("sessionToken", True),
        ("session_cookie", True),
        ("X-Api-Key", True),
        # the other words
        ("pwd", True),
        ("pass", True),
        ("passphrase", True),
        ("creds", True),
        ("secrets", True),
        ("Authorization", True),
        ("bearer", True),
        ("cookies", True),
        ("class_token", True),  # named like one; a boolean value is still left alone (below)
        # ordinary words holding the letters
        ("tokenizer", False),
        ("reg_tokens", False),
        ("max_tokens", False),
        ("num_tokens", False),
        ("tokens_per_step", False),
        ("passes", False),
        ("compass", False),
        ("bypass", False),
        ("passthrough", False),
        ("tracking_uri", False),
        ("keywords", False),
        ("key", False),
        ("monkey", False),
        ("secretary", False),
        ("author", False),
        ("cookiecutter", False),
        (3, False),
    ],
)
def test_keys_named_like_credentials(key, secret):
    assert secret_key(key) is secret


def test_no_key_of_the_schema_a_builtin_hook_or_a_study_file_is_a_credential():
    """Every dotted key ``largebatch config keys`` lists, every argument of a built-in hook
    and of the classification task, and every study-file key stays visible."""
    import inspect

    from largebatch.config.schema import SCHEMA, describe_keys
    from largebatch.hooks import BUILTIN_HOOKS
    from largebatch.study import spec
    from largebatch.tasks.classification import ClassificationTask

    keys = [row[0] for row in describe_keys(SCHEMA)]
    assert len(keys) > 100 and "optimizer.lr" in keys
    for path in BUILTIN_HOOKS.values():
        module, _, name = path.partition(":")
        keys += list(inspect.signature(getattr(__import__(module, fromlist=[name]), name)).parameters)
    keys += list(inspect.signature(ClassificationTask).parameters)
    keys += [*spec.KEYS, *spec.DATA_KEYS, *spec.EVALUATION_KEYS, *spec.NOISE_KEYS, *spec.WORKER_KEYS, *spec.TARGET_KEYS]
    assert [k for k in keys if secret_key(k)] == []


def test_a_config_is_redacted_everywhere_and_nothing_else_changes():
    config = {
        "seed": 0,
        "model": {"name": "vit_tiny_patch16_224", "class_token": True, "reg_tokens": 4, "init_from": "runs/a"},
        "data": {"root": "s3://key:secret@bucket/imagenet"},
        "hooks": [
            "loss",
            {"type": "mlflow", "tracking_uri": "https://alice:tok@mlflow.example.com", "tags": {"hf_token": "hf_abc", "team": "vision"}},
            {"type": "hooks/notify.py:Notify", "api_key": "sk-123", "password": "", "secret": None, "urls": ["http://u:p@a", "http://b"]},
        ],
    }
    assert redact(config) == {
        "seed": 0,
        "model": {"name": "vit_tiny_patch16_224", "class_token": True, "reg_tokens": 4, "init_from": "runs/a"},
        "data": {"root": "s3://<redacted>@bucket/imagenet"},
        "hooks": [
            "loss",
            {"type": "mlflow", "tracking_uri": "https://<redacted>@mlflow.example.com", "tags": {"hf_token": REDACTED, "team": "vision"}},
            {
                "type": "hooks/notify.py:Notify",
                "api_key": REDACTED,
                "password": "",
                "secret": None,
                "urls": ["http://<redacted>@a", "http://b"],
            },
        ],
    }
    assert config["hooks"][2]["api_key"] == "sk-123"  # a copy: what the run uses is unchanged


def test_every_text_under_a_credential_name_is_redacted_at_any_depth():
    hook = {
        "type": "x",
        "credentials": {"user": "alice", "pass": "p", "hosts": ["a", {"b": "c"}], "port": 5432, "tls": True},
        "creds": ["k1", "k2"],
        "env": ["HF_TOKEN=t", "OMP_NUM_THREADS=1"],
        "headers": {"Authorization": "Bearer x", "Accept": "*/*"},
        "class_token": True,
        "num_tokens": 3,
    }
    assert redact(hook) == {
        "type": "x",
        "credentials": {"user": REDACTED, "pass": REDACTED, "hosts": [REDACTED, {"b": REDACTED}], "port": 5432, "tls": True},
        "creds": [REDACTED, REDACTED],
        "env": ["HF_TOKEN=<redacted>", "OMP_NUM_THREADS=1"],
        "headers": {"Authorization": REDACTED, "Accept": "*/*"},
        "class_token": True,
        "num_tokens": 3,
    }
    assert restore(redact(hook), hook) == hook
    assert unresolved(redact({"hooks": [hook]})) == [
        "hooks[0].credentials.user",
        "hooks[0].credentials.pass",
        "hooks[0].credentials.hosts[0]",
        "hooks[0].credentials.hosts[1].b",
        "hooks[0].creds[0]",
        "hooks[0].creds[1]",
        "hooks[0].env[0]",
        "hooks[0].headers.Authorization",
    ]


def test_unresolved_names_each_redacted_value_and_restore_takes_it_back_from_its_file():
    real = {"hooks": [{"type": "mlflow", "tracking_uri": "https://alice:tok@h"}, {"type": "x", "api_key": "sk-1"}], "seed": 1}
    saved = redact(real)
    assert unresolved(saved) == ["hooks[0].tracking_uri", "hooks[1].api_key"]
    assert unresolved(real) == []
    assert restore(saved, real) == real
    # a file whose values redact to other ones gives nothing back
    other = {"hooks": [{"type": "mlflow", "tracking_uri": "https://alice:tok@elsewhere"}, {"type": "x", "api_key": "sk-1"}], "seed": 1}
    assert unresolved(restore(saved, other)) == ["hooks[0].tracking_uri"]
    assert restore(saved, {"seed": 1}) == saved  # nothing there


def test_a_command_line_is_redacted_under_each_set_key():
    argv = [
        "train.py",
        "--config",
        "c.py",
        "--set",
        'hooks=[{"type": "mlflow", "tracking_uri": "https://a:tok@h", "tags": {"hf_token": "hf-1"}}]',
        "--set=log.api_key=sk-2",
        "--set",
        "optimizer.lr=0.1",
        "--set",
        "data.root=s3://k:s@bucket/x",
        "--se",  # argparse takes any unambiguous prefix of --set
        "hooks.0.HFToken=hf-3",
        "--s=hooks.0.pwd=p-4",
        "--storage",
        "postgresql://h/db?password=pw-5",
    ]
    assert redact_argv(argv) == [
        "train.py",
        "--config",
        "c.py",
        "--set",
        'hooks=[{"type": "mlflow", "tracking_uri": "https://<redacted>@h", "tags": {"hf_token": "<redacted>"}}]',
        "--set=log.api_key=<redacted>",
        "--set",
        "optimizer.lr=0.1",  # untouched, as typed
        "--set",
        "data.root=s3://<redacted>@bucket/x",
        "--se",
        "hooks.0.HFToken=<redacted>",
        "--s=hooks.0.pwd=<redacted>",
        "--storage",
        "postgresql://h/db?password=<redacted>",
    ]


def test_a_resume_takes_redacted_values_from_the_config_file_that_holds_them(tmp_path):
    """``config.yaml`` is written redacted; resuming with ``--config`` gives the run the real
    values back, resuming without it (or with a file whose values differ) is refused, and so
    is starting a new run from the redacted file."""
    import torch

    from largebatch.config import dump_yaml, resolve_config
    from largebatch.errors import UserError
    from largebatch.launch import TrainArgs
    from largebatch.start import plan_start
    from tests.conftest import tiny_config, write_config

    def start(args: TrainArgs):
        return plan_start(args, is_main=False).config

    cfg = tiny_config(hooks=[{"type": "hooks/notify.py:Notify", "url": "https://alice:tok@hooks.example.com/x", "api_key": "sk-1"}])
    source = write_config(tmp_path, cfg, name="mine.yaml")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({"format": 1, "model": {}}, run_dir / "checkpoints" / "step-00000001.pt")  # the plan reads it; nothing loads it
    (run_dir / "config.yaml").write_text(dump_yaml(redact(resolve_config(source).to_dict())))

    resumed = start(TrainArgs(config=str(source), run_dir=str(run_dir), resume="auto"))
    assert resumed.to_dict()["hooks"] == cfg["hooks"]
    with pytest.raises(UserError, match=r"config.yaml: hooks\[0\].url, hooks\[0\].api_key: '<redacted>'"):
        start(TrainArgs(config=None, run_dir=str(run_dir), resume="auto"))
    elsewhere = write_config(
        tmp_path, tiny_config(hooks=[{**cfg["hooks"][0], "url": "https://alice:tok@other.example.com/x"}]), name="b.yaml"
    )
    with pytest.raises(UserError, match=r"hooks\[0\].url: '<redacted>'"):
        start(TrainArgs(config=str(elsewhere), run_dir=str(run_dir), resume="auto"))
    with pytest.raises(UserError, match=r"hooks\[0\].url, hooks\[0\].api_key: '<redacted>'"):
        start(TrainArgs(config=str(run_dir / "config.yaml"), run_dir=str(tmp_path / "new")))
