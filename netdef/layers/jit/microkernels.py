"""Register-blocked convolution microkernels, written as LLVM IR and compiled for this CPU by llvmlite.

OpenBLAS multiplies the narrow matrices of small-image convolutions (32-64 output channels) at well
below the rate PyTorch's convolutions reach, and numba loops written for the same blocking ran far
slower still: LLVM kept their accumulator block in memory (benchmarks/README.md, "The figures behind
the other layers' choices"). Written in IR, with explicit vector
types and one SSA value per accumulator, the block lives in registers: a multiply-add of a broadcast
input value and a vector of output channels per register, and nothing else in the inner loop.

Two families, both over float or double vectors of the CPU's native width (``Shape``):

- ``taps_{w}`` (forward, and the stride-1 input gradient): for ``w`` output pixels and ``vectors``
  vectors of output channels, acc[j][v] = sum_t x[off[t] + j*ps] * wt[t][v], t over the taps in order,
  stored to y[j][v] (pixel-major, the channel block contiguous). The accumulators start at zero.
- ``pixels_{k}`` (the weight gradient): for ``k`` taps and the same channel block,
  acc[k][v] += sum over rows r and columns p of x[off[k] + r*xrs + p*ps] * dy[r*dyrs + p*block + v],
  loaded from and stored back to dw[k][v], so that the sum goes on across calls (images).

A third, ``transpose`` (with and without a bias added), moves a square tile of lanes x lanes values
between the NCHW layout (a row per channel) and the blocked one (a row per pixel) with vector loads,
shuffles and stores, where numba's loops stored one value at a time (jit/direct_conv.py's to_blocks
and from_blocks ran at a third of a copy's speed).

A fourth, ``depthwise_{w}``, sums the taps of a depthwise convolution for ``w`` output pixels of one
vector of channels in the same blocked layout: acc[j] = sum_t wt[t] * x[off[t] + j*ps], a vector load of
the input per tap and pixel where the others broadcast one value (jit/depthwise.py); and
``depthwise_weights_{k}``, its weight gradient for ``k`` taps: ``pixels_{k}`` for one vector of
channels whose input is blocked too.

Each output or gradient element is one accumulator, summed in a fixed order (taps in order; images,
rows and columns in order) with fused multiply-adds: the result is the same whatever the blocking, the
thread count or the vector width, so runs and resumes are bit-exact. The kernels are called from numba
(jit/direct_conv.py, jit/depthwise.py; jit/kernel_calls.py) through their addresses; the compiled code
lives as long as the process.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools

import numpy as np

# Accumulator blocks are at most this wide where the CPU has 32 vector registers (AVX-512): 12 x 2
# accumulators, 2 vectors and a broadcast fit in them. The weight gradient's 12 taps per call ran at
# least as fast as 10 on every shape tried; the forward's 12 pixels per call ran slower than 10 on
# 55-56 pixel wide rows and no faster on CIFAR's narrow ones, so the forward takes 10 (the figures:
# benchmarks/README.md, "The figures behind the other layers' choices").
WIDEST_PIXELS_32_REGISTERS = 10  # output pixels per call of the taps kernels
WIDEST_TAPS_32_REGISTERS = 12  # taps per call of the pixels kernels
# With 16 registers (AVX, NEON as LLVM sees it): 6 x 2 accumulators.
WIDEST_16_REGISTERS = 6
# The depthwise kernels keep one vector per output pixel: 16 accumulators, a weight vector and an input
# vector on AVX-512, 12 with 16 registers (a 14-wide row of MobileNet's then takes two calls).
WIDEST_DEPTHWISE_32_REGISTERS = 16
WIDEST_DEPTHWISE_16_REGISTERS = 12
# Their weight gradient keeps one vector per tap: a 3x3 kernel's 9 in one call, a 5x5's in spans.
DEPTHWISE_TAPS_32_REGISTERS = 12
DEPTHWISE_TAPS_16_REGISTERS = 8
VECTORS_PER_BLOCK = 2  # vectors of output channels per call: 32 float channels on AVX-512


@dataclasses.dataclass(frozen=True)
class Shape:
    """The vector shape the kernels of one element type are generated for."""

    element: str  # "float" or "double"
    lanes: int  # elements per vector register
    vectors: int  # vectors of output channels per block
    widest_pixels: int  # most output pixels per call of the taps kernels
    widest_taps: int  # most taps per call of the pixels kernels
    widest_depthwise: int  # most output pixels per call of the depthwise kernels
    depthwise_taps: int  # most taps per call of the depthwise weight gradient kernels

    @property
    def channels(self) -> int:
        """Output channels per block: the kernels' weights and outputs are laid out in blocks of this many."""
        return self.lanes * self.vectors


