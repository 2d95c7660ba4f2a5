"""Make the repository root and this folder importable however pytest is started
(`python -m pytest` adds the cwd, the `pytest` script does not)."""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _path in (_HERE.parents[2], _HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
