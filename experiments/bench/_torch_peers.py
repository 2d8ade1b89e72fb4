"""PyTorch / torchdiffeq peers of the benchmark problems, timed on the CPU in the same process.

Each peer solves the same ensemble as its diffsim benchmark, as ONE batched float32 state tensor
of shape (N, d) on the CPU (no Python loop over members), under `torch.no_grad()`, saving only
t=0 and t=t1. Timings are the median wall time (seconds, `time.perf_counter`) of whole
`torchdiffeq.odeint` calls after one warm-up call; CPU torch is synchronous, so no explicit wait
is needed. torch is imported lazily: this module imports without it, and `available()` says why
the peers cannot run.

Note that torchdiffeq's `method="rk4"` is the 3/8-rule variant of fourth-order Runge-Kutta
(`rk4_alt_step_func`), not the classical tableau: same order and cost (4 evaluations per step),
slightly different truncation error.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

_THREADS_SET = False


def available() -> str | None:
    """None when torch and torchdiffeq import, else a short reason string."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch not installed: pip install '.[bench]'"
    try:
        import torchdiffeq  # noqa: F401
    except ImportError:
        return "torchdiffeq not installed: pip install '.[bench]'"
    return None


def versions() -> dict:
    """{"torch": ..., "torchdiffeq": ...}, or {} when the peers are unavailable."""
    if available() is not None:
        return {}
    import torch
    import torchdiffeq

    return {"torch": torch.__version__, "torchdiffeq": torchdiffeq.__version__}


def _torch():
    """Import torch, setting its intra-op thread count to `os.cpu_count()` once per process."""
    global _THREADS_SET
    import torch

    if not _THREADS_SET:
        torch.set_num_threads(os.cpu_count() or 1)
        _THREADS_SET = True
    return torch


def _counted(rhs_module_cls, *, adaptive: bool):
    """Wrap an RHS `nn.Module` class so it counts vector-field calls and torchdiffeq's step
    callbacks: attempted steps, plus accepted / rejected ones for adaptive solvers (fixed-grid
    solvers would warn about those two callbacks)."""

    class Counted(rhs_module_cls):
        def reset(self):
            self.function_evals = self.steps = self.accepted = self.rejected = 0

        def forward(self, t, y):
            self.function_evals += 1
            return super().forward(t, y)

        def callback_step(self, t0, y0, dt):
            self.steps += 1

    if not adaptive:
        return Counted

    class CountedAdaptive(Counted):
        def callback_accept_step(self, t0, y0, dt):
            self.accepted += 1

        def callback_reject_step(self, t0, y0, dt):
            self.rejected += 1

    return CountedAdaptive


def _solve(rhs, y0, t1: float, repeats: int, **odeint_kwargs) -> dict:
    """Time `odeint(rhs, y0, [0, t1], **odeint_kwargs)`: median of `repeats` calls after one
    warm-up; returns {"run_s", "final" (NumPy, y0's shape), "function_evals" and "steps"
    (attempted steps) of the last call}; `rhs` keeps the last call's counters."""
    torch = _torch()
    from torchdiffeq import odeint

    t = torch.tensor([0.0, t1], dtype=torch.float32)
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            rhs.reset()
            start = time.perf_counter()
            ys = odeint(rhs, y0, t, **odeint_kwargs)
            if i:
                times.append(time.perf_counter() - start)
    return {
        "run_s": statistics.median(times),
        "final": ys[-1].numpy().copy(),
        "function_evals": rhs.function_evals,
        "steps": rhs.steps,
    }


def _pendulum_module():
    nn = _torch().nn

    class Pendulum(nn.Module):
        """theta'' = -(g/L) sin(theta) - damping * theta'; state (N, 2) = (theta [rad], omega
        [rad/s]); `g_over_l` [1/s^2] and `damping` [1/s] have shape (N,)."""

        def __init__(self, g_over_l, damping):
            super().__init__()
            self.g_over_l, self.damping = g_over_l, damping

        def forward(self, t, y):
            theta, omega = y[:, 0], y[:, 1]
            domega = -self.g_over_l * theta.sin() - self.damping * omega
            return _torch().stack((omega, domega), dim=1)

    return _counted(Pendulum, adaptive=False)


