"""experts_implementation="tiermoe": transformers 5's experts modules, run by TierMoE.

    import tiermoe.transformers
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="tiermoe")
    # or, on a loaded model: model.set_experts_implementation("tiermoe")

transformers' router stays in PyTorch and trains as usual; the dispatch, the
experts (TierMoE's grouped host kernels) and the combine run in the engine,
the router scores absorbed before W2 unless the experts carry a post-expert
norm. Expert weights are read where torch holds them; trainable experts get
their gradients in .grad like any parameter. tiermoe.configure(model, device=...)
puts the hot experts on the device tier.
"""
import contextlib
import functools

from torch.nn.utils import parametrize
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from . import _tier
from ._core import TierMoEError
from ._families import experts_params, make_engine
from ._lora import EngineLora, active_factors, bindable
from ._ops import RoutedMoe, adjust_version, check_input, engine_for, lora_inputs, score_dtype

NAME = "tiermoe"


def experts_engine(experts):
    """The engine of an experts module (made on first use)."""
    return engine_for(experts, experts_params(experts, original=True)[0].dtype,
                      lambda: make_engine(experts, f"{type(experts).__name__} "
                                                   "(experts_implementation='tiermoe')"))


def bind_original(experts):
    """Binds the module's own expert weights (under PEFT's LoRA, the frozen ones) to its engine."""
    experts_engine(experts).sync_experts(*experts_params(experts, original=True))


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The ExpertsInterface function: out_TD = experts(hidden_states) under the given routing.
    Called inside PEFT's ParamWrappers (target_parameters), it computes their LoRA in the engine."""
    engine = experts_engine(self)
    check_input(engine.name, hidden_states, engine.dtype)
    params = experts_params(self, original=True)
    factors, other = active_factors(self)
    lora = None
    if factors and not other and bindable(factors):
        lora = EngineLora(factors, score_dtype(engine.dtype), engine.interleaved)
    elif factors or other:
        if self in _tier._TIERS:
            raise TierMoEError(
                f"{engine.name}: PEFT's expert LoRA here is one of several active adapters, or of "
                "two ranks on gate_up_proj and down_proj, which the device tier does not run "
                "(hint: one active adapter of one rank)")
        params = experts_params(self)  # PEFT's dense W + delta (_lora.py says when)
    _tier.begin_step(self)
    engine.sync_experts(*params)
    return RoutedMoe.apply(engine, lora, hidden_states, top_k_index, top_k_weights, *params,
                           *lora_inputs(lora))


ALL_EXPERTS_FUNCTIONS.register(NAME, experts_forward)


def _skip_peft_fold_check():
    """PEFT runs an expert adapter by registering a torch parametrization on the experts module
    at every forward, and torch checks a new parametrization by evaluating it: PEFT's dense fold
    W + scaling * B A of the whole expert stack, which nothing reads when TierMoE computes the
    adapter from its factors (about 2 s of a 4.9 s step at Qwen3-30B-A3B shapes, docs/python.md). For
    experts modules that run in TierMoE only, PEFT's registration is made with unsafe=True, which
    skips that check and nothing else (no right_inverse runs for PEFT's proxy either way).

    The registration also sets the frozen weight to itself (original.set_(original), so that
    optimizers keep their tensor), which moves its version counter without changing a value:
    those moves are recorded (_ops.adjust_version), so that the engine does not re-pack
    the experts at every forward as it would for a changed weight."""
    try:
        from peft.tuners.lora.layer import ParamWrapper
    except ImportError:
        return
    activate = getattr(ParamWrapper, "_activate_lora", None)
    if activate is None or getattr(activate, "_tiermoe", False):
        return

    @contextlib.contextmanager
    def activate_lora(self, active_adapters):
        config = getattr(self.get_base_layer(), "config", None)
        if getattr(config, "_experts_implementation", None) != NAME:
            with activate(self, active_adapters):
                yield
            return
        register = parametrize.register_parametrization

        def register_unchecked(module, name, parametrization, unsafe=False):
            before = getattr(module, name) if not parametrize.is_parametrized(module, name) else None
            version = before._version if before is not None else None
            register(module, name, parametrization, unsafe=True)
            after = module.parametrizations[name].original
            if before is not None and after is before:
                adjust_version(after, version - after._version)

        parametrize.register_parametrization = register_unchecked
        try:
            with activate(self, active_adapters):
                parametrize.register_parametrization = register
                yield
        finally:
            parametrize.register_parametrization = register

    activate_lora._tiermoe = True
    ParamWrapper._activate_lora = activate_lora


_skip_peft_fold_check()
