"""Starts that end at the kept optimum's loss with other parameter values: a loss with several
optima of equal height (a symmetry of the model), which a count of agreeing starts hides."""

import numpy as np


def equal_optima_note(values, reached, best: int, stderr, names) -> str | None:
    """A note where a start in `reached` (bool, per start) ended at values (`values[j]`, one row
    per start, the same coordinates as `stderr`) distinguishable from the kept start's: more
    than 5 standard errors and 1e-3 relative apart in some unknown. An unknown of infinite
    standard error (the data do not determine it: a ridge, warned about on its own) is not
    compared."""
    values = np.asarray(values, np.float64)
    kept = values[best]
    stderr = np.asarray(stderr, np.float64)
    apart = np.abs(values - kept) > np.maximum(5.0 * stderr, 1e-3 * (1.0 + np.abs(kept)))
    apart &= np.isfinite(stderr) & np.all(np.isfinite(values), axis=1, keepdims=True)
    apart &= np.asarray(reached, bool)[:, None]
    if not apart.any():
        return None
    start, unknown = (int(i) for i in np.argwhere(apart)[0])
    others = int(np.sum(apart.any(axis=1)))
    return (
        f"{others} start(s) reached the kept loss elsewhere (start {start}: {names[unknown]} "
        f"{values[start, unknown]:.6g} against {kept[unknown]:.6g}, beyond 5 standard errors): "
        "the loss has several optima of equal height (a symmetry of the model, two rates that "
        "can swap, say); the standard errors and intervals describe the kept one only"
    )
