"""Planning layer: trees -> per-rank schedules, a dry-run simulator, assembly plans. Pure."""

from .assembly import AssemblyPlan, even_ranges, plan_assembly  # noqa: F401
from .combine_plan import Group, Plan, plan  # noqa: F401
from .simulate import Traffic, simulate  # noqa: F401
from .steps import Edge, Step  # noqa: F401
