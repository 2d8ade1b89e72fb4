"""Mathematics of model files as SymPy expressions, and SymPy expressions as JAX functions.

A model file is data: nothing in it is `eval`ed or `exec`ed. SBML's MathML arrives as libsbml's
parsed tree (`ASTNode`), and formulas written as text (PEtab's observables and noise models) are
parsed by libsbml's own infix parser (`parseL3Formula`, a C++ grammar, not Python); both trees
are turned into SymPy objects node by node here, and a SymPy expression is turned into a JAX
function by walking it once into nested closures.

Why by hand: sympy2jax (the equinox author's) has no `Piecewise` and turns every constant into
a trainable leaf (each would then count as an input of the solve's forward-mode Jacobian);
SymPy's `lambdify` and `parse_expr` generate and `exec` Python source.
"""

from __future__ import annotations  # annotations name sympy, imported on first use

import functools
import importlib.util
import math
import sys
from collections.abc import Callable

import jax.numpy as jnp
from jax.scipy.special import gammaln


def _imported_on_first_use(name: str):
    """The module `name`, executed when one of its attributes is first read (Python's
    `importlib.util.LazyLoader`): SymPy took 0.6 s of the 2.6 s `import diffsim` took, and
    only a model file needs it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sympy = _imported_on_first_use("sympy")

TIME_NAME = "time"  # SBML's csymbol time, and PEtab's


@functools.cache
def time_symbol():
    """The symbol of time in every expression read from a model file."""
    return sympy.Symbol(TIME_NAME)


class ExpressionError(ValueError):
    """A piece of mathematics a model file holds that diffsim cannot read (named in the
    message)."""


# --- libsbml's tree -> SymPy --------------------------------------------------------------------


def _libsbml():
    import libsbml

    return libsbml


def from_ast(
    node, functions: dict | None = None, where: str = "an expression", *, formula: bool = False
) -> sympy.Expr:
    """The SymPy expression of a libsbml `ASTNode`; `functions` maps the ids of the file's
    function definitions to `sympy.Lambda`s (expanded in place). `formula`: a PEtab formula
    parsed from text, whose `log(x, base)` takes the base second and which may call `sign`
    and `log2` (SBML's MathML has neither)."""
    lib = _libsbml()
    functions = functions or {}
    kind = node.getType()
    children = [
        from_ast(node.getChild(i), functions, where, formula=formula)
        for i in range(node.getNumChildren())
    ]
    if not _takes_conditions(kind):
        # true and false are 1 and 0 where a number is expected (PEtab; SBML's MathML allows
        # it too): in arithmetic, as function arguments, compared with numbers
        children = [as_number(c) for c in children]
    if kind == lib.AST_NAME:
        return sympy.Symbol(node.getName())
    if kind == lib.AST_NAME_TIME:
        return time_symbol()
    if kind == lib.AST_NAME_AVOGADRO:
        return sympy.Float(6.02214076e23)
    if kind == lib.AST_INTEGER:
        return sympy.Integer(node.getInteger())
    if kind in (lib.AST_REAL, lib.AST_REAL_E):
        value = node.getReal()
        if not math.isfinite(value):
            return sympy.oo if value > 0 else (-sympy.oo if value < 0 else sympy.nan)
        return sympy.Float(value)
    if kind == lib.AST_RATIONAL:
        return sympy.Rational(node.getNumerator(), node.getDenominator())
    if kind == lib.AST_CONSTANT_PI:
        return sympy.pi
    if kind == lib.AST_CONSTANT_E:
        return sympy.E
    if kind == lib.AST_CONSTANT_TRUE:
        return sympy.true
    if kind == lib.AST_CONSTANT_FALSE:
        return sympy.false
    if kind == lib.AST_PLUS:
        return sympy.Add(*children) if children else sympy.Integer(0)
    if kind == lib.AST_TIMES:
        return sympy.Mul(*children) if children else sympy.Integer(1)
    if kind == lib.AST_MINUS:
        return -children[0] if len(children) == 1 else children[0] - children[1]
    if kind == lib.AST_DIVIDE:
        return children[0] / children[1]
    if kind in (lib.AST_POWER, lib.AST_FUNCTION_POWER):
        return children[0] ** children[1]
    if kind == lib.AST_FUNCTION_ROOT:
        degree, value = children if len(children) == 2 else [sympy.Integer(2), children[0]]
        return value ** (1 / degree)
    if kind == lib.AST_FUNCTION_LOG:
        base, value = children if len(children) == 2 else [sympy.Integer(10), children[0]]
        if formula and len(children) == 2:
            value, base = base, value
        return _log(value) / _log(base)
    if kind == lib.AST_FUNCTION_LN:
        return _log(children[0])
    if kind == lib.AST_FUNCTION_PIECEWISE:
        pieces = []
        for i in range(0, len(children) - 1, 2):
            pieces.append((children[i], _truth(children[i + 1])))
        if len(children) % 2:
            pieces.append((children[-1], sympy.true))
        else:  # SBML leaves the value undefined where no piece holds
            pieces.append((sympy.nan, sympy.true))
        return sympy.Piecewise(*pieces)
    if kind == lib.AST_FUNCTION:
        name = node.getName()
        if formula and name not in functions and name in _FORMULA_FUNCTIONS:
            return _FORMULA_FUNCTIONS[name](*children)
        if name not in functions:
            raise ExpressionError(f"{where} calls {name!r}, which no function definition gives")
        expected = len(functions[name].variables)
        if len(children) != expected:
            raise ExpressionError(
                f"{where} calls {name} with {len(children)} argument(s); its function "
                f"definition takes {expected}"
            )
        return functions[name](*children)
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple(*children)
    relation = _RELATIONS.get(kind)
    if relation is not None:
        if len(children) == 2:
            return relation(*children)
        return sympy.And(*[relation(a, b) for a, b in zip(children[:-1], children[1:])])
    logical = _LOGICAL.get(kind)
    if logical is not None:
        return logical(*[_truth(c) for c in children])
    text = lib.formulaToL3String(node) if node is not None else "?"
    raise ExpressionError(f"{where} uses {text!r}, which diffsim cannot read (not supported)")


def _log(value):
    # unevaluated: SymPy would turn log(0) into complex infinity, which has no JAX value
    return sympy.log(value, evaluate=False) if value.is_Number else sympy.log(value)


@functools.cache
def _conditions():
    """What is a condition (a Symbol is a SymPy Boolean too, but here a number)."""
    return (
        sympy.logic.boolalg.BooleanAtom,
        sympy.logic.boolalg.BooleanFunction,
        sympy.core.relational.Relational,
    )


def as_number(expr):
    """`expr` where a number is expected: true and false as 1 and 0, a condition as 1 where
    it holds and 0 elsewhere."""
    if _boolean_piecewise(expr):
        expr = _truth(expr)
    if isinstance(expr, _conditions()):
        if expr is sympy.true or expr is sympy.false:
            return sympy.Integer(int(bool(expr)))
        return sympy.Piecewise((1, expr), (0, True))
    return expr


def _takes_conditions(kind) -> bool:
    """Whether the children of an AST node of `kind` are conditions, kept boolean: the
    logical operators, and piecewise (whose conditions `_truth` reads)."""
    lib = _libsbml()
    return kind in (
        lib.AST_LOGICAL_AND,
        lib.AST_LOGICAL_OR,
        lib.AST_LOGICAL_NOT,
        lib.AST_LOGICAL_XOR,
        lib.AST_FUNCTION_PIECEWISE,
    )


# PEtab's functions that SBML lacks (petab v2 math: sign, log2)
_FORMULA_FUNCTIONS = {"sign": lambda x: sympy.sign(x), "log2": lambda x: _log(x) / sympy.log(2)}


def _truth(expr):
    """A condition: a relational or a boolean; a number is true where it is not 0."""
    if _boolean_piecewise(expr):
        # a piecewise of true and false (a condition chosen by conditions): as a condition.
        # Compared with 0 it would be a boolean, never equal to a number: always true
        pieces, earlier = [], sympy.true
        for value, condition in expr.args:
            pieces.append(sympy.And(earlier, condition, value))
            earlier = sympy.And(earlier, sympy.Not(condition))
        return sympy.Or(*pieces)
    if isinstance(expr, _conditions()):
        return expr
    return sympy.Ne(expr, 0)


def _boolean_piecewise(expr) -> bool:
    return isinstance(expr, sympy.Piecewise) and all(
        isinstance(value, _conditions()) for value, _ in expr.args
    )


def _lookups():
    lib = _libsbml()
    simple = {
        lib.AST_FUNCTION_ABS: sympy.Abs,
        lib.AST_FUNCTION_EXP: sympy.exp,
        lib.AST_FUNCTION_FLOOR: sympy.floor,
        lib.AST_FUNCTION_CEILING: sympy.ceiling,
        lib.AST_FUNCTION_SIN: sympy.sin,
        lib.AST_FUNCTION_COS: sympy.cos,
        lib.AST_FUNCTION_TAN: sympy.tan,
        lib.AST_FUNCTION_SINH: sympy.sinh,
        lib.AST_FUNCTION_COSH: sympy.cosh,
        lib.AST_FUNCTION_TANH: sympy.tanh,
        lib.AST_FUNCTION_ARCSIN: sympy.asin,
        lib.AST_FUNCTION_ARCCOS: sympy.acos,
        lib.AST_FUNCTION_ARCTAN: sympy.atan,
        lib.AST_FUNCTION_ARCSINH: sympy.asinh,
        lib.AST_FUNCTION_ARCCOSH: sympy.acosh,
        lib.AST_FUNCTION_ARCTANH: sympy.atanh,
        lib.AST_FUNCTION_SEC: sympy.sec,
        lib.AST_FUNCTION_CSC: sympy.csc,
        lib.AST_FUNCTION_COT: sympy.cot,
        lib.AST_FUNCTION_ARCSEC: sympy.asec,
        lib.AST_FUNCTION_ARCCSC: sympy.acsc,
        lib.AST_FUNCTION_ARCCOT: sympy.acot,
        lib.AST_FUNCTION_SECH: sympy.sech,
        lib.AST_FUNCTION_CSCH: sympy.csch,
        lib.AST_FUNCTION_COTH: sympy.coth,
        lib.AST_FUNCTION_ARCSECH: sympy.asech,
        lib.AST_FUNCTION_ARCCSCH: sympy.acsch,
        lib.AST_FUNCTION_ARCCOTH: sympy.acoth,
        lib.AST_FUNCTION_MAX: sympy.Max,
        lib.AST_FUNCTION_MIN: sympy.Min,
        lib.AST_FUNCTION_FACTORIAL: sympy.factorial,
        lib.AST_FUNCTION_QUOTIENT: lambda a, b: sympy.floor(a / b),
        lib.AST_FUNCTION_REM: lambda a, b: a - b * sympy.floor(a / b),
    }
    relations = {
        lib.AST_RELATIONAL_EQ: sympy.Eq,
        lib.AST_RELATIONAL_NEQ: sympy.Ne,
        lib.AST_RELATIONAL_LT: sympy.StrictLessThan,
        lib.AST_RELATIONAL_LEQ: sympy.LessThan,
        lib.AST_RELATIONAL_GT: sympy.StrictGreaterThan,
        lib.AST_RELATIONAL_GEQ: sympy.GreaterThan,
    }
    logical = {
        lib.AST_LOGICAL_AND: sympy.And,
        lib.AST_LOGICAL_OR: sympy.Or,
        lib.AST_LOGICAL_NOT: sympy.Not,
        lib.AST_LOGICAL_XOR: sympy.Xor,
    }
    return simple, relations, logical


class _Lazy(dict):
    """A lookup table built on first use (libsbml and SymPy are imported only by the
    importers)."""

    def __init__(self, build: Callable[[], dict]):
        super().__init__()
        self.build = build

    def get(self, key, default=None):
        if not self:
            self.update(self.build())
        return super().get(key, default)


_SIMPLE, _RELATIONS, _LOGICAL = (_Lazy(lambda k=k: _lookups()[k]) for k in range(3))


def parse_formula(text: str, where: str) -> sympy.Expr:
    """A formula written as text (PEtab's observable and noise formulas) by libsbml's infix
    parser (`**` read as `^`); its functions are SBML's."""
    lib = _libsbml()
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(f"{where}: the formula is empty")
    settings = lib.L3ParserSettings()
    # PEtab's log(x) is the natural logarithm (libsbml's infix default reads it as log10)
    settings.setParseLog(lib.L3P_PARSE_LOG_AS_LN)
    node = lib.parseL3FormulaWithSettings(text.replace("**", "^"), settings)
    if node is None:
        raise ExpressionError(f"{where}: {text!r} is not a formula ({lib.getLastParseL3Error()})")
    return from_ast(node, where=where, formula=True)


# --- SymPy -> JAX --------------------------------------------------------------------------------


def compile_expression(expr: sympy.Expr, where: str = "an expression") -> Callable:
    """A function `env -> value` of a SymPy expression, `env` a dict from symbol names (and
    "time") to JAX values; built once by walking the tree into closures."""
    return _compile(sympy.sympify(expr), where)


def _compile(expr, where):
    if isinstance(expr, sympy.Symbol):
        name = expr.name

        def symbol(env):
            try:
                return env[name]
            except KeyError:
                raise ExpressionError(
                    f"{where} names {name!r}, which the model does not define"
                ) from None

        return symbol
    if expr is sympy.true or expr is sympy.false:
        value = bool(expr)
        return lambda env: jnp.asarray(value)
    if expr.is_Number or expr in (sympy.pi, sympy.E) or expr is sympy.nan:
        value = float(expr) if expr is not sympy.nan else math.nan
        return lambda env: value
    if expr in (sympy.oo, -sympy.oo):
        value = math.inf if expr is sympy.oo else -math.inf
        return lambda env: value
    if isinstance(expr, sympy.Piecewise):
        pieces = [(_compile(e, where), _compile(c, where)) for e, c in expr.args]

        def piecewise(env):
            out = pieces[-1][0](env)
            for value, condition in reversed(pieces[:-1]):
                out = jnp.where(condition(env), value(env), out)
            return out

        return piecewise
    args = [_compile(a, where) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return lambda env: _fold(jnp.add, [a(env) for a in args])
    if isinstance(expr, sympy.Mul):
        return lambda env: _fold(jnp.multiply, [a(env) for a in args])
    if isinstance(expr, sympy.Pow):
        base, exponent = args
        if expr.exp == sympy.Rational(1, 2):
            return lambda env: jnp.sqrt(base(env))
        if expr.exp.is_Integer:
            power = int(expr.exp)
            return lambda env: jnp.asarray(base(env)) ** power
        return lambda env: jnp.power(base(env), exponent(env))
    function = _JAX.get(type(expr))
    if function is not None:
        return lambda env: function(*[a(env) for a in args])
    raise ExpressionError(f"{where} uses {expr.func.__name__}, which diffsim cannot evaluate")


def _fold(op, values):
    out = values[0]
    for value in values[1:]:
        out = op(out, value)
    return out


def _jax_functions() -> dict:
    return {
        sympy.exp: jnp.exp,
        sympy.log: jnp.log,
        sympy.Abs: jnp.abs,
        sympy.sign: jnp.sign,
        sympy.floor: jnp.floor,
        sympy.ceiling: jnp.ceil,
        sympy.sin: jnp.sin,
        sympy.cos: jnp.cos,
        sympy.tan: jnp.tan,
        sympy.sinh: jnp.sinh,
        sympy.cosh: jnp.cosh,
        sympy.tanh: jnp.tanh,
        sympy.asin: jnp.arcsin,
        sympy.acos: jnp.arccos,
        sympy.atan: jnp.arctan,
        sympy.asinh: jnp.arcsinh,
        sympy.acosh: jnp.arccosh,
        sympy.atanh: jnp.arctanh,
        sympy.sec: lambda x: 1 / jnp.cos(x),
        sympy.csc: lambda x: 1 / jnp.sin(x),
        sympy.cot: lambda x: 1 / jnp.tan(x),
        sympy.asec: lambda x: jnp.arccos(1 / x),
        sympy.acsc: lambda x: jnp.arcsin(1 / x),
        sympy.acot: lambda x: jnp.arctan(1 / x),
        sympy.sech: lambda x: 1 / jnp.cosh(x),
        sympy.csch: lambda x: 1 / jnp.sinh(x),
        sympy.coth: lambda x: 1 / jnp.tanh(x),
        sympy.asech: lambda x: jnp.arccosh(1 / x),
        sympy.acsch: lambda x: jnp.arcsinh(1 / x),
        sympy.acoth: lambda x: jnp.arctanh(1 / x),
        sympy.factorial: lambda x: jnp.exp(gammaln(x + 1.0)),
        sympy.Max: lambda *x: _fold(jnp.maximum, list(x)),
        sympy.Min: lambda *x: _fold(jnp.minimum, list(x)),
        sympy.Eq: jnp.equal,
        sympy.Ne: jnp.not_equal,
        sympy.StrictLessThan: jnp.less,
        sympy.LessThan: jnp.less_equal,
        sympy.StrictGreaterThan: jnp.greater,
        sympy.GreaterThan: jnp.greater_equal,
        sympy.And: lambda *x: _fold(jnp.logical_and, list(x)),
        sympy.Or: lambda *x: _fold(jnp.logical_or, list(x)),
        sympy.Not: jnp.logical_not,
        sympy.Xor: lambda *x: _fold(jnp.logical_xor, list(x)),
    }


_JAX = _Lazy(_jax_functions)
