"""PEtab-SciML problems: PEtab v2 files with the `sciml` extension, mechanistic SBML models in
which neural networks stand for parameters (Persson et al., the PEtab-SciML benchmark
collection).

What is read:
- the network files (`neural_nets`, YAML): `Linear` layers and element-wise activations called
  one after the other (torch.fx's graph of a sequential network), weights from the
  `array_files` (HDF5, torch's layout: `parameters/<net>/<layer>/weight` of shape (out, in)
  and `bias`), read with h5py;
- the hybridization table: each network input (`<net>_input<k>`) as a formula of the model's
  symbols, and which model parameter each output (`<net>_output<k>`) replaces, so the network
  is evaluated in the vector field wherever that parameter is read;
- the v2 tables of one experiment without conditions (`experimentId` empty), parameters on a
  linear scale (v2 has no `parameterScale`) with `estimate` true/false, observables with
  normal or Laplace noise; they are handed to the v1 reader as its tables.

The networks are fields of the model (`HybridSBMLModel.nets`, equinox modules): the network
parameters (`<net>_ps`) are the weights read, not unknowns of the problem, so `problem.llh()`
is the log-likelihood at the given weights; training them is a loss over
`ds.simulate` of the model with other weights (docs/howto/hybrid-models.md). Anything else of
v2 or of the extension is refused naming what it is.
"""

from collections.abc import Callable, Mapping
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from .expressions import compile_expression, ExpressionError, parse_formula
from .petab_tables import PetabError, read_tables, v2_files, v2_model_file
from .sbml import SBMLModel


class Network(eqx.Module):
    """A feed-forward network of a PEtab-SciML file: `Linear` layers (`weights[i]` = (weight of
    shape (out, in), bias of shape (out,) or None)) and element-wise activations, applied in
    the order of `steps` (("linear", i) or ("activation", name, approximate)). Input (in,) →
    output (out,)."""

    weights: list
    steps: tuple = eqx.field(static=True)

    def initialised(self, key) -> "Network":
        """The same network with fresh weights from `key` (a `jax.random` key): every weight
        and bias uniform in ±1/√(inputs of its layer), PyTorch's (and equinox's) default for
        a linear layer, as PEtab-SciML's networks are defined."""
        keys = jax.random.split(key, 2 * len(self.weights))
        fresh = []
        for i, (weight, bias) in enumerate(self.weights):
            bound = 1.0 / jnp.sqrt(weight.shape[1])

            def draw(k, like, bound=bound):
                return jax.random.uniform(k, like.shape, like.dtype, -bound, bound)

            fresh.append(
                (draw(keys[2 * i], weight), None if bias is None else draw(keys[2 * i + 1], bias))
            )
        return eqx.tree_at(lambda n: n.weights, self, fresh)

    def __call__(self, x):
        for step in self.steps:
            if step[0] == "linear":
                weight, bias = self.weights[step[1]]
                x = weight @ x + (0 if bias is None else bias)
            else:
                x = _ACTIVATIONS[step[1]](x, step[2])
        return x


# the activations by their fx name. gelu without `approximate` is its tanh form: the
# collection's expected log-likelihoods are computed with it (Ko_NeurIPS2023's training llh
# -740.8365268083 is reproduced to 2.4e-9 relative with it at the default tolerances, the
# solver's error, and is 6.5e-5 relative away with torch's exact erf form, which
# `approximate: none` selects)
_ACTIVATIONS: dict[str, Callable] = {
    "silu": lambda x, _: jax.nn.silu(x),
    "swish": lambda x, _: jax.nn.silu(x),
    "gelu": lambda x, approximate: jax.nn.gelu(x, approximate=approximate != "none"),
    "tanh": lambda x, _: jnp.tanh(x),
    "relu": lambda x, _: jax.nn.relu(x),
    "sigmoid": lambda x, _: jax.nn.sigmoid(x),
    "softplus": lambda x, _: jax.nn.softplus(x),
    "elu": lambda x, _: jax.nn.elu(x),
    "identity": lambda x, _: x,
}


class _Hybridization(eqx.Module):
    """Where the networks enter the model (static): per network, its inputs as functions of
    the environment (`env -> value`), and per output the parameter it replaces."""

    inputs: tuple  # ((net id, (input function, ...)), ...)
    outputs: tuple  # ((parameter id, net id, output index), ...)


