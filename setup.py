"""The optional C accelerator of the generated codec; everything else is in pyproject.toml.

optional=True: without a C compiler the build goes on and the package runs in pure Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pgoutput_codec._speedups",
            ["generated/pgoutput_codec/_speedups.c"],
            optional=True,
        )
    ]
)
