"""Figures: `ds.plot.trajectory`, `phase_portrait`, `sweep_heatmap`, `sweep_line`, `fit`,
`convergence`, `sobol_indices`, `waterfall`, each returning the matplotlib figure; the shared
style (`STYLE`, `style()`) and byte-stable `save`."""

from ._plot import (
    convergence as convergence,
    fit as fit,
    measured_order as measured_order,
    phase_portrait as phase_portrait,
    save as save,
    sobol_indices as sobol_indices,
    STYLE as STYLE,
    style as style,
    sweep_heatmap as sweep_heatmap,
    sweep_line as sweep_line,
    trajectory as trajectory,
    waterfall as waterfall,
)