class HybridSBMLModel(SBMLModel):
    """An SBML model whose parameters listed in `hybrid.outputs` are the outputs of neural
    networks (`nets`: id → `Network`) of the model's symbols (PEtab-SciML's hybridization).
    Otherwise an `SBMLModel`: `params`, `state_names`, `initial_state`, `value`."""

    nets: dict
    hybrid: _Hybridization = eqx.field(static=True)

    def environment(self, t, y, params: Mapping) -> dict:
        env = dict(params)
        env["time"] = t
        for i, name in enumerate(self.structure.states):
            env[name] = y[i]
        dtype = jnp.result_type(y)
        for net_id, functions in self.hybrid.inputs:
            x = jnp.stack([jnp.asarray(f(env), dtype) for f in functions])
            out = self.nets[net_id](x)
            for target, source, index in self.hybrid.outputs:
                if source == net_id:
                    env[target] = out[index]
        for name, rule in self.structure.rules:
            env[name] = rule(env)
        return env


def is_sciml(config: Mapping) -> bool:
    extensions = config.get("extensions") or {}
    return isinstance(extensions, Mapping) and "sciml" in extensions


def read(path: Path, config: Mapping):
    """(the hybrid model, the v1-shaped tables: parameters, conditions, measurements,
    observables, the files read) of the PEtab-SciML problem `config` read from `path`."""
    import pandas as pd

    from .sbml import load as load_sbml

    folder = path.parent
    sbml_file = v2_model_file(path, config)
    base = load_sbml(sbml_file)

    def tables(key):
        return v2_files(path, config, key)

    for key in ("condition_files", "experiment_files"):
        if tables(key):
            raise PetabError(f"{path}: {key} are not supported for PEtab-SciML problems yet")
    sciml = config["extensions"]["sciml"]
    files = [path, sbml_file]
    nets = {}
    for net_id, entry in (sciml.get("neural_nets") or {}).items():
        if entry.get("pre_initialization"):
            raise PetabError(f"{path}: network {net_id}: pre_initialization is not supported")
        net_file = folder / entry["location"]
        files.append(net_file)
        nets[net_id] = _network(net_file, net_id)
    arrays = [folder / name for name in sciml.get("array_files") or []]
    files += arrays
    for net_id in nets:
        nets[net_id] = _with_weights(nets[net_id], net_id, arrays, path)
    hybrid_files = [folder / name for name in sciml.get("hybridization_files") or []]
    files += hybrid_files
    hybridization = read_tables(hybrid_files, path, "hybridization_files")
    model = _hybrid_model(base, nets, hybridization, path)

    parameters = read_tables(tables("parameter_files"), path, "parameter_files")
    measurements = read_tables(tables("measurement_files"), path, "measurement_files")
    observables = read_tables(tables("observable_files"), path, "observable_files")
    files += tables("parameter_files") + tables("measurement_files") + tables("observable_files")
    files += tables("mapping_files")

    network_parameters = {f"{net_id}_ps" for net_id in nets}
    rows = parameters[~parameters["parameterId"].str.strip().isin(network_parameters)].copy()
    if "parameterScale" not in rows.columns:
        rows["parameterScale"] = "lin"
    flags = {"true": "1", "false": "0", "1": "1", "0": "0"}
    unknown_flags = [f for f in rows["estimate"].str.strip().str.lower() if f not in flags]
    if unknown_flags:
        raise PetabError(f"{path}: 'estimate' must be true or false, got {unknown_flags[0]!r}")
    rows["estimate"] = [flags[f] for f in rows["estimate"].str.strip().str.lower()]
    if "experimentId" in measurements.columns:
        experiments = set(measurements["experimentId"].str.strip())
        if experiments - {""}:
            raise PetabError(
                f"{path}: experiments {sorted(experiments - {''})} need an experiment table, "
                "which is not supported for PEtab-SciML problems yet"
            )
    measurements = measurements.assign(simulationConditionId="")
    conditions = pd.DataFrame({"conditionId": [""]})
    return model, rows, conditions, measurements, observables, files


