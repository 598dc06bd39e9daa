"""The engine's MoE block as torch.autograd.Functions, shared by both entry points.

An EngineMoe is one transformers MoE module's engine op (tiermoe._core.MoeOp)
and the tensors it is bound to. The engine reads torch's memory where it lies
(DLPack views, no copy); for gpt-oss's x-major experts ([E, D, 2F], [E, F, D])
it reads a transposed copy made once per weight change. A binding is renewed
only when a tensor's version counter or address moves, so frozen experts are
packed for the grouped kernels once, and trainable ones again after each
optimizer step.

What the engine keeps for backward (a MoeSaved) points into the forward's
inputs: each Function keeps those tensors with it for as long as it lives.
Under torch's non-reentrant activation checkpointing (transformers' and TRL's
gradient_checkpointing) a Function keeps nothing in the checkpointed forward
and takes what the recomputation inside backward kept (_keep, _kept).
"""
import sys
import weakref

import torch

from . import _core

DTYPE_NAMES = {torch.float64: "f64", torch.float32: "f32", torch.bfloat16: "bf16"}


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """Router scores, the LoRA's weights and their gradients in the engine: fp32 for f32 and
    bf16 runs, f64 in f64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _engine_view(t: torch.Tensor) -> torch.Tensor:
    # DLPack refuses tensors that require grad; detach() shares the memory.
    return t.detach().contiguous()


def _from_engine(array) -> torch.Tensor:
    return torch.from_dlpack(array)


def _checkpoint_pass():
    """"forward" inside a forward under torch.utils.checkpoint (non-reentrant), whose saved
    tensors are dropped and rebuilt by running the region again inside backward; "recompute" in
    that second run; None otherwise. Read from the saved-tensor hooks checkpoint pushes (torch
    has no public query; without it every pass keeps what it saved, which is correct, only
    larger)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(False) if top is not None else None
    if hooks is None or not getattr(hooks[0], "_checkpoint_internal", False):
        return None
    return "recompute" if "_recomputation_hook" in hooks[0].__qualname__ else "forward"


def _keep(ctx, saved, tensors):
    """Keeps a forward's MoeSaved and the tensors it points into for its backward. Under
    checkpointing both passes save one token tensor through save_for_backward, which checkpoint
    drops after the forward and hands the backward from the recomputation: the recomputation's
    token carries what it kept, the forward's carries nothing."""
    mode = _checkpoint_pass()
    if mode is None:
        ctx.kept = (saved, tensors)
        return
    ctx.kept = None
    token = torch.empty(0)
    if mode == "recompute":
        token.tiermoe_kept = (saved, tensors)
    ctx.save_for_backward(token)


def _kept(ctx):
    """The MoeSaved a backward reads (see _keep)."""
    if ctx.kept is not None:
        return ctx.kept[0]
    (token,) = ctx.saved_tensors
    kept = getattr(token, "tiermoe_kept", None)
    if kept is None:
        raise _core.TierMoEError(
            "a TierMoE MoE block's backward found nothing the checkpoint's recomputation kept "
            "(hint: use non-reentrant checkpointing, gradient_checkpointing_kwargs="
            "{\"use_reentrant\": False}, transformers' default)")
    ctx.kept = kept  # a second backward (retain_graph) reads it again
    return kept[0]


