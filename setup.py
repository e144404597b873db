"""Build the compiled record codec and the producer's per-record path, ``sluice._crecords``,
and the broker's native fsync threads, ``sluice._csyncer``.

Everything else is in pyproject.toml.  The extensions are optional: where it cannot be built
(no C compiler), ``pip install`` still succeeds: ``sluice.protocol.records`` runs on its
pure-Python codec and the broker syncs in Python worker threads.
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
        ),
        Extension(
            "sluice._csyncer",
            sources=["src/sluice/_csyncer.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall"],
            optional=True,
        ),
    ]
)
