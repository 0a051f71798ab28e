"""Sibling LoRA projections of one input in one product while decoding: q/k/v, and gate/up.

A decode step of a small model on MLX's CUDA backend is bound by the host's cost per operation (see
`lora_kernel.py`). An attention layer's q, k and v projections read the same input, and so do an MLP's
gate and up projections; each adapted projection costs a 4-bit product, a bias add where it has one, and
the fused LoRA kernel. Grouped, the siblings cost one of each: the 4-bit weights are concatenated along
their outputs (the members keep views into that one copy, so the base is held once), the LoRA factors
become one `A = [A_1 .. A_n]` and one block-diagonal `B` with each member's scale folded in (rebuilt when
an adapter is loaded: the group keeps the arrays it was built from and compares them by identity), and
the product's columns are handed back to each member. Up to the fused kernel's rows the LoRA term is that
kernel; above them (a batch of agents), the factors' two products and an add for the whole group. Per layer of
the 0.5B shape: 17 operations become 7 at one row, and ~45 become ~17 at 128 rows.

mlx-lm's attention and MLP modules call the siblings one after another with the same input array, so
the first member called computes the group and the others take their slice: a member called with any
other input, with as many rows as its 4-bit product dequantizes for (a long prefill, `model/backend.py`), in
training, or outside the engine's `inference()`, runs alone as before. The results equal the members' own up to the order of float32
additions inside the kernel (tested against the members run alone).

Off by default: on the H200 (0.5B shape) 128 agents took 11.1 / 10.2 s grouped against 9.9 / 10.0 s
alone: MLX's launch time per run fell by ~0.4-1.0 s and the Python building the steps grew by ~0.5 s, and the
one-conversation serving runs were too noisy to tell (benchmarks/RESULTS.md). `ARTMLX_LORA_GROUPS=1` turns it
on, for measuring it on other machines (a Mac's Metal backend pays other launch costs).
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from . import lora_kernel

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class LoRAGroup:
    """Projections of one input, each a `FusedLoRALinear` over a 4-bit `QuantizedLinear` of the same format."""

    def __init__(self, members: list, use_kernel: bool = True):
        self.members = members
        self.use_kernel = use_kernel
        linears = [m.linear for m in members]
        self.sizes = [linear.weight.shape[0] for linear in linears]
        self.format = dict(group_size=linears[0].group_size, bits=linears[0].bits, mode=linears[0].mode)
        self._merge_base()
        self._adapter_from: list | None = None
        self._input = None
        self._outputs: list | None = None
        for index, member in enumerate(members):
            member.lora_group, member.lora_group_index = self, index

    @staticmethod
    def compatible(members: list) -> bool:
        if any(type(m) is not lora_kernel.FusedLoRALinear or not isinstance(m.linear, nn.QuantizedLinear)
               for m in members):
            return False
        first = members[0].linear
        same = all((m.linear.group_size, m.linear.bits, m.linear.mode, "bias" in m.linear, "biases" in m.linear,
                    m.linear.weight.shape[1]) == (first.group_size, first.bits, first.mode, "bias" in first,
                                                  "biases" in first, first.weight.shape[1]) for m in members)
        return same and sum(m.lora_a.shape[-1] for m in members) <= lora_kernel.MAX_RANK

    def _merge_base(self) -> None:
        """One copy of the members' 4-bit weights, concatenated; each member's arrays become views of it."""
        names = [name for name in ("weight", "scales", "biases", "bias") if name in self.members[0].linear]
        self.base = {name: mx.concatenate([m.linear[name] for m in self.members], axis=0) for name in names}
        mx.eval(self.base)
        start = 0
        for member, size in zip(self.members, self.sizes):
            for name in names:
                member.linear[name] = self.base[name][start : start + size]
            start += size
        mx.eval([m.linear.parameters() for m in self.members])
        self._base_views = [[m.linear[name] for name in names] for m in self.members]

    def _current(self) -> bool:
        """Whether the members still hold the arrays the group was built from (a load replaces them)."""
        names = list(self.base)
        return all(all(m.linear[name] is view for name, view in zip(names, views))
                   for m, views in zip(self.members, self._base_views))

    def _adapter(self) -> tuple[mx.array, mx.array]:
        sources = [(m.lora_a, m.lora_b, m.scale) for m in self.members]
        if self._adapter_from is None or any(a is not a0 or b is not b0 or s != s0 for (a, b, s), (a0, b0, s0)
                                             in zip(sources, self._adapter_from)):
            a = mx.concatenate([m.lora_a for m in self.members], axis=1)
            blocks, start, total = [], 0, a.shape[1]
            for m in self.members:
                rank = m.lora_a.shape[1]
                scaled = (m.scale * m.lora_b.astype(mx.float32)).astype(m.lora_b.dtype)
                blocks.append(mx.pad(scaled, [(start, total - start - rank), (0, 0)]))
                start += rank
            self._adapter_from = sources
            self._a, self._b = a, mx.concatenate(blocks, axis=1)
        return self._a, self._b

    def output(self, member, x: mx.array) -> mx.array | None:
        """`member`'s output for `x`, computed with its siblings'; None if it must run alone (a module tree
        copied from this one, `policy.share_base`, has its own adapter: its members are not this group's)."""
        index = member.lora_group_index
        if not 0 <= index < len(self.members) or self.members[index] is not member:
            return None
        dequant_rows = getattr(member.linear, "dequant_rows", 0)  # a long prefill multiplies dense weights instead
        if dequant_rows and x.size // x.shape[-1] >= dequant_rows:
            return None
        if x is not self._input or self._outputs[index] is None:
            if not self._current():
                return None
            self._input, self._outputs = x, self._compute(x)
        out = self._outputs[index]
        self._outputs[index] = None
        if all(o is None for o in self._outputs):  # every sibling took its part: hold no arrays past the step
            self._input = self._outputs = None
        return out

    def _compute(self, x: mx.array) -> list:
        base = self.base
        y = mx.quantized_matmul(x, base["weight"], scales=base["scales"], biases=base.get("biases"), transpose=True,
                                **self.format)
        if "bias" in base:
            y = y + base["bias"]
        a, b = self._adapter()
        if (self.use_kernel and x.size // x.shape[-1] <= lora_kernel.FUSED_ROWS and y.dtype == x.dtype
                and lora_kernel._usable()):
            y = lora_kernel.lora_product(x, y, a, b, 1.0)
        else:
            y = y + ((x @ a) @ b).astype(x.dtype)
        bounds, start = [], 0
        for size in self.sizes[:-1]:
            start += size
            bounds.append(start)
        return list(mx.split(y, bounds, axis=-1))


def enabled() -> bool:
    """Off unless `ARTMLX_LORA_GROUPS=1`: measured on the H200 it did not make decode steps faster (RESULTS.md)."""
    return os.environ.get("ARTMLX_LORA_GROUPS", "0") == "1"


def group_siblings(model: nn.Module, use_kernel: bool = True) -> int:
    """Group every module's sibling projections that qualify; returns how many groups were made."""
    made = 0
    for _, module in model.named_modules():
        for names in SIBLINGS:
            members = [getattr(module, name, None) for name in names]
            if all(m is not None for m in members) and LoRAGroup.compatible(members) \
                    and not any(getattr(m, "lora_group", None) is not None for m in members):
                LoRAGroup(members, use_kernel)
                made += 1
    return made
