"""The renderers' shared step skeleton (ember/backends/render_steps.py): every renderer has one method per IR step,
a renderer missing one fails naming the step, and renderers without scratch arrays refuse them by kernel name."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember.backends.base import Renderer
from ember.backends.c import VECTOR_OPS, CRenderer
from ember.backends.opencl import OpenCLRenderer
from ember.backends.ptx import PTXRenderer
from ember.backends.render_steps import STEP_METHODS, KernelBody, StepRenderer
from ember.backends.wgsl import WGSLRenderer
from ember.capabilities import DeviceInfo
from ember.core.errors import CompileError
from ember.ir.ir import IRNode, IROp, KernelIR, topological_nodes
from ember.ir.linearize import Step
from ember.ir.opt import build_kernel_ir
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch

RENDERERS = [CRenderer, OpenCLRenderer, WGSLRenderer, PTXRenderer]


def _kernels(tensor: em.Tensor, info: DeviceInfo) -> list[KernelIR]:
    items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
    return [build_kernel_ir(item.kernel, f"kernel{number}", info) for number, item in enumerate(items)]


def _sum_kernel() -> KernelIR:
    """A reduce over a loop stored by each work item: every step but define_local."""
    tensor = em.tensor(np.zeros((3, 17), dtype=np.float32), device="dummy:0").sum(1)
    return _kernels(tensor, DeviceInfo())[0]


def test_every_step_has_a_method_name() -> None:
    assert set(STEP_METHODS) == set(Step)
    assert len(set(STEP_METHODS.values())) == len(Step)


@pytest.mark.parametrize("renderer_class", RENDERERS, ids=lambda cls: cls.__name__)
def test_each_renderer_implements_every_step(renderer_class: type[StepRenderer[KernelBody]]) -> None:
    renderer = renderer_class()
    assert isinstance(renderer, StepRenderer)
    methods = renderer.step_methods()
    assert set(methods) == set(Step)
    for step, name in STEP_METHODS.items():
        assert callable(getattr(renderer, name)), f"{renderer_class.__name__} lacks {name} for {step}"
    renders: Renderer = renderer  # the protocol the backends and dummy devices hold
    assert renders.language and renders.language != StepRenderer.language


class _WithoutStores(StepRenderer[KernelBody]):
    """A renderer that forgot the store step."""

    language = "Example"

    def value(self, body: KernelBody, node: IRNode) -> None:
        body.line(f"{body.name_of(node, 'v')} = ...")

    def define_accumulator(self, body: KernelBody, node: IRNode) -> None:
        body.name_of(node, "acc")

    def update_accumulator(self, body: KernelBody, node: IRNode) -> None:
        pass

    def open_loop(self, body: KernelBody, node: IRNode) -> None:
        body.names[id(node)] = "i"

    def close_loop(self, body: KernelBody, node: IRNode) -> None:
        pass

    def define_local(self, body: KernelBody, node: IRNode) -> None:
        self.refuse_scratch_arrays(body, node)


def test_a_missing_step_method_is_named() -> None:
    body = KernelBody(_sum_kernel(), lambda node: str(node.arg))
    with pytest.raises(NotImplementedError, match=r"Example renderer \(_WithoutStores\) has no method store\(body, "
                                                  r"node\) for the IR step STORE"):
        _WithoutStores().render_steps(body)


def test_a_step_method_overridden_in_a_subclass_is_the_one_called() -> None:
    class MarkedStores(CRenderer):
        def store(self, body: KernelBody, node: IRNode) -> None:
            body.line("/* store */")
            super().store(body, node)

    source = MarkedStores().render(_sum_kernel())
    plain = CRenderer().render(_sum_kernel())
    assert source.count("/* store */") == 1 and source.replace("    /* store */\n", "") == plain


@pytest.mark.parametrize("renderer_class", [WGSLRenderer, PTXRenderer], ids=lambda cls: cls.__name__)
def test_renderers_without_scratch_arrays_refuse_them_by_kernel_name(renderer_class: type[StepRenderer[KernelBody]]
                                                                     ) -> None:
    info = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS)
    product = (em.tensor(np.zeros((128, 256), dtype=np.float32), device="dummy:0")
               @ em.tensor(np.zeros((256, 64), dtype=np.float32), device="dummy:0"))
    staged = [kernel for kernel in _kernels(product, info)
              if any(node.op is IROp.DEFINE_LOCAL for node in topological_nodes(kernel.sink))]
    assert staged, "a matmul this size is staged into a scratch array for a device with vector ops"
    renderer = renderer_class()
    with pytest.raises(CompileError, match=f"kernel {staged[0].name} uses a scratch array, which the "
                                           f"{renderer.language} renderer does not render"):
        renderer.render(staged[0])
