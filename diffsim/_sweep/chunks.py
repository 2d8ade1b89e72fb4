"""The chunks of a sweep: how the member array is cut, which chunks are left, and computing them.

Invariants:

- A chunk is a rectangular block of the member array (`ChunkPlan.block`, the same for every
  chunk; the last ones along a dimension are cut short), so it is exactly one zarr chunk of every
  per-member variable and has a single writer.
- Every chunk runs padded to `ChunkPlan.padded` members (the last member repeated; a multiple of
  the device count), so the whole sweep compiles one program.
- Process `p` of `P` computes chunks `p, p + P, …` that the store does not mark done; which
  chunks a process runs never changes a member's numbers (its key comes from its index).
- Chunk `i + 1` is dispatched before chunk `i` is fetched and written: JAX runs asynchronously,
  so the devices compute while the host stores.
"""

import dataclasses
import math

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._validate import Bounded, check_static_count
from .axes import Axes
from .members import MemberOutputs, MemberSpec

_OUTPUT_BYTES_PER_CHUNK = 64 * 2**20  # default chunk: about this much output per chunk...
_MAX_DEFAULT_CHUNK = 2**16  # ...and at most this many members


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """The member array cut into rectangular blocks (chunks) of shape `block`; each runs padded
    to `padded` members (a multiple of the device count) so all share one compilation."""

    shape: tuple[int, ...]
    block: tuple[int, ...]
    padded: int

    @classmethod
    def build(cls, shape, chunk_size, bytes_per_member: int, num_devices: int) -> "ChunkPlan":
        """Check `chunk_size` (None: about 64 MiB of outputs, at most 65,536 members) and cut
        the member array of `shape` into blocks of at most that many members."""
        if chunk_size is None:
            by_memory = _OUTPUT_BYTES_PER_CHUNK // bytes_per_member
            chunk_size = max(1, min(_MAX_DEFAULT_CHUNK, by_memory))
        check_static_count("chunk_size", chunk_size)
        block = _block_shape(shape, min(int(chunk_size), math.prod(shape)))
        padded = -(-math.prod(block) // num_devices) * num_devices
        return cls(tuple(shape), block, padded)

    @property
    def blocks_per_dim(self) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(self.shape, self.block))

    @property
    def num_chunks(self) -> int:
        return math.prod(self.blocks_per_dim)

    def region(self, chunk: int) -> tuple[slice, ...]:
        """The slice of the member array that `chunk` covers, one per dimension."""
        corner = np.unravel_index(chunk, self.blocks_per_dim)
        return tuple(
            slice(c * b, min((c + 1) * b, n)) for c, b, n in zip(corner, self.block, self.shape)
        )

    def members_in(self, chunk: int) -> int:
        return math.prod(s.stop - s.start for s in self.region(chunk))

    def pending(self, process_id: int, num_processes: int, done: set[int]) -> list[int]:
        """This process's share of the chunks that are not `done` yet (resuming a store)."""
        return [c for c in range(process_id, self.num_chunks, num_processes) if c not in done]


def bytes_per_member(outputs: dict) -> int:
    """The bytes of one member's variables (`outputs`: name → shape and dtype)."""
    return max(1, sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in outputs.values()))


def _block_shape(shape, size: int) -> tuple[int, ...]:
    """A block of at most `size` members: whole trailing dimensions while they fit, then an even
    split of the next one (e.g. 100 rows of 100 in blocks of 4096 → 3 blocks of 34, 34, 32 rows
    rather than 40, 40, 20), then 1 along the leading ones."""
    block = [1] * len(shape)
    room = size
    for axis in reversed(range(len(shape))):
        n = shape[axis]
        if n <= room:
            block[axis] = n
            room //= n
        else:
            pieces = -(-n // room)
            block[axis] = -(-n // pieces)
            break
    return tuple(block)


class ChunkRunner:
    """Computes chunks: host-side member values → one jitted, device-sharded vmap."""

    def __init__(self, spec: MemberSpec, axes: Axes, plan: ChunkPlan, devices):
        self.spec, self.axes, self.plan = spec, axes, plan
        sharding = NamedSharding(Mesh(np.array(devices), ("batch",)), PartitionSpec("batch"))
        self._sharding = sharding
        self._program = _members_program(spec)
        self._dynamic = spec.dynamic()

    def launch(self, chunk: int) -> MemberOutputs:
        """Start computing `chunk` (asynchronously); returns the device outputs."""
        region = self.plan.region(chunk)
        positions = np.meshgrid(*(np.arange(s.start, s.stop) for s in region), indexing="ij")
        positions = tuple(p.ravel() for p in positions)
        count = positions[0].size
        pad = np.minimum(np.arange(self.plan.padded), count - 1)  # repeat the last member
        positions = tuple(p[pad] for p in positions)
        index = np.ravel_multi_index(positions, self.plan.shape).astype(np.uint32)
        values = self.axes.values_at(positions)
        values = {n: self._as_input(n, values[n]) for n in self.spec.inputs}
        # placed on this process's devices first: under jax.distributed, jit refuses numpy
        # inputs with a sharding over several devices (each process runs its own chunks)
        values, index = jax.device_put((values, index), self._sharding)
        return self._program(self._dynamic, values, index)

    def _as_input(self, name: str, values: np.ndarray) -> np.ndarray:
        if name == "y0":
            values = values.reshape(values.shape[0], -1)
        return np.asarray(values, dtype=self.spec.dtype)

    def fetch(
        self, chunk: int, device_outputs: MemberOutputs
    ) -> tuple[tuple[slice, ...], dict[str, np.ndarray]]:
        """The chunk's region and its variables as host arrays of the region's shape (the
        padding dropped)."""
        region = self.plan.region(chunk)
        region_shape = tuple(s.stop - s.start for s in region)
        count = math.prod(region_shape)
        return region, {
            name: np.asarray(x)[:count].reshape(region_shape + x.shape[1:])
            for name, x in device_outputs.by_name().items()
        }


_PROGRAMS = Bounded(16)  # program key -> compiled chunk function


def _members_program(spec: MemberSpec):
    """The compiled function of a chunk, `(spec.dynamic(), values, index) -> outputs`, shared by
    every sweep whose spec has the same `program_key` (a new jit per sweep would trace and
    compile again for new values of the same shapes)."""
    key = spec.program_key()
    try:
        program = _PROGRAMS.get(key)
    except TypeError:  # an unhashable part (e.g. a reduce object): a program of its own
        return _program_for(spec)
    if program is None:
        program = _PROGRAMS[key] = _program_for(spec)
    return program


def _program_for(template: MemberSpec):
    # XLA's default emitters, not diffsim's faster-compiling ones (`_compile.py`): a sweep's
    # wall time is its run, and they run a `vmap`ped adaptive solve up to ~10 % faster
    @eqx.filter_jit
    def run(dynamic, values, index):
        # the template's static parts with this sweep's arrays; values and index arrive
        # placed on the chunk's devices, so the outputs are sharded as they are
        spec = dataclasses.replace(template, **dynamic)
        return jax.vmap(spec.member)(values, index)

    return run


def run_chunks(chunks, runner: ChunkRunner, sink, bar) -> None:
    """Compute `chunks` in order and hand each to `sink.write` (`bar` counts the members)."""
    in_flight = None
    for chunk in [*chunks, None]:
        launched = None if chunk is None else (chunk, runner.launch(chunk))
        if in_flight is not None:
            done, outputs = in_flight
            sink.write(done, *runner.fetch(done, outputs))
            bar.update(runner.plan.members_in(done))
        in_flight = launched