@dataclasses.dataclass(frozen=True)
class Kernels:
    """Addresses of the compiled kernels of one element type: ``taps[variant, w - 1]`` takes w pixels
    (1 <= w <= shape.widest_pixels; variants: TAPS_VARIANTS), ``pixels[k - 1]`` k taps (1 <= k <=
    shape.widest_taps), ``depthwise[w - 1]`` w pixels."""

    shape: Shape
    taps: np.ndarray  # int64 addresses
    pixels: np.ndarray
    transpose: np.ndarray  # [plain, with the bias added]
    depthwise: np.ndarray  # depthwise[w - 1] takes w pixels (1 <= w <= shape.widest_depthwise)
    depthwise_weights: np.ndarray  # depthwise_weights[k - 1] takes k taps (1 <= k <= shape.depthwise_taps)


@functools.lru_cache(maxsize=None)
def _host():
    """llvmlite's binding, this CPU's name and features (asked once: a layer's reshape, every forward,
    asks which shape the kernels have, and LLVM's feature query costs tens of microseconds)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features = llvm.get_host_cpu_features()
    return llvm, llvm.get_host_cpu_name(), features


@functools.lru_cache(maxsize=None)
def shape_for(dtype) -> Shape:
    """The native vector shape for ``dtype`` on this CPU."""
    _, _, features = _host()
    itemsize = np.dtype(dtype).itemsize
    if features.get("avx512f"):
        register_bytes, pixels, taps = 64, WIDEST_PIXELS_32_REGISTERS, WIDEST_TAPS_32_REGISTERS
        depthwise, depthwise_taps = WIDEST_DEPTHWISE_32_REGISTERS, DEPTHWISE_TAPS_32_REGISTERS
    else:
        register_bytes, pixels, taps = (32 if features.get("avx") else 16), WIDEST_16_REGISTERS, WIDEST_16_REGISTERS
        depthwise, depthwise_taps = WIDEST_DEPTHWISE_16_REGISTERS, DEPTHWISE_TAPS_16_REGISTERS
    element = {4: "float", 8: "double"}[itemsize]
    return Shape(element, register_bytes // itemsize, VECTORS_PER_BLOCK, pixels, taps, depthwise, depthwise_taps)


class _Emitter:
    """Lines of one IR function; names the vector type and the multiply-add once."""

    def __init__(self, shape: Shape, fused: bool):
        self.s = shape
        suffix = f"v{shape.lanes}f{32 if shape.element == 'float' else 64}"
        self.vec = f"<{shape.lanes} x {shape.element}>"
        # llvm.fma is exact (one rounding) everywhere, but a CPU without FMA units computes it in a
        # library call; fmuladd lets such a CPU multiply and add (its results then differ in rounding).
        self.fma = f"@llvm.{'fma' if fused else 'fmuladd'}.{suffix}"
        self.lines: list[str] = []

    def __call__(self, line: str):
        self.lines.append("  " + line if not line.endswith(":") else line)

    @property
    def align(self) -> int:
        return 4 if self.s.element == "float" else 8

    def count_up(self, counter: str, limit: str, again: str, done: str):
        """%counter.next = %counter + 1; on to ``again`` while it is below %limit, else ``done``."""
        self(f"%{counter}.next = add i64 %{counter}, 1")
        self(f"%{counter}.more = icmp ult i64 %{counter}.next, %{limit}")
        self(f"br i1 %{counter}.more, label %{again}, label %{done}")

    def madd_broadcast(self, index: int, pointer: str, vectors: str):
        """The accumulators a{index}.q (q over the block's vectors) plus the value at ``pointer``,
        broadcast, times the vectors %{vectors}q; results n{index}.q."""
        self.broadcast(f"x{index}", pointer)
        for q in range(self.s.vectors):
            self.madd(f"n{index}.{q}", f"%x{index}", f"%{vectors}{q}", f"%a{index}.{q}")

    def pointers(self, *names: str):
        """%name = the i64 argument %{name}a as a pointer."""
        for name in names:
            self(f"%{name} = inttoptr i64 %{name}a to ptr")

    def accumulator_phis(self, count: int, into: str, first: str | None, entry: str, block: str,
                         vectors: int | None = None):
        """%{into}i.q = %{first}i.q (zeros if ``first`` is None) coming from ``entry``, %ni.q coming
        from ``block``; i < count, q over ``vectors`` (default: the block's vectors)."""
        for i in range(count):
            for q in range(self.s.vectors if vectors is None else vectors):
                start = "zeroinitializer" if first is None else f"%{first}{i}.{q}"
                self(f"%{into}{i}.{q} = phi {self.vec} [{start}, %{entry}], [%n{i}.{q}, %{block}]")

    def scatter_rows(self, width: int):
        """Stores acc n{j}.{q} plus the bias vector q to the NCHW output (see taps_kernel_ir): one
        masked scatter per vector, lane i to channel q*lanes + i, i.e. i*plane elements apart."""
        s, v = self.s, self.vec
        lanes = f"<{s.lanes} x i64>"
        pointers = f"<{s.lanes} x ptr>"
        self(f"%plane.i = insertelement {lanes} poison, i64 %plane, i64 0")
        self(f"%plane.v = shufflevector {lanes} %plane.i, {lanes} poison, <{s.lanes} x i32> zeroinitializer")
        self(f"%valid.i = insertelement {lanes} poison, i64 %valid, i64 0")
        self(f"%valid.v = shufflevector {lanes} %valid.i, {lanes} poison, <{s.lanes} x i32> zeroinitializer")
        for q in range(s.vectors):
            channels = ", ".join(f"i64 {q * s.lanes + i}" for i in range(s.lanes))
            self(f"%lane{q} = mul {lanes} <{channels}>, %plane.v")
            self(f"%mask{q} = icmp slt {lanes} <{channels}>, %valid.v")
            self.load_vector(f"bias{q}", "%bias", q * s.lanes)
        for j in range(width):
            self(f"%row{j} = getelementptr {s.element}, ptr %y, i64 {j}")
            self(f"%row{j}.i = insertelement {pointers} poison, ptr %row{j}, i64 0")
            self(f"%row{j}.v = shufflevector {pointers} %row{j}.i, {pointers} poison, <{s.lanes} x i32> zeroinitializer")
            for q in range(s.vectors):
                self(f"%out{j}.{q} = fadd {v} %n{j}.{q}, %bias{q}")
                self(f"%at{j}.{q} = getelementptr {s.element}, {pointers} %row{j}.v, {lanes} %lane{q}")
                self(f"call void {self.scatter}({v} %out{j}.{q}, {pointers} %at{j}.{q}, i32 {self.align}, "
                     f"<{s.lanes} x i1> %mask{q})")

    @property
    def scatter(self) -> str:
        return f"@llvm.masked.scatter.v{self.s.lanes}f{32 if self.s.element == 'float' else 64}.v{self.s.lanes}p0"

    def declaration(self) -> str:
        v, s = self.vec, self.s
        return (f"declare {v} {self.fma}({v}, {v}, {v})\n"
                f"declare void {self.scatter}({v}, <{s.lanes} x ptr>, i32 immarg, <{s.lanes} x i1>)")

    def broadcast(self, name: str, pointer: str):
        s, v = self.s, self.vec
        self(f"%{name}.s = load {s.element}, ptr {pointer}, align {self.align}")
        self(f"%{name}.i = insertelement {v} poison, {s.element} %{name}.s, i64 0")
        self(f"%{name} = shufflevector {v} %{name}.i, {v} poison, <{s.lanes} x i32> zeroinitializer")

    def load_vector(self, name: str, base: str, offset):
        self(f"%{name}.p = getelementptr {self.s.element}, ptr {base}, i64 {offset}")
        self(f"%{name} = load {self.vec}, ptr %{name}.p, align {self.align}")

    def madd(self, out: str, a: str, b: str, acc: str):
        self(f"%{out} = call {self.vec} {self.fma}({self.vec} {a}, {self.vec} {b}, {self.vec} {acc})")


# The taps kernels' variants, in the order of their rows in Kernels.taps: whether the sum starts from
# zero or from the partial sums of earlier calls (a sum over more taps than one call's, whose weights
# would not stay in cache, goes on over calls in the same order), and whether the result is stored
# blocked (partial sums) or, the last call, with the bias into the output's own NCHW layout.
TAPS_VARIANTS = (("zero", "blocked"), ("zero", "nchw"), ("partial", "blocked"), ("partial", "nchw"))


def taps_kernel_ir(e: _Emitter, name: str, width: int, start: str, finish: str) -> None:
    """acc[j][v] = (0 or p[j][v]) + sum_t x[off[t] + j*ps] * wt[t*block + v*lanes ...], p the blocked
    partial sums at ``part`` (j*block + v*lanes ...); then acc to p, or acc + bias[v*lanes ...] to the
    NCHW output: channel v*lanes + lane of pixel j at y + (v*lanes + lane)*plane + j, the channels
    below ``valid`` only (the block's trailing channels past the layer's are not stored).
    Arguments (all i64): x, wt, part, off (i64 table), taps (>= 1), ps, y, plane, valid, bias."""
    s, v = e.s, e.vec
    block = s.channels
    e(f"define void @{name}(i64 %xa, i64 %wa, i64 %parta, i64 %offa, i64 %taps, i64 %ps, i64 %ya, i64 %plane, "
      f"i64 %valid, i64 %biasa) {{")
    e("entry:")
    e.pointers("x", "w", "part", "off", "y", "bias")
    for j in range(width):
        for k in range(s.vectors):
            e(f"%p{j}.{k} = getelementptr {s.element}, ptr %part, i64 {j * block + k * s.lanes}")
            if start == "partial":
                e(f"%s{j}.{k} = load {v}, ptr %p{j}.{k}, align {e.align}")
    e("br label %loop")
    e("loop:")
    e("%t = phi i64 [0, %entry], [%t.next, %loop]")
    e.accumulator_phis(width, "a", "s" if start == "partial" else None, "entry", "loop")
    e("%off.p = getelementptr i64, ptr %off, i64 %t")
    e("%o = load i64, ptr %off.p, align 8")
    e("%xb = getelementptr " + s.element + ", ptr %x, i64 %o")
    e(f"%wrow = mul i64 %t, {block}")
    e(f"%wb = getelementptr {s.element}, ptr %w, i64 %wrow")
    for k in range(s.vectors):
        e.load_vector(f"w{k}", "%wb", k * s.lanes)
    for j in range(width):
        e(f"%xo{j} = mul i64 %ps, {j}")
        e(f"%xp{j} = getelementptr {s.element}, ptr %xb, i64 %xo{j}")
        e.madd_broadcast(j, f"%xp{j}", "w")
    e.count_up("t", "taps", "loop", "done")
    e("done:")
    if finish == "blocked":
        for j in range(width):
            for k in range(s.vectors):
                e(f"store {v} %n{j}.{k}, ptr %p{j}.{k}, align {e.align}")
    else:
        e.scatter_rows(width)
    e("ret void")
    e("}")


def pixels_kernel_ir(e: _Emitter, name: str, count: int, depthwise: bool = False) -> None:
    """acc[k][v] = dw[k][v] + sum_{r < rows, p < cols} x[off[k] + r*xrs + p*ps] * dy[r*dyrs + p*block + v];
    stored back to dw. With ``depthwise``, one vector of ``lanes`` channels whose input is blocked too:
    acc[k] = dw[k] + the sum of dy[r*dyrs + p*lanes ...] * x[off[k] + r*xrs + p*ps ...] lane by lane (a
    vector load of the input, not a broadcast). Arguments (all i64): x, dy, dw, off (i64 table), rows,
    cols (both >= 1), ps, xrs, dyrs."""
    s, v = e.s, e.vec
    vectors = 1 if depthwise else s.vectors
    block = s.lanes * vectors
    e(f"define void @{name}(i64 %xa, i64 %dya, i64 %dwa, i64 %offa, i64 %rows, i64 %cols, i64 %ps, "
      f"i64 %xrs, i64 %dyrs) {{")
    e("entry:")
    e.pointers("x", "dy", "dw", "off")
    for k in range(count):
        e(f"%off{k}.p = getelementptr i64, ptr %off, i64 {k}")
        e(f"%off{k} = load i64, ptr %off{k}.p, align 8")
        e(f"%xk{k} = getelementptr {s.element}, ptr %x, i64 %off{k}")
        for q in range(vectors):
            e.load_vector(f"s{k}.{q}", "%dw", k * block + q * s.lanes)
    e("br label %row")
    e("row:")
    e("%r = phi i64 [0, %entry], [%r.next, %row.end]")
    e.accumulator_phis(count, "b", "s", "entry", "row.end", vectors)
    e("%xr = mul i64 %r, %xrs")
    e("%dr = mul i64 %r, %dyrs")
    e("br label %col")
    e("col:")
    e("%p = phi i64 [0, %row], [%p.next, %col]")
    e.accumulator_phis(count, "a", "b", "row", "col", vectors)
    e("%xp = mul i64 %p, %ps")
    e("%xo = add i64 %xp, %xr")
    e(f"%dp = mul i64 %p, {block}")
    e("%do = add i64 %dp, %dr")
    for q in range(vectors):
        e(f"%do{q} = add i64 %do, {q * s.lanes}")
        e.load_vector(f"g{q}", "%dy", f"%do{q}")
    for k in range(count):
        if depthwise:
            e.load_vector(f"xv{k}", f"%xk{k}", "%xo")
            e.madd(f"n{k}.0", "%g0", f"%xv{k}", f"%a{k}.0")
        else:
            e(f"%xq{k} = getelementptr {s.element}, ptr %xk{k}, i64 %xo")
            e.madd_broadcast(k, f"%xq{k}", "g")
    e.count_up("p", "cols", "col", "row.end")
    e("row.end:")
    e.count_up("r", "rows", "row", "done")
    e("done:")
    for k in range(count):
        for q in range(vectors):
            e(f"store {v} %n{k}.{q}, ptr %s{k}.{q}.p, align {e.align}")
    e("ret void")
    e("}")


def depthwise_kernel_ir(e: _Emitter, name: str, width: int) -> None:
    """acc[j] = sum_t wt[t*lanes ...] * x[off[t] + j*ps ...] lane by lane, t over the taps in order from
    zero; stored to y[j*ys ...]: ``width`` output pixels of one block of ``lanes`` channels of a
    depthwise convolution, input and output in the channel-blocked layout (a pixel's block of
    channels contiguous), so that each tap is one vector load and multiply-add per pixel. Arguments
    (all i64): x, wt, y, off (i64 table), taps (>= 1), ps and ys (elements between the pixels' inputs,
    and between their outputs)."""
    s, v = e.s, e.vec
    e(f"define void @{name}(i64 %xa, i64 %wa, i64 %ya, i64 %offa, i64 %taps, i64 %ps, i64 %ys) {{")
    e("entry:")
    e.pointers("x", "w", "y", "off")
    e("br label %loop")
    e("loop:")
    e("%t = phi i64 [0, %entry], [%t.next, %loop]")
    for j in range(width):
        e(f"%a{j} = phi {v} [zeroinitializer, %entry], [%n{j}, %loop]")
    e("%off.p = getelementptr i64, ptr %off, i64 %t")
    e("%o = load i64, ptr %off.p, align 8")
    e(f"%xb = getelementptr {s.element}, ptr %x, i64 %o")
    e(f"%wrow = mul i64 %t, {s.lanes}")
    e.load_vector("wv", "%w", "%wrow")
    for j in range(width):
        e(f"%xo{j} = mul i64 %ps, {j}")
        e.load_vector(f"xv{j}", "%xb", f"%xo{j}")
        e.madd(f"n{j}", "%wv", f"%xv{j}", f"%a{j}")
    e.count_up("t", "taps", "loop", "done")
    e("done:")
    for j in range(width):
        e(f"%yo{j} = mul i64 %ys, {j}")
        e(f"%y{j}.p = getelementptr {s.element}, ptr %y, i64 %yo{j}")
        e(f"store {v} %n{j}, ptr %y{j}.p, align {e.align}")
    e("ret void")
    e("}")


def transpose_kernel_ir(e: _Emitter, name: str, add_bias: bool) -> None:
    """dst[i*ds + r] = src[r*ss + i] (+ bias[i]) for r, i < lanes: the tile's rows become its columns,
    by log2(lanes) rounds of two-vector shuffles, each exchanging one bit of the row index with the
    same bit of the column index. Arguments (all i64): src, ss, dst, ds, bias (read with ``add_bias``)."""
    s, v = e.s, e.vec
    n = s.lanes
    e(f"define void @{name}(i64 %srca, i64 %ss, i64 %dsta, i64 %ds, i64 %biasa) {{")
    e("entry:")
    e.pointers("src", "dst", "bias")
    for r in range(n):
        e(f"%so{r} = mul i64 %ss, {r}")
        e.load_vector(f"t0.{r}", "%src", f"%so{r}")
    stage, bit = 0, 1
    while bit < n:
        for i in range(n):
            if i & bit:
                continue
            low = ", ".join(f"i32 {c if not c & bit else n + c - bit}" for c in range(n))
            high = ", ".join(f"i32 {c + bit if not c & bit else n + c}" for c in range(n))
            e(f"%t{stage + 1}.{i} = shufflevector {v} %t{stage}.{i}, {v} %t{stage}.{i + bit}, <{n} x i32> <{low}>")
            e(f"%t{stage + 1}.{i + bit} = shufflevector {v} %t{stage}.{i}, {v} %t{stage}.{i + bit}, "
              f"<{n} x i32> <{high}>")
        stage, bit = stage + 1, bit * 2
    for i in range(n):
        value = f"%t{stage}.{i}"
        if add_bias:
            e(f"%bias{i}.p = getelementptr {s.element}, ptr %bias, i64 {i}")
            e.broadcast(f"b{i}", f"%bias{i}.p")
            e(f"%u{i} = fadd {v} {value}, %b{i}")
            value = f"%u{i}"
        e(f"%do{i} = mul i64 %ds, {i}")
        e(f"%dp{i} = getelementptr {s.element}, ptr %dst, i64 %do{i}")
        e(f"store {v} {value}, ptr %dp{i}, align {e.align}")
    e("ret void")
    e("}")


_ENGINES = []  # the compiled code must outlive every call: one engine per element type, never freed


@functools.lru_cache(maxsize=None)
def kernels_for(dtype) -> Kernels:
    """Compiles (once per process and element type) both families for this CPU."""
    llvm, cpu, features = _host()
    shape = shape_for(dtype)
    e = _Emitter(shape, fused=bool(features.get("fma") or features.get("neon") or features.get("avx512f")))
    for variant, (start, finish) in enumerate(TAPS_VARIANTS):
        for w in range(1, shape.widest_pixels + 1):
            taps_kernel_ir(e, f"taps_{variant}_{w}", w, start, finish)
    for k in range(1, shape.widest_taps + 1):
        pixels_kernel_ir(e, f"pixels_{k}", k)
    for add_bias in (False, True):
        transpose_kernel_ir(e, f"transpose_{int(add_bias)}", add_bias)
    for w in range(1, shape.widest_depthwise + 1):
        depthwise_kernel_ir(e, f"depthwise_{w}", w)
    for k in range(1, shape.depthwise_taps + 1):
        pixels_kernel_ir(e, f"depthwise_weights_{k}", k, depthwise=True)
    module = llvm.parse_assembly(e.declaration() + "\n" + "\n".join(e.lines))
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features.flatten(), opt=3)
    passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    passes.getModulePassManager().run(module, passes)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    _ENGINES.append(engine)
    taps = np.array([[engine.get_function_address(f"taps_{variant}_{w}") for w in range(1, shape.widest_pixels + 1)]
                     for variant in range(len(TAPS_VARIANTS))], np.int64)
    pixels = np.array([engine.get_function_address(f"pixels_{k}") for k in range(1, shape.widest_taps + 1)], np.int64)
    transpose = np.array([engine.get_function_address(f"transpose_{k}") for k in (0, 1)], np.int64)
    depthwise = np.array([engine.get_function_address(f"depthwise_{w}")
                          for w in range(1, shape.widest_depthwise + 1)], np.int64)
    depthwise_weights = np.array([engine.get_function_address(f"depthwise_weights_{k}")
                                  for k in range(1, shape.depthwise_taps + 1)], np.int64)
    return Kernels(shape, taps, pixels, transpose, depthwise, depthwise_weights)


def call_address(address: int, *args: int) -> None:
    """Calls a kernel from Python (tests): every argument an i64."""
    ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * len(args)))(address)(*args)
