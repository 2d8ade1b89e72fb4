"""A small fit in its own process, for the persistent compilation cache tests: prints one JSON
line with the fitted value, the cache events JAX recorded and the warnings raised.

    python tests/cache_worker.py [--model oscillator|van-der-pol|none]

The cache folder comes from DIFFSIM_CACHE_DIR, as a user would set it.
"""

import argparse
import json
import os
import sys
import warnings
from collections import Counter

import jax

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax.monitoring  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

events = Counter()
jax.monitoring.register_event_listener(lambda name, **_: events.update([name]))
jax.monitoring.register_event_duration_secs_listener(lambda name, _, **__: events.update([name]))

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import diffsim as ds  # noqa: E402
    import models  # noqa: E402

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", choices=("oscillator", "van-der-pol", "none"), default="oscillator"
    )
    model_name = parser.parse_args().model
    ts = np.linspace(0.0, 3.0, 13)
    y0 = jnp.array([1.0, 0.0])
    # RK4 (dt = 0.025, 10 steps per interval): the cache does not depend on the solver, and a
    # fixed-step fit compiles in a fraction of an adaptive one's time
    solver = dict(solver=ds.RK4(), dt=0.025)
    if model_name == "oscillator":  # x = cos(1.3 t): the fit must find omega = 1.3
        guess, name, data = models.HarmonicOscillator(omega=1.0), "omega", np.cos(1.3 * ts)
    elif model_name == "van-der-pol":  # another vector field: a different program to compile
        truth = ds.simulate(models.VanDerPol(mu=1.3), y0, ts, **solver).ys[:, 0]
        guess, name, data = models.VanDerPol(mu=1.0), "mu", np.asarray(truth)
    if model_name == "none":  # the import only
        value = None
    else:
        fitted = ds.fit(guess, y0, (ts, data), params=[name], observe=lambda y: y[0], **solver)
        value = fitted.params[name]

print(
    json.dumps(
        {
            "value": value,
            "events": dict(events),
            "warnings": [str(w.message) for w in caught],
            "config": ds.config(),
        }
    )
)
