"""Formula ids and their exact evaluation orders, as numerical contracts name them.

The Adam, AdamW and SGD orders are written down once, in csrc/kernel/alpha_kernel.h ("ADAM EVALUATION
ORDER", "ADAMW EVALUATION ORDER", "SGD WITH MOMENTUM"); the strings here are that text with the blanks removed, one assignment per
`;`, each operation one correctly rounded binary64 operation, parenthesised as evaluated.
tests/test_contracts.py reads the header and checks that every assignment below is written there,
in this order, so the two cannot drift apart. A contract names a formula by id *and* text: a
peer or checkpoint whose text differs is a different order (`numerical-order-mismatch`).
"""

from __future__ import annotations

__all__ = ["ADAM_V1", "ADAMW_V1", "SGD_MOMENTUM_V1", "NORMALIZE_ONCE", "FORMULAS", "ALIASES", "assignments"]

#: Adam (kernel ak_adam). Scalars once per call; per element the five lines; then the caller
#: multiplies the carried bias-correction powers once per step (never pow): b1t, b2t enter step
#: t as b1**t, b2**t.
ADAM_V1 = (
    "c1=1-b1; c2=1-b2; bc1=1-b1t; bc2=1-b2t; "
    "m'=(b1*m)+(c1*g); v'=(b2*v)+(c2*(g*g)); mhat=m'/bc1; vhat=v'/bc2; "
    "p'=p-((lr*mhat)/(sqrt(vhat)+eps)); "
    "b1t*=b1; b2t*=b2"
)

#: AdamW (kernel ak_adamw): decoupled weight decay wd in torch.optim.AdamW's order, the parameter
#: decayed first and Adam's step run on the decayed value; the bias powers carried as for Adam.
ADAMW_V1 = (
    "c1=1-b1; c2=1-b2; bc1=1-b1t; bc2=1-b2t; dec=1-(lr*wd); "
    "pd=p*dec; m'=(b1*m)+(c1*g); v'=(b2*v)+(c2*(g*g)); mhat=m'/bc1; vhat=v'/bc2; "
    "p'=pd-((lr*mhat)/(sqrt(vhat)+eps)); "
    "b1t*=b1; b2t*=b2"
)

#: SGD with momentum, PyTorch convention, no dampening, no Nesterov (kernel ak_sgd).
SGD_MOMENTUM_V1 = "mu!=0: buf'=(mu*buf)+g; p'=p-(lr*buf'); mu==0: p'=p-(lr*g)"

#: Normalisation after the combine, once: one true division per coordinate by the combined
#: mass (never a reciprocal then a multiply, which rounds twice).
NORMALIZE_ONCE = "g=numerator/mass"

FORMULAS: dict = {
    "adam-v1": ADAM_V1,
    "adamw-v1": ADAMW_V1,
    "sgd-momentum-v1": SGD_MOMENTUM_V1,
    "normalize-once": NORMALIZE_ONCE,
}

#: Short names a learner may pass to contract_for_plan(plan, optimizer=...).
ALIASES: dict = {
    "adam": "adam-v1",
    "adamw": "adamw-v1",
    "sgd": "sgd-momentum-v1",
    "sgd-momentum": "sgd-momentum-v1",
}


def assignments(text: str) -> list:
    """The assignments of a formula string in order, without case labels (`mu!=0:`)."""
    out = []
    for part in text.split(";"):
        part = part.strip()
        if ":" in part:
            part = part.split(":", 1)[1].strip()
        if part:
            out.append(part)
    return out
