"""The device tier's figures in a transformers / TRL Trainer's logs.

    trainer = SFTTrainer(..., callbacks=[tiermoe.trl.StatsCallback()])

works with any transformers Trainer (TRL's derive from it) over a model patched with a device
tier (tiermoe.torch.patch(model, device=..., device_memory=...)). Each log entry of
trainer.state.log_history gets the last optimizer step's tier figures under "tier/..." keys:
the hot fraction, rows on the device, launches, bytes up and down, the time split (host,
device, wait for it, transfers), re-placements and the bytes of expert weights moved.
"""
from transformers import TrainerCallback

from . import _core
from .torch import stats

KEYS = ("hot_fraction", "device_rows", "device_calls", "bytes_up", "bytes_down", "host_s",
        "device_s", "wait_s", "transfer_s", "replacements", "bytes_moved", "bytes_synced")


class StatsCallback(TrainerCallback):
    """Adds the device tier's figures of the last step to every log entry."""

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        try:
            last = stats(model)["last_step"]
        except _core.TierMoEError:  # no tier on this model: nothing to add
            return
        if not last:
            return
        figures = {f"tier/{k}": last[k] for k in KEYS}
        # Trainer.log has put its copy of `logs` into log_history already; callbacks after
        # this one see `logs` itself.
        if logs is not None:
            logs.update(figures)
        if state.log_history:
            state.log_history[-1].update(figures)
