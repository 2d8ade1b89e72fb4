"""Gradients of a universal differential equation (a neural network inside a mechanistic model)
with respect to the network's weights: diffsim's default against diffrax's adjoints.

The model is Lotka–Volterra with its interaction terms learned (Rackauckas et al. 2020):
du/dt = α u + NN(u, v)₁, dv/dt = −δ v + NN(u, v)₂, an `eqx.nn.MLP` (two hidden layers, GELU)
as a field of a `ds.AbstractODE`. The loss is the mean squared error over 31 output times on
[0, 3]; Tsit5 at rtol = atol = 1e-6, float32, default options everywhere. Per network size
(widths giving ~1e3, 1e4 and 1e5 weights):

  - diffsim: `eqx.filter_grad` through `ds.simulate` (the default derivative rule);
  - diffrax `RecursiveCheckpointAdjoint` (its default) and `BacksolveAdjoint`, the same
    vector field and tolerances through `diffrax.diffeqsolve` with `SaveAt(ts=...)`;
  - torchdiffeq's `odeint_adjoint` (the bench extra's torch on its CPU build): the same
    network and weights as a `torch.nn.Sequential` (GELU in the tanh form, JAX's default),
    dopri5 at the same tolerances (torchdiffeq has no Tsit5), the gradient by
    `loss.backward()`; nothing to compile, and no XLA memory figure.

Compile time (trace + lower + compile of the jitted gradient), run time (median after a
warm-up, `block_until_ready`), XLA's temporary buffer size of the compiled program (its
`memory_analysis`, a proxy for peak memory), and the gradient error: the largest difference
from diffrax's default gradient relative to its largest entry. Ratios are against diffrax's
default, as the targets of hybrid models are.

`--train S` instead trains a PEtab-SciML problem (`--problem`: Dandekar's UDE, the default, or
Ko's neural ODE) with `ds.train` from S seeded network initialisations (Adam `--steps`, default
3,000, at `--learning-rate`, default 3e-3, then L-BFGS `--lbfgs-steps`, default 2,000,
float64; with `--collocate`, from `ds.collocate`'s start) and reports the best validation
log-likelihood (checked every `--every` steps) against the collection's expected one.

Run: `python experiments/bench/hybrid.py [--quick] [--train S [--problem P] [--steps N]
[--lbfgs-steps N] [--learning-rate R] [--every N] [--collocate]]`
"""

import argparse
import os
import sys
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _timing import compile_seconds, machine_line, record, run_seconds, table

import diffsim as ds

RTOL = ATOL = 1e-6
TS = np.linspace(0.0, 3.0, 31).astype(np.float32)
Y0 = np.array([0.44, 4.6], np.float32)


class UDE(ds.AbstractODE):
    """Lotka–Volterra's growth and decay, the interactions learned by `net`."""

    alpha: jax.Array
    delta: jax.Array
    net: eqx.nn.MLP

    def vector_field(self, t, y, args=None):
        return jnp.stack([self.alpha * y[0], -self.delta * y[1]]) + self.net(y)


def _width(weights: int) -> int:
    """The hidden width whose MLP 2 → w → w → 2 has about `weights` weights (w² + 6w + 2)."""
    return max(2, int(round((-6 + np.sqrt(36 + 4 * (weights - 2))) / 2)))


def _data() -> jnp.ndarray:
    """The target trajectory: Lotka–Volterra with β = 0.9, γ = 0.8 (what the network learns)."""
    truth = ds.ODE(
        lambda t, y, p: jnp.stack(
            [1.3 * y[0] - 0.9 * y[0] * y[1], -1.8 * y[1] + 0.8 * y[0] * y[1]]
        ),
        {},
    )
    return ds.simulate(truth, jnp.asarray(Y0), TS, solver=ds.Tsit5(rtol=RTOL, atol=ATOL)).ys


