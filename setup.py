"""Packages and the optional C accelerators of the generated codecs; the rest is in
pyproject.toml.

Every folder under generated/ with an __init__.py is a generated codec package (one per spec),
installed under its own name. optional=True: without a C compiler the build goes on and the
codecs run in pure Python.

The generator (codegen/) stays in the repository: the wheel holds the runtime (pgcdc) and what
the generator rendered. Each codec package also carries its spec's Kaitai Struct files and
sample capture under ``<package>/kaitai/`` (listed in the generator's manifest,
generated/.codegen/<package>.files), so ``pgcdc kaitai`` can hand them to a pip user.
"""

from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

GENERATED = sorted(p.parent.name for p in Path("generated").glob("*/__init__.py"))
KAITAI_SUFFIXES = (".ksy", ".pgcap", ".pgrcap")


def kaitai_files(package: str) -> list[Path]:
    """The .ksy files and sample capture the generator rendered for ``package``."""
    manifest = Path("generated/.codegen") / f"{package}.files"
    if not manifest.exists():
        return []
    names = manifest.read_text().split()
    return [
        Path("generated") / name
        for name in names
        if name.startswith(("kaitai/", "samples/")) and name.endswith(KAITAI_SUFFIXES)
    ]


class BuildPyWithKaitai(build_py):
    """build_py, plus each codec's Kaitai files copied into ``<package>/kaitai/``."""

    def run(self):
        super().run()
        for package in GENERATED:
            target = Path(self.build_lib) / package / "kaitai"
            for source in kaitai_files(package):
                self.mkpath(str(target))
                self.copy_file(str(source), str(target / source.name))


# Folders of Java sources (decode_messages' JVM engine) have no __init__.py; setuptools wants
# every folder that ships data named as a package.
JAVA = [
    *(f"{name}.jvm" for name in GENERATED if Path(f"generated/{name}/jvm").is_dir()),
    "pgcdc.runtime.spark.java",
]

setup(
    packages=[*find_packages(include=["pgcdc*"]), *GENERATED, *JAVA],
    package_dir={name: f"generated/{name}" for name in GENERATED},
    cmdclass={"build_py": BuildPyWithKaitai},
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
    ]
    + [
        # spec-independent: capture records read in chunks (pgcdc.capture.files.iter_chunks)
        Extension("pgcdc.runtime._capturescan", ["pgcdc/runtime/_capturescan.c"], optional=True),
        # spec-independent: a replication stream read into capture records (capture.copyread)
        Extension("pgcdc.runtime._copyread", ["pgcdc/runtime/_copyread.c"], optional=True),
    ],
)
