"""Figures users draw daily: trajectories, phase portraits, sweep heatmaps, fits with residuals
and convergence plots; the shared style and byte-stable saving.

Every helper draws into `ax` when given (and returns its figure) or makes a new figure, and
returns the `matplotlib.figure.Figure`. matplotlib is imported inside the functions, so that
`import diffsim` does not load it.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ._fit.plot import fit as _fit_figure
from ._validate import is_count, user_path

STYLE = Path(__file__).parent / "style" / "diffsim.mplstyle"
"""The path of diffsim's matplotlib style file (`diffsim/style/diffsim.mplstyle`): matplotlib's
bundled DejaVu Sans, fixed sizes and DPI, no settings that depend on the machine, so that figures
come out byte for byte the same wherever matplotlib is the same. `plt.style.use(ds.plot.STYLE)`
applies it for good, `ds.plot.style()` within a `with` block."""


def style():
    """A context manager applying diffsim's matplotlib style (`STYLE`); `diffsim reproduce`
    applies it to every experiment. Use `plt.style.use(ds.plot.STYLE)` to apply it for good."""
    import matplotlib.pyplot as plt

    return plt.style.context(STYLE)


def save(
    fig,
    out_dir: str | Path,
    name: str,
    *,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: float | None = None,
) -> list[str]:
    """Save `fig` as `out_dir/name.<format>` for each format with no creation date or software
    stamp in the file, so that a rerun writes the same bytes.

    **Arguments:** `fig` a matplotlib figure; `out_dir` a folder (created); `name` the file name
    without suffix; `formats` any of `png`, `pdf`, `svg`; `dpi` for raster formats (default:
    matplotlib's `savefig.dpi`, 130 under `style()`).

    **Returns:** the file names written, relative to `out_dir`.
    """
    out = user_path(out_dir, "out_dir")
    out.mkdir(parents=True, exist_ok=True)
    # what each backend would stamp into the file: a date, or a version that changes the bytes
    # across otherwise identical installs
    stamps = {
        "png": {"Software": None},
        "pdf": {"CreationDate": None, "Producer": None},
        "svg": {"Date": None},
    }
    import matplotlib

    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    unknown = sorted(set(formats) - set(stamps))
    if unknown:
        raise ValueError(f"save: unknown formats {unknown}; choose from {sorted(stamps)}")
    written = []
    # SVG ids are random unless salted: salt them with the name (whatever style is active)
    with matplotlib.rc_context({"svg.hashsalt": name}):
        for fmt in formats:
            kwargs = {} if dpi is None or fmt == "pdf" else {"dpi": dpi}
            fig.savefig(out / f"{name}.{fmt}", format=fmt, metadata=stamps[fmt], **kwargs)
            written.append(f"{name}.{fmt}")
    return written


def _figure_and_axes(ax, **subplots):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    return plt.subplots(**subplots)


def _states(ys) -> np.ndarray:
    """A state pytree with a leading time axis → array (times, components), leaves flattened
    and concatenated in pytree order."""
    import jax

    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(ys)]
    if not leaves:
        raise ValueError("no states to plot")
    times = leaves[0].shape[0]
    return np.concatenate([leaf.reshape(times, -1) for leaf in leaves], axis=1)


def _names(names, count: int) -> list[str]:
    if names is None:
        return [f"y[{i}]" for i in range(count)]
    if isinstance(names, str):
        raise TypeError(f"names must be a list of labels, one per component, got {names!r}")
    names = list(names)
    if len(names) != count:
        raise ValueError(f"got {len(names)} names for {count} state components")
    return names


def _components(which, count: int, what: str = "component") -> None:
    """Indices into `count` state components, checked (NumPy would raise its own error)."""
    for i in which:
        if not is_count(i) or not -count <= i < count:
            raise ValueError(
                f"{what} {i!r} is not an index of the {count} state components (0 to {count - 1})"
            )


def _solution(solution, function: str):
    from ._integrate.simulate import Solution

    if not isinstance(solution, Solution):
        raise TypeError(
            f"ds.plot.{function} takes a ds.Solution (from ds.simulate), got "
            f"{type(solution).__name__}"
        )
    return solution


def trajectory(
    solution,
    *,
    names: Sequence[str] | None = None,
    components: Sequence[int] | None = None,
    ax=None,
    **plot_kwargs,
):
    """States against time, one line per component.

    **Arguments:** `solution` a `ds.Solution` (its `ts` and `ys`; pytree states are flattened);
    `names` labels of the flattened components (e.g. `model.state_names`); `components` which
    of them to draw (default all); `ax` axes to draw into; `plot_kwargs` go to `ax.plot`.

    **Returns:** the figure.
    """
    solution = _solution(solution, "trajectory")
    ts = np.asarray(solution.ts)
    states = _states(solution.ys)
    labels = _names(names, states.shape[1])
    if components is not None:
        _components(components, states.shape[1])
    fig, ax = _figure_and_axes(ax, figsize=(6.0, 3.6), layout="constrained")
    for i in range(states.shape[1]) if components is None else components:
        ax.plot(ts, states[:, i], label=labels[i], **plot_kwargs)
    ax.set_xlabel("t")
    ax.legend()
    return fig


def phase_portrait(
    states, x: int = 0, y: int = 1, *, names: Sequence[str] | None = None, ax=None, **plot_kwargs
):
    """One state component against another.

    **Arguments:** `states` a `ds.Solution`, or states of shape (times, components) for one
    trajectory or (members, times, components) for several (e.g. from `jax.vmap`); `x`, `y` the
    components on the axes; `names` labels of the components; `ax` axes to draw into;
    `plot_kwargs` go to `ax.plot`.

    **Returns:** the figure.
    """
    from ._integrate.simulate import Solution

    if isinstance(states, Solution):
        paths = _states(states.ys)[None]
    else:
        paths = np.asarray(states)
        if paths.ndim == 2:
            paths = paths[None]
        if paths.ndim != 3:
            raise ValueError(
                "phase_portrait: states must be (times, components) or (members, times, "
                f"components), got shape {paths.shape}"
            )
    labels = _names(names, paths.shape[2])
    _components([x, y], paths.shape[2], "axis component")
    fig, ax = _figure_and_axes(ax, figsize=(4.8, 4.2), layout="constrained")
    kwargs = {"lw": 0.8, **plot_kwargs}
    for path in paths:
        ax.plot(path[:, x], path[:, y], **kwargs)
    ax.set_xlabel(labels[x])
    ax.set_ylabel(labels[y])
    return fig


def sweep_heatmap(
    dataset,
    variable: str,
    *,
    x: str | None = None,
    y: str | None = None,
    select: Mapping | None = None,
    log: bool = False,
    ax=None,
    **mesh_kwargs,
):
    """A variable of a `ds.sweep` dataset over two of its parameter axes, as a colour map.

    **Arguments:** `dataset` the `xarray.Dataset` of `ds.sweep`/`ds.open_sweep`; `variable` the
    name of an output (`"final_state"`, `"max_abs"`, `"result"`, …); `x`, `y` the dimensions on
    the axes (default: the variable's first two); `select` picks one value of every other
    dimension (`{"state": "angle"}`, by label); `log` a logarithmic colour scale; `ax` axes to
    draw into; `mesh_kwargs` go to `pcolormesh`.

    **Returns:** the figure.
    """
    import matplotlib.colors

    field = _selected(dataset, variable, select, "sweep_heatmap")
    dims = list(field.dims)
    x = dims[0] if x is None and dims else x
    y = next((d for d in dims if d != x), None) if y is None else y
    rest = [d for d in dims if d not in (x, y)]
    if x not in dims or y not in dims or rest:
        raise ValueError(
            f"sweep_heatmap: {variable} has dimensions {tuple(dims)}; choose x and y among them "
            f"and pick one value of the others with select={{...}} (left over: {rest})"
        )
    values = np.asarray(field.transpose(y, x).values, dtype=float)
    fig, ax = _figure_and_axes(ax, figsize=(5.4, 4.2), layout="constrained")
    norm = matplotlib.colors.LogNorm() if log else None
    mesh = ax.pcolormesh(
        np.asarray(field[x]), np.asarray(field[y]), values, shading="auto", norm=norm, **mesh_kwargs
    )
    label = variable + "".join(f", {k}={v}" for k, v in (select or {}).items())
    fig.colorbar(mesh, ax=ax, label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    return fig


def sweep_line(
    dataset,
    variable: str,
    *,
    x: str | None = None,
    hue: str | None = None,
    select: Mapping | None = None,
    log: bool = False,
    ax=None,
    **line_kwargs,
):
    """A variable of a `ds.sweep` dataset over one of its parameter axes, as lines: one line,
    or one per value of a second dimension (`hue`).

    **Arguments:** `dataset` the `xarray.Dataset` of `ds.sweep`/`ds.open_sweep`; `variable` the
    name of an output; `x` the dimension on the horizontal axis (default: the variable's
    first); `hue` the dimension whose values give one line each (default: the one left, if
    any); `select` picks one value of every other dimension (`{"state": "angle"}`, by label);
    `log` a logarithmic vertical axis; `ax` axes to draw into; `line_kwargs` go to `plot`.

    **Returns:** the figure.
    """
    field = _selected(dataset, variable, select, "sweep_line")
    dims = list(field.dims)
    x = dims[0] if x is None and dims else x
    hue = next((d for d in dims if d != x), None) if hue is None else hue
    rest = [d for d in dims if d not in (x, hue)]
    if x not in dims or (hue is not None and hue not in dims) or rest:
        raise ValueError(
            f"sweep_line: {variable} has dimensions {tuple(dims)}; choose x (and hue) among "
            f"them and pick one value of the others with select={{...}} (left over: {rest})"
        )
    fig, ax = _figure_and_axes(ax, figsize=(5.4, 3.8), layout="constrained")
    label = variable + "".join(f", {k}={v}" for k, v in (select or {}).items())
    if hue is None:
        ax.plot(np.asarray(field[x]), np.asarray(field.values, dtype=float), **line_kwargs)
    else:
        for value in field[hue].values:
            line = field.sel({hue: value})
            ax.plot(
                np.asarray(field[x]),
                np.asarray(line.values, dtype=float),
                label=f"{hue}={value:g}"
                if np.isscalar(value) and not isinstance(value, str)
                else f"{hue}={value}",
                **line_kwargs,
            )
        ax.legend(frameon=False)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(label)
    return fig


def _selected(dataset, variable: str, select, caller: str):
    """`dataset[variable]` with one value of each dimension in `select` picked, checked."""
    if variable not in dataset:
        raise ValueError(
            f"{caller}: no variable {variable!r}; the dataset has {sorted(dataset.data_vars)}"
        )
    field = dataset[variable]
    if select:
        unknown = sorted(set(select) - set(field.dims))
        if unknown:
            raise ValueError(
                f"{caller}: {variable} has no dimensions {unknown}; its dimensions are {field.dims}"
            )
        field = field.sel(dict(select))
    return field


def fit(result, *, points: int = 400):
    """Data, the fitted curve and the residuals of a `ds.FitResult`, one column per observable
    (residuals below, on the scale of the loss: log residuals for `log_loss` fits); of a
    `ds.ProblemFit`, its measurements and predictions, one panel per experiment.

    **Returns:** the figure (`result.plot()` draws the same).
    """
    from ._fit.result import FitResult
    from ._fit.study_fit import ProblemFit

    # the type is checked here, above the fitting layer: the figure itself (diffsim._fit.plot)
    # sits below FitResult, which draws through it, so it cannot import FitResult
    if isinstance(result, ProblemFit):
        return result.plot()
    if not isinstance(result, FitResult):
        raise TypeError(
            f"ds.plot.fit takes a ds.FitResult or a ds.ProblemFit (from ds.fit), got "
            f"{type(result).__name__}"
        )
    return _fit_figure(result, points=points)


def waterfall(result):
    """The final log-likelihoods of a study's starts, best first, as their distance below the
    best (`ds.ProblemFit.plot_waterfall`): how many starts found the best optimum, and which
    other optima they ended in.

    **Returns:** the figure.
    """
    from ._fit.study_fit import ProblemFit

    if not isinstance(result, ProblemFit):
        raise TypeError(
            f"ds.plot.waterfall takes a ds.ProblemFit (ds.fit of a ds.Problem), got "
            f"{type(result).__name__}"
        )
    return result.plot_waterfall()


def sobol_indices(indices, *, labels=None, ax=None):
    """A bar chart of the first-order and total Sobol' indices of `ds.sobol` (its xarray
    Dataset), one pair of bars per parameter with their bootstrap intervals.

    **Arguments:** `indices` what `ds.sobol` returns; `labels` names for the bars (default the
    parameters); `ax` an axes to draw on.

    **Returns:** the figure.
    """
    needed = {"first_order", "total"}
    if not hasattr(indices, "data_vars") or not needed <= set(indices.data_vars):
        raise TypeError(
            "ds.plot.sobol_indices takes the xarray Dataset of ds.sobol (with first_order and "
            f"total), got {type(indices).__name__}"
        )
    names = [str(n) for n in indices["parameter"].values]
    labels = names if labels is None else [str(label) for label in labels]
    if len(labels) != len(names):
        raise ValueError(f"labels has {len(labels)} entries for {len(names)} parameters")
    fig, ax = _figure_and_axes(ax, figsize=(1.4 * len(names) + 2.4, 3.2))
    x = np.arange(len(names))
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "first_order", "first order", "C0"),
        (width / 2, "total", "total", "C1"),
    ):
        value = np.asarray(indices[key])
        error = None
        if f"{key}_low" in indices:
            low, high = np.asarray(indices[f"{key}_low"]), np.asarray(indices[f"{key}_high"])
            error = np.stack([np.maximum(value - low, 0), np.maximum(high - value, 0)])
        ax.bar(x + offset, value, width, yerr=error, capsize=3, color=color, label=label)
    ax.set_xticks(x, labels)
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_ylabel("Sobol' index")
    level = indices.attrs.get("level")
    title = f"N = {indices.attrs.get('base_samples', '?')}"
    if level is not None:
        title += f", {100 * float(level):g}% bootstrap intervals"
    ax.set_title(title, fontsize=9)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def measured_order(steps, errors) -> float:
    """The least-squares slope of log(error) against log(step): a method's measured order of
    accuracy where the errors are in the asymptotic regime (far above round-off)."""
    steps, errors = np.asarray(steps, float), np.asarray(errors, float)
    if steps.shape != errors.shape or steps.ndim != 1 or steps.size < 2:
        raise ValueError(
            f"measured_order: need two equal-length 1-D arrays of at least two "
            f"values, got shapes {steps.shape} and {errors.shape}"
        )
    if not (np.all(steps > 0) and np.all(errors > 0) and np.all(np.isfinite(errors))):
        raise ValueError("measured_order: steps and errors must be positive and finite")
    return float(np.polyfit(np.log(steps), np.log(errors), 1)[0])


def convergence(
    steps,
    errors: Mapping[str, Sequence[float]],
    *,
    orders: Mapping[str, float] | None = None,
    styles: Mapping[str, Mapping] | None = None,
    ax=None,
    xlabel: str = "step size",
    ylabel: str = "error",
):
    """Errors against step size on log-log axes, one line per method, each labelled with its
    measured order (`measured_order`) and, when `orders` gives it, the nominal one, drawn as a
    dotted reference slope through the method's smallest-step error.

    **Arguments:** `steps` step sizes, shape (n,); `errors` method name → errors, shape (n,);
    `orders` method name → nominal order; `styles` method name → keyword arguments of its line
    (`{"Leapfrog": {"ls": "--", "marker": "s"}}`; a `color` applies to its reference slope
    too); `ax` axes to draw into; axis labels. Methods take the colours of the style's cycle in
    turn, and a new marker each time the cycle starts over.

    **Returns:** the figure.
    """
    import matplotlib.pyplot as plt

    steps = np.asarray(steps, float)
    orders = dict(orders or {})
    styles = dict(styles or {})
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["k"])
    markers = "o^vDPX*"
    fig, ax = _figure_and_axes(ax, figsize=(5.8, 4.6), layout="constrained")
    for index, (name, values) in enumerate(errors.items()):
        values = np.asarray(values, float)
        slope = measured_order(steps, values)
        turn, position = divmod(index, len(colours))
        line = {
            "color": colours[position],
            "marker": markers[turn % len(markers)],
            "ms": 3.5,
            "ls": "-",
            **styles.get(name, {}),
        }
        label = f"{name}: {slope:.2f}"
        if name in orders:
            label += f" (order {orders[name]:g})"
            anchor = np.argmin(steps)
            reference = values[anchor] * (steps / steps[anchor]) ** orders[name]
            ax.loglog(steps, reference, ":", color=line["color"], lw=0.8)
        ax.loglog(steps, values, label=label, **line)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(title="measured slope", fontsize=7)
    return fig
