"""SBML models: `ds.sbml.load(path)` reads a model file (levels 2–3) as a diffsim model whose
vector field is built from the file's mathematics (never evaluated as Python)."""

from ._import.sbml import load as load, SBMLError as SBMLError, SBMLModel as SBMLModel
