"""D3PM ancestral sampling: x_T = all MASK, then x_{t_{i-1}} ~ p(x_{t_{i-1}} | x_{t_i}) (Austin et al. 2021,
eq. 4, absorbing kernel; seqdiff.methods.graphs.absorbing_reverse_step) down to t = 0.

The loop is MDLM's ancestral loop over `steps` uniform steps from t = 1 to 0; with steps equal to the
method's T it walks the training grid exactly (fewer steps are valid too: the posterior holds for any s < t).
Without SUBS the model's own MASK probability pi_M slows revealing. At the last step (alpha_0 = 1) the model
would keep a MASK with probability pi_M / Z, which the bound's reconstruction term charges; the sampler instead
reveals every MASK there, drawing x_0 from pi without its MASK entry (the model conditioned on producing data).
"""

from __future__ import annotations

from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler


class D3PMAncestralSampler(MDLMAncestralSampler):
    name = "d3pm"
    methods = ("d3pm",)
    reads = frozenset({"steps"})
    exact = True  # the D3PM reverse chain (its last step conditioned on producing data, see above)
