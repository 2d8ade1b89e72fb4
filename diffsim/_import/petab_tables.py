"""What the PEtab readers (`petab`, `petab_v2`, `petab_sciml`) share: their error, how a table
is read, and how a v2 YAML file names its model and tables."""

from pathlib import Path


class PetabError(ValueError):
    """A PEtab problem that cannot be read (the message names the file, the table and the
    row or column)."""


def read_table(file: Path, path, key):
    import pandas as pd

    if not file.is_file():
        raise PetabError(f"{path}: {key} names {file.name}, which does not exist")
    try:
        return pd.read_csv(file, sep="\t", dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise PetabError(f"{file} is not a tab-separated table: {error}") from None


def concat_tables(tables):
    import pandas as pd

    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


def read_tables(files: list, path, key):
    """The tables of `files` (listed under `key` of the YAML file `path`) as one."""
    return concat_tables([read_table(f, path, key) for f in files])


def v2_model_file(path: Path, config) -> Path:
    """The one SBML file a v2 YAML file (`config`, read from `path`) names."""
    models = config.get("model_files") or {}
    if len(models) != 1:
        raise PetabError(f"{path}: one model under 'model_files' expected, got {list(models)}")
    (entry,) = models.values()
    if str(entry.get("language", "sbml")).lower() != "sbml":
        raise PetabError(f"{path}: the model's language {entry.get('language')!r} is not sbml")
    return path.parent / entry["location"]


def v2_files(path: Path, config, key: str) -> list:
    """The files a v2 YAML file lists under `key` (a name or a list of names)."""
    names = config.get(key) or []
    names = [names] if isinstance(names, str) else names
    return [path.parent / name for name in names]
