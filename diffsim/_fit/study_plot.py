"""The figures of a study's fit (`ds.ProblemFit`): the measurements against the fitted
predictions, one panel per experiment (`ProblemFit.plot`, `ds.plot.fit`), and the waterfall
of its starts (`ProblemFit.plot_waterfall`, `ds.plot.waterfall`).

It reads only what a `ds.ProblemFit` exposes (its predictions and its starts), so it sits below
`study_fit.py`, which draws through it. matplotlib is imported inside the functions, so that
`import diffsim` does not load it.
"""

import math

import numpy as np

# more panels than this make each unreadable; the figure says how many it leaves out
MAX_PANELS = 12


def fits(result, *, experiments=None):
    """Measurements (points) and the fitted predictions at their times (lines) of every
    observable, one panel per experiment (the first 12, or those named in `experiments`).

    **Returns:** the matplotlib figure."""
    import matplotlib.pyplot as plt

    predicted = result.predictions()
    names = [e.name or f"experiment {i}" for i, e in enumerate(result.problem.experiments)]
    if experiments is None:
        chosen = list(range(min(len(names), MAX_PANELS)))
    else:
        unknown = [n for n in experiments if n not in names]
        if unknown:
            raise ValueError(f"no experiment named {unknown}; the problem's: {names}")
        chosen = [names.index(n) for n in experiments]
    columns = min(len(chosen), 3)
    rows = math.ceil(len(chosen) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.4 * columns, 3.3 * rows), squeeze=False, constrained_layout=True
    )
    observables = list(result.problem.observables)
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for panel, e in enumerate(chosen):
        ax = axes.flat[panel]
        table = predicted[e]
        for o, name in enumerate(observables):
            mine = np.asarray(table["observable"]) == name
            if not mine.any():
                continue
            color = colors[o % len(colors)]
            time = np.asarray(table["time"], dtype=float)[mine]
            order = np.argsort(time, kind="stable")
            ax.plot(
                time[order],
                np.asarray(table["prediction"], dtype=float)[mine][order],
                color=color,
                label=name,
            )
            ax.plot(
                time,
                np.asarray(table["value"], dtype=float)[mine],
                "o",
                color=color,
                markersize=3.5,
                alpha=0.8,
            )
        ax.set_title(names[e], fontsize="medium")
        ax.set_xlabel("time")
        if len(observables) <= 8:
            ax.legend(fontsize="x-small")
    for ax in axes.flat[len(chosen) :]:
        ax.set_visible(False)
    left_out = len(names) - len(chosen)
    title = f"llh {result.llh:.6g}: data (points) and fit (lines)"
    if left_out and experiments is None:
        title += f"; {left_out} more experiments not drawn"
    fig.suptitle(title, fontsize="medium")
    return fig


def waterfall(result, *, reached: float = 0.1):
    """The starts' final log-likelihoods, best first, as their distance below the best (a
    symmetric-log axis; the starts within `reached` of it, which found the same optimum, in
    their own colour).

    **Returns:** the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    llh = np.asarray(result.starts["llh"], dtype=float)
    finite = np.isfinite(llh)
    below = np.sort(np.max(llh[finite]) - llh[finite]) if finite.any() else np.zeros(0)
    fig, ax = plt.subplots(figsize=(6.0, 3.8), constrained_layout=True)
    rank = np.arange(1, below.size + 1)
    best = below <= reached
    ax.plot(rank, below, color="0.6", linewidth=1)
    ax.plot(rank[best], below[best], "o", color="C0", label=f"within {reached:g} of the best")
    ax.plot(rank[~best], below[~best], "o", color="C3", label="elsewhere")
    ax.set_yscale("symlog", linthresh=reached)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("start (best first)")
    ax.set_ylabel("best llh − llh")
    failed = int((~finite).sum())
    ax.set_title(
        f"{int(best.sum())} of {llh.size} starts reached llh {np.max(llh[finite]):.6g}"
        + (f"; {failed} failed" if failed else "")
        if finite.any()
        else f"every one of {llh.size} starts failed",
        fontsize="medium",
    )
    ax.legend(fontsize="small")
    return fig
