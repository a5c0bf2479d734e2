"""Planning layer: trees -> per-rank schedules, a dry-run simulator, assembly plans. Pure.

`validate` checks a request once; `plan` plans the tree realization in passes (group, lower
the reduce, lower the delivery); `realize` lowers any realization to a `Program`, the one
executable form (each rank's ops) that the executor runs and `check` simulates. Every plan is
a `PlanBase`: the same tree order id, layout order id and identity fields on each.
"""

from .assembly import AssemblyPlan, even_ranges, plan_assembly
from .base import PlanBase
from .combine_plan import Edge, Group, Plan, plan
from .program import Program
from .realize import plan_scatter, realize
from .simulate import Traffic, simulate

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
