"""Package layout (the rest of the metadata is in pyproject.toml): the ``bridge`` packages,
plus the bundled web page, which lives in ``web/`` in the source tree and is installed as
package data under ``bridge/web/`` (bridge/api/web.py looks in both places)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["bridge", "bridge.*"]), "bridge.web"],
    package_dir={"bridge.web": "web"},
    package_data={"bridge": ["py.typed"], "bridge.web": ["*.*", "**/*.*"]},
)
