"""Runs the Python blocks of one Markdown page as a reader would, and checks what they promise.

`python tests/docs_runner.py PAGE` executes the page's ```python blocks in order, in one fresh
process, statement by statement, and exits non-zero (with the page, line and reason) on

- an exception or a warning the page does not announce;
- a value a comment promises that the statement does not give: an expression statement (or a
  `print(...)`) followed by a comment that begins with a literal, e.g. `sol.ys.shape  # (101, 2)`,
  `print(ds.sweep_summary(result))  # {'successful': 16}`, `result.llh  # -149.5878...: text`.
  Numbers are compared to the digits shown (half a unit of the last digit; one unit when they
  end in `...`, cut rather than rounded); `...` alone stands for more elements; numpy's printed
  form (`[0 0 6]`, `[1. 0.5]`) reads as a list. A comment that begins with a word (`# the state
  at t = 10 s`, `# ≈ 100`) describes and is not checked.

The Markdown says what a block is, in an HTML comment on the line before its fence:
`<!-- docs-test: fragment (why) -->` skips it (a sketch that cannot run as written: a cluster,
a `...` argument), `<!-- docs-test: warns FitWarning -->` announces a warning of that class and
`<!-- docs-test: raises ValueError -->` an exception the block ends in.

The last line of stdout is a JSON report: blocks run, skipped and promises checked.
"""

import ast
import contextlib
import io
import json
import math
import re
import sys
import textwrap
import tokenize
import traceback
import warnings
from dataclasses import dataclass, field

# a fence at the margin or indented (inside a list item or an admonition)
_FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*([^>]*?)\s*-->\s*$")


@dataclass
class Block:
    code: str
    line: int  # the first code line's line number in the page
    kind: str = "run"  # "run" or "fragment"
    warns: tuple[str, ...] = ()
    raises: str | None = None
    note: str = ""


def blocks(text: str) -> list[Block]:
    """The page's Python blocks with the directives on the line before each fence."""
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 2
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        block = Block(textwrap.dedent(match.group(2)), line)
        directive = _DIRECTIVE.search(before)
        if directive:
            word, rest = directive.group(1), directive.group(2)
            if word == "fragment":
                block.kind, block.note = "fragment", rest
            elif word == "warns":
                block.warns = tuple(rest.split())
            elif word == "raises":
                block.raises = rest.split()[0]
            else:
                raise ValueError(f"line {line - 1}: unknown docs-test directive {word!r}")
        found.append(block)
    return found


# --- promises ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A number as shown: its value and how far a true value may lie from it."""

    text: str

    @property
    def value(self) -> float:
        return float(self.text.replace("...", ""))

    @property
    def tolerance(self) -> float:
        mantissa, _, exponent = self.text.replace("...", "").lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        unit = 10.0 ** (-decimals + (int(exponent) if exponent else 0))
        return unit if "..." in self.text else unit / 2


