"""Objects registered with a `DataParallel` (an LR scheduler, a sampler, a loss scaler ...): their
`state_dict()` as exact JSON for the manifest (`encode_state` / `decode_state`), their class
(recorded at save, compared on restore), and restoring them all or nothing: each saved state is
first tried on a copy of its object (`try_load`, before any rank installs anything), then
installed with the ones already loaded put back should one still raise (`load_all`).
"""

from __future__ import annotations

import copy

from ..refusals import CheckpointRefusal, Refusal

__all__ = ["class_name", "decode_state", "encode_state", "load_all", "try_load"]


def encode_state(v, where: str = "state"):
    """A state_dict value as JSON the manifest accepts, exactly: floats round-trip (repr),
    non-finite floats and tuples are tagged; anything else (a tensor, a function) is refused."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and abs(v) != float("inf") else {"__float__": repr(v)}
    if isinstance(v, tuple):
        return {"__tuple__": [encode_state(x, where) for x in v]}
    if isinstance(v, list):
        return [encode_state(x, where) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) and not k.startswith("__") for k in v):
        return {k: encode_state(x, f"{where}.{k}") for k, x in v.items()}
    raise Refusal(
        "torch-state-unsupported",
        f"{where} is a {type(v).__name__}; a registered object's state_dict() must hold numbers, "
        "strings, booleans, None, lists, tuples and dicts with string keys",
    )


def decode_state(v):
    """The inverse of encode_state."""
    if isinstance(v, list):
        return [decode_state(x) for x in v]
    if isinstance(v, dict):
        if set(v) == {"__float__"}:
            return float(v["__float__"])
        if set(v) == {"__tuple__"}:
            return tuple(decode_state(x) for x in v["__tuple__"])
        return {k: decode_state(x) for k, x in v.items()}
    return v


def class_name(obj) -> str:
    """`module.QualifiedName` of `obj`'s class: recorded at save, compared on restore."""
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def try_load(name: str, obj, state, shared: dict) -> None:
    """Load `state` into a copy of `obj` (sharing what `shared` holds): a `load_state_dict` that
    raises is refused by name, and `obj` is left as it was. An object that cannot be copied is
    tried on itself and put back from its own state_dict()."""
    try:
        trial = copy.deepcopy(obj, dict(shared))
    except Exception:
        trial = None
    try:
        if trial is not None:  # a copy of the state too: a load_state_dict may keep or edit it
            trial.load_state_dict(copy.deepcopy(state))
        else:
            before = obj.state_dict()
            try:
                obj.load_state_dict(state)
            finally:
                obj.load_state_dict(before)
    except Exception as e:
        raise _refused(name, obj, e) from None


def load_all(registered: dict, states: dict, keep_base_lrs: bool = False) -> None:
    """`load_state_dict(states[name])` on every registered object, each state already taken by
    a copy (try_load): should one raise all the same, those already loaded are put back and it is
    refused by name. `keep_base_lrs` (adopt_lr): a scheduler keeps its present `base_lrs`."""
    done = []
    for k, o in registered.items():
        before = o.state_dict()
        keep = list(o.base_lrs) if keep_base_lrs and hasattr(o, "base_lrs") else None
        try:
            o.load_state_dict(states[k])
        except Exception as e:
            for obj, was in reversed(done):
                obj.load_state_dict(was)
            raise _refused(k, o, e) from None
        if keep is not None:
            o.base_lrs = keep
        done.append((o, before))


def _refused(name: str, obj, e: Exception) -> CheckpointRefusal:
    return CheckpointRefusal(
        "checkpoint-config-mismatch",
        f"registered {name!r} ({class_name(obj)}) refused the checkpoint's state: {type(e).__name__}: {e}",
    )
