"""ember: a small, hackable deep-learning framework with a torch-like lazy Tensor, fused kernels and pluggable backends."""

from ember.collection_pause import tune_young_generation as _tune_young_generation
from ember.scheduler.runtime import install as _install_runtime

_tune_young_generation()  # a step's graph is not promoted to the old generations (collection_pause.py)
del _tune_young_generation

_install_runtime()  # core reaches the scheduler only through core/runtime.py's interface
del _install_runtime

from ember.autograd.engine import grad
from ember.autograd.grad_mode import (
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad, set_grad_enabled,
)
from ember.core.creation import (
    arange, as_tensor, asarray, empty, empty_like, empty_strided, eye, from_numpy, frombuffer, full, full_like,
    initial_seed, linspace, logspace,
    manual_seed, normal, ones, ones_like, rand, rand_like, randint, randint_like, randn, randn_like, randperm,
    scalar_tensor, seed, tensor, uniform, zeros, zeros_like,
)
from ember.core.dtype import (
    DType, bfloat16, can_cast, float16, float32, float64, int8, int16, int32, int64, promote_types, uint8, uint16,
    uint32, uint64,
)
from ember.core.dtype_info import finfo, get_default_dtype, iinfo, result_type, set_default_dtype
from ember.core.printing import set_printoptions
from ember.core.random import get_rng_state, set_rng_state
from ember.core.shapes import broadcast_shapes
from ember.core.dtype import bool_ as bool  # noqa: A001 - torch's name
from ember.core.errors import (
    ArgumentError, AutogradError, AxisError, BackendUnavailable, CompileError, CompileFallbackWarning, DeviceError,
    DTypeError, EmberError, MemoryBudgetError, OutOfMemoryError, ShapeError,
)
from ember.core.elementwise import where
from ember.core.generator import Generator
from ember.core.movement import broadcast_tensors, cat, stack
from ember.core.linalg import einsum
from ember.core.matrix_structure import (
    block_diag, cartesian_prod, combinations, meshgrid, tril_indices, triu_indices, vander,
)
from ember.core.products import cdist, tensordot
from ember.core.arithmetic_forms import rsub
from ember.core.calculus import cumulative_trapezoid, gradient, trapezoid, trapz
from ember.core.number_ops import isin
from ember.core.searching import bucketize, searchsorted
from ember.core.stacking import (
    atleast_1d, atleast_2d, atleast_3d, column_stack, dstack, hstack, row_stack, unravel_index, vstack,
)
from ember.core.tensor import Tensor, is_tensor, realize
from ember.core.tensor_attributes import imag, real
from ember.core.windows import bartlett_window, blackman_window, hamming_window, hann_window, kaiser_window
from ember.scheduler.devices import get_default_device, set_default_device
from ember.capture.jit import JitError, jit
from ember.capture.shared_arena import JitMemoryPool
from ember.budget.memory_budget import get_memory_budget, memory_budget
from ember.plan.planner import PlanError, load_plan
from ember.scheduler.profile import profile
from ember.ir.search import search
from ember.plan.trace import record_trace

float = float32  # noqa: A001 - torch's aliases
double = float64
half = float16
long = int64
int = int32  # noqa: A001

concat = concatenate = cat

__version__ = "0.1.0"

# the subpackages, reachable as attributes after `import ember` like torch.nn and torch.optim (they import ember)
from ember import cuda, distributed, io, linalg, nn, optim, utils, viz  # noqa: E402
from ember.io import load, save  # noqa: E402

# torch's module-level forms of Tensor methods (ember.exp(x) is x.exp(), ember.gather(x, 1, index) is
# x.gather(1, index)): every Tensor method named like a torch.* function (see ember/function_forms.py)
from ember import torch_names  # noqa: E402
from ember.function_forms import function_forms  # noqa: E402
from ember.torch_level import (  # noqa: E402
    Size, adaptive_max_pool1d, bilinear, chain_matmul, constant_pad_nd, device, dtype, feature_alpha_dropout, fill,
    is_storage, max_pool1d_with_indices,
)

globals().update(function_forms(Tensor, globals()))
del function_forms
# torch.celu_, torch.selu_, torch.rrelu_, ...: in-place functions torch.Tensor has no method for are nn.functional's
globals().update({name: getattr(nn.functional, name) for name in torch_names.TORCH_FUNCTIONS
                  if name.endswith("_") and name not in globals() and hasattr(nn.functional, name)})

# EMBER_TRACE=path records this run's trace; EMBER_PLAN=path loads a plan (`python -m ember plan`)
from ember.plan import planner as _planner
from ember.plan import trace as _trace

_trace.start_from_environment()
_planner.load_from_environment()
del _planner, _trace
