"""The figures of a fit: data, the fitted curve and the residuals (`ds.plot.fit`,
`FitResult.plot`); and those of a posterior (`Posterior.plot`).

It reads only what a `ds.FitResult` exposes, so it sits below `result.py` (which draws through
it); `ds.plot.fit` checks that it is given one. matplotlib is imported inside the function, so
that `import diffsim` does not load it.
"""

import numpy as np

from .._validate import is_count


def fit(result, *, points: int = 400):
    """Data, the fitted curve and the residuals of a `ds.FitResult`, one column per observable
    (residuals below, on the scale of the loss: log residuals for `log_loss` fits).

    **Arguments:** `result` a `ds.FitResult`; `points` the times of the drawn curve (at least 2).

    **Returns:** the figure (`result.plot()` draws the same).
    """
    import matplotlib.pyplot as plt

    # not check_static_count: ds.plot.fit has always raised one ValueError, "an int >= 2", for a
    # non-int and a too-small count alike, where that check would raise TypeError for the former
    if not is_count(points) or points < 2:
        raise ValueError(f"points must be an int >= 2 (times of the drawn curve), got {points!r}")
    ts, curve = result.curve(points)
    data = result.data
    values = data.values.reshape(len(data.ts), -1)
    residuals = result.residuals.reshape(len(data.ts), -1)
    m = values.shape[1]
    names = data.names or tuple(f"observable {i}" for i in range(m))
    fig, axes = plt.subplots(
        2,
        m,
        figsize=(4.2 * m, 4.8),
        sharex=True,
        squeeze=False,
        gridspec_kw=dict(height_ratios=[3, 1]),
    )
    for j in range(m):
        top, bottom = axes[0, j], axes[1, j]
        top.plot(data.ts, values[:, j], "o", ms=3.5, color="0.25", label="data")
        top.plot(ts, curve[:, j], "-", color="C0", label="fit")
        top.set_title(names[j])
        bottom.axhline(0.0, color="0.6", lw=0.8)
        bottom.plot(data.ts, residuals[:, j], "o", ms=3, color="C3")
        bottom.set_xlabel("t")
        bottom.set_ylabel("log residual" if result.log_loss else "residual")
    axes[0, 0].legend(frameon=False)
    fig.tight_layout()
    return fig


POSTERIOR_KINDS = ("predictive", "trace", "pair")


def posterior_figure(posterior, kind: str, **kwargs):
    """The figures of a `ds.Posterior` (`Posterior.plot`): `"predictive"` draws the data over
    the bands of `posterior.predict(**kwargs)`; `"trace"` and `"pair"` are ArviZ's
    `plot_trace` and `plot_pair` (divergences marked) of its draws."""
    import matplotlib.pyplot as plt

    if kind not in POSTERIOR_KINDS:
        raise ValueError(f"kind must be one of {POSTERIOR_KINDS}, got {kind!r}")
    if kind in ("trace", "pair"):
        from .libraries import arviz

        az = arviz()
        idata = posterior.to_arviz()
        if kind == "trace":
            axes = az.plot_trace(idata, compact=False, **kwargs)
        else:
            axes = az.plot_pair(idata, divergences=True, **kwargs)
        figure = np.ravel(axes)[0].figure
        figure.tight_layout()
        return figure
    bands = posterior.predict(**kwargs)
    data = posterior.data
    values = data.values.reshape(len(data.ts), -1)
    names = list(bands["observable"].values)
    m = len(names)
    fig, axes = plt.subplots(1, m, figsize=(4.2 * m, 3.4), squeeze=False)
    ts = bands["time"].values
    percent = f"{100 * bands.attrs['level']:g}%"
    for j, ax in enumerate(axes[0]):
        column = bands.isel(observable=j)
        ax.fill_between(
            ts,
            column["data_low"],
            column["data_high"],
            color="C0",
            alpha=0.15,
            lw=0,
            label=f"new data, {percent}",
        )
        ax.fill_between(
            ts,
            column["model_low"],
            column["model_high"],
            color="C0",
            alpha=0.35,
            lw=0,
            label=f"model, {percent}",
        )
        ax.plot(ts, column["model_median"], "-", color="C0", lw=1.2, label="model, median")
        ax.plot(data.ts, values[:, j], "o", ms=3.5, color="0.2", label="data")
        ax.set_title(names[j])
        ax.set_xlabel("t")
    axes[0, 0].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
