"""Packages and the optional C accelerators of the generated codecs; the rest is in
pyproject.toml.

Every folder under generated/ with an __init__.py is a generated codec package (one per spec),
installed under its own name. optional=True: without a C compiler the build goes on and the
codecs run in pure Python.
"""

from pathlib import Path

from setuptools import Extension, find_packages, setup

GENERATED = sorted(p.parent.name for p in Path("generated").glob("*/__init__.py"))

setup(
    packages=[*find_packages(include=["codegen*", "pgcdc*"]), *GENERATED],
    package_dir={name: f"generated/{name}" for name in GENERATED},
    ext_modules=[
        Extension(
            f"{name}._speedups",
            [f"generated/{name}/_speedups.c"],
            include_dirs=["pgcdc/runtime"],
            depends=["pgcdc/runtime/speedups.h"],
            optional=True,
        )
        for name in GENERATED
        if Path(f"generated/{name}/_speedups.c").exists()
    ],
)