def _losses(model: UDE, data):
    """{method: loss(net)} for the three ways of differentiating the solve."""

    def diffsim_loss(net):
        solution = ds.simulate(
            eqx.tree_at(lambda m: m.net, model, net),
            jnp.asarray(Y0),
            jnp.asarray(TS),
            solver=ds.Tsit5(rtol=RTOL, atol=ATOL),
        )
        return jnp.mean((solution.ys - data) ** 2)

    def diffrax_loss(adjoint):
        def loss(net):
            ude = eqx.tree_at(lambda m: m.net, model, net)
            solution = diffrax.diffeqsolve(
                # the model as `args`: BacksolveAdjoint differentiates only explicit inputs
                diffrax.ODETerm(lambda t, y, ude: ude.vector_field(t, y)),
                diffrax.Tsit5(),
                float(TS[0]),
                float(TS[-1]),
                None,
                jnp.asarray(Y0),
                args=ude,
                saveat=diffrax.SaveAt(ts=jnp.asarray(TS)),
                stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
                adjoint=adjoint,
                max_steps=4096,
            )
            return jnp.mean((solution.ys - data) ** 2)

        return loss

    return {
        "diffsim default": diffsim_loss,
        "diffrax RecursiveCheckpointAdjoint": diffrax_loss(diffrax.RecursiveCheckpointAdjoint()),
        "diffrax BacksolveAdjoint": diffrax_loss(diffrax.BacksolveAdjoint()),
    }


def _network(weights: int):
    """(the UDE, its network's arrays, the rest) for a network of about `weights` weights."""
    net = eqx.nn.MLP(2, 2, _width(weights), 2, activation=jax.nn.gelu, key=jax.random.key(0))
    # small output weights: the learned term starts near zero, as in a UDE's training
    net = eqx.tree_at(lambda n: n.layers[-1].weight, net, net.layers[-1].weight * 0.01)
    model = UDE(jnp.asarray(1.3, jnp.float32), jnp.asarray(1.8, jnp.float32), net)
    return model, *eqx.partition(net, eqx.is_array)


WARM_UP_WEIGHTS = 57  # above the 32 inputs where diffsim's default turns to its reverse pass


def warm_up(data) -> None:
    """The gradients the targets compare compiled once for a small network, so that what a
    process pays once (the first trace of each library's solve and adjoint, JAX's own
    caches) is charged to neither's compile time: measured first in a fresh process,
    diffsim's default paid ~1 s of it (2026-12-07)."""
    model, params, static = _network(WARM_UP_WEIGHTS)
    losses = _losses(model, data)
    # the two the targets compare (BacksolveAdjoint, measured after them, finds diffrax warm)
    for name in ("diffsim default", "diffrax RecursiveCheckpointAdjoint"):
        loss = losses[name]
        grad = jax.jit(jax.grad(lambda p, loss=loss: loss(eqx.combine(p, static))))
        compile_seconds(grad, params)


def measure(weights: int, data, repeats: int) -> list[dict]:
    model, params, static = _network(weights)
    net = model.net
    count = sum(x.size for x in jax.tree.leaves(params))
    rows, gradients = [], {}
    for name, loss in _losses(model, data).items():
        grad = jax.jit(jax.grad(lambda p, loss=loss: loss(eqx.combine(p, static))))
        compile_s, compiled = compile_seconds(grad, params)
        run_s = run_seconds(compiled, params, repeats=repeats)
        memory = compiled.memory_analysis()
        temp = getattr(memory, "temp_size_in_bytes", float("nan")) if memory else float("nan")
        gradients[name] = np.concatenate([np.ravel(g) for g in jax.tree.leaves(compiled(params))])
        rows.append(dict(method=name, weights=count, compile_s=compile_s, run_s=run_s, temp=temp))
    torch_row = _torchdiffeq(net, model, data, repeats)
    if torch_row is not None:
        row, gradient = torch_row
        rows.append(dict(row, weights=count))
        gradients[row["method"]] = gradient
    reference = gradients["diffrax RecursiveCheckpointAdjoint"]
    scale = float(np.max(np.abs(reference)))
    for row in rows:
        row["difference"] = float(np.max(np.abs(gradients[row["method"]] - reference))) / scale
    return rows


