"""kvxfer's Python package: pure Python (ctypes), no build step.

`pip install ./python` works offline with Debian 12's pip and setuptools
(python3-pip, python3-setuptools, python3-wheel): without a pyproject.toml
build-system table pip builds the wheel in this environment instead of
fetching setuptools into an isolated one. With a newer pip that insists on
isolation: `pip install --no-build-isolation ./python`.
"""
from setuptools import setup

setup(
    name="kvxfer",
    version="1.3.0",
    description="KV-cache transfer between prefill and decode instances "
                "(ctypes binding of libkvxfer)",
    long_description=__doc__,
    packages=["kvxfer"],
    python_requires=">=3.9",
    extras_require={"numpy": ["numpy"]},
)
