"""`simulate` and the loops of the solver families.

Each family's solve registers itself for its base class when its module is imported (see
`families`); importing them here registers them all before `simulate` can run. A new family's
loop module is added to this list.
"""

from . import adaptive as adaptive, fixed as fixed, rosenbrock_loop as rosenbrock_loop
