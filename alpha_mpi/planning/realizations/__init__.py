"""The realizations of one declared tree: one module per realization (pure).

Each module holds everything about its realization: `NAME`, `applies(tree_plan, mode)` (None, or
the reason it does not apply), `lower(tree_plan, mode, receivers, segment)` (a `Lowering`: the
per-rank program builder, planning/builder.py) and `estimate(tree_plan, cal, mode)` (its α–β–γ
cost, planning/cost.py):

    tree       reduce up the placed tree, deliver down (any tree)
    scatter    each chunk's whole tree at one rank, chunks gathered (any tree)
    replicate  allgather the top's operands (Bruck), every rank evaluates the top (any tree)
    butterfly  recursive doubling over a rank-partitioned top (any p)
    halving    reduce-scatter by recursive halving + allgather (the same tops)

The registry that looks them up by name, and `realize()`, live in planning/realize.py (this
package imports none of its modules: realize.py is the one place that lists them all).
"""
