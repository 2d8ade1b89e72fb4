"""The `diffsim` command (also `python -m diffsim`)."""

import argparse
import platform
import sys


def _demo(args) -> int:
    from ._demo import run

    run(args.out, quick=args.quick)
    return 0


def _info(args) -> int:
    import diffrax
    import equinox
    import jax

    from . import __version__

    print(f"diffsim {__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"jax {jax.__version__}, diffrax {diffrax.__version__}, equinox {equinox.__version__}")
    print(f"devices: {', '.join(f'{d.platform}:{d.device_kind}' for d in jax.devices())}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="diffsim", description="Differentiable physics and ODE simulation on JAX."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulate, take a gradient, sweep; write a figure")
    demo.add_argument("--out", default="out", help="output folder (default: ./out)")
    demo.add_argument("--quick", action="store_true", help="a smaller sweep")
    demo.set_defaults(handler=_demo)
    info = commands.add_parser("info", help="versions and devices")
    info.set_defaults(handler=_info)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
