"""A universal differential equation: Lotka–Volterra's interaction terms learned by a network.

The prey grows (α u) and the predator decays (−δ v) at known rates; how they interact
(−β uv for the prey, +γ uv for the predator, with β = 0.9, γ = 0.8) is unknown and an
`eqx.nn.MLP` (2 → 16 → 16 → 2, GELU, 354 weights; seeded initialisation, its output layer
scaled by 0.01 so the learned term starts near zero) stands for it: du/dt = α u + NN(u, v)₁,
dv/dt = −δ v + NN(u, v)₂ (Rackauckas et al., "Universal differential equations for scientific
machine learning", 2020). It is trained on three trajectories from different initial states
(31 times each on [0, 3], Tsit5 at rtol = atol = 1e-6) by Adam (learning rate 1e-2) on the
mean squared error, the gradient by `jax.grad` through `ds.simulate` (the default rule: a
checkpointed reverse pass for this many weights), all three trajectories in one `vmap`.
Figures: the data and the trained model's trajectories, the training loss, and the learned
term against the interaction it stands for along the trajectories (the full run: 1,500 steps;
the quick run: 150).

Run: `python experiments/ude_lotka_volterra.py [--out DIR] [--quick]`
"""

import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).parent))
import _output

import diffsim as ds

ALPHA, BETA, GAMMA, DELTA = 1.3, 0.9, 0.8, 1.8
Y0S = np.array([[0.44, 4.6], [1.5, 1.0], [3.0, 2.0]])
TS = np.linspace(0.0, 3.0, 31)
SOLVER = ds.Tsit5(rtol=1e-6, atol=1e-6)


class UDE(ds.AbstractODE):
    """du/dt = α u + NN(u, v)₁, dv/dt = −δ v + NN(u, v)₂."""

    alpha: float
    delta: float
    net: eqx.nn.MLP

    def vector_field(self, t, y, args=None):
        return jnp.stack([self.alpha * y[0], -self.delta * y[1]]) + self.net(y)


def _interaction(y):
    """The terms the network stands for, (..., 2)."""
    uv = y[..., 0] * y[..., 1]
    return jnp.stack([-BETA * uv, GAMMA * uv], axis=-1)


def _trajectories(model):
    return jax.vmap(lambda y0: ds.simulate(model, y0, jnp.asarray(TS), solver=SOLVER).ys)(
        jnp.asarray(Y0S)
    )


def run(out_dir="out/ude_lotka_volterra", quick: bool = False) -> dict:
    out, plt = _output.prepare(out_dir)
    truth = ds.ODE(lambda t, y, p: jnp.stack([ALPHA * y[0], -DELTA * y[1]]) + _interaction(y), {})
    data = _trajectories(truth)
    net = eqx.nn.MLP(2, 2, 16, 2, activation=jax.nn.gelu, key=jax.random.key(0))
    net = eqx.tree_at(lambda n: n.layers[-1].weight, net, net.layers[-1].weight * 0.01)
    model = UDE(ALPHA, DELTA, net)
    weights, structure = eqx.partition(model, eqx.is_inexact_array)

    def loss(weights):
        return jnp.mean((_trajectories(eqx.combine(weights, structure)) - data) ** 2)

    optimizer = optax.adam(1e-2)

    @jax.jit
    def train(weights, state):
        value, grad = jax.value_and_grad(loss)(weights)
        updates, state = optimizer.update(grad, state, weights)
        return optax.apply_updates(weights, updates), state, value

    steps = 150 if quick else 1500
    state = optimizer.init(weights)
    losses = []
    for _ in range(steps):
        weights, state, value = train(weights, state)
        losses.append(float(value))
    final_loss = float(jax.jit(loss)(weights))
    trained = eqx.combine(weights, structure)
    fitted = np.asarray(_trajectories(trained))
    points = np.asarray(data).reshape(-1, 2)
    learned = np.asarray(jax.vmap(trained.net)(jnp.asarray(points)))
    target = np.asarray(_interaction(jnp.asarray(points)))
    error = float(np.max(np.abs(learned - target)) / np.max(np.abs(target)))
    print(
        f"loss {losses[0]:.3g} -> {final_loss:.3g} in {steps} steps; learned term within "
        f"{error:.2f} of the interaction's largest value along the data"
    )

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for i, colour in enumerate(("C0", "C1", "C2")):
        for j, style in enumerate(("o", "s")):
            axes[0].plot(TS, np.asarray(data)[i, :, j], style, color=colour, ms=2.5)
            axes[0].plot(TS, fitted[i, :, j], "-" if j == 0 else "--", color=colour, lw=1)
    axes[0].set(xlabel="t", ylabel="prey (—), predator (– –)", title="data and trained UDE")
    axes[1].semilogy(np.arange(1, steps + 1), losses, lw=1)
    axes[1].set(xlabel="Adam step", ylabel="mean squared error", title="training")
    for k, (name, colour) in enumerate((("prey: −β uv", "C3"), ("predator: +γ uv", "C4"))):
        axes[2].plot(target[:, k], learned[:, k], ".", color=colour, ms=3, label=name)
    low, high = float(target.min()), float(target.max())
    axes[2].plot([low, high], [low, high], "k:", lw=0.8)
    axes[2].set(xlabel="interaction (mechanism)", ylabel="learned term", title="what it learned")
    axes[2].legend(fontsize="x-small", frameon=False)
    fig.tight_layout()
    files = ds.plot.save(fig, out, "ude_lotka_volterra")
    plt.close("all")
    files.append(
        _output.table(
            out,
            "ude_lotka_volterra_learned",
            {
                "u": points[:, 0],
                "v": points[:, 1],
                "learned_prey": learned[:, 0],
                "learned_predator": learned[:, 1],
                "interaction_prey": target[:, 0],
                "interaction_predator": target[:, 1],
            },
        )
    )
    record = dict(
        steps=steps,
        weights=int(sum(x.size for x in jax.tree.leaves(weights))),
        initial_loss=losses[0],
        final_loss=final_loss,
        learned_term_error=error,
        config=dict(
            network="MLP 2 -> 16 -> 16 -> 2, GELU, seed 0, output layer x 0.01",
            optimizer="Adam, learning rate 1e-2",
            solver="Tsit5, rtol 1e-6, atol 1e-6",
            trajectories=Y0S.tolist(),
        ),
    )
    files.append(_output.summary(out, "ude_lotka_volterra", record))
    return dict(record, files=files)


if __name__ == "__main__":
    _output.main(__file__, __doc__)
