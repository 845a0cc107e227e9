"""Stand-in for the bridge package: remembers ``PT_HPU_LAZY_MODE`` as read at import,
as the real bridge does (it reads the variable once)."""

import os

from habana_frameworks._record import record

LAZY_AT_IMPORT = os.environ.get("PT_HPU_LAZY_MODE")
record("import habana_frameworks.torch", PT_HPU_LAZY_MODE=LAZY_AT_IMPORT)