def check_input(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.device.type != "cpu":
        raise _core.TierMoEError(
            f"{name}: hidden_states are on {x.device}; this TierMoE path runs CPU tensors "
            "(hint: keep the model on the CPU; the MoE blocks do not take CUDA tensors yet, and "
            "tiermoe.configure(model, device=\"cuda\", ...) puts the hot experts on the GPU)")
    if x.dtype != dtype:
        raise _core.TierMoEError(
            f"{name}: hidden_states are {x.dtype} but the experts are {dtype} "
            "(hint: load the model in one dtype, e.g. from_pretrained(..., dtype=torch.bfloat16))")


# Corrections to tensors' version counters, by id (dropped with the tensor): a binding is
# renewed when a tensor's corrected version moves. See adjust_version.
_VERSION_OFFSETS = {}


def adjust_version(t: torch.Tensor, by: int) -> None:
    """Corrects t's version counter by `by`: negative for moves that changed no value (PEFT's
    parametrization sets a frozen weight to itself at every forward), positive for changes made
    through t.data, which move none (PEFT's merge and unmerge)."""
    if not by:
        return
    key = id(t)
    if key not in _VERSION_OFFSETS:
        weakref.finalize(t, _VERSION_OFFSETS.pop, key, None)
    _VERSION_OFFSETS[key] = _VERSION_OFFSETS.get(key, 0) + by


def _version(t: torch.Tensor) -> int:
    return t._version + _VERSION_OFFSETS.get(id(t), 0)


def _watch_peft_merges() -> None:
    """Once PEFT is loaded: its ParamWrapper.merge and unmerge (expert LoRA folded into the
    weights and out again) write through param.data, which moves no version counter; each is
    recorded as a change of the weight, so that packed copies of it are rebuilt."""
    layer = sys.modules.get("peft.tuners.lora.layer")
    wrapper = getattr(layer, "ParamWrapper", None) if layer is not None else None
    if wrapper is None or getattr(wrapper.merge, "_tiermoe", False):
        return
    for name in ("merge", "unmerge"):
        def recorded(self, *args, _fn=getattr(wrapper, name), **kwargs):
            out = _fn(self, *args, **kwargs)
            adjust_version(getattr(self.get_base_layer(), self.parameter_name), 1)
            return out
        recorded._tiermoe = True
        setattr(wrapper, name, recorded)


class EngineMoe:
    """One MoE module's engine op and the torch tensors it reads."""

    def __init__(self, op: "_core.MoeOp", name: str, dtype: torch.dtype, transposed: bool,
                 interleaved: bool):
        self.op = op
        self.name = name
        self.dtype = dtype
        self.transposed = transposed  # HF keeps the experts x-major (gpt-oss)
        self.interleaved = interleaved  # W13's gate and up rows alternate (gpt-oss)
        self._experts_key = None
        self._experts_held = ()
        self._router_key = None
        self._router_held = ()

    @staticmethod
    def _key(tensors):
        return tuple((t.data_ptr(), _version(t)) if t is not None else None for t in tensors)

    def sync_experts(self, w13, w2, b13=None, b2=None):
        """Binds the experts' weights (HF layout) unless they are unchanged since the last bind."""
        _watch_peft_merges()
        key = self._key((w13, w2, b13, b2))
        if key == self._experts_key:
            return
        for n, t in (("gate_up_proj", w13), ("down_proj", w2), ("gate_up_proj_bias", b13),
                     ("down_proj_bias", b2)):
            if t is not None and t.dtype != self.dtype:
                raise _core.TierMoEError(
                    f"{self.name}.experts.{n} is {t.dtype}, the module computes in {self.dtype} "
                    "(hint: keep every expert tensor in the model's dtype)")
        if self.transposed:
            w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
        held = tuple(_engine_view(t) if t is not None else None for t in (w13, w2, b13, b2))
        self.op.bind_experts(*held)
        self._experts_held = held  # the engine reads these until the next bind
        self._experts_key = key

    def sync_router(self, weight, bias=None, selection_bias=None):
        """Binds the router's weight (compute dtype) and biases (score dtype)."""
        key = self._key((weight, bias, selection_bias))
        if key == self._router_key:
            return
        sd = score_dtype(self.dtype)
        # A router weight kept wider than the model (DeepSeek-V3 declares it
        # float32) is read at the compute dtype, as the engine's router takes it.
        held = (_engine_view(weight.to(self.dtype)),
                _engine_view(bias.to(sd)) if bias is not None else None,
                _engine_view(selection_bias.to(sd)) if selection_bias is not None else None)
        self.op.bind_router(*held)
        self._router_held = held
        self._router_key = key

    def expert_grads(self, params, wanted):
        """The last backward's expert gradients in the HF layout and dtype of `params`."""
        out = []
        for name, p, want in zip(("w13", "w2", "b13", "b2"), params, wanted):
            if not want:
                out.append(None)
                continue
            g = _from_engine(self.op.grad(name))
            if self.transposed and g.dim() == 3:
                g = g.transpose(1, 2)
            out.append(g.to(p.dtype).contiguous())
        return out


def _bind_lora(engine, lora):
    if lora is None:
        engine.op.set_lora(0, False, False)
    else:
        lora.bind(engine.op)


def _lora_grads(engine, lora, wanted):
    """The gradients of the LoRA factors (B13, A13, B2, A2), None where not wanted."""
    if lora is None or not any(wanted):
        return [None] * 4
    g = lora.grads(engine.op, _from_engine)
    out = [*g.get("gate_up_proj", (None, None)), *g.get("down_proj", (None, None))]
    return [t if want else None for t, want in zip(out, wanted)]


def lora_inputs(lora):
    """The factor tensors a Function takes, so that autograd carries their gradients back to
    PEFT's lora_A and lora_B: B13, A13, B2, A2 (None where not adapted)."""
    f = lora.factors if lora is not None else {}
    gu, dn = f.get("gate_up_proj"), f.get("down_proj")
    return (gu.B if gu else None, gu.A if gu else None, dn.B if dn else None, dn.A if dn else None)


class RoutedMoe(torch.autograd.Function):
    """out_TD = experts(x_TD) under transformers' routing (the experts backend).

    Inputs: the EngineMoe, the expert LoRA's EngineLora (or None), x_TD, ids_TK, weights_TK,
    the experts' parameters in their HF layout (gate_up_proj, down_proj, gate_up_proj_bias,
    down_proj_bias; None where absent), then the LoRA factors (B13, A13, B2, A2), so that
    autograd hands their gradients to whatever trains them.
    """

    @staticmethod
    def forward(ctx, engine, lora, x, ids, weights, *tensors):
        params = tensors[:4]
        expert_grads = any(ctx.needs_input_grad[5:9])
        adapter_grads = any(ctx.needs_input_grad[9:13])
        x_c = _engine_view(x)
        w_c = _engine_view(weights.to(score_dtype(engine.dtype)))
        ids_c = ids.detach().contiguous()
        _bind_lora(engine, lora)
        saved = _core.MoeSaved()
        out = _from_engine(engine.op.forward_routed(saved, x_c, ids_c, w_c, expert_grads,
                                                    adapter_grads))
        _keep(ctx, saved, (x_c, w_c))
        ctx.engine, ctx.lora = engine, lora
        ctx.weights_dtype = weights.dtype
        ctx.params = params
        return out

    @staticmethod
    def backward(ctx, dout):
        engine = ctx.engine
        saved = _kept(ctx)
        _bind_lora(engine, ctx.lora)  # another forward may have bound its own since
        dx, dweights = engine.op.backward(saved, _engine_view(dout))
        grads = engine.expert_grads(ctx.params, ctx.needs_input_grad[5:9])
        lora = _lora_grads(engine, ctx.lora, ctx.needs_input_grad[9:13])
        return (None, None, _from_engine(dx), None,
                _from_engine(dweights).to(ctx.weights_dtype), *grads, *lora)


class BlockMoe(torch.autograd.Function):
    """(out_TD, logits_TE) = the whole routed block, the router included (tiermoe.torch.patch).

    Inputs: the EngineMoe, the expert LoRA's EngineLora (or None), x_TD, the router's weight
    and bias (or None), its e_score_correction_bias (or None; selection only, no gradient),
    the experts' parameters in their HF layout, then the LoRA factors (B13, A13, B2, A2). The
    logits' gradient (the aux loss's, when the model computes one) reaches the engine's router.
    """

    @staticmethod
    def forward(ctx, engine, lora, x, router_weight, router_bias, selection_bias, *tensors):
        params = tensors[:4]
        expert_grads = any(ctx.needs_input_grad[6:10])
        adapter_grads = any(ctx.needs_input_grad[10:14])
        x_c = _engine_view(x)
        _bind_lora(engine, lora)
        saved = _core.MoeSaved()
        out, logits = engine.op.forward(saved, x_c, expert_grads, adapter_grads)
        _keep(ctx, saved, (x_c,))
        ctx.engine, ctx.lora = engine, lora
        ctx.router = (router_weight, router_bias)
        ctx.params = params
        return _from_engine(out), _from_engine(logits)

    @staticmethod
    def backward(ctx, dout, dlogits):
        engine = ctx.engine
        saved = _kept(ctx)
        _bind_lora(engine, ctx.lora)
        dl = _engine_view(dlogits) if dlogits is not None else None
        dx, _ = engine.op.backward(saved, _engine_view(dout), dl)
        weight, bias = ctx.router
        dw = (_from_engine(engine.op.grad("router.weight")).to(weight.dtype)
              if ctx.needs_input_grad[3] else None)
        db = (_from_engine(engine.op.grad("router.bias")).to(bias.dtype)
              if bias is not None and ctx.needs_input_grad[4] else None)
        grads = engine.expert_grads(ctx.params, ctx.needs_input_grad[6:10])
        lora = _lora_grads(engine, ctx.lora, ctx.needs_input_grad[10:14])
        return (None, None, _from_engine(dx), dw, db, None, *grads, *lora)


# Engines by module, held beside the modules rather than on them, so that a
# module deep-copies and pickles as transformers' own (a copy gets an engine
# of its own on first use).
_ENGINES = weakref.WeakKeyDictionary()


def engine_for(module: torch.nn.Module, dtype: torch.dtype, make) -> EngineMoe:
    """The module's engine, made on first use and again when its dtype changed (model.to())."""
    engine = _ENGINES.get(module)
    if engine is None or engine.dtype != dtype:
        engine = make()
        _ENGINES[module] = engine
    return engine
