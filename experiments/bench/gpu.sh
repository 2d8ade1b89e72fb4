#!/usr/bin/env bash
# The Lorenz ensemble of the DiffEqGPU paper on a GPU: diffsim, the same method written by hand
# as vmap(lax.scan) (with its unroll table) and diffrax side by side under
# jax.vmap, float32, N = 2^11 ... 2^23, fixed step (RK4, then Tsit5's tableau as in the paper,
# dt = 0.001, 1,000 steps) and adaptive Tsit5 (rtol = atol = 1e-6); prints the tables and the
# targets (>= 30x faster than diffrax at N >= 2^19 fixed step, <= 10 ms at N = 524,288).
#
# Runs from a source checkout on a machine with jax[cuda], diffrax and equinox (no network, no
# install): PYTHONPATH=. makes the checkout's diffsim and models importable. The interpreter is
# `python3` (GPU images often have no `python`), or $PYTHON; diffsim's compilation cache is off
# (each size's compile time is measured, and its folder needs platformdirs).
#   bash experiments/bench/gpu.sh [SIZES]      (SIZES: log2 range, default 11-23)
set -euo pipefail
cd "$(dirname "$0")/../.."
sizes="${1:-11-23}"
py="${PYTHON:-python3}"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false DIFFSIM_CACHE=off
"$py" -c "import jax; d = jax.devices()[0]; print(f'# device: {d.platform} {d.device_kind} x {jax.device_count()}')"
for method in rk4 tsit5; do
    "$py" experiments/bench/lorenz.py --sizes "$sizes" --peers diffsim,hand,diffrax --method "$method" \
        --repeats 5 --no-work-precision $([ "$method" = tsit5 ] && echo --no-adaptive)
done
