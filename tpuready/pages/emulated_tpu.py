"""The emulated-TPU reference page's generated part, from `tpuready.emulator.behaviours`."""

from __future__ import annotations

from tpuready.emulator.behaviours import BEHAVIOURS, NEVER_CLAIMED, NOT_EMULATED

__all__ = ["markdown"]


def markdown() -> str:
    """The reference page's generated part: the behaviours, what is not emulated, and what
    is never claimed (lists, not wide tables: they fit the text column on a phone)."""
    lines = []
    for behaviour in BEHAVIOURS:
        test = behaviour.test.removeprefix("test_").replace("_", " ")  # words wrap on a phone
        lines.append(
            f"- **{behaviour.name}.** {behaviour.emulated} *Notes:* {behaviour.notes}. "
            f"*Test:* {test}."
        )
    lines += ["", "Documented, not emulated:", ""]
    lines += [f"- {what}: {why}." for what, why in NOT_EMULATED]
    lines += ["", "Never claimed by a figure measured under the emulator:", ""]
    lines += [f"- {claim}." for claim in NEVER_CLAIMED]
    return "\n".join(lines)
