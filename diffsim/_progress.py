"""A progress bar over a long loop: tqdm when it is installed and stderr is a terminal."""

import sys


class _Silent:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, *, enabled: bool, description: str, unit: str):
    """A bar with `update(n)` and `close()` showing rate and ETA; silent when `enabled` is false,
    when stderr is not a terminal (logs and CI stay clean) or when tqdm is missing."""
    if not enabled or not sys.stderr.isatty():
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent()
    return tqdm(total=total, desc=description, unit=unit, unit_scale=True, dynamic_ncols=True)
