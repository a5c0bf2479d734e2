"""Planning layer: trees -> per-rank schedules, a dry-run simulator, assembly plans. Pure.

`validate` checks a request once; `plan` plans the tree realization in passes (group, lower
the reduce, lower the delivery); `realize` lowers any realization to a `Program`, the one
executable form (each rank's ops) that the executor runs and `check` simulates. Every plan is
a `PlanBase`: the same tree order id, layout order id and identity fields on each.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes as _lazy_attributes

# Every name loads on first use: the arrays need one module of this package (array_program), a
# combine a few, the simulator and the other realizations only when asked for.
_LAZY = {
    "AssemblyPlan": ".assembly",
    "even_ranges": ".assembly",
    "plan_assembly": ".assembly",
    "PlanBase": ".base",
    "Edge": ".combine_plan",
    "Group": ".combine_plan",
    "Plan": ".combine_plan",
    "plan": ".combine_plan",
    "Program": ".program",
    "plan_scatter": ".realize",
    "realize": ".realize",
    "Traffic": ".simulate",
    "simulate": ".simulate",
}

__all__ = [
    "plan",
    "Plan",
    "PlanBase",
    "Group",
    "realize",
    "plan_scatter",
    "Program",
    "simulate",
    "Traffic",
    "plan_assembly",
    "AssemblyPlan",
    "even_ranges",
    "Edge",
]

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())

if TYPE_CHECKING:  # the names as static readers see them (the API reference, type checkers)
    from .assembly import AssemblyPlan, even_ranges, plan_assembly  # noqa: F401
    from .base import PlanBase  # noqa: F401
    from .combine_plan import Edge, Group, Plan, plan  # noqa: F401
    from .program import Program  # noqa: F401
    from .realize import plan_scatter, realize  # noqa: F401
    from .simulate import Traffic, simulate  # noqa: F401
