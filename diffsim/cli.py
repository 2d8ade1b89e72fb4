"""The `diffsim` command (`python -m diffsim`, the `diffsim` script). Its body is
`diffsim._apps.cli`; this module is the one entry from the library into the application layer."""

from ._apps.cli import main as main
