"""Type aliases shared across the package (jaxtyping shape strings)."""

from typing import TypeAlias

from jaxtyping import Array, ArrayLike, Float, Int, PyTree

Times: TypeAlias = Float[ArrayLike, " times"]
Scalar: TypeAlias = Float[ArrayLike, ""]
State: TypeAlias = PyTree[Float[ArrayLike, "..."]]
ResultCode: TypeAlias = Int[Array, ""]

__all__ = ["Array", "ArrayLike", "ResultCode", "Scalar", "State", "Times", "PyTree"]
