"""The device tier from PyTorch (patch(device="cpu", device_memory=...), or configure(model, ...)
on either path): hot experts on the tier's CPU backend, cold ones on the host, in the same step;
every loss and every trained weight bitwise those of the host-only run over several steps of
full fine-tuning with the placement moving; stats() reports the hot fraction and the bytes each
way; a saved routing profile plans the same placement when loaded."""
import pytest
import torch

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import batch, stock_f64, twin

STEPS = 16
# Rates that make every move pay (a slow host, a fast device and link): the planner follows the
# routing as it drifts.
RATES = (1e9, 1e12, 1e12, 1e-7)


def steer(model, hot):
    """DeepSeek-V3's selection bias (it only chooses experts) set to send every token to the
    experts `hot` of each MoE layer: the same in both runs, and it moves the hot set."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.zero_()
                b[list(hot)] = 1.0


def train(model, steps=STEPS):
    """SGD steps, every token routed to experts 0 and 1 for the first quarter and to 6 and 7
    after (the routing profile, an average over steps, turns over in a few), so that the
    placement has to move."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, resident = [], []
    for s in range(steps):
        if s in (0, steps // 4):
            steer(model, (0, 1) if s == 0 else (6, 7))
        ids = batch(seed=10 + s)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        try:
            resident.append(tiermoe.torch.stats(model)["resident_experts"])
        except tiermoe.TierMoEError:
            pass
    return losses, resident


# The tier's bucket staging at these shapes, which the budget holds beside the experts.
WORKSPACE = 401408


def budget(model):
    """The workspace and half the experts' bytes: some experts fit, not all."""
    return WORKSPACE + sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                           if ".experts." in n) // 2


def on_path(model, path, **tier):
    """`model` on a TierMoE path ("patch" or "experts": experts_implementation="tiermoe"), with
    the device tier when `tier` names one."""
    if path == "patch":
        return tiermoe.torch.patch(model, **tier)
    model.set_experts_implementation("tiermoe")
    return tiermoe.torch.configure(model, **tier) if tier else model


@pytest.mark.parametrize("path", ["patch", "experts"])
def test_device_tier_equals_the_host_bitwise(tmp_path, path):
    stock = stock_f64("deepseek_v3").to(torch.float32)
    host = on_path(twin(stock), path)
    tier = dict(device="cpu", placement="auto", device_memory=budget(stock), rates=RATES)
    tiered = on_path(twin(stock), path, **tier)
    want, _ = train(host)
    got, resident = train(tiered)
    assert got == want  # bitwise
    for (n, a), (_, b) in zip(host.named_parameters(), tiered.named_parameters()):
        assert torch.equal(a, b), n
    st = tiermoe.torch.stats(tiered)
    totals = st["totals"]
    print(st)
    assert st["steps"] == STEPS
    assert 0 < totals["hot_fraction"] < 1
    assert totals["bytes_up"] > 0 and totals["bytes_down"] > 0 and totals["device_calls"] > 0
    assert totals["bytes_synced"] > 0  # full fine-tuning: updated weights went back up
    assert len({str(r) for r in resident}) > 1, f"the placement never moved: {resident}"

    # The routing profile, saved and loaded, plans the same placement for the first step (the
    # tier places experts when a step begins: at its first forward).
    tiermoe.torch.save_profile(tiered, tmp_path / "profile.json")
    again = on_path(twin(stock), path, **tier, profile=str(tmp_path / "profile.json"))
    assert tiermoe.torch.stats(again)["resident_experts"] == [[], []]
    with torch.no_grad():
        again(input_ids=batch())
    assert tiermoe.torch.stats(again)["resident_experts"] == resident[-1]


def test_configure_refuses_a_model_without_tiermoe_layers_or_a_second_tier():
    stock = stock_f64("qwen3_moe").to(torch.float32)
    with pytest.raises(tiermoe.TierMoEError, match="run transformers' own experts"):
        tiermoe.torch.configure(twin(stock), device="cpu", device_memory=1 << 20)
    model = on_path(twin(stock), "experts")
    with pytest.raises(tiermoe.TierMoEError, match="device_memory must be given"):
        tiermoe.torch.configure(model, device="cpu")
    tiermoe.torch.configure(model, device="cpu", device_memory=1 << 20)
    with pytest.raises(tiermoe.TierMoEError, match="has a device tier already"):
        tiermoe.torch.configure(model, device="cpu", device_memory=1 << 20)
