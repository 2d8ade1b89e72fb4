"""Readers of model and problem files: SBML models (`sbml.py`) and PEtab problems."""