MORE = object()  # `...` as an element: more elements follow

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<number>[-+]?(?:\d+\.?\d*(?:\.\.\.)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w]))
  | (?P<special>[-+]?(?:nan|inf)\b|True\b|False\b|None\b)
  | (?P<string>'[^'\\]*'|"[^"\\]*")
  | (?P<more>\.\.\.)
  | (?P<punct>[\[\](){},:])
    )""",
    re.VERBOSE,
)


def _tokens(text: str) -> tuple[list[tuple[str, str]], int]:
    """The literal tokens at the start of `text` and where they stop."""
    tokens, ends = _spans(text)
    return tokens, ends[-1] if ends else 0


def _spans(text: str) -> tuple[list[tuple[str, str]], list[int]]:
    """The literal tokens at the start of `text` and where each ends."""
    tokens, ends, position = [], [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            break
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        ends.append(position := match.end())
    return tokens, ends


class _Parser:
    def __init__(self, tokens):
        self.tokens, self.i = tokens, 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

    def take(self):
        token = self.peek()
        self.i += 1
        return token

    def value(self):
        kind, text = self.take()
        if kind == "number":
            return Number(text)
        if kind == "special":
            return {"True": True, "False": False, "None": None}.get(text, Number(text))
        if kind == "string":
            return text[1:-1]
        if kind == "more":
            return MORE
        if kind == "punct" and text in "[({":
            return self.sequence(text)
        raise SyntaxError(f"unexpected {text!r}")

    def sequence(self, opening):
        closing = {"[": "]", "(": ")", "{": "}"}[opening]
        items, keys, commas = [], [], 0
        while True:
            kind, text = self.peek()
            if kind is None:
                raise SyntaxError("unclosed")
            if kind == "punct" and text == closing:
                self.take()
                break
            if kind == "punct" and text == ",":
                self.take()
                commas += 1
                continue
            item = self.value()
            if opening == "{" and item is not MORE:
                if self.take() != ("punct", ":"):
                    raise SyntaxError("a dict entry without ':'")
                keys.append(item)
                item = self.value()
            items.append(item)
        if opening == "{":
            more = MORE in items
            entries = dict(zip(keys, [x for x in items if x is not MORE]))
            return (entries, more)
        if opening == "(" and len(items) == 1 and commas == 0:
            return items[0]
        return tuple(items) if opening == "(" else list(items)


def parse_promise(comment: str):
    """The literal a comment begins with, or None (a description). Returns (literal, text)."""
    tokens, _ = _tokens(comment)
    # the longest prefix of tokens that parses as one literal
    for end in range(len(tokens), 0, -1):
        parser = _Parser(tokens[:end])
        try:
            literal = parser.value()
        except (SyntaxError, IndexError, TypeError):
            continue
        if parser.i == end and literal is not MORE and _ends_literal(comment, tokens[:end]):
            return literal, " ".join(t for _, t in tokens[:end])
    return None


def _ends_literal(comment: str, tokens) -> bool:
    """Whether the literal stands alone: the comment ends after it, or goes on with ':', ';',
    ',', '=', '(' or a dash. `# 8 final angles` describes; `# 8: the final angles` promises."""
    rest = comment[_spans(comment)[1][len(tokens) - 1] :].lstrip()
    return not rest or rest[0] in ":;,=(—-"


def _plain(value):
    """Arrays and scalars of numpy/JAX as Python lists and numbers."""
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
        try:
            import numpy as np

            array = np.asarray(value)
            if array.dtype.kind in "biufc":
                return array.tolist()
            if array.dtype.kind in "OU" and array.ndim:
                return [_plain(x) for x in array.tolist()]
        except Exception:
            pass
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def mismatch(promise, value, where="value") -> str | None:
    """Why `value` is not what `promise` shows, or None."""
    value = _plain(value)
    if isinstance(promise, Number):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{where} is {value!r}, not a number ({promise.text})"
        expected = promise.value
        if math.isnan(expected):
            return None if math.isnan(value) else f"{where} = {value!r}, not nan"
        if math.isinf(expected):
            return None if value == expected else f"{where} = {value!r}, not {promise.text}"
        if abs(value - expected) <= promise.tolerance * (1 + 1e-9) + 1e-300:
            return None
        return f"{where} = {value!r}, not {promise.text}"
    if isinstance(promise, tuple) and len(promise) == 2 and isinstance(promise[0], dict):
        entries, more = promise
        if not isinstance(value, dict):
            return f"{where} is {type(value).__name__}, not a dict"
        if not more and set(map(str, value)) != set(map(str, entries)):
            return f"{where} has keys {sorted(map(str, value))}, not {sorted(map(str, entries))}"
        for key, expected in entries.items():
            match = next((k for k in value if str(k) == str(key)), None)
            if match is None:
                return f"{where} has no key {key!r}"
            reason = mismatch(expected, value[match], f"{where}[{key!r}]")
            if reason:
                return reason
        return None
    if isinstance(promise, (tuple, list)):
        if isinstance(value, str) or not isinstance(value, (tuple, list)):
            return f"{where} is {value!r}, not a sequence like {promise!r}"
        more = bool(promise) and promise[-1] is MORE
        shown = promise[:-1] if more else promise
        if len(value) < len(shown) or (not more and len(value) != len(shown)):
            return f"{where} has {len(value)} elements, not {len(shown)}{'+' if more else ''}"
        for i, (expected, actual) in enumerate(zip(shown, value)):
            reason = mismatch(expected, actual, f"{where}[{i}]")
            if reason:
                return reason
        return None
    if isinstance(promise, str):
        return None if str(value) == promise else f"{where} is {value!r}, not {promise!r}"
    return None if value == promise else f"{where} is {value!r}, not {promise!r}"


def printed_value(text: str):
    """What a print showed, read as a literal where it is one (else the text itself)."""
    stripped = text.strip()
    tokens, stop = _tokens(stripped)
    if stop == len(stripped):
        parser = _Parser(tokens)
        try:
            literal = parser.value()
            if parser.i == len(tokens):
                return _concrete(literal)
        except (SyntaxError, IndexError, TypeError):
            pass
    return stripped


def _concrete(literal):
    if isinstance(literal, Number):
        number = literal.value
        return int(number) if re.fullmatch(r"[-+]?\d+", literal.text) else number
    if isinstance(literal, tuple) and len(literal) == 2 and isinstance(literal[0], dict):
        return {k: _concrete(v) for k, v in literal[0].items()}
    if isinstance(literal, (tuple, list)):
        return type(literal)(_concrete(v) for v in literal)
    return literal


# --- running -------------------------------------------------------------------------------------


def _comments(code: str) -> dict[int, str]:
    """Comment text by line; a comment whose literal is left open continues on the comment lines
    below it (`# ('a', 'b',` / `#  'c')`)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = (token.start[1], token.string[1:].strip())
    lines = code.splitlines()
    joined = {}
    for number, (column, text) in found.items():
        if column > 0 and lines[number - 1][:column].strip():  # a comment after code
            below = number + 1
            while (
                text.count("(") + text.count("[") + text.count("{")
                > (text.count(")") + text.count("]") + text.count("}"))
                and below in found
                and not lines[below - 1][: found[below][0]].strip()
            ):
                text += " " + found[below][1]
                below += 1
            joined[number] = text
    return joined


