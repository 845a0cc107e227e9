"""Names in a config resolved to classes (``largebatch.config.classes``), for hooks and
tasks alike; the tasks' cases are in ``tests/tasks``, the hooks' errors in ``tests/cli``."""

from largebatch.hooks import load_hook_class
from tests.support.rank_weights import SaveRankWeights


def test_a_hook_may_be_named_by_module():
    assert load_hook_class("tests.support.rank_weights:SaveRankWeights", "hooks[0]") is SaveRankWeights


def test_a_file_is_loaded_once_as_its_own_module():
    first = load_hook_class("tests/support/rank_weights.py:SaveRankWeights", "hooks[0]")
    assert first is load_hook_class("tests/support/rank_weights.py:SaveRankWeights", "hooks[1]")
    assert first.__module__.startswith("largebatch_user_hook_") and first is not SaveRankWeights
