"""Child entry point of `common.run_isolated`: `python -m bench._isolated MODULE FUNC JSON`.

Prints the function's JSON result as the last line of stdout.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    module_name, func_name, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    module = importlib.import_module(f"bench.{module_name}")
    result = getattr(module, func_name)(**json.loads(raw))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
