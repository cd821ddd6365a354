"""The trainable heads that read the target's hidden states, one file per head, named for its method: `eagle`
(`EagleHead`), `eagle3` (`Eagle3Head`), `medusa` (`MedusaHeads`), `block` (`BlockHead`, DFlash-style), `recurrent`
(`RecurrentHead`, ReDrafter's); `parts` holds what several share (attention, fp32 norms). Each is used by its drafter
in `drafters/` and trained by the online learner (`specroll.online_drafter.heads`) on the same math."""

from .block import BlockHead
from .eagle import EagleHead
from .eagle3 import Eagle3Head
from .medusa import MedusaHeads
from .recurrent import RecurrentHead

__all__ = ["BlockHead", "Eagle3Head", "EagleHead", "MedusaHeads", "RecurrentHead"]