def _lorenz_module(adaptive: bool = False):
    nn = _torch().nn

    class Lorenz(nn.Module):
        """Lorenz system, sigma=10, beta=8/3, per-member `rho` of shape (N,); state (N, 3)."""

        def __init__(self, rho):
            super().__init__()
            self.rho = rho

        def forward(self, t, u):
            x, y, z = u[:, 0], u[:, 1], u[:, 2]
            return _torch().stack(
                (10.0 * (y - x), x * (self.rho - z) - y, x * y - (8.0 / 3.0) * z), dim=1
            )

    return _counted(Lorenz, adaptive=adaptive)


def pendulum_rk4(lengths, dampings, *, gravity, t1, steps, y0, repeats) -> dict:
    """Damped pendulum ensemble by torchdiffeq RK4 (3/8 rule), step t1/steps, float32 on CPU.

    lengths [m], dampings [1/s]: NumPy float32 arrays of shape (N,); gravity [m/s^2]; t1 [s];
    y0 = (theta0 [rad], omega0 [rad/s]) shared by all members. Returns {"run_s": median seconds
    of one odeint call, "final": NumPy (N, 2) states at t1, "function_evals", "steps", ...}.
    """
    torch = _torch()
    lengths = torch.as_tensor(np.array(lengths, np.float32))
    dampings = torch.as_tensor(np.array(dampings, np.float32))
    rhs = _pendulum_module()(gravity / lengths, dampings)
    state0 = torch.tensor(y0, dtype=torch.float32).expand(len(lengths), 2).contiguous()
    return _solve(rhs, state0, t1, repeats, method="rk4", options={"step_size": t1 / steps})


def _lorenz_y0(n: int):
    torch = _torch()
    return torch.tensor([1.0, 0.0, 0.0], dtype=torch.float32).expand(n, 3).contiguous()


def lorenz_fixed(rhos, *, dt, t1, repeats) -> dict:
    """Lorenz ensemble (sigma=10, beta=8/3, rho=rhos[i]; rhos NumPy float32 (N,)), u0=(1, 0, 0),
    t in [0, t1], torchdiffeq RK4 (3/8 rule) with fixed step dt, float32 on CPU.

    Returns {"run_s": median seconds of one odeint call, "final": NumPy (N, 3), counters}.
    """
    rho = _torch().as_tensor(np.array(rhos, np.float32))
    rhs = _lorenz_module()(rho)
    return _solve(rhs, _lorenz_y0(len(rho)), t1, repeats, method="rk4", options={"step_size": dt})


ADAPTIVE_NOTE = (
    "torchdiffeq adapts ONE step size for the whole batched (N, 3) tensor: its error norm (RMS "
    "over all members' components) spans the batch, so all members share one step sequence and "
    "the tolerance holds for the batch average, not per member; diffsim under jax.vmap adapts "
    "each member's step size separately"
)


def lorenz_adaptive(rhos, *, rtol, atol, t1, repeats, method="dopri5") -> dict:
    """Lorenz ensemble as in `lorenz_fixed`, by an adaptive torchdiffeq solver (default dopri5;
    torchdiffeq has no Tsit5) at the given rtol / atol, float32 on CPU.

    torchdiffeq adapts ONE step size for the whole batched tensor: its error norm (RMS over all
    members' components) spans the batch, so all members share one step sequence, unlike the
    per-member adaptivity of diffsim under `jax.vmap`. Returns {"run_s", "final": NumPy (N, 3),
    "function_evals": vector-field calls (each on the whole batch) of one solve, "steps":
    accepted steps, "rejected": rejected steps, "note": that caveat}.
    """
    rho = _torch().as_tensor(np.array(rhos, np.float32))
    rhs = _lorenz_module(adaptive=True)(rho)
    out = _solve(rhs, _lorenz_y0(len(rho)), t1, repeats, method=method, rtol=rtol, atol=atol)
    out.update(steps=rhs.accepted, rejected=rhs.rejected)
    out["note"] = ADAPTIVE_NOTE
    return out