def _torchdiffeq(net, model, data, repeats: int):
    """(row, flat gradient in the MLP's leaf order) for torchdiffeq's adjoint, or None where
    torch or torchdiffeq is not installed."""
    try:
        import torch
        from torchdiffeq import odeint_adjoint
    except ImportError:
        return None
    import time

    layers = []
    for i, layer in enumerate(net.layers):
        linear = torch.nn.Linear(layer.in_features, layer.out_features)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.array(layer.weight)))
            linear.bias.copy_(torch.from_numpy(np.array(layer.bias)))
        layers.append(linear)
        if i < len(net.layers) - 1:
            layers.append(torch.nn.GELU(approximate="tanh"))
    mlp = torch.nn.Sequential(*layers)
    alpha, delta = float(model.alpha), float(model.delta)

    class Field(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp

        def forward(self, t, y):
            growth = torch.stack([alpha * y[0], -delta * y[1]])
            return growth + self.net(y)

    field = Field()
    y0, ts = torch.from_numpy(Y0.copy()), torch.from_numpy(TS.copy())
    target = torch.from_numpy(np.array(data))

    def gradient():
        field.zero_grad()
        ys = odeint_adjoint(field, y0, ts, rtol=RTOL, atol=ATOL, method="dopri5")
        torch.mean((ys - target) ** 2).backward()

    gradient()  # warm-up
    times = []
    for _ in range(min(repeats, 2)):  # seconds a gradient at 1e4 weights and more
        start = time.perf_counter()
        gradient()
        times.append(time.perf_counter() - start)
    flat = np.concatenate(
        [
            np.ravel(p.grad.numpy())
            for linear in layers
            if isinstance(linear, torch.nn.Linear)
            for p in (linear.weight, linear.bias)
        ]
    )
    row = dict(method="torchdiffeq odeint_adjoint", compile_s=None, run_s=float(np.median(times)))
    return dict(row, temp=None), flat


SCIML = os.path.join(os.path.dirname(__file__), "..", "data", "petab-sciml")
# expected_<problem>.yaml: the log-likelihoods at the published weights
EXPECTED = {
    "Dandekar_Patterns2020": dict(train=-118.34924348758996, validation=-30.39590464896155),
    "Ko_NeurIPS2023": dict(train=-740.8365268083237, validation=-271.75114583603334),
}


def train_sciml(
    name: str,
    seeds,
    steps: int,
    lbfgs_steps: int,
    learning_rate: float = 3e-3,
    collocate: bool = False,
    every: int = 100,
) -> list[dict]:
    """`ds.train` of a PEtab-SciML problem (`EXPECTED`'s names) from seeded network
    initialisations and neutral mechanistic guesses (0.1 each), validation on its held-out
    data checked every `every` steps (with `collocate`, from `ds.collocate`'s start): the
    best validation and training log-likelihoods, compile and run seconds."""
    import dataclasses

    folder = os.path.join(SCIML, name)
    train = ds.petab.load(os.path.join(folder, f"train_{name}.yaml"))
    validation = ds.petab.load(os.path.join(folder, f"validation_{name}.yaml"))
    unknowns = {
        n: dataclasses.replace(u, value=0.1) if n in train.names else u
        for n, u in train.unknowns.items()
    }
    rows = []
    for seed in seeds:
        net = train.model.nets["net1"].initialised(jax.random.PRNGKey(seed))
        model = eqx.tree_at(lambda m: m.nets["net1"], train.model, net)
        problem = ds.Problem(
            model, train.experiments, train.observables, unknowns, solver=train.solver
        )
        clock = time.perf_counter()
        if collocate:
            problem = ds.collocate(problem, 'nets["net1"]')
        collocated = time.perf_counter() - clock
        out = ds.train(
            problem,
            'nets["net1"]',
            steps=steps,
            learning_rate=learning_rate,
            lbfgs_steps=lbfgs_steps,
            validation=validation,
            every=every,
            progress=False,
        )
        rows.append(
            dict(
                seed=seed,
                validation=out.validation_llh,
                train=out.llh,
                best_step=out.best_step,
                collocate_s=collocated,
                compile_s=out.seconds["compile"],
                run_s=out.seconds["run"],
            )
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e3 weights only, for smoke tests")
    parser.add_argument(
        "--train",
        type=int,
        default=0,
        metavar="SEEDS",
        help="instead, train a PEtab-SciML problem from this many seeded starts",
    )
    parser.add_argument("--problem", default="Dandekar_Patterns2020", choices=sorted(EXPECTED))
    parser.add_argument("--steps", type=int, default=3000, help="Adam's (with --train)")
    parser.add_argument("--lbfgs-steps", type=int, default=2000, help="L-BFGS's (with --train)")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="Adam's (with --train)")
    parser.add_argument("--every", type=int, default=100, help="steps between validation checks")
    parser.add_argument(
        "--collocate", action="store_true", help="start training from ds.collocate (with --train)"
    )
    args = parser.parse_args(argv)
    if args.train:
        jax.config.update("jax_enable_x64", True)
        rows = train_sciml(
            args.problem,
            range(args.train),
            args.steps,
            args.lbfgs_steps,
            learning_rate=args.learning_rate,
            collocate=args.collocate,
            every=args.every,
        )
        expected = EXPECTED[args.problem]
        print(
            table(
                [
                    [
                        r["seed"],
                        f"{r['validation']:.3f}",
                        f"{r['train']:.3f}",
                        r["best_step"],
                        f"{r['collocate_s']:.1f}",
                        f"{r['compile_s']:.1f}",
                        f"{r['run_s']:.1f}",
                    ]
                    for r in rows
                ],
                [
                    "seed",
                    "validation llh",
                    "training llh",
                    "best step",
                    "collocate s",
                    "compile s",
                    "run s",
                ],
            )
        )
        print(
            f"{args.problem}, expected (published weights): validation "
            f"{expected['validation']:.3f}, training {expected['train']:.3f}"
        )
        return
    sizes = (1_000,) if args.quick else (1_000, 10_000, 100_000)
    repeats = 3 if args.quick else 10
    print(machine_line())
    print(f"UDE (Lotka–Volterra + MLP), Tsit5 rtol = atol = {RTOL:g}, float32, 31 outputs\n")
    data = _data()
    warm_up(data)
    print(
        f"(diffsim's and diffrax's default gradients compiled once first for a {WARM_UP_WEIGHTS}-"
        "weight network: the process's one-time costs are in no row)\n"
    )
    table_rows = []
    for weights in sizes:
        rows = measure(weights, data, repeats)
        base = next(r for r in rows if r["method"] == "diffrax RecursiveCheckpointAdjoint")
        for row in rows:
            record(
                f"UDE gradient, {row['weights']:,} weights",
                row["method"],
                compile_s=row["compile_s"],
                run_s=row["run_s"],
                temp_bytes=row["temp"],
            )
            compiled = row["compile_s"] is not None
            table_rows.append(
                [
                    f"{row['weights']:,}",
                    row["method"],
                    f"{row['compile_s']:.2f}" if compiled else "–",
                    f"{1e3 * row['run_s']:.2f}",
                    f"{row['run_s'] / base['run_s']:.2f}",
                    f"{row['compile_s'] / base['compile_s']:.2f}" if compiled else "–",
                    f"{row['temp'] / 2**20:.1f}" if row["temp"] is not None else "–",
                    f"{row['difference']:.1e}",
                ]
            )
    print(
        table(
            table_rows,
            [
                "weights",
                "method",
                "compile s",
                "run ms",
                "run / diffrax default",
                "compile / diffrax default",
                "temp MiB",
                "gradient error (rel.)",
            ],
        )
    )


if __name__ == "__main__":
    main()
