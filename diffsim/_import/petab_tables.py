"""What the PEtab readers (`petab`, `petab_sciml`) share: their error and how a table is read."""

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
