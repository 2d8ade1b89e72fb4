"""Physical models for diffsim, by field. Models are `equinox.Module`s; fields are parameters."""

from .celestial import Kepler as Kepler, NBody as NBody
from .chaos import Lorenz as Lorenz
from .chemistry import (
    EquilibriumReactor as EquilibriumReactor,
    HIRES as HIRES,
    Robertson as Robertson,
)
from .circuits import Rectifier as Rectifier
from .delay import DelayedNegativeFeedback as DelayedNegativeFeedback, MackeyGlass as MackeyGlass
from .fields import Heat1D as Heat1D, Nagumo1D as Nagumo1D
from .mechanics import (
    BouncingBall as BouncingBall,
    DampedPendulum as DampedPendulum,
    DoublePendulum as DoublePendulum,
    Duffing as Duffing,
    HarmonicOscillator as HarmonicOscillator,
    VanDerPol as VanDerPol,
)
from .population import LotkaVolterra as LotkaVolterra, SEIR as SEIR, SIR as SIR
from .signalling import (
    BoehmSTAT5 as BoehmSTAT5,
    BrunoCarotenoids as BrunoCarotenoids,
    FujitaAkt as FujitaAkt,
)
from .stochastic import (
    GeometricBrownianMotion as GeometricBrownianMotion,
    Langevin as Langevin,
    OrnsteinUhlenbeck as OrnsteinUhlenbeck,
    StochasticSIR as StochasticSIR,
)