@dataclass
class Report:
    page: str
    run: int = 0
    fragments: list[str] = field(default_factory=list)
    promises: int = 0


def _is_print(node) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "print"
    )


class DocsFailure(Exception):
    pass


def run_page(path: str) -> Report:
    text = open(path, encoding="utf-8").read()
    report = Report(path)
    namespace = {"__name__": "__main__"}
    for block in blocks(text):
        if block.kind == "fragment":
            report.fragments.append(f"line {block.line}: {block.note}")
            continue
        report.run += 1
        _run_block(path, block, namespace, report)
    return report


def _run_block(path, block, namespace, report):
    tree = ast.parse(block.code, filename=path)
    ast.increment_lineno(tree, block.line - 1)  # tracebacks and warnings name the page's lines
    comments = _comments(block.code)
    raised = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for statement in tree.body:
            where = f"{path}:{statement.lineno}"
            output = io.StringIO()
            try:
                with contextlib.redirect_stdout(output):
                    if isinstance(statement, ast.Expr):
                        source = ast.Expression(statement.value)
                        value = eval(compile(source, path, "eval"), namespace)  # noqa: S307
                    else:
                        module = ast.Module([statement], type_ignores=[])
                        exec(compile(module, path, "exec"), namespace)  # noqa: S102
                        value = None
            except Exception as error:  # the block's announced end, or a failure
                sys.stdout.write(output.getvalue())
                if block.raises and type(error).__name__ == block.raises:
                    raised = error
                    break
                detail = "".join(traceback.format_exception(error)[-6:])
                raise DocsFailure(f"{where}: {type(error).__name__} raised\n{detail}") from None
            sys.stdout.write(output.getvalue())
            comment = comments.get(statement.end_lineno - block.line + 1)
            if comment is None or not isinstance(statement, ast.Expr):
                continue
            parsed = parse_promise(comment)
            if parsed is None:
                continue
            promise, shown = parsed
            actual = printed_value(output.getvalue()) if _is_print(statement) else value
            reason = mismatch(promise, actual)
            if reason:
                raise DocsFailure(f"{where}: the comment promises {shown}, but {reason}")
            report.promises += 1
    if block.raises and raised is None:
        raise DocsFailure(f"{path}:{block.line}: the block announces {block.raises}, none raised")
    unannounced = [w for w in caught if w.category.__name__ not in block.warns]
    if unannounced:
        first = unannounced[0]
        raise DocsFailure(
            f"{path}: block at line {block.line} warns {first.category.__name__} "
            f"({first.filename}:{first.lineno}): {first.message}"
        )
    for name in block.warns:
        if not any(w.category.__name__ == name for w in caught):
            raise DocsFailure(f"{path}:{block.line}: the block announces {name}, none warned")


if __name__ == "__main__":
    try:
        result = run_page(sys.argv[1])
    except DocsFailure as failure:
        print(f"DOCS FAILURE {failure}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result.__dict__))
