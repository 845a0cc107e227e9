"""Stand-in for ``habana_frameworks.torch.utils.internal.is_lazy``."""

import habana_frameworks.torch as bridge


def is_lazy() -> bool:
    return bridge.LAZY_AT_IMPORT == "1"
