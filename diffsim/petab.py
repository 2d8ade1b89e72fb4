"""PEtab problems: `ds.petab.load(path_to_yaml)` reads a parameter-estimation problem (an SBML
model and its tables of conditions, measurements, observables and parameters) as a
`ds.Problem`; a PEtab-SciML problem's networks are `ds.petab.Network`s of its model."""

from ._import.petab import load as load, PetabError as PetabError, simulations as simulations
from ._import.petab_sciml import Network as Network
