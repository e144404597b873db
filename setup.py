"""Build the compiled record codec and the producer's per-record path, ``sluice._crecords``.

Everything else is in pyproject.toml.  The extension is optional: where it cannot be built
(no C compiler), ``pip install`` still succeeds and ``sluice.protocol.records`` runs on its
pure-Python codec.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sluice._crecords",
            sources=["src/sluice/_crecords.c", "src/sluice/_cproducer.c", "src/sluice/_cfuture.c", "src/sluice/_coutbox.c"],
            depends=["src/sluice/_crecords.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall"],
            optional=True,
        )
    ]
)