def _network(file: Path, net_id: str) -> tuple[Network, tuple]:
    """The network of a file (its weights zero until `_with_weights`) and its layers' ids."""
    import yaml

    try:
        spec = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PetabError(f"{file}: cannot be read as YAML ({error})") from None
    layers = {}
    for layer in spec.get("layers") or []:
        if layer.get("layer_type") != "Linear":
            raise PetabError(
                f"{file}: layer {layer.get('layer_id')!r} is a {layer.get('layer_type')!r}; "
                "diffsim reads Linear layers and element-wise activations"
            )
        layers[layer["layer_id"]] = (len(layers), layer.get("args") or {})
    steps, previous = [], None
    for node in spec.get("forward") or []:
        op, target, args = node.get("op"), node.get("target"), node.get("args") or []
        if op == "placeholder":
            previous = node["name"]
            continue
        if op == "output":
            break
        if args != [previous]:
            raise PetabError(
                f"{file}: node {node.get('name')!r} takes {args}; diffsim reads networks whose "
                "calls follow one another (each on the output of the one before)"
            )
        if op == "call_module" and target in layers:
            steps.append(("linear", layers[target][0]))
        elif op == "call_function" and target in _ACTIVATIONS:
            approximate = (node.get("kwargs") or {}).get("approximate", "tanh")
            approximate = approximate if target == "gelu" else None
            steps.append(("activation", target, approximate))
        else:
            raise PetabError(
                f"{file}: node {node.get('name')!r} ({op} {target!r}) is not a Linear layer or "
                f"one of the activations {sorted(_ACTIVATIONS)}"
            )
        previous = node["name"]
    shapes = [args for _, args in sorted(layers.values(), key=lambda item: item[0])]
    weights = [
        (
            jnp.zeros((int(a["out_features"]), int(a["in_features"]))),
            jnp.zeros(int(a["out_features"])) if a.get("bias", True) else None,
        )
        for a in shapes
    ]
    names = tuple(sorted(layers, key=lambda k: layers[k][0]))
    return Network(weights, tuple(steps)), names


def _with_weights(net_and_names, net_id: str, arrays: list, path) -> Network:
    import h5py
    import numpy as np

    net, names = net_and_names
    for file in arrays:
        with h5py.File(file, "r") as handle:
            group = handle.get(f"parameters/{net_id}")
            if group is None:
                continue
            weights = []
            for i, name in enumerate(names):
                weight, bias = net.weights[i]
                values = []
                for key, like in (("weight", weight), ("bias", bias)):
                    if like is None:
                        values.append(None)
                        continue
                    if f"{name}/{key}" not in group:
                        raise PetabError(f"{file}: no parameters/{net_id}/{name}/{key}")
                    array = np.asarray(group[f"{name}/{key}"], dtype=float)
                    if array.shape != like.shape:
                        raise PetabError(
                            f"{file}: parameters/{net_id}/{name}/{key} has shape "
                            f"{array.shape}; the network file says {like.shape}"
                        )
                    values.append(jnp.asarray(array))
                weights.append(tuple(values))
            return Network(weights, net.steps)
    raise PetabError(f"{path}: no array file holds the parameters of network {net_id}")


def _hybrid_model(base: SBMLModel, nets: dict, table, path) -> HybridSBMLModel:
    inputs: dict = {net_id: {} for net_id in nets}
    outputs = []
    for _, row in table.iterrows():
        target, value = row["targetId"].strip(), row["targetValue"].strip()
        where = f"{path}: hybridization of {target}"
        for net_id in nets:
            if target.startswith(f"{net_id}_input"):
                index = int(target[len(f"{net_id}_input") :]) - 1
                try:
                    inputs[net_id][index] = compile_expression(parse_formula(value, where), where)
                except ExpressionError as error:
                    raise PetabError(str(error)) from None
                break
        else:
            source = next((n for n in nets if value.startswith(f"{n}_output")), None)
            if source is None:
                raise PetabError(
                    f"{where}: {value!r} is no network output; diffsim reads hybridizations "
                    "of network inputs and of model parameters set to a network output"
                )
            if target not in base.params:
                raise PetabError(f"{where}: {target!r} is not a parameter of the model")
            outputs.append((target, source, int(value[len(f"{source}_output") :]) - 1))
    ordered = []
    for net_id, functions in inputs.items():
        count = len(functions)
        if sorted(functions) != list(range(count)):
            raise PetabError(f"{path}: the inputs of {net_id} are not numbered 1 … {count}")
        ordered.append((net_id, tuple(functions[i] for i in range(count))))
    hybrid = _Hybridization(tuple(ordered), tuple(outputs))
    # a parameter a network replaces is never read: its value in the file (often none) is 0
    params = dict(base.params)
    for target, _, _ in outputs:
        params[target] = jnp.zeros_like(params[target])
    return HybridSBMLModel(params=params, structure=base.structure, nets=nets, hybrid=hybrid)
